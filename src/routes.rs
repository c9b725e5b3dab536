//! Credential-injecting API routes: the sandbox calls an API through the gateway, the
//! gateway holds the key. Reached as `http://gateway:4002/routes/NAME/PATH` (for SDKs
//! that take a base URL) or as `http://HOST/PATH` through the proxy when HOST is a
//! route's upstream host (the gateway upgrades to HTTPS). The sandbox's credentials and
//! any client-supplied value of the injected header are stripped; the secret is
//! redacted from anything the upstream echoes back; bodies stream both ways (SSE
//! arrives as produced); redirects are never followed; upstream TLS is verified.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::budget::Dir;
use crate::config::RouteConfig;
use crate::dial::UpstreamAddr;
use crate::door::bodies::{Counting, IdleBody, LoggedBody, Trailers};
use crate::door::headers::strip_upstream_response;
use crate::door::limits::SandboxLimits;
use crate::door::method_field;
use crate::door::record::refuse_as as finish;
use crate::door::registry::{ENDED_HINT, Revocable};
use crate::door::{self, ConnInfo, Door, Entry, Presented, ProxyBody};
use crate::policy::{DenyReason, Subject};
use crate::redact;
use crate::reload::State;

/// The API routes' upstream clients, one per sandbox.
pub struct Routes {
    pub clients: crate::https_client::Clients,
}

/// Per route: the per-sandbox request budget (`sandbox_requests_per_minute`), which
/// the front door enforces.
pub fn budgets(routes: &[RouteConfig]) -> HashMap<String, SandboxLimits> {
    routes
        .iter()
        .filter(|r| r.sandbox_requests_per_minute > 0)
        .map(|r| (r.name.clone(), SandboxLimits::per_minute(r.sandbox_requests_per_minute)))
        .collect()
}

