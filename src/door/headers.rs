//! Header hygiene every handler applies: hop-by-hop headers (and those `Connection`
//! names) never cross the gateway.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOPS: usize = 9;

/// Typed names: removing by a standard name hashes no string. A `static`, not a
/// `const`: a const array of names would be built and dropped at every use.
static HOP_BY_HOP: [HeaderName; HOPS] = [
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

/// The request's headers as a request rule sees them: lower-case names, values as
/// text; never the proxy credentials, nor a field that is not sent on.
pub fn rule_headers(h: &HeaderMap) -> Vec<(String, String)> {
    // Hop-by-hop headers, and any the client nominates in `Connection`, are not sent
    // on: a rule must not match on them.
    let nominated: Vec<String> =
        connection_tokens(h).map(|t| String::from_utf8_lossy(t).to_ascii_lowercase()).collect();
    h.iter()
        .filter(|(k, _)| {
            hop_by_hop_index(k.as_str()).is_none()
                && !GATEWAY_ONLY.contains(&k.as_str())
                && !is_credential_lookalike(k.as_str().as_bytes())
                && !nominated.iter().any(|n| n == k.as_str())
        })
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect()
}

/// An upgrade to WebSocket only. Where requests are judged one by one (inspected
/// hosts), an upgrade to `h2c` or another protocol would be an unjudged pipe.
pub fn is_websocket_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::UPGRADE).iter().all(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// Where each request to a host is judged by request rules (an inspected host, over
/// TLS or plain HTTP), what may not be sent on, and why: an upgrade to anything but
/// WebSocket (an unjudged pipe), and a GET or HEAD with a body (an upstream that
/// ignores it would read the body as a second request no rule judged).
pub fn unjudged_framing(method: &http::Method, h: &HeaderMap, has_body: bool) -> Option<&'static str> {
    if is_upgrade(h) && !is_websocket_upgrade(h) {
        return Some("only WebSocket upgrades are relayed to an inspected host");
    }
    // An upgrade keeps its connection for the upgraded protocol, or, answered without
    // one, for the next request: a body an upstream ignored would begin that request.
    if is_upgrade(h) && has_body {
        return Some("an upgrade request with a body is not sent to an inspected host");
    }
    if h.keys().any(|k| OVERRIDE_FIELDS.iter().any(|o| same_field(k.as_str().as_bytes(), o.as_bytes()))) {
        return Some(
            "a method or URL override field (X-HTTP-Method-Override, X-Original-URL...) is not sent to an \
             inspected host: an upstream that honours it would run what no rule judged",
        );
    }
    // In any case: the rules judge `get` as GET, and some servers run it as one.
    let m = method.as_str();
    if (m.eq_ignore_ascii_case("GET") || m.eq_ignore_ascii_case("HEAD")) && has_body {
        return Some("a GET or HEAD request with a body is not sent on: upstreams disagree on its framing");
    }
    None
}

/// Fields with which some upstreams run another method or path than the request
/// line's: never sent where the gateway judged the request line.
pub const OVERRIDE_FIELDS: [&str; 10] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-rewrite-url",
    "x-original-method",
    "x-original-uri",
    "x-forwarded-uri",
    "x-forwarded-prefix",
    "x-envoy-original-path",
];

pub fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE) && connection_tokens(h).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
}

/// The names `Connection` lists, as bytes: a value with a byte that is not visible
/// ASCII (`x-foo, \xff`) still nominates the names it holds.
fn connection_tokens(h: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    list_elements(h, header::CONNECTION)
}

