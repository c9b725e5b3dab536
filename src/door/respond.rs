//! Local responses: denials (JSON body, `X-Egress-Deny-Reason`) and small helpers.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, PROXY_AUTHENTICATE};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};

use super::ProxyBody;
use crate::policy::DenyReason;

pub const DENY_REASON_HEADER: &str = "x-egress-deny-reason";
/// On a `429` for a spent budget: which one (`upload_bytes`, `new_hosts`...).
pub const BUDGET_HEADER: &str = "x-egress-budget";
pub const REALM: &str = "Basic realm=\"egress-gateway\"";

/// What a denial says about itself; every field is optional but `reason`.
#[derive(Debug, Default)]
pub struct Denial<'a> {
    pub target: Option<&'a str>,
    pub sandbox: Option<&'a str>,
    pub policy: Option<&'a str>,
    pub rule: Option<&'a str>,
    /// What to do instead, or the specific detail of a bad request.
    pub hint: Option<String>,
}

/// The HTTP status for a deny reason on the proxy port.
pub fn status_for(reason: DenyReason) -> StatusCode {
    match reason {
        DenyReason::AuthRequired | DenyReason::AuthInvalid | DenyReason::TokenExpired => {
            StatusCode::PROXY_AUTHENTICATION_REQUIRED
        }
        DenyReason::BadRequest => StatusCode::BAD_REQUEST,
        DenyReason::RequestTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        DenyReason::ResolveFailed
        | DenyReason::UpstreamUnreachable
        | DenyReason::UpstreamEncoding
        | DenyReason::UpstreamInvalid => StatusCode::BAD_GATEWAY,
        DenyReason::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        DenyReason::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::FORBIDDEN,
    }
}

/// The JSON body of a denial. `error` says it all in one line (the message, the
/// target, the code and the hint): clients that show one field of a JSON error body
/// (npm's family, yarn) show `error`.
pub fn body_json(reason: DenyReason, d: &Denial<'_>) -> String {
    let mut error = reason.message().to_string();
    if let Some(target) = d.target.filter(|t| !t.is_empty()) {
        error.push_str(": ");
        error.push_str(target);
    }
    error.push_str(" (");
    error.push_str(reason.code());
    error.push(')');
    if let Some(hint) = d.hint.as_deref().filter(|h| !h.is_empty()) {
        error.push_str("; ");
        error.push_str(hint);
    }
    // A hint may quote what the client sent (a `_method` value): clients print these
    // fields to terminals and logs, where control characters would forge lines or
    // escape sequences.
    let printable = |s: &str| s.chars().map(|c| if c.is_control() { '?' } else { c }).collect::<String>();
    serde_json::json!({
        "error": printable(&error),
        "reason": reason.code(),
        "target": d.target,
        "sandbox": d.sandbox,
        "policy": d.policy,
        "rule": d.rule,
        "hint": d.hint.as_deref().map(printable),
    })
    .to_string()
}

pub fn deny(reason: DenyReason, d: &Denial<'_>) -> Response<ProxyBody> {
    let status = status_for(reason);
    let mut resp = Response::new(full(body_json(reason, d)));
    *resp.status_mut() = status;
    // Most clients show the status line of a refused CONNECT, not its body: the reason
    // travels in the reason phrase too, and in Proxy-Status (RFC 9209).
    let explanation = explain(reason, d.hint.as_deref());
    rephrase(&mut resp, reason, d.hint.as_deref());
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(DENY_REASON_HEADER, HeaderValue::from_static(reason.code()));
    if let Ok(v) = HeaderValue::from_str(&proxy_status(reason, &explanation)) {
        h.insert(PROXY_STATUS, v);
    }
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        h.insert(PROXY_AUTHENTICATE, HeaderValue::from_static(REALM));
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

pub const PROXY_STATUS: &str = "proxy-status";

/// A gRPC request (over HTTP/2): a refusal is only shown to its caller in gRPC's own
/// terms ([`as_grpc`]). gRPC-Web (`application/grpc-web`) carries its status in the
/// body and is answered like any request.
pub fn is_grpc<B>(req: &http::Request<B>) -> bool {
    let ct = req.headers().get(CONTENT_TYPE).map(HeaderValue::as_bytes).unwrap_or_default();
    let grpc = ct.len() >= 16 && ct[..16].eq_ignore_ascii_case(b"application/grpc");
    let web = ct.len() >= 20 && ct[..20].eq_ignore_ascii_case(b"application/grpc-web");
    req.version() == http::Version::HTTP_2 && grpc && !web
}

/// The gRPC status code a refusal with this HTTP status maps to.
fn grpc_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        // UNAUTHENTICATED
        401 | 407 => "16",
        // PERMISSION_DENIED
        403 => "7",
        // RESOURCE_EXHAUSTED: a limit or a budget, not an outage to retry through
        429 => "8",
        // UNAVAILABLE
        502..=504 => "14",
        // INTERNAL, as gRPC maps any other HTTP error
        _ => "13",
    }
}

