//! CONNECT: validate, identify, decide, resolve and vet, connect upstream, and only then
//! answer `200` and relay bytes.

pub mod head;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::addr;
use crate::door::registry::ENDED_HINT;
use crate::door::{self, ConnInfo, Door, Entry, Presented, ProxyBody, Refusal, respond};
use crate::policy::{DenyReason, Subject};
use crate::relay;
use crate::reload::State;
use crate::replayed::Replayed;

fn reject(rec: &mut AccessRecord, reason: DenyReason, hint: &str) -> Response<ProxyBody> {
    door::refuse(rec, Refusal::new(reason, hint), Entry::Absolute)
}

/// What happens next to an authorized CONNECT, once its `200` is answered.
enum Next {
    /// Relayed to the upstream already dialled.
    Tunnel { hold: door::registry::Hold, upstream: TcpStream },
    /// Handed to the inspector: no upstream is dialled for the tunnel itself, each
    /// request inside is decided and sent on its own. Boxed: a tunnel's task holds
    /// this value for its life, and the tunnel variant is the common one.
    Inspect(Box<Inspection>),
}

struct Inspection {
    hold: door::registry::Hold,
    inner: ConnInfo,
    target: addr::Target,
    inspector: Arc<dyn door::Inspector>,
}

/// The client side of a tunnel: hyper's upgrade, or the socket itself when the head
/// was read by the fast path ([`head`]), which answers `200` itself, with the bytes the
/// client sent behind the head.
enum Client {
    Upgrade(hyper::upgrade::OnUpgrade),
    Tcp(TcpStream, Vec<u8>),
}

/// The client side once the tunnel is open: `None` when the upgrade failed or the
/// `200` could not be written.
enum Open {
    Upgraded(hyper::upgrade::Upgraded),
    Tcp(TcpStream, Vec<u8>),
}

impl Client {
    async fn open(self) -> Option<Open> {
        match self {
            Client::Upgrade(on_upgrade) => match on_upgrade.await {
                Ok(upgraded) => Some(Open::Upgraded(upgraded)),
                Err(e) => {
                    tracing::debug!(error = %e, "CONNECT upgrade failed");
                    None
                }
            },
            Client::Tcp(mut stream, early) => {
                stream.write_all(ESTABLISHED).await.ok().map(|()| Open::Tcp(stream, early))
            }
        }
    }
}

/// The record every CONNECT starts with.
fn record(conn: &ConnInfo, state: &State) -> AccessRecord {
    AccessRecord::with_vpce(Kind::Connect, "CONNECT", String::new(), conn.peer, state.generation, conn.vpce.clone())
}

pub async fn handle(
    req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    state: Arc<State>,
    inspector: Option<Arc<dyn door::Inspector>>,
) -> Response<ProxyBody> {
    let mut rec = record(conn, &state);
    // Only a refused request that never parsed needs its raw target recorded.
    let uri = req.uri();
    let refuse = |rec: &mut AccessRecord, hint: &str| {
        rec.target = raw_target(&uri.to_string()).into();
        reject(rec, DenyReason::BadRequest, hint)
    };

    // HTTP/1.0 CONNECT (Python's http.client, so pip, requests and urllib, with or
    // without Host) is accepted like 1.1: the target is in the request line either way.
    if req.version() != Version::HTTP_11 && req.version() != Version::HTTP_10 {
        return refuse(&mut rec, "CONNECT requires HTTP/1.0 or HTTP/1.1");
    }
    let authority = match (uri.scheme(), uri.path_and_query(), uri.authority()) {
        (None, None, Some(a)) => a.as_str(),
        _ => return refuse(&mut rec, "CONNECT target must be host:port"),
    };
    // A CONNECT has no content (RFC 9110, 9.3.6): what follows its head is the tunnel's.
    // A `Content-Length` or `Transfer-Encoding` would have hyper take the client's first
    // tunnel bytes as a body and drop them.
    if !http_body::Body::is_end_stream(req.body()) {
        return refuse(
            &mut rec,
            "a CONNECT request has no content: send it without Content-Length or Transfer-Encoding",
        );
    }
    let next = match admit(&mut rec, authority, Presented::proxy(req.headers()), conn, door, &state, inspector).await {
        Ok(next) => next,
        Err(resp) => return resp,
    };
    start(next, Client::Upgrade(hyper::upgrade::on(req)), rec, conn, door);
    let mut resp = Response::new(respond::empty());
    *resp.status_mut() = StatusCode::OK;
    resp
}