/// The elements of every `name` field's comma-separated list, in order, trimmed; empty
/// ones skipped.
fn list_elements(h: &HeaderMap, name: HeaderName) -> impl Iterator<Item = &[u8]> {
    h.get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Removes hop-by-hop headers, including those named in `Connection`. For an upgrade,
/// `Upgrade` and `Connection: upgrade` are kept so the upstream sees the handshake. A
/// message that came chunked loses its `Content-Length` too (RFC 9112, 6.3: the
/// transfer coding decides its length, and it is sent on with the gateway's own
/// framing, which a stale length would cut short).
pub fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    // One pass over the head's names finds which are here (most heads carry none, or
    // only `Proxy-Authorization`): a lookup per name would hash nine names each time.
    let mut found = [false; HOPS];
    for k in h.keys() {
        if let Some(i) = hop_by_hop_index(k.as_str()) {
            found[i] = true;
        }
    }
    let has = |name: &str| hop_by_hop_index(name).is_some_and(|i| found[i]);
    if has("transfer-encoding") {
        h.remove(header::CONTENT_LENGTH);
    }
    if has("connection") {
        let named: Vec<HeaderName> = connection_tokens(h)
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .filter(|n| !(keep_upgrade && n == header::UPGRADE))
            .collect();
        for n in named {
            h.remove(n);
        }
    }
    let upgrade = if keep_upgrade && has("upgrade") { h.get(header::UPGRADE).cloned() } else { None };
    for (n, _) in HOP_BY_HOP.iter().zip(found).filter(|(_, f)| *f) {
        h.remove(n);
    }
    if let Some(u) = upgrade {
        h.insert(header::UPGRADE, u);
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The transfer codings a message's `Transfer-Encoding` lists, in order, across all
/// its lines.
fn transfer_codings(h: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    list_elements(h, header::TRANSFER_ENCODING)
}

/// Why a request's `Transfer-Encoding` cannot be sent on, if it cannot: anything but
/// `chunked` alone. The gateway takes the chunked framing off and frames the body
/// again itself, so a coding beneath it (`gzip, chunked`) would reach the upstream
/// unannounced, and `chunked` applied twice would be read twice. Clients compress a
/// body with `Content-Encoding`, which passes untouched.
pub fn unsupported_transfer_coding(h: &HeaderMap) -> Option<&'static str> {
    let mut codings = transfer_codings(h);
    match (codings.next(), codings.next()) {
        (None, _) => None,
        (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => None,
        _ => Some(
            "Transfer-Encoding other than chunked alone is not supported: send a compressed body with \
             Content-Encoding",
        ),
    }
}

/// Where `name` (lower case, as a `HeaderMap` holds it) is in [`HOP_BY_HOP`]: a match
/// on the text, which compiles to a length switch, where comparing typed names would
/// take nine calls per field.
fn hop_by_hop_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "proxy-connection" => 1,
        "keep-alive" => 2,
        "proxy-authorization" => 3,
        "proxy-authenticate" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        _ => return None,
    })
}

/// Fields only the gateway writes (on its refusals and budget answers).
const GATEWAY_ONLY: [&str; 3] =
    [super::respond::DENY_REASON_HEADER, super::respond::PROXY_STATUS, super::respond::BUDGET_HEADER];

/// Prepares an upstream response's head for the client: hop-by-hop headers go (as in
/// `strip_hop_by_hop`), and so do the fields the gateway writes on its own refusals
/// and the upstream's reason phrase (the gateway's refusals explain themselves there),
/// so an upstream cannot pass its answer off as the gateway's (or have a gRPC call's
/// answer rewritten as a refusal). Its trailers go through `strip_gateway_fields`.
pub fn strip_upstream_response(parts: &mut http::response::Parts, keep_upgrade: bool) {
    // `Trailer` is end to end (RFC 9110, 6.6.2; RFC 2616 listed it among hop-by-hop
    // fields by an erratum), and hyper writes only the trailer fields it declares.
    let declared: Vec<HeaderValue> = parts.headers.get_all(header::TRAILER).iter().cloned().collect();
    strip_hop_by_hop(&mut parts.headers, keep_upgrade);
    strip_gateway_fields(&mut parts.headers);
    for v in declared {
        parts.headers.append(header::TRAILER, v);
    }
    // The gateway refuses only with standard statuses: an upstream's own status
    // without a standard phrase keeps its phrase (else the client would read
    // `<none>`), and cannot be taken for a refusal.
    if parts.status.canonical_reason().is_some() {
        parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    }
    // The gateway speaks HTTP/1.1 (RFC 9110, 6.2: an intermediary sends its own
    // version): an HTTP/1.0 upstream's version is not the client's business, and hyper
    // answers an HTTP/1.0 client in HTTP/1.0 whatever this says.
    parts.version = http::Version::HTTP_11;
    single_content_length(&mut parts.headers);
}

