//! Absolute-form HTTP forwarding (`GET http://host/path`): the same decision path as
//! CONNECT, then the request is re-issued upstream through a pooled client whose
//! connector dials only vetted addresses. Bodies stream both ways; hop-by-hop headers
//! and `Proxy-Authorization` are stripped; `Host` comes from the URI. A `101` upgrade
//! (WebSocket) is relayed as a tunnel.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;

use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::addr::{self, Target};
use crate::budget::Dir;
use crate::dial::{self, UpstreamAddr, VettingConnector};
use crate::door::bodies::{Counting, LoggedBody, charge_head, request_line_len};
use crate::door::headers::{is_upgrade, strip_hop_by_hop};
use crate::door::registry::{ENDED_HINT, Hold, Revocable};
use crate::door::{self, ConnInfo, Door, Entry, Presented, ProxyBody, Refusal};
use crate::policy::{DenyReason, Subject};
use crate::reload::State;

/// What a forwarded request body is, upstream: counted, and cut by a sweep.
pub type UpBody = Counting<Revocable<Incoming>>;
pub type UpstreamClient = Client<VettingConnector, UpBody>;

/// The forwarding handler's own state: one pooled client per proxy thread, so a
/// pooled upstream connection is driven by the thread whose requests use it.
pub struct Forwarder {
    pub clients: Vec<UpstreamClient>,
}

impl Forwarder {
    /// The calling proxy thread's client (`thread`: its index, when on one).
    pub fn client(&self, thread: Option<usize>) -> &UpstreamClient {
        &self.clients[thread.unwrap_or(0) % self.clients.len()]
    }
}

pub async fn handle(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    client: &UpstreamClient,
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
    let reject = |rec: &mut AccessRecord, reason: DenyReason, hint: &str| {
        door::refuse(rec, Refusal::new(reason, hint), Entry::Absolute)
    };
    // Only a refused request that never parsed needs its raw target recorded.
    let refuse = |rec: &mut AccessRecord, hint: &str| {
        rec.target = raw_target(&req.uri().to_string()).into();
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
    rec.target = crate::access_log::Text::display(&target);

    let identity = match door::identified(door, &state, conn, Presented::proxy(req.headers())) {
        Ok(i) => i,
        Err(refusal) => return door::refuse(&mut rec, refusal, Entry::Absolute),
    };
    // A host the policy inspects is decided request by request, in plain HTTP too.
    let subject = if identity.policy.inspects(&target).is_some() {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        let headers = crate::door::headers::rule_headers(req.headers());
        Subject::Request { target: target.clone(), method: req.method().as_str().to_string(), path, headers }
    } else {
        Subject::Host(target.clone())
    };
    let hold = match door::authorize_as(door, &state, &mut rec, conn, identity, subject) {
        Ok(a) => Arc::new(a.hold),
        Err(refusal) => return door::refuse(&mut rec, refusal, Entry::Absolute),
    };
    // Placeholder secrets are replaced only inside inspected TLS: over plain HTTP one is
    // refused, never sent (and never swapped for a value that would travel in clear).
    if !door.config.secrets.is_empty() {
        let uri = req.uri().to_string();
        let carried = std::iter::once(uri.as_bytes())
            .chain(req.headers().values().map(|v| v.as_bytes()))
            .find_map(|b| crate::config::SecretConfig::find_in(&door.config.secrets, b));
        if let Some(s) = carried {
            tracing::warn!(target = %rec.target, secret = %s.name, "a secret placeholder was sent over plain HTTP");
            let hint = format!(
                "{} is only replaced in HTTPS requests to its hosts; the request was not sent",
                s.placeholder()
            );
            return reject(&mut rec, DenyReason::SecretNotAllowed, &hint);
        }
    }
    let line = charge_head(&hold, Dir::Up, request_line_len(&req), req.headers());
    if let Err(refusal) = line {
        return door::refuse(&mut rec, refusal, Entry::Absolute);
    }

    let wants_upgrade = is_upgrade(req.headers());
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));
    let up_req = match upstream_request(req, &target, wants_upgrade, hold.clone()) {
        Ok((r, counter)) => (r, counter),
        Err(msg) => return reject(&mut rec, DenyReason::BadRequest, msg),
    };
    let (mut up_req, bytes_up) = up_req;
    // A peer's connection is never pooled: a reload may move the peer, and a pooled
    // connection would still lead to its old address (another sandbox's, perhaps).
    if !wants_upgrade && crate::policy::peer_id(&target, &door.config.egress.peer_suffix).is_some() {
        up_req.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }

    let timeout = door.config.proxy.response_header_timeout;
    let sent = hold.registration().unless_ended(tokio::time::timeout(timeout, client.request(up_req))).await;
    let Some(sent) = sent else {
        return reject(&mut rec, DenyReason::AuthInvalid, ENDED_HINT);
    };
    let resp = match sent {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            let (reason, detail) = match dial::dial_error(&e) {
                Some(d) => (d.reason(), d.to_string()),
                None => (DenyReason::UpstreamUnreachable, format!("upstream request failed: {e}")),
            };
            return reject(&mut rec, reason, &detail);
        }
        Err(_) => {
            return reject(&mut rec, DenyReason::UpstreamTimeout, "no response headers in time");
        }
    };
    rec.upstream_addr = resp.extensions().get::<UpstreamAddr>().map(|a| a.0);
    rec.status = resp.status().as_u16();
    // The status line: `HTTP/1.1 200 OK\r\n` and a reason phrase.
    if let Err(refusal) = charge_head(&hold, Dir::Down, 32, resp.headers()) {
        return door::refuse(&mut rec, refusal, Entry::Absolute);
    }

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        return door::relay_upgraded(door, conn.place(), hold, rec, client_upgrade, resp);
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    let body = Revocable::new(body, hold.clone(), Dir::Down);
    let body = LoggedBody::new(body, bytes_up, rec, hold);
    Response::from_parts(parts, body.boxed_unsync())
}

/// Builds the upstream request: origin URI from the normalised target, hop-by-hop
/// headers and proxy credentials removed, `Host` set from the URI.
fn upstream_request(
    req: Request<Incoming>,
    target: &Target,
    upgrade: bool,
    hold: Arc<Hold>,
) -> Result<(Request<UpBody>, Arc<AtomicU64>), &'static str> {
    let (mut parts, body) = req.into_parts();
    // The authority is the normalised target's (never the client's userinfo); the
    // client's own is reused when it already reads the same.
    let text = crate::access_log::Text::display(target);
    let authority = match parts.uri.authority() {
        Some(a) if a.as_str() == text.as_str() => a.clone(),
        _ => Authority::try_from(text.as_str()).map_err(|_| "invalid host")?,
    };
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(authority);
    uri.path_and_query = Some(parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")));
    parts.uri = Uri::from_parts(uri).map_err(|_| "invalid request path")?;
    strip_hop_by_hop(&mut parts.headers, upgrade);
    let host = if target.port == 80 { text.strip_suffix(":80").unwrap_or(&text) } else { &text };
    let host = HeaderValue::from_str(host).map_err(|_| "invalid host")?;
    parts.headers.insert(header::HOST, host);
    let counter = Arc::new(AtomicU64::new(0));
    let body = Counting::new(Revocable::new(body, hold, Dir::Up), counter.clone());
    Ok((Request::from_parts(parts, body), counter))
}
