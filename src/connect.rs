//! CONNECT: validate, identify, decide, resolve and vet, connect upstream, and only then
//! answer `200` and relay bytes.

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

fn reject(rec: &mut AccessRecord, reason: DenyReason, hint: &str) -> Response<ProxyBody> {
    door::refuse(rec, Refusal::new(reason, hint), Entry::Absolute)
}

pub async fn handle(
    req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    state: Arc<State>,
    inspector: Option<Arc<dyn door::Inspector>>,
) -> Response<ProxyBody> {
    let mut rec = AccessRecord::with_vpce(
        Kind::Connect,
        "CONNECT",
        String::new(),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    // Only a refused request that never parsed needs its raw target recorded.
    let uri = req.uri();
    let refuse = |rec: &mut AccessRecord, hint: &str| {
        rec.target = raw_target(&uri.to_string());
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
    let target = match addr::parse_authority(authority, None) {
        Ok(t) => t,
        Err(e) => return refuse(&mut rec, &format!("invalid CONNECT target: {e}")),
    };
    rec.target = target.to_string();

    // Registered before the dial: a reload while the gateway resolves and connects
    // (which the client can stretch) ends this tunnel like any open one.
    let presented = Presented::proxy(req.headers());
    let authorized = match door::authorize(door, &state, &mut rec, conn, presented, Subject::Host(target.clone())) {
        Ok(a) => a,
        Err(refusal) => return door::refuse(&mut rec, refusal, Entry::Absolute),
    };
    if let Some(inspector) = inspector.filter(|i| i.inspects(&authorized.identity.policy, &target)) {
        return inspect(req, conn, door, rec, authorized, target, inspector);
    }
    if let Some(refusal) = authorized.opaque_refusal("intercept.never (or no [intercept]) keeps it a tunnel") {
        return door::refuse(&mut rec, refusal, Entry::Absolute);
    }
    let hold = authorized.hold;
    let (upstream, upstream_addr) = match hold.registration().unless_ended(door.resolver.dial(&target)).await {
        Some(Ok(ok)) => ok,
        Some(Err(e)) => {
            let reason = e.reason();
            return reject(&mut rec, reason, &e.to_string());
        }
        None => return reject(&mut rec, DenyReason::AuthInvalid, ENDED_HINT),
    };
    rec.upstream_addr = Some(upstream_addr);
    rec.status = 200;

    let on_upgrade = hyper::upgrade::on(req);
    let idle = door.config.proxy.tunnel_idle_timeout;
    // Counted and registered from before the `200` is written, so a scrape or a reload
    // right after it sees the tunnel.
    let slot = conn.slot.clone();
    let active = crate::metrics::ActiveGuard::tunnel();
    door.tasks.spawn(async move {
        let (_slot, _active) = (slot, active);
        let cancel = hold.registration().token().clone();
        match on_upgrade.await {
            Ok(upgraded) => {
                let meter = hold.meter().map(|m| &**m);
                let out = relay(upgraded, upstream, idle, &cancel, meter).await;
                rec.bytes_up = out.up;
                rec.bytes_down = out.down;
                door::record::budget_ended(&mut rec, out.end, meter);
            }
            Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
        }
        rec.emit();
    });
    let mut resp = Response::new(respond::empty());
    *resp.status_mut() = StatusCode::OK;
    resp
}

/// Answers `200` and hands the connection to the inspector: no upstream is dialled
/// for the tunnel itself, each request inside is decided and sent on its own.
fn inspect(
    req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    mut rec: AccessRecord,
    authorized: door::Authorized,
    target: addr::Target,
    inspector: Arc<dyn door::Inspector>,
) -> Response<ProxyBody> {
    rec.status = 200;
    let on_upgrade = hyper::upgrade::on(req);
    let slot = conn.slot.clone();
    let active = crate::metrics::ActiveGuard::tunnel();
    let hold = authorized.hold;
    let inner = ConnInfo { identity: Some(authorized.identity), pending: None, ..conn.clone() };
    door.tasks.spawn(async move {
        let (_slot, _active) = (slot, active);
        match on_upgrade.await {
            Ok(upgraded) => {
                let cancel = hold.registration().token().clone();
                let io: Box<dyn door::Io> = Box::new(TokioIo::new(upgraded));
                inspector.serve(io, door::Inspected { target, conn: inner, cancel }).await;
            }
            Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
        }
        rec.emit();
        drop(hold);
    });
    let mut resp = Response::new(respond::empty());
    *resp.status_mut() = StatusCode::OK;
    resp
}

/// A plain-TCP client leg is taken back from hyper (dropping its buffers) and relayed
/// socket to socket; a TLS client leg is relayed through buffers.
async fn relay(
    upgraded: hyper::upgrade::Upgraded,
    mut upstream: TcpStream,
    idle: Duration,
    cancel: &CancellationToken,
    meter: Option<&crate::budget::Meter>,
) -> relay::Outcome {
    match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            // Bytes the client sent right behind the CONNECT head.
            let early = parts.read_buf.len() as u64;
            if early > 0 && upstream.write_all(&parts.read_buf).await.is_err() {
                return relay::Outcome { up: 0, down: 0, end: relay::End::Error };
            }
            drop(parts.read_buf);
            relay::relay_tcp(parts.io.into_inner(), upstream, early, idle, cancel, meter).await
        }
        // Boxed: the cold path's buffers and state stay out of every tunnel's task.
        Err(upgraded) => Box::pin(relay::relay(TokioIo::new(upgraded), upstream, idle, cancel, meter)).await,
    }
}
