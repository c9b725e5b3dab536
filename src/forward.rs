//! Absolute-form HTTP forwarding (`GET http://host/path`): the same decision path as
//! CONNECT, then the request is re-issued upstream over the client connection's own
//! upstream connection ([`Upstream`]), dialled to a vetted address. Bodies stream both
//! ways; hop-by-hop headers and `Proxy-Authorization` are stripped; `Host` comes from
//! the URI. A `101` upgrade (WebSocket) is relayed as a tunnel.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::addr::{self, Target};
use crate::budget::Dir;
use crate::door::bodies::{Counting, IdleBody, LoggedBody, Trailers, charge_head, request_line_len};
use crate::door::headers::{
    is_upgrade, is_websocket_upgrade, strip_client_request, strip_upstream_response, unjudged_framing,
};
use crate::door::method_field;
use crate::door::registry::{ENDED_HINT, Hold, Revocable};
use crate::door::watch::Stalling;
use crate::door::{self, ConnInfo, Door, Entry, Presented, ProxyBody, Refusal};
use crate::policy::{DenyReason, Subject};
use crate::reload::State;
use crate::resolve::DialError;

/// What a forwarded request body is, upstream: counted, cut by a sweep, and failed
/// after `proxy.tunnel_idle_timeout` without a byte; or none, when a request without a
/// body is sent again ([`retry_of`]); or, to an inspected host, a form watched for the
/// method it names ([`method_field`]).
pub type UpBody = Either<Sent<Incoming>, Either<Empty<Bytes>, Box<Sent<method_field::Watched<Incoming>>>>>;

/// A request body as sent on: counted, cut by a sweep, failed when idle.
type Sent<B> = Counting<Revocable<IdleBody<B>>>;

/// A form body's `_method` watch: the form, its judge, and where a refusal's reason goes.
type Watch = (method_field::Form, method_field::Judge, Arc<std::sync::OnceLock<String>>);

/// A client connection's upstream connection, which its forwarded requests to the same
/// host reuse. One per client connection, never shared between client connections:
/// what one sandbox's exchange leaves on a connection (a response framed differently
/// than the gateway read it) can never reach another's request, and a closed client
/// connection closes its upstream one instead of leaving it idle in a pool. A request
/// to another host, or from another sandbox, replaces it.
#[derive(Default)]
pub struct Upstream(Mutex<Option<Kept>>);

struct Kept {
    target: Target,
    sandbox: Arc<str>,
    addr: SocketAddr,
    send: SendRequest<UpBody>,
    /// When it was last kept (its last response's head arrived).
    kept_at: std::time::Instant,
}

/// A kept connection idle for this long may meet the origin's idle timeout as a
/// request goes out: a request sent on it is copied first, to be sent again. Origins
/// time idle connections out after seconds, so back-to-back requests pay no copy.
const IDLE_BEFORE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl Upstream {
    /// The kept connection, when it leads to `target`, was opened for `sandbox` and is
    /// still open.
    fn take(&self, target: &Target, sandbox: &str) -> Option<Kept> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        kept.filter(|k| k.target == *target && *k.sandbox == *sandbox && !k.send.is_closed())
    }

    fn keep(&self, kept: Kept) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(kept);
    }
}

/// Why an exchange got no response.
enum ExchangeError {
    Dial(DialError),
    Http(hyper::Error),
}

/// The connection a request goes out on: the kept one, or one just dialled.
enum Conn {
    Kept(Kept),
    New(SendRequest<UpBody>, SocketAddr),
}

/// `kept` once it is ready (the connection kept for this client connection, when it
/// leads to the target and was opened for the same sandbox), else a new connection.
/// Dialled before the request's body is taken, so that a dial that fails (refused,
/// unreachable, a name that does not resolve) leaves the body to be read and
/// discarded as any refusal's is: the client reads the `502` instead of failing to
/// write the rest of its upload.
async fn connection(
    kept: Option<Kept>,
    door: &Door,
    target: &Target,
    ended: Option<&CancellationToken>,
) -> Result<Conn, ExchangeError> {
    if let Some(mut kept) = kept
        && kept.send.ready().await.is_ok()
    {
        return Ok(Conn::Kept(kept));
    }
    // Boxed: the dial's state is large, and a request over a kept connection (the
    // common case) would otherwise carry and move it too.
    let (send, addr) = Box::pin(open(door, target, ended)).await?;
    Ok(Conn::New(send, addr))
}

