//! `proxy.max_header_bytes` and `proxy.max_headers`, enforced where the refusal can
//! say why. hyper answers a head over its own limits with a bare `431` (no reason, no
//! hint); so hyper is given twice the configured byte limit ([`Hard`]) and a parsed
//! head over the configured one is refused by the gateway, as `431 request_too_large`
//! with the limit it broke. Only a head over twice the limit still gets hyper's bare
//! answer. The field count stays hyper's to enforce at the configured limit over
//! HTTP/1: hyper keeps up to 100 parsed fields on the stack, and a larger limit cost
//! every request a heap allocation (about 1,000 instructions for 200 fields).

use http::{HeaderMap, Method, Uri};

/// The limits handed to hyper's HTTP/1 server for configured `max_bytes` and
/// `max_fields`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hard {
    pub head_bytes: usize,
    pub fields: usize,
    /// hyper's read buffer: a head must fit in it (its default, about 408 KiB, would
    /// otherwise cut a larger configured limit short).
    pub buffer: usize,
}

/// hyper's own default read buffer limit (8 KiB plus 100 pages).
const HYPER_DEFAULT_BUFFER: usize = 8192 + 4096 * 100;

pub fn hard(max_bytes: usize, max_fields: usize) -> Hard {
    let head_bytes = max_bytes.saturating_mul(2);
    Hard { head_bytes, fields: max_fields, buffer: head_bytes.saturating_add(8192).max(HYPER_DEFAULT_BUFFER) }
}

/// A request head's size as parsed: the request line and each field line counted as
/// `name:value` (without optional whitespace, so never more than the bytes sent).
pub fn head_len(method: &Method, uri: &Uri, headers: &HeaderMap) -> usize {
    let target = uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len());
    // "METHOD TARGET HTTP/1.1\r\n", each "name:value\r\n", the final "\r\n".
    let fields: usize = headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 3).sum();
    method.as_str().len() + 1 + target + 11 + fields + 2
}

/// Why a parsed head breaks the configured limits, as the refusal's hint; `None`
/// within them. (Over HTTP/1, hyper has already refused a head with too many fields;
/// over HTTP/2 the count is held here.)
pub fn over(method: &Method, uri: &Uri, headers: &HeaderMap, max_bytes: usize, max_fields: usize) -> Option<String> {
    // `HeaderMap::len` counts every field line, repeated names included.
    if headers.len() > max_fields {
        return Some(format!(
            "the request has {} header fields, over the gateway's limit of {max_fields} (proxy.max_headers)",
            headers.len()
        ));
    }
    let len = head_len(method, uri, headers);
    (len > max_bytes).then(|| {
        format!(
            "the request head is {len} bytes, over the gateway's limit of {max_bytes} (proxy.max_header_bytes); \
             send fewer or shorter header fields (cookies, tokens)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_head_is_counted_as_sent_without_optional_whitespace() {
        let raw = "GET http://a.test/x?y HTTP/1.1\r\nhost:a.test\r\nx-long:vvvvvvvvvv\r\n\r\n";
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("a.test"));
        h.insert("x-long", HeaderValue::from_static("vvvvvvvvvv"));
        let uri: Uri = "http://a.test/x?y".parse().unwrap();
        assert_eq!(head_len(&Method::GET, &uri, &h), raw.len());
        let connect = "CONNECT a.test:443 HTTP/1.1\r\nhost:a.test\r\nx-long:vvvvvvvvvv\r\n\r\n";
        assert_eq!(head_len(&Method::CONNECT, &"a.test:443".parse().unwrap(), &h), connect.len());
    }

    #[test]
    fn each_limit_names_itself() {
        let uri: Uri = "http://a.test/".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_str(&"c".repeat(2000)).unwrap());
        assert_eq!(over(&Method::GET, &uri, &h, 4096, 10), None);
        let hint = over(&Method::GET, &uri, &h, 1024, 10).unwrap();
        assert!(hint.contains("over the gateway's limit of 1024 (proxy.max_header_bytes)"), "{hint}");
        for i in 0..11 {
            h.append("x-many", HeaderValue::from(i));
        }
        let hint = over(&Method::GET, &uri, &h, 1 << 20, 10).unwrap();
        assert!(hint.contains("12 header fields, over the gateway's limit of 10 (proxy.max_headers)"), "{hint}");
    }

    #[test]
    fn hyper_gets_twice_the_byte_limit_and_room_to_read_it() {
        assert_eq!(hard(32 * 1024, 100), Hard { head_bytes: 65536, fields: 100, buffer: HYPER_DEFAULT_BUFFER });
        let big = hard(1 << 20, 10_000);
        assert_eq!((big.head_bytes, big.fields, big.buffer), (2 << 20, 10_000, (2 << 20) + 8192));
    }
}