/// Rewrites a refusal as gRPC's "trailers-only" answer: `200`, `content-type:
/// application/grpc`, `grpc-status` (the refusal's status mapped) and `grpc-message`
/// (the reason code, its message and the hint, percent-encoded), with no body. A gRPC
/// client shows only these, never a body or a status line. The refusal's own headers
/// (`X-Egress-Deny-Reason`, `Proxy-Status`, `Retry-After`...) stay.
pub fn as_grpc(resp: Response<ProxyBody>) -> Response<ProxyBody> {
    let (mut parts, _body) = resp.into_parts();
    let message = parts
        .extensions
        .remove::<hyper::ext::ReasonPhrase>()
        .and_then(|p| {
            let p = String::from_utf8_lossy(p.as_bytes()).into_owned();
            let (_, rest) = p.split_once(" (")?;
            Some(rest.strip_suffix(')').unwrap_or(rest).to_string())
        })
        .unwrap_or_else(|| parts.status.canonical_reason().unwrap_or("refused").to_string());
    let mut encoded = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    let status = grpc_status(parts.status);
    parts.status = StatusCode::OK;
    let h = &mut parts.headers;
    h.remove(http::header::CONTENT_LENGTH);
    h.remove(PROXY_AUTHENTICATE);
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static(status));
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        h.insert("grpc-message", v);
    }
    Response::from_parts(parts, empty())
}

/// Sets the reason phrase of a denial for its (final) status: the canonical phrase,
/// then the explanation in parentheses.
pub fn rephrase<B>(resp: &mut Response<B>, reason: DenyReason, hint: Option<&str>) {
    let canonical = resp.status().canonical_reason().unwrap_or("Refused");
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(format!("{canonical} ({})", explain(reason, hint))) {
        resp.extensions_mut().insert(phrase);
    }
}

/// Longest hint carried in the status line and `Proxy-Status`.
const MAX_HINT: usize = 240;

/// `code: message; hint`, in visible ASCII and bounded: what a client that shows only
/// the status line shows.
pub fn explain(reason: DenyReason, hint: Option<&str>) -> String {
    let mut out = format!("{}: {}", reason.code(), reason.message());
    if let Some(hint) = hint.filter(|h| !h.is_empty()) {
        out.push_str("; ");
        out.extend(hint.chars().take(MAX_HINT).map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }));
    }
    out
}

/// The RFC 9209 `Proxy-Status` value: the proxy's name, the error type that fits the
/// reason, and the explanation as details.
pub fn proxy_status(reason: DenyReason, explanation: &str) -> String {
    let error = match reason {
        DenyReason::AddressDenied => "destination_ip_prohibited",
        DenyReason::ResolveFailed => "dns_error",
        DenyReason::UpstreamUnreachable => "destination_unavailable",
        DenyReason::UpstreamTimeout => "connection_timeout",
        DenyReason::BadRequest => "http_request_error",
        DenyReason::RequestTooLarge => "http_request_error",
        DenyReason::UpstreamEncoding => "http_response_content_coding_error",
        DenyReason::UpstreamInvalid => "http_protocol_error",
        _ => "http_request_denied",
    };
    let details: String = explanation
        .chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    format!("egress-gateway; error={error}; details=\"{details}\"")
}

