//! The embedded DNS firewall: resolves only the gateway's own hostnames and blocks
//! every other name. No forwarding, no recursion.

pub mod firewall;
pub mod ratelimit;
pub mod server;
#[cfg(target_os = "linux")]
mod udp_batch;
pub mod wire;

pub use server::DnsServer;