/// Sends `req` to `target` over `conn` (once more over a new connection if a kept one
/// closed before the request was written). The response, and the address it came
/// from; with `keep`, the connection is kept for the client connection's next request
/// (it is ready again once this response's body is read).
#[allow(clippy::too_many_arguments, reason = "one exchange's facts, each used once")]
async fn exchange(
    upstream: &Upstream,
    door: &Door,
    target: &Target,
    sandbox: &Arc<str>,
    conn: Conn,
    mut req: Request<UpBody>,
    keep: bool,
    ended: Option<&CancellationToken>,
) -> Result<(Response<Incoming>, SocketAddr), ExchangeError> {
    let (mut send, addr) = match conn {
        Conn::New(send, addr) => (send, addr),
        Conn::Kept(mut kept) => {
            let again = if kept.kept_at.elapsed() >= IDLE_BEFORE_RETRY { retry_of(&req) } else { None };
            match kept.send.try_send_request(req).await {
                Ok(resp) => {
                    let addr = kept.addr;
                    if keep && resp.version() != http::Version::HTTP_10 {
                        kept.kept_at = std::time::Instant::now();
                        upstream.keep(kept);
                    }
                    return Ok((resp, addr));
                }
                Err(mut e) => match (e.take_message(), again) {
                    (Some(unsent), _) => req = unsent,
                    // The origin closed the kept connection as the request went out (its
                    // idle timeout, say): it answered nothing, so a request that is safe
                    // to repeat goes once more, over a new connection.
                    (None, Some(again)) if closed_unanswered(e.error()) => req = again,
                    (None, _) => return Err(ExchangeError::Http(e.into_error())),
                },
            }
            Box::pin(open(door, target, ended)).await?
        }
    };
    let resp = send.send_request(req).await.map_err(ExchangeError::Http)?;
    // An HTTP/1.0 upstream is not kept: hyper would speak HTTP/1.0 on it from then on,
    // where a chunked request body has no framing (and went missing).
    if keep && resp.version() != http::Version::HTTP_10 {
        upstream.keep(Kept {
            target: target.clone(),
            sandbox: sandbox.clone(),
            addr,
            send,
            kept_at: std::time::Instant::now(),
        });
    }
    Ok((resp, addr))
}

/// A copy of `req` to send again if a kept connection fails under it: only for a
/// method that is safe to repeat (GET, HEAD, OPTIONS) with no body, and never for a
/// request that asks to upgrade the connection (a WebSocket handshake opens a session
/// at the origin; it is not repeated behind the client's back).
fn retry_of(req: &Request<UpBody>) -> Option<Request<UpBody>> {
    let safe = matches!(*req.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS);
    if !safe || !http_body::Body::is_end_stream(req.body()) || is_upgrade(req.headers()) {
        return None;
    }
    let mut again = Request::new(Either::Right(Either::Left(Empty::new())));
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    Some(again)
}

/// True when a kept connection closed, or was reset, before a complete response head
/// arrived: nothing, a partial head, or only interim (`1xx`) responses reached the
/// gateway, so nothing reached the client either.
fn closed_unanswered(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    e.is_incomplete_message()
        || io.is_some_and(|io| matches!(io.kind(), BrokenPipe | ConnectionAborted | ConnectionReset))
}

