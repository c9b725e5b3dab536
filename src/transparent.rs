//! Handler: transparent connections, from programs that ignore `HTTP_PROXY`. The
//! name comes from what the client asks for (the TLS ClientHello's SNI, or the HTTP
//! `Host`), the sandbox from the client's address; then the same decision as a
//! CONNECT to that name, and the gateway's own resolution and vetting: the address
//! the client dialled is never used, only (when the connection was redirected) its
//! port. The bytes read are replayed upstream and the rest relayed, zero-copy.

pub mod host;
pub mod sni;

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::access_log::{AccessRecord, Kind};
use crate::addr::{self, Host, Target};
use crate::config::TransparentConfig;
use crate::door::registry::ENDED_HINT;
use crate::door::respond::{self, Denial};
use crate::door::{self, ConnInfo, Door, Refusal};
use crate::policy::{DenyReason, Subject};
use crate::relay;
use crate::replayed::Replayed;

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// TLS: the ClientHello's SNI.
    Https,
    /// Plain HTTP: the first request's `Host`.
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
            ReadError::Timeout => f.write_str("the client sent no complete ClientHello or request head in time"),
            ReadError::Closed => f.write_str("the client closed the connection before naming a host"),
            ReadError::TooLarge => f.write_str("the ClientHello or request head is larger than the gateway reads"),
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