/// `Content-Length: 5, 5` (a list of one repeated value, which hyper framed the body
/// by) as `Content-Length: 5` (RFC 9112, 6.3): clients such as Python's `http.client`
/// read a list as no length, and waited for the connection to close.
/// The same for the value repeated on several field lines: hyper's server refuses to
/// write those on an answer without a body (a `HEAD`'s), and the client got nothing.
/// On an answer with no body (a `HEAD`'s, a `304`), where hyper checked nothing, values
/// that disagree or are no number are dropped: they frame nothing, and curl refuses an
/// answer that carries one.
fn single_content_length(h: &mut HeaderMap) {
    let mut values = h.get_all(header::CONTENT_LENGTH).iter();
    let Some(v) = values.next() else { return };
    if values.next().is_none() && !v.is_empty() && v.as_bytes().iter().all(u8::is_ascii_digit) {
        return;
    }
    let first = v.as_bytes().split(|&b| b == b',').next().unwrap_or_default().trim_ascii();
    let same = h
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .all(|n| n.trim_ascii() == first);
    match HeaderValue::from_bytes(first) {
        Ok(one) if same && !first.is_empty() && first.iter().all(u8::is_ascii_digit) => {
            h.insert(header::CONTENT_LENGTH, one);
        }
        _ => {
            h.remove(header::CONTENT_LENGTH);
        }
    }
}

/// Prepares a client's request head for the upstream: hop-by-hop headers go (as in
/// `strip_hop_by_hop`), and so do the fields only the gateway writes, which an
/// upstream could otherwise read as the gateway's word.
pub fn strip_client_request(h: &mut HeaderMap, keep_upgrade: bool) {
    strip_hop_by_hop(h, keep_upgrade);
    // One pass finds whether any is here (almost never).
    let never = |name: &[u8]| is_gateway_only(name) || is_credential_lookalike(name);
    if h.keys().any(|k| never(k.as_str().as_bytes())) {
        let found: Vec<HeaderName> = h.keys().filter(|k| never(k.as_str().as_bytes())).cloned().collect();
        for name in found {
            h.remove(name);
        }
    }
}

/// Spellings of `Proxy-Authorization` that are not it, and so are not hop-by-hop to
/// hyper: `Proxy_Authorization` (which CGI and WSGI backends read as the real one) and
/// `X-Proxy-Authorization`. A client that puts its gateway token there meant it for
/// the gateway; it never goes on to an origin.
const CREDENTIAL_LOOKALIKES: [&str; 2] = ["proxy-authorization", "x-proxy-authorization"];

fn is_credential_lookalike(name: &[u8]) -> bool {
    CREDENTIAL_LOOKALIKES.iter().any(|c| same_field(c.as_bytes(), name))
}

/// Whether `name` is one the client's `Connection` nominates as hop-by-hop, one only
/// the gateway writes, or a spelling of the proxy credentials': for handlers that copy a request's fields by name. `_`
/// and `-` are the same here, as CGI and WSGI backends read them (`proxy_status` is
/// their `Proxy-Status`).
pub fn never_forwarded(h: &HeaderMap, name: &str) -> bool {
    is_gateway_only(name.as_bytes())
        || is_credential_lookalike(name.as_bytes())
        || connection_tokens(h).any(|t| same_field(t, name.as_bytes()))
}

/// Whether two field names are the same, with `_`, `.` and `-` alike (PHP's built-in
/// server and CGI read `X.HTTP.Method.Override` as `X-HTTP-Method-Override`).
fn same_field(a: &[u8], b: &[u8]) -> bool {
    let fold = |c: u8| if c == b'_' || c == b'.' { b'-' } else { c.to_ascii_lowercase() };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| fold(*x) == fold(*y))
}

