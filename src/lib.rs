//! egress-gateway: the egress gateway and DNS firewall for AI-agent code sandboxes.

pub mod addr;
pub mod policy;
