//! Handler: transparent connections, from programs that ignore `HTTP_PROXY`. The
//! name comes from what the client asks for, the sandbox from the client's address,
//! and the gateway resolves and vets the name itself: the address the client dialled
//! is never used, only (when the connection was redirected) its port.
//! - TLS ([`serve`]): the ClientHello's SNI gets the same decision as a CONNECT to that
//!   name; the bytes read are replayed upstream and the rest relayed, zero-copy.
//! - Plain HTTP ([`http_request`], each request of a connection hyper serves): the
//!   request's `Host` is decided and the request forwarded as an absolute-form request
//!   on the proxy port would be (`forward`), so a second request on a kept connection
//!   is decided and logged on its own.

pub mod host;
pub mod sni;

use std::net::SocketAddr;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::access_log::{AccessRecord, Kind};
use crate::addr::{self, Host, Target};
use crate::config::TransparentConfig;
use crate::door::registry::ENDED_HINT;
use crate::door::respond;
use crate::door::{self, ConnInfo, Door, Entry, ProxyBody, Refusal};
use crate::policy::{DenyReason, Subject};
use crate::relay;
use crate::replayed::Replayed;

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// TLS: the ClientHello's SNI.
    Https,
    /// Plain HTTP: each request's `Host`.
    Http,
}

/// Why the name could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Timeout,
    Closed,
    TooLarge,
    Io(String),
    Malformed(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Timeout => f.write_str("the client sent no complete ClientHello in time"),
            ReadError::Closed => f.write_str("the client closed the connection before naming a host"),
            ReadError::TooLarge => f.write_str("the ClientHello is larger than the gateway reads"),
            ReadError::Io(e) => write!(f, "reading from the client failed: {e}"),
            ReadError::Malformed(e) => f.write_str(e),
        }
    }
}

/// Reads what the client sent next onto `buf`, by `deadline`; the client closing
/// first is an error (it has not named a host yet).
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, deadline: tokio::time::Instant) -> Result<(), ReadError> {
    use tokio::io::AsyncReadExt;
    match tokio::time::timeout_at(deadline, stream.read_buf(buf)).await {
        Err(_) => Err(ReadError::Timeout),
        Ok(Err(e)) => Err(ReadError::Io(e.to_string())),
        Ok(Ok(0)) => Err(ReadError::Closed),
        Ok(Ok(_)) => Ok(()),
    }
}