/// A connection's first request, read by the fast path: answered here, on the socket.
/// `early` is what the client sent behind the head (tunnel bytes, or its next
/// request).
pub async fn handle_first(
    head: &head::ConnectHead<'_>,
    early: &[u8],
    mut stream: TcpStream,
    conn: &ConnInfo,
    door: &Door,
    state: Arc<State>,
    inspector: Option<Arc<dyn door::Inspector>>,
) -> First {
    let mut rec = record(conn, &state);
    let presented = Presented::proxy_value(head.proxy_authorization);
    match admit(&mut rec, head.target, presented, conn, door, &state, inspector).await {
        Ok(next) => First::Tunnel(tunnel(next, Client::Tcp(stream, early.to_vec()), rec, conn, door)),
        Err(mut resp) => {
            if head.close {
                resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            let bytes = respond::serialize(resp).await;
            let sent = tokio::time::timeout(Duration::from_secs(10), stream.write_all(&bytes)).await;
            match sent {
                Ok(Ok(())) if !head.close => First::Serve(Replayed::new(early.to_vec(), stream)),
                _ => {
                    let _ = stream.shutdown().await;
                    First::Closed
                }
            }
        }
    }
}

/// Decides a CONNECT to `authority` and dials it (unless it is to be inspected): what
/// happens next, or the refusal to answer.
async fn admit(
    rec: &mut AccessRecord,
    authority: &str,
    presented: Presented<'_>,
    conn: &ConnInfo,
    door: &Door,
    state: &State,
    inspector: Option<Arc<dyn door::Inspector>>,
) -> Result<Next, Response<ProxyBody>> {
    let target = match addr::parse_authority(authority, None) {
        Ok(t) => t,
        Err(e) => {
            rec.target = raw_target(authority).into();
            return Err(reject(rec, DenyReason::BadRequest, &format!("invalid CONNECT target: {e}")));
        }
    };
    rec.target = crate::access_log::Text::written(|t| target.write_to(t));

    // Registered before the dial: a reload while the gateway resolves and connects
    // (which the client can stretch) ends this tunnel like any open one.
    let authorized = match door::authorize(door, state, rec, conn, presented, Subject::Host(target.clone())) {
        Ok(a) => a,
        Err(refusal) => return Err(door::refuse(rec, refusal, Entry::Absolute)),
    };
    if let Some(inspector) = inspector.filter(|i| i.inspects(&authorized.identity.policy, &target)) {
        rec.status = 200;
        // The inner connection keeps the tunnel's share and place: a WebSocket inside it
        // outlives the inspected connection's own task and must go on counting.
        let inner = ConnInfo { identity: Some(authorized.identity), ..conn.clone() };
        return Ok(Next::Inspect(Box::new(Inspection { hold: authorized.hold, inner, target, inspector })));
    }
    if let Some(refusal) = authorized.opaque_refusal("intercept.never (or no [intercept]) keeps it a tunnel") {
        return Err(door::refuse(rec, refusal, Entry::Absolute));
    }
    let hold = authorized.hold;
    let (upstream, upstream_addr) = match hold.registration().unless_ended(door.resolver.dial_for_relay(&target)).await
    {
        Some(Ok(ok)) => ok,
        Some(Err(e)) => {
            let reason = e.reason();
            return Err(reject(rec, reason, &e.client_hint()));
        }
        None => return Err(reject(rec, DenyReason::Revoked, ENDED_HINT)),
    };
    rec.upstream_addr = Some(upstream_addr);
    rec.status = 200;
    Ok(Next::Tunnel { hold, upstream })
}

/// The answer of an authorized CONNECT on the fast path.
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";

/// A tunnel (or an inspection) to run, boxed: its state is allocated only once the
/// connection is a tunnel, and freed with it.
pub type Tunnel = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What became of a connection's first request on the fast path.
pub enum First {
    /// Authorized: the tunnel to run, in the connection's own task (no second task is
    /// spawned for it).
    Tunnel(Tunnel),
    /// Not a CONNECT the fast path answers, or a refusal the client may follow with
    /// another request: hyper serves the connection from here.
    Serve(Replayed),
    /// Closed.
    Closed,
}

/// Runs [`tunnel`] in a task of its own: for a CONNECT that hyper served (not a
/// connection's first request), whose connection task goes on driving hyper.
fn start(next: Next, client: Client, rec: AccessRecord, conn: &ConnInfo, door: &Door) {
    door.tasks.spawn(tunnel(next, client, rec, conn, door));
}

/// The tunnel (or the inspection). Counted and registered from before the `200` is
/// written, so a scrape or a reload right after it sees it.
fn tunnel(next: Next, client: Client, mut rec: AccessRecord, conn: &ConnInfo, door: &Door) -> Tunnel {
    let place = conn.place();
    let active = crate::metrics::ActiveGuard::tunnel();
    let (idle, keepalive) = (door.config.proxy.tunnel_idle_timeout, door.resolver.keepalive());
    Box::pin(async move {
        let (_place, _active) = (place, active);
        match next {
            Next::Tunnel { hold, mut upstream } => {
                let cancel = hold.registration().token().clone();
                let meter = hold.meter().map(|m| &**m);
                let failed = relay::Outcome { up: 0, down: 0, end: relay::End::Error };
                let out = match client.open().await {
                    // Boxed: the fast path's tunnels (most of them) would otherwise all
                    // carry room for this path's larger state, idle or not.
                    Some(Open::Upgraded(upgraded)) => {
                        Box::pin(relay(upgraded, upstream, idle, keepalive, &cancel, meter)).await
                    }
                    Some(Open::Tcp(stream, early)) => {
                        if !early.is_empty() && upstream.write_all(&early).await.is_err() {
                            failed
                        } else {
                            let sent = early.len() as u64;
                            drop(early);
                            relay::relay_tcp(stream, upstream, sent, idle, keepalive, &cancel, meter).await
                        }
                    }
                    None => failed,
                };
                rec.bytes_up = out.up;
                rec.bytes_down = out.down;
                door::record::budget_ended(&mut rec, out.end, meter);
            }
            Next::Inspect(inspection) => {
                let Inspection { hold, inner, target, inspector } = *inspection;
                let io: Option<Box<dyn door::Io>> = match client.open().await {
                    Some(Open::Upgraded(upgraded)) => Some(Box::new(TokioIo::new(upgraded))),
                    Some(Open::Tcp(stream, early)) => Some(Box::new(Replayed::new(early, stream))),
                    None => None,
                };
                if let Some(io) = io {
                    let cancel = hold.registration().token().clone();
                    inspector.serve(io, door::Inspected { target, conn: inner, cancel }).await;
                }
                drop(hold);
            }
        }
        rec.emit();
    })
}

/// A plain-TCP client leg is taken back from hyper (dropping its buffers) and relayed
/// socket to socket; a TLS client leg is relayed through buffers.
async fn relay(
    upgraded: hyper::upgrade::Upgraded,
    mut upstream: TcpStream,
    idle: Duration,
    keepalive: Duration,
    cancel: &CancellationToken,
    meter: Option<&crate::budget::Meter>,
) -> relay::Outcome {
    match upgraded.downcast::<door::watch::Served<Replayed>>() {
        Ok(parts) => {
            // Bytes the client sent right behind the CONNECT head: what hyper read, then
            // what it left of the fast path's first read (nothing, in practice).
            let (client, unread) = parts.io.into_inner().into_inner().into_parts();
            let early = (parts.read_buf.len() + unread.len()) as u64;
            for bytes in [&parts.read_buf[..], &unread[..]] {
                if !bytes.is_empty() && upstream.write_all(bytes).await.is_err() {
                    return relay::Outcome { up: 0, down: 0, end: relay::End::Error };
                }
            }
            drop((parts.read_buf, unread));
            relay::relay_tcp(client, upstream, early, idle, keepalive, cancel, meter).await
        }
        // Boxed: the cold path's buffers and state stay out of every tunnel's task.
        Err(upgraded) => {
            crate::resolve::set_keepalive(&upstream, keepalive);
            Box::pin(relay::relay(TokioIo::new(upgraded), upstream, idle, cancel, meter)).await
        }
    }
}