/// The route an origin-form path names, and the upstream path after it.
pub fn match_origin<'r, 'p>(routes: &'r [RouteConfig], path: &'p str) -> Option<(&'r RouteConfig, &'p str)> {
    let rest = path.strip_prefix("/routes/")?;
    let (name, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let route = routes.iter().find(|r| r.name == name)?;
    Some((route, if tail.is_empty() { "/" } else { tail }))
}

/// True when an absolute-form host is some route's upstream host.
pub fn is_route_host(routes: &[RouteConfig], host: &str) -> bool {
    routes.iter().any(|r| r.host.eq_ignore_ascii_case(host))
}

pub async fn handle(
    req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    routes_client: &Routes,
    state: Arc<State>,
    entry: Entry,
) -> Response<ProxyBody> {
    let idle = door.config.proxy.tunnel_idle_timeout;
    crate::door::bodies::body_apart(req, idle, async |req, body| {
        route(req, body, conn, door, routes_client, state, entry).await
    })
    .await
}

/// [`handle`] with the body apart: taken when the request is sent on.
async fn route(
    req: Request<()>,
    body: &mut Option<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    routes_client: &Routes,
    state: Arc<State>,
    entry: Entry,
) -> Response<ProxyBody> {
    let method = req.method().as_str().to_string();
    let mut rec = AccessRecord::with_vpce(
        Kind::Forward,
        &method,
        raw_target(&req.uri().to_string()),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    if req.method() == http::Method::CONNECT {
        // Never sent upstream with the route's credential, however it got here.
        let hint = "CONNECT is not a request an API route forwards";
        return finish(&mut rec, DenyReason::BadRequest, None, hint, entry);
    }
    let routes = &door.config.routes;
    let path_and_query = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();

    // Which route, and which upstream path.
    let (candidates, upstream_path): (Vec<&RouteConfig>, String) = match entry {
        Entry::Origin | Entry::OwnUrl => match match_origin(routes, req.uri().path()) {
            Some((r, tail)) => {
                let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
                (vec![r], format!("{tail}{query}"))
            }
            None => return finish(&mut rec, DenyReason::BadRequest, None, "no such route", entry),
        },
        Entry::Absolute | Entry::Identified => {
            let host = req.uri().host().unwrap_or_default();
            (routes.iter().filter(|r| r.host.eq_ignore_ascii_case(host)).collect(), path_and_query.clone())
        }
    };
    let Some(first) = candidates.first() else {
        return finish(&mut rec, DenyReason::BadRequest, None, "no such route", entry);
    };
    rec.target = format!("route:{}", first.name).into();

    // An origin-form path names one route; several routes may share a host, and the
    // route is then the first the sandbox's policy lists: identify first.
    let presented = Presented::of(req.headers(), entry, Some((&first.header, first.prefix.as_str())));
    let identity = match door::identified(door, &state, conn, presented) {
        Ok(i) => i,
        Err(refusal) => return door::refuse(&mut rec, refusal, entry),
    };
    let route = identity.policy.routes().find_map(|name| candidates.iter().find(|r| r.name == name)).unwrap_or(first);
    rec.target = format!("route:{}", route.name).into();
    let subject = Subject::Route { route: route.name.clone(), method: method.clone(), path: upstream_path.clone() };
    let sandbox = identity.sandbox.clone();
    let policy = identity.policy.clone();
    let hold = match door::authorize_as(door, &state, &mut rec, conn, identity, subject) {
        Ok(a) => Arc::new(a.hold),
        Err(refusal) => return door::refuse(&mut rec, refusal, entry),
    };
    let head =
        crate::door::bodies::charge_head(&hold, Dir::Up, crate::door::bodies::request_line_len(&req), req.headers());
    if let Err(refusal) = head {
        return door::refuse(&mut rec, refusal, entry);
    }
    let Some(secret) = state.route_secrets.get(&route.name) else {
        return finish(
            &mut rec,
            DenyReason::UpstreamUnreachable,
            Some(StatusCode::BAD_GATEWAY),
            "route secret not loaded",
            entry,
        );
    };
    let (parts, ()) = req.into_parts();
    let Some(body) = body.take() else {
        return finish(&mut rec, DenyReason::BadRequest, None, "the request body is gone", entry);
    };
    let has_body = !http_body::Body::is_end_stream(&body);
    // An upstream that ignores a GET's body would read it as a second request, run
    // with the route's key and judged by no rule.
    let m = parts.method.as_str();
    if has_body && (m.eq_ignore_ascii_case("GET") || m.eq_ignore_ascii_case("HEAD")) {
        let hint = "a GET or HEAD request with a body is not sent on: upstreams disagree on its framing";
        return finish(&mut rec, DenyReason::BadRequest, None, hint, entry);
    }
    let bytes_up = Arc::new(AtomicU64::new(0));
    let idle = door.config.proxy.tunnel_idle_timeout;
    let mut body = Revocable::new(IdleBody::new(Counting::new(body, bytes_up.clone()), idle), hold.clone(), Dir::Up)
        .boxed_unsync();
    // A POST whose body names another method (`_method=DELETE`, which Rails, Laravel
    // and Symfony run as a DELETE) is judged as that method too, as the body streams.
    let refused_method = Arc::new(std::sync::OnceLock::new());
    let judge = || method_field::judge_route(policy.clone(), route.name.clone(), upstream_path.clone());
    match method_field::plan(&parts.method, &parts.headers, has_body, judge) {
        method_field::Plan::Pass => {}
        method_field::Plan::Refuse(hint) => return finish(&mut rec, DenyReason::RouteNotAllowed, None, &hint, entry),
        method_field::Plan::Watch(form, judge) => {
            body = method_field::watch(body, form, judge, refused_method.clone()).boxed_unsync();
        }
    }
    let uri = format!("{}{}", route.upstream.to_string().trim_end_matches('/'), upstream_path);
    let mut up = Request::builder().method(parts.method.clone()).uri(uri);
    if let Some(h) = up.headers_mut() {
        copy_headers(&parts.headers, h, route);
        // Responses are redacted byte by byte: ask for them unencoded.
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        // An upstream that ignores this request's body (a handler that never reads
        // it, a method it takes as bodiless) would read the body as the start of a
        // request, finished by the next request on the connection, with the key:
        // after a body, the connection is not used again.
        if has_body {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Ok(mut v) = HeaderValue::from_str(&format!("{}{}", route.prefix, secret.expose())) {
            v.set_sensitive(true);
            h.insert(route.header.clone(), v);
        }
    }
    let Ok(up) = up.body(body) else {
        return finish(&mut rec, DenyReason::BadRequest, None, "cannot build the upstream request", entry);
    };
    let timeout = door.config.proxy.response_header_timeout;
    let sent = {
        let mut abandoned = door::Abandoned::arm(&mut rec, &bytes_up);
        let sent = hold
            .registration()
            .unless_ended(crate::https_client::send(&routes_client.clients, &sandbox, up, timeout, "the API"))
            .await;
        abandoned.disarm();
        sent
    };
    // What went up before an upstream failure or a sweep ended the exchange.
    rec.bytes_up = bytes_up.load(std::sync::atomic::Ordering::Relaxed);
    let resp = match sent {
        Some(Ok(r)) => r,
        Some(Err(_)) if let Some(spent) = hold.meter().and_then(|m| m.why()).cloned() => {
            return door::refuse(&mut rec, door::Refusal::budget(spent), entry);
        }
        Some(Err(_)) if let Some(hint) = refused_method.get() => {
            return finish(&mut rec, DenyReason::RouteNotAllowed, None, hint, entry);
        }
        Some(Err((reason, detail))) => return finish(&mut rec, reason, None, &detail, entry),
        None => return finish(&mut rec, DenyReason::Revoked, None, ENDED_HINT, entry),
    };
    rec.upstream_addr = resp.extensions().get::<UpstreamAddr>().map(|a| a.0);
    // A route does not upgrade: a `101` would leave the client waiting on a protocol
    // the gateway never relays.
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let detail = "the API answered 101 Switching Protocols; routes do not upgrade connections";
        return finish(&mut rec, DenyReason::UpstreamInvalid, Some(StatusCode::BAD_GATEWAY), detail, entry);
    }
    // The redactor matches raw bytes: a compressed echo of the key would pass it. The
    // upstream was asked for `identity`; anything else is refused, never passed on.
    // A transfer coding other than chunked (which hyper decodes) would pass encoded
    // bytes unlabelled once the hop-by-hop header is stripped.
    if redact::is_encoded(resp.headers()) {
        let detail = "the API answered with a content or transfer coding although identity was asked for; an \
                      encoded body cannot be redacted";
        return finish(&mut rec, DenyReason::UpstreamEncoding, None, detail, entry);
    }
    rec.status = resp.status().as_u16();
    let (mut parts, body) = resp.into_parts();
    strip_upstream_response(&mut parts, false);
    // The upstream's own reason phrase is not passed on: it is not redacted.
    parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    // Redaction can change the length.
    for h in [header::CONTENT_LENGTH, header::SET_COOKIE] {
        parts.headers.remove(h);
    }
    // Never follow or expose redirects into the upstream's own auth flows; a 3xx passes
    // through as is, with its Location redacted like everything else.
    // The key as sent, and as an upstream may echo it escaped (JSON, a URL).
    let redactor = redact::redactor(&[secret.expose()]);
    redactor.headers(&mut parts.headers);
    let body = Revocable::new(IdleBody::new(Trailers::from_upstream(body), idle), hold.clone(), Dir::Down);
    let body = redact::body(body, redactor);
    let body = LoggedBody::new(body, bytes_up, rec, hold);
    Response::from_parts(parts, body.boxed_unsync())
}

/// End-to-end headers pass; credentials, cookies, hop-by-hop headers (and those the
/// client's `Connection` names), the gateway's own fields and any value of the
/// injected header the client sent stay behind.
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, route: &RouteConfig) {
    // `range`/`if-range`: a key split across two ranges would escape a per-response
    // redactor; `accept-encoding` is replaced by `identity`. Method and URL override
    // headers would let an upstream that honours them run another method or path
    // than the one the route's rules judged, with the gateway's key.
    // `expect`: the gateway answered the client's `100-continue` itself; an upstream
    // told to expect a body may answer before it and leave the body to be read as a
    // request of its own.
    let drop: [&str; 15] = [
        "host",
        "expect",
        "range",
        "if-range",
        "accept-encoding",
        "authorization",
        "proxy-authorization",
        "cookie",
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    for (k, v) in from {
        // CGI and WSGI backends (and PHP's built-in server) read `x_api_key` and
        // `x.api.key` as `x-api-key`: judged as that.
        let name = if k.as_str().contains(['_', '.']) {
            std::borrow::Cow::Owned(k.as_str().replace(['_', '.'], "-"))
        } else {
            std::borrow::Cow::Borrowed(k.as_str())
        };
        if drop.contains(&name.as_ref())
            || crate::door::headers::OVERRIDE_FIELDS.contains(&name.as_ref())
            || name == route.header.as_str()
            || crate::door::headers::never_forwarded(from, k.as_str())
        {
            continue;
        }
        to.append(k.clone(), v.clone());
    }
}