/// Serves one TLS transparent connection to its end. With `inspector`, a connection
/// to a host the sandbox's policy inspects is handed to it (the ClientHello read is
/// replayed to the TLS acceptor), as a CONNECT to that host would be.
pub async fn serve(
    mut stream: TcpStream,
    conn: ConnInfo,
    door: &Door,
    cfg: &TransparentConfig,
    inspector: Option<std::sync::Arc<dyn door::Inspector>>,
) {
    let state = door.store.snapshot();
    let mut rec = AccessRecord::with_vpce(
        Kind::Transparent,
        "TLS",
        String::new(),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    let proxy = &door.config.proxy;
    let port = dialled_port(&stream, cfg.https_port);
    let (name, early) = match sni::read(&mut stream, proxy.header_read_timeout).await {
        Ok((Some(name), bytes)) => (name, bytes),
        Ok((None, _)) => {
            // A hello without a name (or with an IP literal) is readable: it names nothing usable.
            let hint = "the ClientHello names no host (SNI): transparent mode needs the name the client asks for";
            let refusal = Refusal::new(DenyReason::BadRequest, hint);
            return refuse_with(&mut stream, &mut rec, refusal, Some(sni::UNRECOGNIZED_NAME)).await;
        }
        Err(e) => return refuse(&mut stream, &mut rec, read_refusal(&e)).await,
    };
    let target = match addr::parse_authority(&format!("{name}:{port}"), None) {
        Ok(t @ Target { host: Host::Name(_), .. }) => t,
        Ok(_) => {
            rec.target = crate::access_log::raw_target(&name).into();
            let hint = "the client named an IP address, not a host: transparent mode decides host names";
            return refuse(&mut stream, &mut rec, Refusal::new(DenyReason::BadRequest, hint)).await;
        }
        Err(e) => {
            rec.target = crate::access_log::raw_target(&name).into();
            let hint = format!("the client named an invalid host: {e}");
            return refuse(&mut stream, &mut rec, Refusal::new(DenyReason::BadRequest, hint)).await;
        }
    };
    rec.target = crate::access_log::Text::written(|t| target.write_to(t));

    let identity = match door::identify_by_address(&state, &conn, cfg.sandbox.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            let refusal = Refusal::new(e.reason(), e.to_string());
            return refuse(&mut stream, &mut rec, refusal).await;
        }
    };
    let authorized = match door::authorize_as(door, &state, &mut rec, &conn, identity, Subject::Host(target.clone())) {
        Ok(a) => a,
        Err(refusal) => return refuse(&mut stream, &mut rec, refusal).await,
    };
    if let Some(inspector) = inspector.filter(|i| i.inspects(&authorized.identity.policy, &target)) {
        rec.status = 200;
        let _active = crate::metrics::ActiveGuard::tunnel();
        let cancel = authorized.hold.registration().token().clone();
        // The connection goes on counting for its sandbox while it is inspected, and so
        // does a WebSocket inside it, which outlives this task ([`ConnInfo::place`]).
        let inner = ConnInfo { identity: Some(authorized.identity), ..conn };
        let io: Box<dyn door::Io> = Box::new(Replayed::new(early, stream));
        inspector.serve(io, door::Inspected { target, conn: inner, cancel }).await;
        rec.emit();
        drop(authorized.hold);
        return;
    }
    let why = "intercept.never (or no [intercept]) keeps it a tunnel";
    let hold = match authorized.opaque_refusal(why) {
        Some(refusal) => return refuse(&mut stream, &mut rec, refusal).await,
        None => authorized.hold,
    };
    let (mut upstream, upstream_addr) =
        match hold.registration().unless_ended(door.resolver.dial_for_relay(&target)).await {
            Some(Ok(ok)) => ok,
            Some(Err(e)) => {
                let refusal = Refusal::new(e.reason(), e.client_hint());
                return refuse(&mut stream, &mut rec, refusal).await;
            }
            None => {
                let refusal = Refusal::new(DenyReason::Revoked, ENDED_HINT);
                return refuse(&mut stream, &mut rec, refusal).await;
            }
        };
    rec.upstream_addr = Some(upstream_addr);
    rec.status = 200;
    if upstream.write_all(&early).await.is_err() {
        rec.emit();
        return;
    }
    let _active = crate::metrics::ActiveGuard::tunnel();
    let cancel = hold.registration().token().clone();
    let meter = hold.meter().map(|m| &**m);
    let (idle, keepalive) = (proxy.tunnel_idle_timeout, door.resolver.keepalive());
    let out = relay::relay_tcp(stream, upstream, early.len() as u64, idle, keepalive, &cancel, meter).await;
    rec.bytes_up = out.up;
    rec.bytes_down = out.down;
    crate::door::record::budget_ended(&mut rec, out.end, meter);
    rec.emit();
}

fn read_refusal(e: &ReadError) -> Refusal {
    let reason = match e {
        ReadError::TooLarge => DenyReason::RequestTooLarge,
        _ => DenyReason::BadRequest,
    };
    Refusal::new(reason, e.to_string())
}

/// Records a refusal and tells the TLS client with an alert (the reason is in the
/// access log).
async fn refuse(stream: &mut TcpStream, rec: &mut AccessRecord, refusal: Refusal) {
    refuse_with(stream, rec, refusal, None).await
}

/// [`refuse`] with `alert` instead of the one the reason implies.
async fn refuse_with(stream: &mut TcpStream, rec: &mut AccessRecord, refusal: Refusal, alert: Option<u8>) {
    let Refusal { reason, rule, budget, .. } = refusal;
    // Refused before a name was read: logged under the address the client dialled.
    let unnamed = rec.target.is_empty();
    if let Some(dialled) = redirected(stream).filter(|_| unnamed) {
        rec.target = crate::access_log::Text::display(&dialled);
    }
    rec.budget = budget.map(|(name, _)| name);
    // No proxy authentication exists here: an unidentified client is forbidden.
    let status = match respond::status_for(reason) {
        http::StatusCode::PROXY_AUTHENTICATION_REQUIRED => http::StatusCode::FORBIDDEN,
        s => s,
    };
    let description = alert.unwrap_or(match reason {
        DenyReason::BadRequest if unnamed => sni::DECODE_ERROR,
        DenyReason::BadRequest | DenyReason::RequestTooLarge => sni::UNRECOGNIZED_NAME,
        DenyReason::ResolveFailed
        | DenyReason::UpstreamUnreachable
        | DenyReason::UpstreamTimeout
        | DenyReason::UpstreamInvalid => sni::INTERNAL_ERROR,
        _ => sni::ACCESS_DENIED,
    });
    // Best effort: the client may be gone.
    let alert = sni::alert(description);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.write_all(&alert)).await;
    let _ = stream.shutdown().await;
    door::record::record_refusal(rec, reason, rule, status.as_u16());
}

