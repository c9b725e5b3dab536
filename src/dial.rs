//! What the pooled upstream clients (git, API routes, TLS inspection) share: the
//! address a response came from, the dial error inside a client error, and the
//! failure of the request body being sent.

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

/// The upstream's answer, when the client error was that it could not be read as
/// HTTP (a head too large, not HTTP/1.1): told as `upstream_invalid`, not as an
/// upstream that could not be reached.
pub fn unreadable_answer(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<hyper::Error>().filter(|h| h.is_parse()) {
            return Some(if h.is_parse_too_large() {
                "the upstream answered with a head of more than 100 fields or about 400 KiB, more than the gateway \
                 takes"
                    .to_string()
            } else {
                format!("the upstream's answer is not HTTP the gateway can read: {h}")
            });
        }
        cur = e.source();
    }
    None
}

/// What failed in the request body being sent, if the client error was that: the
/// client's framing, a stalled upload, or the gateway refusing what it carried. Told
/// to the client as its own fault, never as the upstream's.
pub fn body_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_user) {
            return Some(e.source().map_or_else(|| e.to_string(), ToString::to_string));
        }
        cur = e.source();
    }
    None
}

/// True when the request body failed because the client's own connection ended under
/// it (closed before the body was complete, or reset): the client left, which is not a
/// fault of its framing.
pub fn client_left_mid_body(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let mut cur = Some(err);
    let mut in_body = false;
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            in_body |= h.is_user();
            if in_body && h.is_incomplete_message() {
                return true;
            }
        }
        if in_body
            && e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| matches!(io.kind(), BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof))
        {
            return true;
        }
        cur = e.source();
    }
    false
}
