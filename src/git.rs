//! The git route: sandboxes clone, fetch and (where allowed) push connected GitHub
//! repositories through port 4002 while the gateway injects a short-lived,
//! repository-scoped credential upstream. The sandbox never holds a GitHub token.

pub mod credentials;
pub mod handler;
pub mod path;
pub mod pktline;
pub mod refusal;