/// Serves one transparent connection to its end. With `inspector`, a TLS connection
/// to a host the sandbox's policy inspects is handed to it (the ClientHello read is
/// replayed to the TLS acceptor), as a CONNECT to that host would be.
pub async fn serve(
    mut stream: TcpStream,
    conn: ConnInfo,
    door: &Door,
    cfg: &TransparentConfig,
    listener: Listener,
    inspector: Option<std::sync::Arc<dyn door::Inspector>>,
) {
    let state = door.store.snapshot();
    let method = match listener {
        Listener::Https => "TLS",
        Listener::Http => "",
    };
    let mut rec = AccessRecord::with_vpce(
        Kind::Transparent,
        method,
        String::new(),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    let proxy = &door.config.proxy;
    // The port the client dialled, when a redirect (nftables, iptables) changed it.
    let port = redirected(&stream).map_or(
        match listener {
            Listener::Https => cfg.https_port,
            Listener::Http => cfg.http_port,
        },
        |d| d.port(),
    );

    let (name, early) = match listener {
        Listener::Https => match sni::read(&mut stream, proxy.header_read_timeout).await {
            Ok((Some(name), bytes)) => (name, bytes),
            Ok((None, _)) => {
                let hint = "the ClientHello names no host (SNI): transparent mode needs the name the client asks for";
                return refuse(&mut stream, &mut rec, listener, Refusal::new(DenyReason::BadRequest, hint)).await;
            }
            Err(e) => return refuse(&mut stream, &mut rec, listener, read_refusal(&e)).await,
        },
        Listener::Http => {
            match host::read(&mut stream, proxy.header_read_timeout, proxy.max_header_bytes, proxy.max_headers).await {
                Ok((method, host, bytes)) => {
                    rec.method = method.into();
                    // The port is the one the client dialled; a port in `Host` is its claim.
                    let name = match addr::parse_authority(&host, Some(port)) {
                        Ok(t) => t.host.to_string(),
                        Err(_) => host,
                    };
                    (name, bytes)
                }
                Err(e) => return refuse(&mut stream, &mut rec, listener, read_refusal(&e)).await,
            }
        }
    };
    let target = match addr::parse_authority(&format!("{name}:{port}"), None) {
        Ok(t @ Target { host: Host::Name(_), .. }) => t,
        Ok(_) => {
            rec.target = crate::access_log::raw_target(&name).into();
            let hint = "the client named an IP address, not a host: transparent mode decides host names";
            return refuse(&mut stream, &mut rec, listener, Refusal::new(DenyReason::BadRequest, hint)).await;
        }
        Err(e) => {
            rec.target = crate::access_log::raw_target(&name).into();
            let hint = format!("the client named an invalid host: {e}");
            return refuse(&mut stream, &mut rec, listener, Refusal::new(DenyReason::BadRequest, hint)).await;
        }
    };
    rec.target = crate::access_log::Text::display(&target);

    let identity = match door::identify_by_address(&state, &conn, cfg.sandbox.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            let refusal = Refusal::new(e.reason(), e.to_string());
            return refuse(&mut stream, &mut rec, listener, refusal).await;
        }
    };
    let authorized = match door::authorize_as(door, &state, &mut rec, &conn, identity, Subject::Host(target.clone())) {
        Ok(a) => a,
        Err(refusal) => return refuse(&mut stream, &mut rec, listener, refusal).await,
    };
    if listener == Listener::Https
        && let Some(inspector) = inspector.filter(|i| i.inspects(&authorized.identity.policy, &target))
    {
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
    let why = match listener {
        Listener::Https => "intercept.never (or no [intercept]) keeps it a tunnel",
        Listener::Http => "the plain-HTTP transparent listener does not inspect",
    };
    let hold = match authorized.opaque_refusal(why) {
        Some(refusal) => return refuse(&mut stream, &mut rec, listener, refusal).await,
        None => authorized.hold,
    };
    let (mut upstream, upstream_addr) =
        match hold.registration().unless_ended(door.resolver.dial_for_relay(&target)).await {
            Some(Ok(ok)) => ok,
            Some(Err(e)) => {
                let refusal = Refusal::new(e.reason(), e.to_string());
                return refuse(&mut stream, &mut rec, listener, refusal).await;
            }
            None => {
                let refusal = Refusal::new(DenyReason::AuthInvalid, ENDED_HINT);
                return refuse(&mut stream, &mut rec, listener, refusal).await;
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

/// Records a refusal and tells the client in its own protocol: a TLS alert (the
/// reason is in the access log), or an HTTP denial like the proxy's.
async fn refuse(stream: &mut TcpStream, rec: &mut AccessRecord, listener: Listener, refusal: Refusal) {
    let Refusal { reason, hint, rule, status: _, budget } = refusal;
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
    let bytes = match listener {
        Listener::Https => {
            let description = match reason {
                DenyReason::BadRequest if unnamed => sni::DECODE_ERROR,
                DenyReason::BadRequest | DenyReason::RequestTooLarge => sni::UNRECOGNIZED_NAME,
                DenyReason::ResolveFailed | DenyReason::UpstreamUnreachable | DenyReason::UpstreamTimeout => {
                    sni::INTERNAL_ERROR
                }
                _ => sni::ACCESS_DENIED,
            };
            sni::alert(description).to_vec()
        }
        Listener::Http => {
            let denial = Denial {
                target: Some(&*rec.target),
                sandbox: rec.sandbox.as_deref(),
                policy: rec.policy.as_deref(),
                rule: rule.as_deref(),
                hint: hint.clone(),
            };
            http_denial(status, reason, &respond::body_json(reason, &denial), hint.as_deref())
        }
    };
    // Best effort: the client may be gone.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.write_all(&bytes)).await;
    let _ = stream.shutdown().await;
    door::record::record_refusal(rec, reason, rule, status.as_u16());
}

/// An HTTP/1.1 denial with the proxy's headers, closing the connection.
fn http_denial(status: http::StatusCode, reason: DenyReason, body: &str, hint: Option<&str>) -> Vec<u8> {
    let explanation = respond::explain(reason, hint);
    let canonical = status.canonical_reason().unwrap_or("Refused");
    let proxy_status = respond::proxy_status(reason, &explanation);
    format!(
        "HTTP/1.1 {} {canonical} ({explanation})\r\ncontent-type: application/json\r\n{}: {}\r\n{}: {proxy_status}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        respond::DENY_REASON_HEADER,
        reason.code(),
        respond::PROXY_STATUS,
        body.len(),
    )
    .into_bytes()
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
