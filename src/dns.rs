//! The embedded DNS firewall: resolves only the gateway's own hostnames and blocks
//! every other name. No forwarding, no recursion.

pub mod firewall;
pub mod ratelimit;
pub mod server;
#[cfg(target_os = "linux")]
mod udp_batch;
pub mod wire;

pub use server::DnsServer;

/// Answer mode's question: may the client at this address reach this name (lowercase,
/// no trailing dot)? The gateway answers it from the current policies.
pub type MayReach = std::sync::Arc<dyn Fn(std::net::IpAddr, &str) -> bool + Send + Sync>;