/// A new upstream connection to `target`, dialled to a vetted address, driven by a
/// task of its own until it closes or `ended` (the client connection's end) fires. A
/// write to it that makes no progress for `proxy.tunnel_idle_timeout` fails it: an
/// origin that stops reading a request body does not hold the connection and the
/// request's registration for ever.
async fn open(
    door: &Door,
    target: &Target,
    ended: Option<&CancellationToken>,
) -> Result<(SendRequest<UpBody>, SocketAddr), ExchangeError> {
    let (stream, addr) = door.resolver.dial(target).await.map_err(ExchangeError::Dial)?;
    let stream = Stalling::new(stream, door.config.proxy.tunnel_idle_timeout);
    let (send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(ExchangeError::Http)?;
    let ended = ended.cloned();
    tokio::spawn(async move {
        let conn = conn.with_upgrades();
        let result = match ended {
            Some(ended) => crate::door::registry::UnlessEnded::new(&ended, conn).await.unwrap_or(Ok(())),
            None => conn.await,
        };
        if let Err(e) = result {
            tracing::debug!(upstream_addr = %addr, error = %e, "upstream connection ended with an error");
        }
    });
    Ok((send, addr))
}

pub fn handle<'a>(
    req: Request<Incoming>,
    conn: &'a ConnInfo,
    door: &'a Door,
    upstream: &'a Upstream,
    state: Arc<State>,
) -> impl Future<Output = Response<ProxyBody>> + 'a {
    handle_as(Kind::Forward, req, conn, door, upstream, state)
}

/// [`handle`], logged as `kind` (a transparent listener's requests are forwarded so).
/// Not an `async fn`: the future it returns is `body_apart`'s own, with no layer around
/// it for the hot path to move.
pub fn handle_as<'a>(
    kind: Kind,
    req: Request<Incoming>,
    conn: &'a ConnInfo,
    door: &'a Door,
    upstream: &'a Upstream,
    state: Arc<State>,
) -> impl Future<Output = Response<ProxyBody>> + 'a {
    let idle = door.config.proxy.tunnel_idle_timeout;
    crate::door::bodies::body_apart(req, idle, async move |req, body| {
        decide_and_send(kind, req, body, conn, door, upstream, state).await
    })
}

