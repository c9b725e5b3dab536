//! What the pooled upstream clients (git, API routes, TLS inspection) share: the
//! address a response came from, and the dial error inside a client error.

use std::net::SocketAddr;

use crate::resolve::DialError;

/// The vetted address a forwarded response came from (response extension).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAddr(pub SocketAddr);

/// Finds the dial error inside a client error, if the failure was in connecting.
pub fn dial_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a DialError> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(d) = e.downcast_ref::<DialError>() {
            return Some(d);
        }
        cur = e.source();
    }
    None
}