pub fn full(s: impl Into<Bytes>) -> ProxyBody {
    Full::new(s.into()).map_err(|never| match never {}).boxed_unsync()
}

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A local response (a refusal) as the HTTP/1.1 bytes hyper would write: status line
/// with its reason phrase, the headers, `content-length`, `date` and the body. For an
/// answer written on the socket directly (the CONNECT fast path).
pub async fn serialize(resp: Response<ProxyBody>) -> Vec<u8> {
    use std::io::Write;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let phrase = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    let phrase = phrase.map_or(parts.status.canonical_reason().unwrap_or("").as_bytes(), |p| p.as_bytes());
    let mut out = Vec::with_capacity(512 + body.len());
    let _ = write!(out, "HTTP/1.1 {} ", parts.status.as_str());
    out.extend_from_slice(phrase);
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == http::header::CONTENT_LENGTH || name == http::header::DATE {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let _ = write!(out, "content-length: {}\r\ndate: {date}\r\n\r\n", body.len());
    out.extend_from_slice(&body);
    out
}

/// The bytes written to a connection refused for the global connection limit, before
/// any of its request is read.
pub fn over_capacity_bytes() -> Vec<u8> {
    let body = body_json(
        DenyReason::LimitExceeded,
        &Denial { hint: Some("the gateway is at proxy.max_connections; retry later".into()), ..Denial::default() },
    );
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n{DENY_REASON_HEADER}: limit_exceeded\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The bytes written to a connection refused because its address already holds
/// `proxy.max_unauthenticated_per_client` connections that have not authenticated.
pub fn over_client_share_bytes() -> Vec<u8> {
    let body = body_json(
        DenyReason::LimitExceeded,
        &Denial {
            hint: Some(
                "this address holds proxy.max_unauthenticated_per_client connections that have not \
                 authenticated; send credentials on them, or retry later"
                    .into(),
            ),
            ..Denial::default()
        },
    );
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n{DENY_REASON_HEADER}: limit_exceeded\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_a_status_and_body() {
        for r in DenyReason::ALL {
            let resp = deny(r, &Denial::default());
            assert!(resp.status().is_client_error() || resp.status().is_server_error());
            assert_eq!(resp.headers()[DENY_REASON_HEADER], r.code());
            let v: serde_json::Value = serde_json::from_str(&body_json(r, &Denial::default())).unwrap();
            assert_eq!(v["reason"], r.code());
        }
        assert_eq!(deny(DenyReason::AuthRequired, &Denial::default()).headers()[PROXY_AUTHENTICATE], REALM);
    }

    #[test]
    fn the_error_field_says_it_all_for_clients_that_show_only_it() {
        let d = Denial { target: Some("nope.test:443"), hint: Some("add it".into()), ..Denial::default() };
        let v: serde_json::Value = serde_json::from_str(&body_json(DenyReason::HostNotAllowed, &d)).unwrap();
        let message = DenyReason::HostNotAllowed.message();
        assert_eq!(v["error"], format!("{message}: nope.test:443 (host_not_allowed); add it"));
        let v: serde_json::Value =
            serde_json::from_str(&body_json(DenyReason::BadRequest, &Denial::default())).unwrap();
        assert_eq!(v["error"], format!("{} (bad_request)", DenyReason::BadRequest.message()));
        // Nor any control character a hint quotes.
        let d = Denial { hint: Some("_method=DEL\r\nX-Forged: 1\u{1b}[31m".into()), ..Denial::default() };
        let v: serde_json::Value = serde_json::from_str(&body_json(DenyReason::RequestNotAllowed, &d)).unwrap();
        for field in ["error", "hint"] {
            let text = v[field].as_str().unwrap();
            assert!(!text.chars().any(char::is_control) && text.contains("DEL??X-Forged: 1?[31m"), "{text}");
        }
    }

    #[tokio::test]
    async fn a_serialized_refusal_is_what_hyper_would_write() {
        let resp = deny(DenyReason::HostNotAllowed, &Denial { hint: Some("add it".into()), ..Denial::default() });
        let bytes = serialize(resp).await;
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        assert_eq!(
            lines.next(),
            Some("HTTP/1.1 403 Forbidden (host_not_allowed: destination host is not in the sandbox policy; add it)")
        );
        let fields: Vec<(&str, &str)> = lines.map(|l| l.split_once(": ").unwrap()).collect();
        let field = |n: &str| fields.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(field(DENY_REASON_HEADER), Some("host_not_allowed"));
        assert_eq!(field("content-length"), Some(body.len().to_string().as_str()));
        assert!(field("date").is_some());
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["reason"], "host_not_allowed");
    }

    #[test]
    fn grpc_calls_get_their_refusals_as_a_grpc_status() {
        let req =
            |ct: &str, v: http::Version| http::Request::builder().version(v).header(CONTENT_TYPE, ct).body(()).unwrap();
        assert!(is_grpc(&req("application/grpc", http::Version::HTTP_2)));
        assert!(is_grpc(&req("Application/GRPC+proto", http::Version::HTTP_2)));
        assert!(!is_grpc(&req("application/grpc-web+proto", http::Version::HTTP_2)));
        assert!(!is_grpc(&req("application/grpc", http::Version::HTTP_11)));
        assert!(!is_grpc(&req("application/json", http::Version::HTTP_2)));

        let d = Denial { hint: Some("100% sure: \u{e9}".into()), ..Default::default() };
        let resp = as_grpc(deny(DenyReason::LimitExceeded, &d));
        assert_eq!(resp.status(), StatusCode::OK);
        let h = resp.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h["grpc-status"], "8", "a limit is RESOURCE_EXHAUSTED");
        assert_eq!(h[DENY_REASON_HEADER], "limit_exceeded");
        assert!(h.contains_key(http::header::RETRY_AFTER));
        let msg = h["grpc-message"].to_str().unwrap();
        assert!(msg.starts_with("limit_exceeded: "), "{msg}");
        assert!(msg.ends_with("100%25 sure: ?"), "percent-encoded, non-ASCII already replaced: {msg}");
        assert!(http_body::Body::is_end_stream(resp.body()), "trailers-only: no body");
        let auth = as_grpc(deny(DenyReason::AuthRequired, &Denial::default()));
        assert_eq!(auth.headers()["grpc-status"], "16");
        assert!(!auth.headers().contains_key(PROXY_AUTHENTICATE));
    }
}
