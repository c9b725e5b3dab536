//! The git route's request path: identify, parse the smart-HTTP path, decide the
//! repository (and, for a push, every ref in the command list, read ahead of the
//! pack), obtain a repository-scoped token, and stream the request to GitHub with the
//! token injected and the sandbox's own credentials removed. Nothing is buffered but
//! the push command list; bodies stream both ways with an idle timeout.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::credentials::{Permission, is_credential_refusal};
use super::path::{self, Op, PathError};
use super::pktline;
use super::refusal;
use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::budget::Dir;
use crate::dial::UpstreamAddr;
use crate::door::bodies::{Counting, IdleBody, LoggedBody, Trailers, drain};
use crate::door::headers::strip_upstream_response;
use crate::door::record::refuse_as as finish;
use crate::door::registry::{ENDED_HINT, Revocable};
use crate::door::{self, ConnInfo, Door, Entry, Presented, ProxyBody, record, respond};
use crate::policy::{self, DenyReason, GitAccess, Subject};
use crate::reload::State;

/// Longest push command list read ahead of the pack.
const MAX_COMMANDS_BYTES: usize = 256 * 1024;

/// The route's upstream machinery, built at start-up.
pub struct GitRoute {
    /// One per sandbox.
    pub clients: crate::https_client::Clients,
    pub credentials: super::credentials::Credentials,
}

pub async fn handle(
    req: Request<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    route: &GitRoute,
    state: Arc<State>,
    entry: Entry,
) -> Response<ProxyBody> {
    let idle = door.config.github.idle_timeout;
    crate::door::bodies::body_apart(req, idle, async |req, body| {
        route_git(req, body, conn, door, route, state, entry).await
    })
    .await
}