/// Whether `name` is one of [`GATEWAY_ONLY`], in any case and with `_` or `.` for `-`.
fn is_gateway_only(name: &[u8]) -> bool {
    GATEWAY_ONLY.iter().any(|g| same_field(g.as_bytes(), name))
}

/// Removes the fields only the gateway writes from a head or trailers, with `_` or `.` for
/// `-` too (`x_egress_deny_reason`), as CGI and WSGI backends read them.
pub fn strip_gateway_fields(h: &mut HeaderMap) {
    // Almost never present: look for them in one pass rather than hash each name.
    if h.keys().any(|k| is_gateway_only(k.as_str().as_bytes())) {
        let found: Vec<HeaderName> = h.keys().filter(|k| is_gateway_only(k.as_str().as_bytes())).cloned().collect();
        for name in found {
            h.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_content_length_is_one_value_and_a_bad_one_is_dropped() {
        let cl = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
            }
            single_content_length(&mut h);
            h.get_all(header::CONTENT_LENGTH).iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(cl(&["5"]), ["5"]);
        assert_eq!(cl(&["5, 5"]), ["5"]);
        assert_eq!(cl(&[" 5 ,5"]), ["5"]);
        assert_eq!(cl(&["5", "5"]), ["5"]);
        assert_eq!(cl(&["5", "5, 5"]), ["5"]);
        for bad in [&["5", "6"][..], &["abc", "5"], &["abc"], &[",5"], &["5,"], &["5", "5, 6"], &["+5, 5"]] {
            assert!(cl(bad).is_empty(), "{bad:?}");
        }
        assert!(cl(&[]).is_empty());
    }

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
    fn the_index_of_each_hop_by_hop_name_is_its_place_in_the_list() {
        for (i, n) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(n.as_str()), Some(i), "{n}");
        }
        assert_eq!(hop_by_hop_index("accept"), None);
    }

    #[test]
    fn a_name_in_connection_goes_even_beside_a_byte_that_is_not_ascii() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_bytes(b"x-foo, \xff").unwrap());
        h.insert("x-foo", HeaderValue::from_static("1"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("accept"));
    }

    fn with(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in fields {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_chunked_alone_is_a_request_coding_sent_on() {
        let te = "transfer-encoding";
        assert!(unsupported_transfer_coding(&with(&[])).is_none());
        assert!(unsupported_transfer_coding(&with(&[(te, "chunked")])).is_none());
        assert!(unsupported_transfer_coding(&with(&[(te, " Chunked ,")])).is_none());
        for refused in [
            &[(te, "gzip, chunked")][..],
            &[(te, "chunked, chunked")],
            &[(te, "gzip"), (te, "chunked")],
            &[(te, "chunked"), (te, "chunked")],
            &[(te, "identity")],
        ] {
            assert!(unsupported_transfer_coding(&with(refused)).is_some(), "{refused:?}");
        }
    }

    #[test]
    fn a_client_cannot_send_the_gateway_s_own_fields_on() {
        let mut h = with(&[
            ("proxy-status", "egress-gateway; error=http_request_denied"),
            ("x-egress-budget", "upload_bytes"),
            ("x-egress-deny-reason", "host_denied"),
            ("x_egress_deny_reason", "host_denied"),
            ("proxy_status", "egress-gateway"),
            ("x-egress_budget", "upload_bytes"),
            ("x.egress.deny.reason", "host_denied"),
            ("accept", "*/*"),
            ("x-egress-budgets", "a longer name"),
        ]);
        strip_client_request(&mut h, false);
        assert_eq!(h.len(), 2, "{h:?}");
        // Nor its proxy credentials, however the field is spelt.
        let mut h = with(&[
            ("proxy_authorization", "Basic c2J4OnRva2Vu"),
            ("x-proxy-authorization", "Basic c2J4OnRva2Vu"),
            ("x_proxy.authorization", "Basic c2J4OnRva2Vu"),
            ("proxy-authorizations", "kept: another name"),
            ("authorization", "Bearer the origin's own"),
        ]);
        assert!(rule_headers(&h).iter().all(|(k, _)| !k.contains("proxy_") && !k.starts_with("x-proxy")));
        strip_client_request(&mut h, false);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "proxy-authorizations"], "{h:?}");
        let h = with(&[("connection", "X-Foo, x_bar"), ("x-foo", "1")]);
        assert!(never_forwarded(&h, "x-foo") && never_forwarded(&h, "proxy-status"));
        assert!(never_forwarded(&h, "x_foo") && never_forwarded(&h, "x-bar") && never_forwarded(&h, "proxy_status"));
        assert!(!never_forwarded(&h, "accept"));
        assert!(never_forwarded(&h, "x-proxy-authorization") && never_forwarded(&h, "Proxy_Authorization"));
    }

    #[test]
    fn override_fields_and_bodies_on_get_are_refused_however_spelt() {
        let get = http::Method::from_bytes(b"get").unwrap();
        for (method, fields, body) in [
            (http::Method::POST, vec![("x.http.method.override", "DELETE")], false),
            (http::Method::POST, vec![("x_http_method", "DELETE")], false),
            (get.clone(), vec![], true),
            (http::Method::from_bytes(b"Head").unwrap(), vec![], true),
        ] {
            assert!(unjudged_framing(&method, &with(&fields), body).is_some(), "{method} {fields:?}");
        }
        assert!(unjudged_framing(&get, &with(&[("x-http-methods", "1")]), false).is_none());
        // A WebSocket handshake goes; with a body it does not.
        let ws = with(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(unjudged_framing(&get, &ws, false).is_none());
        assert!(unjudged_framing(&http::Method::OPTIONS, &ws, true).is_some());
    }

    #[test]
    fn gateway_only_names_are_lower_case_as_header_maps_hold_them() {
        for n in GATEWAY_ONLY {
            assert_eq!(n, n.to_ascii_lowercase(), "strip_gateway_fields compares names as text");
        }
    }

    #[test]
    fn a_chunked_message_loses_its_content_length() {
        let mut h = HeaderMap::new();
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("content-length", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        let mut h = HeaderMap::new();
        h.insert("content-length", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h["content-length"], "3", "a length alone stays");
    }

    #[test]
    fn only_websocket_is_a_websocket_upgrade() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade, HTTP2-Settings"));
        h.insert("upgrade", HeaderValue::from_static("h2c"));
        assert!(is_upgrade(&h) && !is_websocket_upgrade(&h));
        h.insert("upgrade", HeaderValue::from_static("WebSocket"));
        assert!(is_websocket_upgrade(&h));
        h.append("upgrade", HeaderValue::from_static("h2c"));
        assert!(!is_websocket_upgrade(&h), "every offered protocol must be WebSocket");
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

    #[test]
    fn an_upstream_cannot_speak_as_the_gateway() {
        let mut resp = http::Response::new(());
        for (k, v) in [
            ("X-Egress-Deny-Reason", "host_not_allowed"),
            ("proxy-status", "egress-gateway; error=destination_not_found"),
            ("x-egress-budget", "download_bytes"),
            ("content-type", "application/grpc"),
        ] {
            resp.headers_mut().insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_static(v));
        }
        resp.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(b"Forbidden (host_not_allowed: forged)"));
        let (mut parts, ()) = resp.into_parts();
        strip_upstream_response(&mut parts, false);
        assert_eq!(parts.headers.len(), 1, "{:?}", parts.headers);
        assert!(parts.extensions.get::<hyper::ext::ReasonPhrase>().is_none());

        let mut resp = http::Response::new(());
        *resp.status_mut() = http::StatusCode::from_u16(599).unwrap();
        resp.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(b"Network Connect Timeout"));
        let (mut parts, ()) = resp.into_parts();
        strip_upstream_response(&mut parts, false);
        assert!(parts.extensions.get::<hyper::ext::ReasonPhrase>().is_some(), "no standard phrase to fall back on");
    }
}
