//! A first request whose target hyper would refuse with a bare `400` (no reason, no
//! body): a URL holding `"`, `<` or `>` unencoded, as Go's `net/http` and Python's
//! `urllib` send a query such as `?filter={"a":1}`. HTTP/1.1 does not allow these
//! bytes in a request target (RFC 9112 3.2, RFC 3986 2), and the gateway forwards no
//! target it did not parse, so such a request is refused either way; read here, from
//! the connection's first bytes, it is refused with the reason and the fix.
//!
//! Only a request without a body, whose head is complete in the first read: nothing
//! of it is forwarded and the connection closes after the answer, so this reading of
//! the head decides nothing but the wording of a refusal.

/// The method, the target and the hint for a first request to refuse here; `None`
/// for anything hyper parses (or that has a body, or is not a complete head).
pub fn refusal(bytes: &[u8]) -> Option<(String, String, String)> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut fields);
    if !matches!(req.parse(bytes), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    let (method, target) = (req.method?, req.path?);
    if method.eq_ignore_ascii_case("CONNECT") || target.parse::<http::Uri>().is_ok() {
        return None;
    }
    let bodied = req.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            || (h.name.eq_ignore_ascii_case("content-length") && h.value.iter().any(|&b| b != b'0'))
    });
    if bodied {
        return None;
    }
    Some((method.to_string(), target.to_string(), hint(target)))
}

/// What to tell the client: the bytes that need percent-encoding, when those are what
/// made the target unparseable.
fn hint(target: &str) -> String {
    let mut unencoded: Vec<char> = target
        .chars()
        .filter(|c| c.is_ascii_punctuation() && format!("/?{c}").parse::<http::uri::PathAndQuery>().is_err())
        .collect();
    unencoded.sort_unstable();
    unencoded.dedup();
    if unencoded.is_empty() {
        return "the request target is not a URL the gateway can forward".to_string();
    }
    let listed: Vec<String> = unencoded.iter().map(|c| format!("{c} as %{:02X}", u32::from(*c))).collect();
    format!(
        "the URL holds characters HTTP does not allow unencoded in a request target; percent-encode them ({})",
        listed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_to_encode_in_a_bodiless_request_only() {
        let get = b"GET http://api.test/q?filter={\"name\":\"x\"}&a=<b> HTTP/1.1\r\nHost: api.test\r\n\r\n";
        let (method, target, hint) = refusal(get).unwrap();
        assert_eq!((method.as_str(), target.as_str()), ("GET", "http://api.test/q?filter={\"name\":\"x\"}&a=<b>"));
        assert!(hint.contains("\" as %22, < as %3C, > as %3E"), "{hint}");
        // What hyper parses, a body, an unfinished head and CONNECT are left to hyper.
        for left in [
            &b"GET http://api.test/q?filter={a} HTTP/1.1\r\n\r\n"[..],
            b"POST http://api.test/q?a=\"b\" HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            b"POST http://api.test/q?a=\"b\" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET http://api.test/q?a=\"b\" HTTP/1.1\r\nHost: api",
            b"CONNECT \"x\":443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(refusal(left).is_none(), "{}", String::from_utf8_lossy(left));
        }
        // Content-Length: 0 is no body.
        assert!(refusal(b"GET http://a.test/?q=\"x\" HTTP/1.1\r\nContent-Length: 0\r\n\r\n").is_some());
    }
}
