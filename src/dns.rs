//! The embedded DNS firewall: resolves only the gateway's own hostnames and blocks
//! every other name. No forwarding, no recursion.

pub mod firewall;
pub mod ratelimit;
pub mod server;

pub use server::DnsServer;