/// The port the client dialled: the original destination's, when a redirect
/// (nftables, iptables) changed it; else the listener's configured one.
pub fn dialled_port(stream: &TcpStream, configured: u16) -> u16 {
    redirected(stream).map_or(configured, |d| d.port())
}

/// One request on the plain-HTTP listener, from the sandbox at the client's address
/// (or `sidecar`'s, `[transparent] sandbox`), made an absolute-form request for the dispatcher to
/// forward as the proxy port's are (logged as `transparent`): its `Host`, at the port
/// the client dialled, is its target, and the connection's facts carry the sandbox
/// as their identity. The request line may name no other host ([`host::named`]);
/// `CONNECT` belongs on the proxy port. `Err`: the refusal, its body drained.
pub async fn http_request(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    sidecar: Option<&str>,
    port: u16,
) -> Result<(Request<Incoming>, ConnInfo), Response<ProxyBody>> {
    let state = door.store.snapshot();
    let idle = door.config.proxy.tunnel_idle_timeout;
    let mut rec = AccessRecord::with_vpce(
        Kind::Transparent,
        req.method().as_str(),
        String::new(),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    let target = match host::named(req.method(), req.uri(), req.headers(), port) {
        Ok(t) => t,
        Err((raw, hint)) => {
            rec.target = crate::access_log::raw_target(&raw).into();
            let resp = door::refuse(&mut rec, Refusal::new(DenyReason::BadRequest, hint), Entry::Identified);
            return Err(crate::door::bodies::refuse_request(req, idle, resp).await);
        }
    };
    rec.target = crate::access_log::Text::written(|t| target.write_to(t));
    let identity = match door::identify_by_address(&state, conn, sidecar) {
        Ok(i) => i,
        Err(e) => {
            // No proxy authentication exists here: an unidentified client is forbidden.
            let resp = door::refuse(&mut rec, Refusal::new(e.reason(), e.to_string()), Entry::Identified);
            return Err(crate::door::bodies::refuse_request(req, idle, resp).await);
        }
    };
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let path = if path.starts_with('/') { path } else { "/" };
    match format!("http://{target}{path}").parse::<http::Uri>() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => {
            rec.target = crate::access_log::raw_target(&req.uri().to_string()).into();
            let hint = format!("the request target cannot be forwarded: {e}");
            let resp = door::refuse(&mut rec, Refusal::new(DenyReason::BadRequest, hint), Entry::Identified);
            return Err(crate::door::bodies::refuse_request(req, idle, resp).await);
        }
    }
    Ok((req, ConnInfo { identity: Some(identity), ..conn.clone() }))
}

/// The destination before a NAT redirect, when there was one: `SO_ORIGINAL_DST`
/// differs from the socket's own address only for a redirected connection.
fn redirected(stream: &TcpStream) -> Option<SocketAddr> {
    let local = stream.local_addr().ok()?;
    original_dst(stream).filter(|o| *o != local)
}

#[cfg(target_os = "linux")]
fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    match stream.local_addr().ok()? {
        SocketAddr::V4(_) => {
            let sa = getsockopt(stream, sockopt::OriginalDst).ok()?;
            let ip = std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(sa.sin_port))))
        }
        SocketAddr::V6(_) => {
            let sa = getsockopt(stream, sockopt::Ip6tOriginalDst).ok()?;
            let ip = std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(sa.sin6_port))))
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn original_dst(_stream: &TcpStream) -> Option<SocketAddr> {
    None
}
