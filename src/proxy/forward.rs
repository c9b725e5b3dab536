//! Absolute-form HTTP forwarding (`GET http://host/path`): the same decision path as
//! CONNECT, then the request is re-issued upstream through a pooled client whose
//! connector dials only vetted addresses. Bodies stream both ways; hop-by-hop headers
//! and `Proxy-Authorization` are stripped; `Host` comes from the URI. A `101` upgrade
//! (WebSocket) is relayed as a tunnel.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::registry::{Held, Hold, Revocable};
use super::{ConnInfo, ProxyBody, Shared, reject, tunnel, upstream};
use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::addr::{self, Target};
use crate::policy::DenyReason;
use crate::reload::State;

pub async fn handle(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    shared: &Arc<Shared>,
    state: Arc<State>,
) -> Response<ProxyBody> {
    let mut rec = AccessRecord::with_vpce(
        Kind::Forward,
        req.method().as_str(),
        String::new(),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    // Only a refused request that never parsed needs its raw target recorded.
    let refuse = |rec: &mut AccessRecord, hint: &str| {
        rec.target = raw_target(&req.uri().to_string());
        reject(rec, DenyReason::BadRequest, hint)
    };

    match req.uri().scheme_str() {
        Some("http") => {}
        Some("https") => {
            return refuse(
                &mut rec,
                "https:// URLs go through CONNECT: configure this gateway as the proxy for https too",
            );
        }
        _ => return refuse(&mut rec, "only http:// URLs can be forwarded"),
    }
    let authority = req.uri().authority().map(|a| a.as_str()).unwrap_or_default();
    let target = match addr::parse_authority(authority, Some(80)) {
        Ok(t) => t,
        Err(e) => return refuse(&mut rec, &format!("invalid URL authority: {e}")),
    };
    rec.target = target.to_string();

    let super::Authorized { identity: sandbox, permit } =
        match super::authorize(&mut rec, &state, &req, conn, shared, &target) {
            Ok(a) => a,
            Err(resp) => return *resp,
        };
    let registration = shared.tunnels.register(&sandbox, Held::Host(target.clone()), shared.hard_stop.child_token());
    let hold = Hold::new(registration, permit);

    let wants_upgrade = is_upgrade(req.headers());
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));
    let up_req = match upstream_request(req, &target, wants_upgrade, hold.clone()) {
        Ok((r, counter)) => (r, counter),
        Err(msg) => return reject(&mut rec, DenyReason::BadRequest, msg),
    };
    let (up_req, bytes_up) = up_req;

    let timeout = shared.config.proxy.response_header_timeout;
    let sent = hold.registration().unless_ended(tokio::time::timeout(timeout, shared.client().request(up_req))).await;
    let Some(sent) = sent else {
        return reject(&mut rec, DenyReason::AuthInvalid, super::registry::ENDED_HINT);
    };
    let mut resp = match sent {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            let (reason, detail) = match upstream::dial_error(&e) {
                Some(d) => (d.reason(), d.to_string()),
                None => (DenyReason::UpstreamUnreachable, format!("upstream request failed: {e}")),
            };
            return reject(&mut rec, reason, &detail);
        }
        Err(_) => {
            return reject(&mut rec, DenyReason::UpstreamTimeout, "no response headers in time");
        }
    };
    rec.upstream_addr = resp.extensions().get::<upstream::UpstreamAddr>().map(|a| a.0);
    rec.status = resp.status().as_u16();

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let idle = shared.config.proxy.tunnel_idle_timeout;
        let slot = conn.slot.clone();
        // Counted from before the `101` is written, so a scrape after it sees it.
        let active = crate::metrics::ActiveGuard::tunnel();
        shared.tasks.spawn(async move {
            let (_slot, _active) = (slot, active);
            let cancel = hold.registration().token().clone();
            if let (Ok(c), Ok(u)) = (client_upgrade.await, upstream_upgrade.await) {
                let out = tunnel::relay(TokioIo::new(c), TokioIo::new(u), idle, &cancel).await;
                rec.bytes_up = out.up;
                rec.bytes_down = out.down;
            }
            rec.emit();
        });
        let (mut parts, _) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, true);
        return Response::from_parts(parts, super::respond::empty());
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    let body = Revocable::new(body, hold.clone());
    let body = super::logged_body::LoggedBody::new(body, bytes_up, rec, hold);
    Response::from_parts(parts, body.boxed_unsync())
}

/// Builds the upstream request: origin URI from the normalised target, hop-by-hop
/// headers and proxy credentials removed, `Host` set from the URI.
fn upstream_request(
    req: Request<Incoming>,
    target: &Target,
    upgrade: bool,
    hold: Arc<Hold>,
) -> Result<(Request<CountingBody<Incoming>>, Arc<AtomicU64>), &'static str> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("http://{target}{path}").parse().map_err(|_| "invalid request path")?;
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers, upgrade);
    let host = if target.port == 80 { target.host.to_string() } else { target.to_string() };
    let host = HeaderValue::from_str(&host).map_err(|_| "invalid host")?;
    parts.headers.insert(header::HOST, host);
    let counter = Arc::new(AtomicU64::new(0));
    let body = CountingBody { inner: Revocable::new(body, hold), count: counter.clone() };
    Ok((Request::from_parts(parts, body), counter))
}

/// Typed names: removing by a standard name hashes no string.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE) && connection_tokens(h).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(h: &HeaderMap) -> impl Iterator<Item = &str> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes hop-by-hop headers, including those named in `Connection`. For an upgrade,
/// `Upgrade` and `Connection: upgrade` are kept so the upstream sees the handshake.
pub fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    if h.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = connection_tokens(h)
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .filter(|n| !(keep_upgrade && n == header::UPGRADE))
            .collect();
        for n in named {
            h.remove(n);
        }
    }
    let upgrade = if keep_upgrade { h.get(header::UPGRADE).cloned() } else { None };
    for n in &HOP_BY_HOP {
        h.remove(n);
    }
    if let Some(u) = upgrade {
        h.insert(header::UPGRADE, u);
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// A request body that counts the bytes it yields, and ends with an error when its
/// request is ended by a sweep (it holds the request's registration and concurrency
/// slot, shared with the response body: an upload may outlive its response).
pub struct CountingBody<B> {
    inner: Revocable<B>,
    count: Arc<AtomicU64>,
}

impl<B> Body for CountingBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<super::BoxError>,
{
    type Data = Bytes;
    type Error = super::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, super::BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.count.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("proxy-authorization", "Basic abc"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("accept", "*/*"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn upgrade_headers_survive_for_websocket() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
    }
}