/// [`handle`] with the body apart: taken when the request is sent on, left in `body`
/// when it is refused.
async fn decide_and_send(
    kind: Kind,
    mut req: Request<()>,
    body: &mut Option<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    upstream: &Upstream,
    state: Arc<State>,
) -> Response<ProxyBody> {
    let mut rec = AccessRecord::with_vpce(
        kind,
        req.method().as_str(),
        String::new(),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    // A transparent listener's request has its sandbox from its address: no challenge.
    let entry = if kind == Kind::Transparent { Entry::Identified } else { Entry::Absolute };
    let reject =
        |rec: &mut AccessRecord, reason: DenyReason, hint: &str| door::refuse(rec, Refusal::new(reason, hint), entry);
    // Only a refused request that never parsed needs its raw target recorded.
    let refuse = |rec: &mut AccessRecord, hint: &str| {
        rec.target = raw_target(&req.uri().to_string()).into();
        reject(rec, DenyReason::BadRequest, hint)
    };

    match req.uri().scheme_str() {
        Some("http") => {}
        // A `ws://` WebSocket handshake arrives as `http://` (`proxy::handle`).
        Some(ws) if ws.eq_ignore_ascii_case("ws") => {
            return refuse(&mut rec, "a ws:// URL is forwarded only as a WebSocket handshake (Upgrade: websocket)");
        }
        Some(tls) if tls.eq_ignore_ascii_case("https") || tls.eq_ignore_ascii_case("wss") => {
            return refuse(
                &mut rec,
                "https:// and wss:// URLs go through CONNECT: configure this gateway as the proxy for https too",
            );
        }
        _ => return refuse(&mut rec, "only http:// URLs (and ws:// WebSocket handshakes) can be forwarded"),
    }
    let authority = req.uri().authority().map(|a| a.as_str()).unwrap_or_default();
    let target = match addr::parse_authority(authority, Some(80)) {
        Ok(t) => t,
        Err(e) => return refuse(&mut rec, &format!("invalid URL authority: {e}")),
    };
    rec.target = crate::access_log::Text::written(|t| target.write_to(t));

    let identity = match door::identified(door, &state, conn, Presented::proxy(req.headers())) {
        Ok(i) => i,
        Err(refusal) => return door::refuse(&mut rec, refusal, entry),
    };
    // A host the policy inspects is decided request by request, in plain HTTP too.
    let inspected = identity.policy.inspects(&target).is_some();
    let subject = if inspected {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
        let headers = crate::door::headers::rule_headers(req.headers());
        Subject::Request { target: target.clone(), method: req.method().as_str().to_string(), path, headers }
    } else {
        Subject::Host(target.clone())
    };
    let sandbox = identity.sandbox.clone();
    // For judging `_method` form fields, on an inspected host only.
    let policy = inspected.then(|| identity.policy.clone());
    let hold = match door::authorize_as(door, &state, &mut rec, conn, identity, subject) {
        Ok(a) => Arc::new(a.hold),
        Err(refusal) => return door::refuse(&mut rec, refusal, entry),
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
        // A host with values bound to it has its answers redacted over HTTPS only: over
        // plain HTTP, an answer could carry a value an earlier request stored upstream.
        // On any port: a value stored through port 443 is read back through port 80.
        if door.config.secrets.iter().any(|s| s.on_host_name(&target.host)) {
            let hint = format!(
                "secrets are bound to {target}, which is reached over HTTPS only (plain HTTP answers are not \
                 redacted of their values)"
            );
            return reject(&mut rec, DenyReason::SecretNotAllowed, &hint);
        }
    }
    // What a request rule judged must be all that reaches an inspected host.
    if inspected
        && let Some(hint) = unjudged_framing(
            req.method(),
            req.headers(),
            body.as_ref().is_some_and(|b| !http_body::Body::is_end_stream(b)),
        )
    {
        return reject(&mut rec, DenyReason::BadRequest, hint);
    }
    let line = charge_head(&hold, Dir::Up, request_line_len(&req), req.headers());
    if let Err(refusal) = line {
        return door::refuse(&mut rec, refusal, entry);
    }

    // On an inspected host a POST whose form names another method (`_method=DELETE`)
    // is judged as that method too, as the body streams. Planned before the dial: a
    // refusal here needs no upstream connection.
    let mut watch = None;
    if let Some(policy) = &policy
        && req.method().as_str().eq_ignore_ascii_case("POST")
    {
        let has_body = body.as_ref().is_some_and(|b| !http_body::Body::is_end_stream(b));
        let judge = || {
            let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
            let headers = crate::door::headers::rule_headers(req.headers());
            method_field::judge(policy.clone(), target.clone(), path, headers)
        };
        match method_field::plan(req.method(), req.headers(), has_body, judge) {
            method_field::Plan::Pass => {}
            method_field::Plan::Refuse(hint) => return reject(&mut rec, DenyReason::RequestNotAllowed, &hint),
            method_field::Plan::Watch(form, judge) => watch = Some((form, judge, Arc::new(std::sync::OnceLock::new()))),
        }
    }

    let client_10 = req.version() == http::Version::HTTP_10;
    let ended = conn.watch.as_ref().map(|w| w.end());
    let up_conn = match upstream.take(&target, &sandbox) {
        // The common case, back-to-back requests: the kept connection is ready now.
        Some(kept) if kept.send.is_ready() => Conn::Kept(kept),
        kept => {
            // A client that leaves during the dial is recorded too (nothing went up).
            let nothing_up = AtomicU64::new(0);
            let mut abandoned = door::Abandoned::arm(&mut rec, &nothing_up);
            let dialled = hold.registration().unless_ended(connection(kept, door, &target, ended)).await;
            abandoned.disarm();
            drop(abandoned);
            match dialled {
                Some(Ok(c)) => c,
                Some(Err(ExchangeError::Dial(e))) => return reject(&mut rec, e.reason(), &e.client_hint()),
                Some(Err(ExchangeError::Http(e))) => {
                    let hint = format!("upstream connection failed: {e}");
                    return reject(&mut rec, DenyReason::UpstreamUnreachable, &hint);
                }
                None => return reject(&mut rec, DenyReason::Revoked, ENDED_HINT),
            }
        }
    };
    // A new connection's address is where the request goes. A kept one's is named only
    // once answered: if it closed under the request, a safe one goes again over a new
    // connection, perhaps to another of the name's addresses.
    if let Conn::New(_, addr) = &up_conn {
        rec.upstream_addr = Some(*addr);
    }

    let wants_upgrade = is_upgrade(req.headers());
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));
    let idle = door.config.proxy.tunnel_idle_timeout;
    let Some(sent_body) = body.take() else {
        return reject(&mut rec, DenyReason::BadRequest, "the request body is gone");
    };
    let (parts, ()) = req.into_parts();
    let refused_method = watch.as_ref().map(|(_, _, refused)| refused.clone());
    let req = Request::from_parts(parts, sent_body);
    let up_req = match upstream_request(req, &target, &rec.target, wants_upgrade, hold.clone(), idle, watch) {
        Ok((r, counter)) => (r, counter),
        Err(msg) => return reject(&mut rec, DenyReason::BadRequest, msg),
    };
    let (mut up_req, bytes_up) = up_req;
    // A peer's connection is never kept: a reload may move the peer, and a kept
    // connection would still lead to its old address (another sandbox's, perhaps).
    let peer = crate::policy::peer_id(&target, &door.config.egress.peer_suffix).is_some();
    // To an inspected host, a request with a body closes its upstream connection: an
    // upstream that ignored the body would read it as the start of a request no rule
    // judged, finished by the next request on the connection.
    let once = peer || inspected && !http_body::Body::is_end_stream(up_req.body());
    if !wants_upgrade && once {
        let close = if up_req.headers().contains_key(header::TE) { "te, close" } else { "close" };
        up_req.headers_mut().insert(header::CONNECTION, HeaderValue::from_static(close));
    }

    let timeout = door.config.proxy.response_header_timeout;
    let sent = {
        let mut abandoned = door::Abandoned::arm(&mut rec, &bytes_up);
        let keep = !wants_upgrade && !once;
        let sent = Box::pin(exchange(upstream, door, &target, &sandbox, up_conn, up_req, keep, ended));
        let sent = hold.registration().unless_ended(tokio::time::timeout(timeout, sent)).await;
        abandoned.disarm();
        sent
    };
    // What went up before an upstream failure or a sweep ended the exchange.
    rec.bytes_up = bytes_up.load(std::sync::atomic::Ordering::Relaxed);
    let Some(sent) = sent else {
        return reject(&mut rec, DenyReason::Revoked, ENDED_HINT);
    };
    let resp = match sent {
        Ok(Ok((resp, addr))) => {
            rec.upstream_addr = Some(addr);
            resp
        }
        Ok(Err(ExchangeError::Dial(e))) => return reject(&mut rec, e.reason(), &e.client_hint()),
        Ok(Err(ExchangeError::Http(e))) if let Some(hint) = crate::dial::unreadable_answer(&e) => {
            return reject(&mut rec, DenyReason::UpstreamInvalid, &hint);
        }
        Ok(Err(ExchangeError::Http(e))) => {
            if let Some(spent) = hold.meter().and_then(|m| m.why()).cloned() {
                return door::refuse(&mut rec, door::Refusal::budget(spent), entry);
            }
            if let Some(hint) = refused_method.as_ref().and_then(|r| r.get()) {
                return reject(&mut rec, DenyReason::RequestNotAllowed, hint);
            }
            if let Some(body) = crate::dial::body_failure(&e) {
                if crate::dial::client_left_mid_body(&e) {
                    return door::record::client_left(&mut rec, &format!("the request body ended early: {body}"));
                }
                return reject(
                    &mut rec,
                    DenyReason::BadRequest,
                    &format!("the request body could not be sent: {body}"),
                );
            }
            return reject(&mut rec, DenyReason::UpstreamUnreachable, &format!("upstream request failed: {e}"));
        }
        Err(_) => {
            return reject(&mut rec, DenyReason::UpstreamTimeout, "no response headers in time");
        }
    };
    rec.status = resp.status().as_u16();
    // The status line: `HTTP/1.1 200 OK\r\n` and a reason phrase.
    if let Err(refusal) = charge_head(&hold, Dir::Down, 32, resp.headers()) {
        return door::refuse(&mut rec, refusal, entry);
    }

    if inspected && resp.status() == StatusCode::SWITCHING_PROTOCOLS && !is_websocket_upgrade(resp.headers()) {
        let detail = "the upstream switched to a protocol other than WebSocket";
        return reject(&mut rec, DenyReason::UpstreamInvalid, detail);
    }
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            let detail = "the upstream switched protocols, which the request did not ask for";
            return reject(&mut rec, DenyReason::UpstreamInvalid, detail);
        };
        return door::relay_upgraded(door, conn.place(), hold, rec, client_upgrade, resp);
    }

    let (mut parts, body) = resp.into_parts();
    strip_upstream_response(&mut parts, false);
    // An HTTP/1.0 client reads a body of unknown length to the connection's close, so
    // the answer must not say `keep-alive` (hyper adds it for a client that asked).
    if client_10 && !parts.headers.contains_key(header::CONTENT_LENGTH) && !http_body::Body::is_end_stream(&body) {
        parts.version = http::Version::HTTP_10;
    }
    let idle = door.config.proxy.tunnel_idle_timeout;
    let body = Revocable::new(IdleBody::new(Trailers::from_upstream(body), idle), hold.clone(), Dir::Down);
    let body = LoggedBody::new(body, bytes_up, rec, hold);
    Response::from_parts(parts, body.boxed_unsync())
}