/// [`handle`] with the body apart: taken when the request is sent on (or, for a push,
/// when its command list is read). A body left there is a refused request's, drained
/// before the refusal goes out.
async fn route_git(
    req: Request<()>,
    body: &mut Option<Incoming>,
    conn: &ConnInfo,
    door: &Door,
    route: &GitRoute,
    state: Arc<State>,
    entry: Entry,
) -> Response<ProxyBody> {
    let gh = &door.config.github;
    let method = req.method().as_str().to_string();
    let mut rec = AccessRecord::with_vpce(
        Kind::Git,
        &method,
        raw_target(&req.uri().to_string()),
        conn.peer,
        state.generation,
        conn.vpce.clone(),
    );
    let path = req.uri().path();
    let path = match entry {
        Entry::Origin | Entry::OwnUrl => path.strip_prefix(&format!("/{}", gh.web_host)).unwrap_or(path),
        Entry::Absolute | Entry::Identified => path,
    };
    let git = match path::parse(&method, path, req.uri().query()) {
        Ok(g) => g,
        Err(e) => {
            let status = if e == PathError::Unsupported { StatusCode::FORBIDDEN } else { StatusCode::BAD_REQUEST };
            return finish(&mut rec, DenyReason::BadRequest, Some(status), &e.to_string(), entry);
        }
    };
    rec.target = format!("{}/{}", gh.web_host, git.full_name()).into();

    let write = git.service.is_write();
    let subject =
        Subject::Git { repo: git.full_name(), access: if write { GitAccess::Write } else { GitAccess::Read } };
    let presented = Presented::of(req.headers(), entry, None);
    let authorized = match door::authorize(door, &state, &mut rec, conn, presented, subject) {
        Ok(a) => a,
        // A policy refusal is answered as git understands it (git prints it);
        // authentication and limits as HTTP (git asks for credentials on a 401).
        Err(refusal) if is_git_refusal(refusal.reason) => {
            let hint = refusal.hint.unwrap_or_default();
            let what = match refusal.reason {
                DenyReason::GitWriteDenied => format!("pushing to {} is not allowed for this sandbox", git.full_name()),
                _ => format!("repository {} is not connected to this sandbox", git.full_name()),
            };
            let message = format!("{what} ({}); {hint}", refusal.reason.code());
            let body = match git.op {
                Op::InfoRefs => refusal::advertisement_error(git.service, &message),
                Op::Rpc => refusal::rpc_error(&message),
            };
            let content_type = match git.op {
                Op::InfoRefs => refusal::advertisement_type(git.service),
                Op::Rpc => refusal::result_type(git.service),
            };
            rec.rule = refusal.rule;
            return in_git_terms(&mut rec, refusal.reason, &hint, &content_type, body);
        }
        Err(refusal) => return door::refuse(&mut rec, refusal, entry),
    };
    let (identity, hold) = (authorized.identity, Arc::new(authorized.hold));
    let head =
        crate::door::bodies::charge_head(&hold, Dir::Up, crate::door::bodies::request_line_len(&req), req.headers());
    if let Err(refusal) = head {
        return door::refuse(&mut rec, refusal, entry);
    }

    let (parts, ()) = req.into_parts();
    let idle = gh.idle_timeout;
    let push = git.service.is_write() && git.op == Op::Rpc;
    // Every value is checked (all are forwarded): git never compresses a push, and a
    // coding the gateway did not read would hide the command list it judged.
    if push
        && parts
            .headers
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return finish(&mut rec, DenyReason::BadRequest, None, "compressed push bodies are not supported", entry);
    }
    let Some(body) = body.take() else {
        return finish(&mut rec, DenyReason::BadRequest, None, "the request's body is gone", entry);
    };
    // A server that ignores a GET's body would read it as a request of its own, sent
    // with the gateway's GitHub credential and judged by no rule.
    if git.op == Op::InfoRefs && !http_body::Body::is_end_stream(&body) {
        let hint = "a GET or HEAD request with a body is not sent on: upstreams disagree on its framing";
        return finish(&mut rec, DenyReason::BadRequest, None, hint, entry);
    }
    let bytes_up = Arc::new(AtomicU64::new(0));
    let mut refs: Vec<Subject> = Vec::new();
    let body: ProxyBody = if push {
        let (head, rest, commands) = match hold.registration().unless_ended(read_commands(body, idle)).await {
            Some(Ok(x)) => x,
            Some(Err(msg)) => return finish(&mut rec, DenyReason::BadRequest, None, &msg, entry),
            None => return finish(&mut rec, DenyReason::Revoked, None, ENDED_HINT, entry),
        };
        // Every ref is judged; one refused ref refuses the whole push, and each refused
        // ref is named in the report git prints.
        let mut verdicts: Vec<(String, Option<String>)> = Vec::with_capacity(commands.updates().len());
        let mut first_refusal: Option<(String, String)> = None;
        for u in commands.updates() {
            let access = GitAccess::Ref { name: u.refname.clone(), delete: u.is_delete() };
            let subject = Subject::Git { repo: git.full_name(), access };
            let d = policy::decide(&identity.policy, &subject, identity.repos.as_deref());
            let Some(reason) = d.reason() else {
                verdicts.push((u.refname.clone(), None));
                refs.push(subject);
                continue;
            };
            let hint = policy::hint(&identity.policy, reason, &subject, &d).unwrap_or_default();
            verdicts.push((u.refname.clone(), Some(format!("{}: {hint}", DenyReason::GitRefDenied.code()))));
            first_refusal.get_or_insert((u.refname.clone(), hint));
        }
        if let Some((refname, hint)) = first_refusal {
            rec.rule = Some(refname.into());
            drain(rest, idle).await;
            let (body, content_type) =
                if commands.has_capability("report-status") || commands.has_capability("report-status-v2") {
                    let sideband = commands.has_capability("side-band-64k") || commands.has_capability("side-band");
                    (refusal::report_status(&verdicts, sideband), refusal::result_type(git.service))
                } else {
                    let message = format!("{}: {hint}", DenyReason::GitRefDenied.code());
                    (refusal::rpc_error(&message), refusal::result_type(git.service))
                };
            return in_git_terms(&mut rec, DenyReason::GitRefDenied, &hint, &content_type, body);
        }
        let counted = Counting::new(Prefixed { head: Some(head), rest }, bytes_up.clone());
        // The refs are held too: a reload that narrows git.push ends the push.
        hold.registration().hold_also(refs);
        Revocable::new(IdleBody::new(counted, idle), hold.clone(), Dir::Up).boxed_unsync()
    } else {
        Revocable::new(IdleBody::new(Counting::new(body, bytes_up.clone()), idle), hold.clone(), Dir::Up).boxed_unsync()
    };
    if hold.registration().is_ended() {
        return finish(&mut rec, DenyReason::Revoked, None, ENDED_HINT, entry);
    }

    let perm = if write { Permission::Write } else { Permission::Read };
    let token = match route.credentials.token(&identity.sandbox, &git.owner, &git.repo, perm).await {
        Ok(t) => t,
        Err(e @ super::credentials::CredError::TooManyMints(_)) => {
            let hint = format!("{e} (github.sandbox_mints_per_minute)");
            return finish(&mut rec, DenyReason::LimitExceeded, None, &hint, entry);
        }
        Err(e) => {
            tracing::warn!(error = %super::credentials::redact(&e.to_string()), "no GitHub credential for a git request");
            return finish(
                &mut rec,
                DenyReason::UpstreamUnreachable,
                Some(StatusCode::BAD_GATEWAY),
                "the gateway could not obtain a GitHub credential for this repository",
                entry,
            );
        }
    };

    let uri = format!("{}{}", gh.web_url.to_string().trim_end_matches('/'), git.upstream_path());
    let mut up = Request::builder().method(parts.method.clone()).uri(uri);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{}", token.expose()));
    if let Some(h) = up.headers_mut() {
        copy_git_headers(&parts.headers, h);
        if let Ok(v) = HeaderValue::from_str(&format!("Basic {basic}")) {
            let mut v = v;
            v.set_sensitive(true);
            h.insert(header::AUTHORIZATION, v);
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
            .unless_ended(crate::https_client::send(&route.clients, &identity.sandbox, up, timeout, "GitHub"))
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
        Some(Err((reason, detail))) => return finish(&mut rec, reason, None, &detail, entry),
        None => return finish(&mut rec, DenyReason::Revoked, None, ENDED_HINT, entry),
    };
    rec.upstream_addr = resp.extensions().get::<UpstreamAddr>().map(|a| a.0);
    if is_credential_refusal(resp.status()) {
        let detail = format!("GitHub refused the gateway's credential ({})", resp.status());
        return finish(&mut rec, DenyReason::UpstreamUnreachable, Some(StatusCode::BAD_GATEWAY), &detail, entry);
    }
    rec.status = resp.status().as_u16();
    let (mut parts, body) = resp.into_parts();
    strip_upstream_response(&mut parts, false);
    for h in [header::SET_COOKIE, header::WWW_AUTHENTICATE] {
        parts.headers.remove(h);
    }
    // The token never goes back in a head (a `Location` that carries it, an echoed
    // header), nor does the upstream's own reason phrase, which is not redacted.
    // Bodies (packs) are not scanned: the upstream is GitHub's, not the sandbox's.
    parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    for form in token_forms(token.expose(), &basic) {
        crate::redact::headers(&mut parts.headers, &form);
    }
    let body = Revocable::new(IdleBody::new(Trailers::from_upstream(body), idle), hold.clone(), Dir::Down);
    let body = LoggedBody::new(body, bytes_up, rec, hold);
    Response::from_parts(parts, body.boxed_unsync())
}

