//! One request inside an inspected connection: decided by the policy's request rules
//! (and, on the GitHub API, by its `git` rules for writes), placeholders swapped, then
//! sent on to the inspected host over verified TLS. Bodies stream both ways; a `101`
//! upgrade (WebSocket) becomes a relayed tunnel.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use super::Intercept;
use super::placeholders;
use super::secrets::{self, Swapped};
use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::addr::Target;
use crate::budget::Dir;
use crate::dial::UpstreamAddr;
use crate::door::bodies::{Counting, IdleBody, LoggedBody, Trailers, charge_head, request_line_len};
use crate::door::headers::{
    is_upgrade, is_websocket_upgrade, strip_client_request, strip_upstream_response, unjudged_framing,
};
use crate::door::method_field;
use crate::door::record::refuse_as as finish;
use crate::door::registry::{ENDED_HINT, Revocable};
use crate::door::{self, ConnInfo, Door, Entry, Presented, ProxyBody, Refusal, respond};
use crate::policy::{self, DenyReason, Outcome, Subject};
use crate::redact;
use crate::reload::State;

/// Largest JSON body read to find the ref a GitHub API write names.
const MAX_API_BODY: usize = 1024 * 1024;

pub async fn handle(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    intercept: &Intercept,
    state: Arc<State>,
    target: &Target,
) -> Response<ProxyBody> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    let shown = if target.port == 443 { target.host.to_string() } else { target.to_string() };
    let mut rec = AccessRecord::with_vpce(
        Kind::Inspect,
        req.method().as_str(),
        raw_target(&format!("https://{shown}{path}")),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    let method = req.method().as_str().to_string();
    let identity = match door::identified(door, &state, conn, Presented::proxy(req.headers())) {
        Ok(i) => i,
        Err(refusal) => return door::refuse(&mut rec, refusal, Entry::Identified),
    };
    // Every refusal below names the sandbox and its policy.
    rec.sandbox = Some(identity.sandbox.clone());
    rec.policy = Some(identity.policy.shared_name());

    let line = request_line_len(&req);
    let wants_upgrade = is_upgrade(req.headers());
    // A client that spoke HTTP/2 is answered over HTTP/2 from the upstream where it
    // speaks it: gRPC needs HTTP/2 end to end, with `TE: trailers` and its trailers.
    let h2 = req.version() == http::Version::HTTP_2;
    let te_trailers =
        h2 && req.headers().get(header::TE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let client_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let mut body = Some(body);
    let has_body = body.as_ref().is_some_and(|b| !http_body::Body::is_end_stream(b));
    if let Some(hint) = unjudged_framing(&parts.method, &parts.headers, has_body)
        .or_else(|| crate::door::headers::unsupported_transfer_coding(&parts.headers))
    {
        drain_rest(body.take(), door).await;
        return finish(&mut rec, DenyReason::BadRequest, None, hint, Entry::Identified);
    }
    // The gateway already answered any `Expect: 100-continue` itself.
    parts.headers.remove(header::EXPECT);

    // On the GitHub API, writes to refs and contents are judged by the git rules too.
    // Mapped on the decoded path, as request rules are: `/git/%72efs` is `/git/refs`.
    // GitHub Enterprise Server serves it under a prefix (`/api/v3`). A write whose path
    // cannot be decoded (`heads%2Fmain`, which GitHub reads as `heads/main`) is refused
    // here, in report mode too: the git rules could not judge it.
    let api = &door.config.github.api_url;
    let on_api = target.host.as_name() == api.host();
    let decoded = on_api.then(|| policy::requests::normalize_path(parts.uri.path()));
    if let Some(Err(why)) = &decoded
        && super::github_api::is_write(&method)
    {
        drain_rest(body.take(), door).await;
        let hint = format!("{why}: a GitHub API write must name its path plainly for the git rules to judge it");
        return finish(&mut rec, DenyReason::BadRequest, None, &hint, Entry::Identified);
    }
    // GitHub runs no mutation sent by GET, but a server that did would write refs
    // the git rules never saw: a read of `/graphql` naming one is refused too.
    if let Some(Ok(p)) = &decoded
        && p.to_ascii_lowercase().trim_end_matches('/').ends_with("/graphql")
        && let Some(mutation) = parts.uri.query().and_then(super::github_api::graphql_query_write)
    {
        drain_rest(body.take(), door).await;
        let hint = format!(
            "the GraphQL mutation {mutation} writes refs, which the git rules cannot judge here; push through git"
        );
        return finish(&mut rec, DenyReason::GitWriteDenied, None, &hint, Entry::Identified);
    }
    let api_write = decoded.and_then(Result::ok).and_then(|path| {
        // GraphQL: `/graphql` on github.com, `/api/graphql` on GHES.
        if path.to_ascii_lowercase().trim_end_matches('/').ends_with("/graphql") {
            return super::github_api::write_of(&method, "/graphql");
        }
        let prefix = api.path().trim_end_matches('/');
        let rest = path.get(..prefix.len()).filter(|p| p.eq_ignore_ascii_case(prefix)).and(path.get(prefix.len()..))?;
        super::github_api::write_of(&method, rest)
    });
    let mut buffered: Option<Bytes> = None;
    if let Some(write) = &api_write {
        // Only a write whose ref is in its body is read ahead; every other body streams
        // on untouched (its Content-Length must stay true).
        if let super::github_api::RefAt::Refused(why) = write.at {
            drain_rest(body.take(), door).await;
            return finish(&mut rec, DenyReason::GitWriteDenied, None, why, Entry::Identified);
        }
        let json = if matches!(
            write.at,
            super::github_api::RefAt::Body { .. }
                | super::github_api::RefAt::GraphQl
                | super::github_api::RefAt::Rename { .. }
        ) && let Some(b) = body.take()
        {
            let idle = door.config.proxy.tunnel_idle_timeout;
            match tokio::time::timeout(idle, Limited::new(b, MAX_API_BODY).collect()).await {
                Ok(Ok(collected)) => {
                    let bytes = collected.to_bytes();
                    // Sent as read: a length that disagreed with the body would desync
                    // the pooled upstream connection.
                    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                    parts.headers.remove(header::TRANSFER_ENCODING);
                    if write.at == super::github_api::RefAt::GraphQl
                        && let Some(mutation) = super::github_api::graphql_write(&bytes)
                    {
                        let hint = format!(
                            "the GraphQL mutation {mutation} writes refs, which the git rules cannot judge here; push \
                             through git"
                        );
                        return finish(&mut rec, DenyReason::GitWriteDenied, None, &hint, Entry::Identified);
                    }
                    let value = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
                    if value.is_none() && write.at == super::github_api::RefAt::GraphQl {
                        let hint = "a GraphQL request to the GitHub API must be a JSON body the gateway can read";
                        return finish(&mut rec, DenyReason::BadRequest, None, hint, Entry::Identified);
                    }
                    // A body that names its ref but does not parse here might still parse
                    // upstream (a comment, a byte order mark, a lone surrogate): its ref
                    // would go unjudged.
                    if value.is_none() && !bytes.is_empty() {
                        let hint = "this GitHub API write names its ref in a JSON body, which must be plain JSON the \
                                    gateway can read for the git rules to judge it";
                        return finish(&mut rec, DenyReason::BadRequest, None, hint, Entry::Identified);
                    }
                    buffered = Some(bytes);
                    value
                }
                _ => {
                    let hint = "the API request body could not be read (at most 1 MiB of JSON)";
                    return finish(&mut rec, DenyReason::BadRequest, None, hint, Entry::Identified);
                }
            }
        } else {
            None
        };
        let mut subjects = super::github_api::subjects(write, json.as_ref());
        // Rails merges the query's parameters with the body's: a ref named there is
        // judged too.
        if let super::github_api::RefAt::Body { field, .. } = &write.at {
            for (k, v) in policy::requests::query_pairs(parts.uri.query()) {
                if k == *field {
                    let named = serde_json::json!({ *field: v });
                    subjects.extend(super::github_api::subjects(write, Some(&named)));
                }
            }
        }
        for subject in subjects {
            let d = policy::decide(&identity.policy, &subject, identity.repos.as_deref());
            if let Some(reason) = d.reason() {
                rec.sandbox = Some(identity.sandbox.clone());
                rec.policy = Some(identity.policy.shared_name());
                let hint = policy::hint(&identity.policy, reason, &subject, &d).unwrap_or_default();
                let refusal = Refusal {
                    reason,
                    hint: Some(format!("{subject}: {hint}")),
                    rule: None,
                    status: None,
                    budget: None,
                };
                drain_rest(body.take(), door).await;
                return door::refuse(&mut rec, refusal, Entry::Identified);
            }
        }
    }

    // The headers judged are the headers sent: hop-by-hop ones (and any the client
    // nominates in `Connection`) go before the decision.
    strip_client_request(&mut parts.headers, wants_upgrade);
    if te_trailers {
        // The one `TE` HTTP/2 allows, which gRPC servers look for. Not nominated in
        // `Connection` for an upstream that turns out to speak HTTP/1.1: hyper's HTTP/2
        // client drops every field `Connection` names, and `TE` with them.
        parts.headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    let subject = Subject::Request {
        target: target.clone(),
        method: method.clone(),
        path: path.clone(),
        headers: crate::door::headers::rule_headers(&parts.headers),
    };
    let hold = match door::authorize_as(door, &state, &mut rec, conn, identity.clone(), subject) {
        Ok(a) => Arc::new(a.hold),
        Err(refusal) => {
            drain_rest(body.take(), door).await;
            return door::refuse(&mut rec, refusal, Entry::Identified);
        }
    };
    if let Err(refusal) = charge_head(&hold, Dir::Up, line, &parts.headers) {
        drain_rest(body.take(), door).await;
        return door::refuse(&mut rec, refusal, Entry::Identified);
    }
    let encoded_body = parts
        .headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"));
    let swapped = match secrets::swap(
        &mut parts,
        target,
        identity.policy.name(),
        &door.config.secrets,
        &state.secrets,
        // Not inside a body under a content coding: what the gateway would read there is
        // not what the upstream decodes (an escape compressed before a placeholder
        // stored in the clear would fold the value), so its placeholders stay text.
        !wants_upgrade
            && !encoded_body
            && (buffered.is_some() || body.as_ref().is_some_and(|b| !http_body::Body::is_end_stream(b))),
    ) {
        Ok(s) => s,
        Err(m) if m.elsewhere => {
            tracing::warn!(sandbox = %identity.sandbox, target = %rec.target, "a secret placeholder was sent to a host it is not bound to");
            drain_rest(body.take(), door).await;
            return finish(&mut rec, DenyReason::SecretNotAllowed, None, &m.hint, Entry::Identified);
        }
        Err(m) => {
            tracing::info!(sandbox = %identity.sandbox, target = %rec.target, "a secret placeholder was refused where it stood");
            drain_rest(body.take(), door).await;
            return finish(&mut rec, DenyReason::SecretNotAllowed, None, &m.hint, Entry::Identified);
        }
    };
    // An upgraded connection is relayed as bytes, which are not redacted: a value
    // swapped into its request, or stored upstream by an earlier one, could come back
    // in the stream. A host with values bound to it is not upgraded.
    if swapped.any() && wants_upgrade {
        let hint = "secrets are bound to this host, and an upgraded (WebSocket) connection is relayed unredacted: \
                    placeholders are not replaced on it, and it is refused";
        drain_rest(body.take(), door).await;
        return finish(&mut rec, DenyReason::SecretNotAllowed, None, hint, Entry::Identified);
    }
    // Report mode never lends the gateway's credential to a request the rules refuse.
    if swapped.lends() && rec.decision == Outcome::WouldDeny {
        let hint = "this request carries a placeholder secret, and the policy (in report mode) does not allow it";
        drain_rest(body.take(), door).await;
        return finish(&mut rec, DenyReason::RequestNotAllowed, None, hint, Entry::Identified);
    }

    let bytes_up = Arc::new(AtomicU64::new(0));
    let idle = door.config.proxy.tunnel_idle_timeout;
    let body: ProxyBody = match (buffered, body) {
        (Some(b), _) => Full::new(b).map_err(|never| match never {}).boxed_unsync(),
        // Request trailers are dropped: no request rule or placeholder check sees them.
        (None, Some(b)) => Trailers::dropped(b).map_err(Into::into).boxed_unsync(),
        (None, None) => respond::empty(),
    };
    let mut body: ProxyBody =
        Revocable::new(IdleBody::new(Counting::new(body, bytes_up.clone()), idle), hold.clone(), Dir::Up)
            .boxed_unsync();
    // A POST whose form names another method (`_method=DELETE`) is judged as that
    // method too, as the body streams (Rails, Laravel and Symfony run it as one).
    let refused_method = Arc::new(std::sync::OnceLock::new());
    let judge = || {
        let headers = crate::door::headers::rule_headers(&parts.headers);
        method_field::judge(identity.policy.clone(), target.clone(), path.clone(), headers)
    };
    match method_field::plan(&parts.method, &parts.headers, has_body, judge) {
        method_field::Plan::Pass => {}
        method_field::Plan::Refuse(hint) => {
            return finish(&mut rec, DenyReason::RequestNotAllowed, None, &hint, Entry::Identified);
        }
        method_field::Plan::Watch(form, judge) => {
            body = method_field::watch(body, form, judge, refused_method.clone()).boxed_unsync();
        }
    }
    // Why a placeholder in the body was refused, if it was: the upstream saw the
    // body end in an error, whatever protocol reports that.
    let refused_in_body = Arc::new(std::sync::OnceLock::new());
    if !swapped.body.is_empty() {
        let declared = swapped.declared.clone();
        body = placeholders::body(body, swapped.body.clone(), declared, refused_in_body.clone()).boxed_unsync();
    }

    // Over HTTP/2 the URI's authority becomes `:authority`, the one name sent (no
    // `Host`); an HTTP/1.1 upstream gets `Host` from it as well.
    let authority = if h2 { shown.clone() } else { target.to_string() };
    let uri = format!("https://{authority}{}", parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    let Ok(uri) = uri.parse::<http::Uri>() else {
        return finish(&mut rec, DenyReason::BadRequest, None, "invalid request path", Entry::Identified);
    };
    parts.headers.remove(header::HOST);
    if !swapped.body.is_empty() {
        // The replacement changes the length: the body goes chunked.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    if swapped.any() {
        // The response is redacted byte by byte: ask for it unencoded.
        parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        parts.headers.remove(header::RANGE);
        parts.headers.remove(header::IF_RANGE);
    }
    let mut up = Request::new(body);
    *up.method_mut() = parts.method.clone();
    *up.uri_mut() = uri;
    *up.headers_mut() = std::mem::take(&mut parts.headers);
    if !h2 && let Ok(h) = HeaderValue::from_str(&shown) {
        up.headers_mut().insert(header::HOST, h);
    }
    // An HTTP/1.1 upstream that ignores this request's body (a handler that never
    // reads it) would read the body as the start of a request no rule judged, finished
    // by the sandbox's next request on the connection (its swapped secrets included):
    // after a body, the connection is not used again. (A client's HTTP/2 request may
    // go to an upstream that speaks only HTTP/1.1; to an HTTP/2 upstream, hyper drops
    // the field.)
    if has_body && !wants_upgrade {
        up.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let version = if h2 { crate::https_client::Version::Http2 } else { crate::https_client::Version::Http1 };

    let timeout = door.config.proxy.response_header_timeout;
    let sent = {
        let mut abandoned = crate::door::Abandoned::arm(&mut rec, &bytes_up);
        let sent = hold
            .registration()
            .unless_ended(crate::https_client::send_as(
                &intercept.clients,
                &identity.sandbox,
                up,
                timeout,
                "the inspected host",
                version,
            ))
            .await;
        abandoned.disarm();
        sent
    };
    // What went up before an upstream failure or a sweep ended the exchange.
    rec.bytes_up = bytes_up.load(std::sync::atomic::Ordering::Relaxed);
    let resp = match sent {
        Some(Ok(r)) => r,
        Some(Err(_)) if let Some(hint) = refused_method.get() => {
            return finish(&mut rec, DenyReason::RequestNotAllowed, None, hint, Entry::Identified);
        }
        Some(Err(_)) if let Some(hint) = refused_in_body.get() => {
            return finish(&mut rec, DenyReason::SecretNotAllowed, None, hint, Entry::Identified);
        }
        Some(Err(_)) if let Some(spent) = hold.meter().and_then(|m| m.why()).cloned() => {
            return door::refuse(&mut rec, door::Refusal::budget(spent), Entry::Identified);
        }
        Some(Err((reason, detail))) => return finish(&mut rec, reason, None, &detail, Entry::Identified),
        None => return finish(&mut rec, DenyReason::Revoked, None, ENDED_HINT, Entry::Identified),
    };
    rec.upstream_addr = resp.extensions().get::<UpstreamAddr>().map(|a| a.0);
    rec.status = resp.status().as_u16();
    if let Err(refusal) = charge_head(&hold, Dir::Down, 32, resp.headers()) {
        return door::refuse(&mut rec, refusal, Entry::Identified);
    }

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS && !is_websocket_upgrade(resp.headers()) {
        let detail = "the upstream switched to a protocol other than WebSocket";
        return finish(&mut rec, DenyReason::UpstreamInvalid, None, detail, Entry::Identified);
    }
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        return door::relay_upgraded(door, conn.place(), hold, rec, client_upgrade, resp);
    }

    if swapped.any() && redact::is_encoded(resp.headers()) {
        let detail = "the upstream answered with a content or transfer coding although identity was asked for; an \
                      encoded body cannot be redacted";
        return finish(&mut rec, DenyReason::UpstreamEncoding, None, detail, Entry::Identified);
    }
    let (mut parts, body) = resp.into_parts();
    strip_upstream_response(&mut parts, false);
    let mut body: ProxyBody =
        Revocable::new(IdleBody::new(Trailers::from_upstream(body), idle), hold.clone(), Dir::Down).boxed_unsync();
    if swapped.any() {
        parts.extensions.remove::<hyper::ext::ReasonPhrase>();
        parts.headers.remove(header::CONTENT_LENGTH);
        body = redact_all(&mut parts.headers, body, &swapped);
    }
    let body = LoggedBody::new(body, bytes_up, rec, hold);
    Response::from_parts(parts, body.boxed_unsync())
}

/// Drains a refused request's unread body, if it has one.
async fn drain_rest(body: Option<Incoming>, door: &Door) {
    // The gateway answered any `Expect: 100-continue` itself: the body is coming.
    if let Some(b) = body {
        crate::door::bodies::drain_refused(b, false, door.config.proxy.tunnel_idle_timeout).await;
    }
}

/// Redacts every swapped-in value, as sent and as an upstream may echo it escaped or
/// re-cased ([`redact::echo_forms`]), from the response's headers and body.
fn redact_all(headers: &mut HeaderMap, body: ProxyBody, swapped: &Swapped) -> ProxyBody {
    let redactor = redact::redactor(&swapped.values);
    redactor.headers(headers);
    redact::body(body, redactor).boxed_unsync()
}