/// Builds the upstream request: origin-form URI, hop-by-hop headers and proxy
/// credentials removed, `Host` set from the normalised target (`text`, as the access
/// record shows it).
fn upstream_request(
    req: Request<Incoming>,
    target: &Target,
    text: &str,
    upgrade: bool,
    hold: Arc<Hold>,
    idle: std::time::Duration,
    watch: Option<Watch>,
) -> Result<(Request<UpBody>, Arc<AtomicU64>), &'static str> {
    let (mut parts, body) = req.into_parts();
    // Origin-form upstream: the path and query only, never the client's userinfo.
    parts.uri = match parts.uri.path_and_query() {
        Some(p) if p.as_str().starts_with('/') => Uri::from(p.clone()),
        Some(p) => Uri::try_from(format!("/{}", p.as_str())).map_err(|_| "invalid request path")?,
        None => Uri::from(PathAndQuery::from_static("/")),
    };
    // A chunked body is sent chunked whatever the method: told nothing, hyper would
    // drop the body of a GET (Elasticsearch's `_search` sends one).
    let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING) && !http_body::Body::is_end_stream(&body);
    // A client that takes trailers gets the upstream's (the gateway relays them): the
    // upstream is told so, on this hop.
    let trailers = parts
        .headers
        .get_all(header::TE)
        .iter()
        .any(|v| v.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers")));
    strip_client_request(&mut parts.headers, upgrade);
    if chunked {
        parts.headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    if trailers && !upgrade {
        parts.headers.insert(header::TE, HeaderValue::from_static("trailers"));
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("te"));
    }
    let host = if target.port == 80 { text.strip_suffix(":80").unwrap_or(text) } else { text };
    let host = HeaderValue::from_str(host).map_err(|_| "invalid host")?;
    parts.headers.insert(header::HOST, host);
    let counter = Arc::new(AtomicU64::new(0));
    let body = match watch {
        None => Either::Left(Counting::new(Revocable::new(IdleBody::new(body, idle), hold, Dir::Up), counter.clone())),
        Some((form, judge, refused)) => {
            let body = method_field::watch(body, form, judge, refused);
            // Boxed: every request's body has this type's size, and it is moved often.
            Either::Right(Either::Right(Box::new(Counting::new(
                Revocable::new(IdleBody::new(body, idle), hold, Dir::Up),
                counter.clone(),
            ))))
        }
    };
    Ok((Request::from_parts(parts, body), counter))
}