/// The spellings of the injected token an echoing upstream could hand back in a head:
/// the token, its Basic value (`basic`, with and without `Basic `), base64 of the
/// token alone, each base64 form without its `=` padding too, and each of those as
/// [`crate::redact::echo_forms`] escapes it (a URL-encoded `Location`, say).
fn token_forms(token: &str, basic: &str) -> Vec<String> {
    let bare = base64::engine::general_purpose::STANDARD.encode(token);
    let mut plain = vec![token.to_string(), format!("Basic {basic}")];
    for b64 in [basic, bare.as_str()] {
        plain.push(b64.to_string());
        plain.push(b64.trim_end_matches('=').to_string());
    }
    let mut forms: Vec<String> = Vec::new();
    for p in plain {
        for f in crate::redact::echo_forms(&p) {
            if !forms.contains(&f) {
                forms.push(f);
            }
        }
    }
    forms
}

/// Refusals the policy makes about a repository (git shows them as the server's).
fn is_git_refusal(reason: DenyReason) -> bool {
    matches!(reason, DenyReason::RepoNotConnected | DenyReason::GitWriteDenied)
}

/// Headers a git client needs upstream; everything else (credentials, cookies,
/// hop-by-hop) stays behind.
fn copy_git_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for name in [
        "content-type",
        "content-encoding",
        "accept",
        "accept-encoding",
        "git-protocol",
        "user-agent",
        "accept-language",
    ] {
        for v in from.get_all(name) {
            to.append(name, v.clone());
        }
    }
}

/// Reads the push command list (through its flush packet) off the front of `body`,
/// bounded; returns it, the rest of the body unread, and the parsed commands.
async fn read_commands(
    mut body: Incoming,
    idle: Duration,
) -> Result<(Bytes, Incoming, pktline::CommandReader), String> {
    let mut head = BytesMut::new();
    let mut reader = pktline::CommandReader::default();
    loop {
        // Resumes where the last frame's bytes ended: each byte is parsed once.
        match reader.advance(&head) {
            // The bytes after the command list stay with the head: they are sent first.
            Ok(Some(_)) => return Ok((head.freeze(), body, reader)),
            Ok(None) => {}
            Err(e) => return Err(format!("push command list: {e}")),
        }
        if head.len() > MAX_COMMANDS_BYTES {
            return Err("push command list too long".into());
        }
        match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    head.extend_from_slice(&data);
                }
            }
            Ok(Some(Err(e))) => return Err(format!("push body: {e}")),
            Ok(None) => return Err("push body ended inside the command list".into()),
            Err(_) => return Err("push body stalled".into()),
        }
    }
}

/// Records a git refusal and answers it as git understands it: `200` with a
/// smart-HTTP body (an `ERR` line or a report-status) that git prints, and the deny
/// reason in `X-Egress-Deny-Reason` and `Proxy-Status` as everywhere else.
fn in_git_terms(
    rec: &mut AccessRecord,
    reason: DenyReason,
    hint: &str,
    content_type: &str,
    body: Bytes,
) -> Response<ProxyBody> {
    let mut resp = Response::new(respond::full(body));
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(respond::DENY_REASON_HEADER, HeaderValue::from_static(reason.code()));
    let explanation = respond::explain(reason, Some(hint));
    if let Ok(v) = HeaderValue::from_str(&format!("egress-gateway; error=http_request_denied; details={explanation:?}"))
    {
        h.insert(respond::PROXY_STATUS, v);
    }
    let rule = rec.rule.clone();
    record::recorded(rec, reason, rule, resp)
}

/// `head`, then the rest of the body.
struct Prefixed {
    head: Option<Bytes>,
    rest: Incoming,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(h) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(h))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }
}
