//! The fast path for a connection's first request when it is a plain CONNECT: the
//! dispatcher reads the first bytes off the socket and the head is parsed in place, so
//! that the common case, a sandbox opening one tunnel per connection, costs no HTTP
//! server state at all (and no second read of the head).
//!
//! Only a head with nothing unusual about it is taken: method `CONNECT`, HTTP/1.0 or
//! 1.1, an authority-form target made of host characters, no body framing, upgrade
//! or expectation headers, all of it in the first read and within the proxy's header
//! limits. Anything else, or a head that has not fully arrived yet, goes to hyper with
//! the bytes read so far in front of the socket ([`crate::replayed::Replayed`]), and
//! hyper serves the connection exactly as it would have without this path (and
//! applies the limits and error answers).

use std::time::Duration;

use http::Version;
use tokio::net::TcpStream;

/// Bytes read for the first head; a longer head goes to hyper.
pub const FIRST_READ: usize = 2048;
/// Header fields parsed in place; more go to hyper (which applies `proxy.max_headers`).
const FIELDS: usize = 32;

/// A first request that is a plain CONNECT, borrowed from the first read's buffer.
#[derive(Debug)]
pub struct ConnectHead<'a> {
    pub target: &'a str,
    pub version: Version,
    /// The first `Proxy-Authorization` value, as hyper's `HeaderMap::get` would give.
    pub proxy_authorization: Option<&'a [u8]>,
    /// The connection closes after a refusal: HTTP/1.0 (as hyper does), or a
    /// `Connection: close` (`Proxy-Connection` is not looked at, as hyper does not).
    pub close: bool,
    /// Length of the head; bytes behind it are the client's first tunnel bytes.
    pub len: usize,
}

/// Waits (up to `timeout`) for the client's first bytes and reads them into `buf`;
/// `None` when the client closed or sent nothing in time, or the read failed (the
/// connection is then closed, as hyper would have).
pub async fn read_first(stream: &mut TcpStream, buf: &mut [u8], timeout: Duration) -> Option<usize> {
    use tokio::io::AsyncReadExt;
    match tokio::time::timeout(timeout, stream.read(buf)).await {
        Ok(Ok(n)) if n > 0 => Some(n),
        _ => None,
    }
}

/// The head in `bytes` when it is a complete, plain CONNECT within the limits.
pub fn parse(bytes: &[u8], max_header_bytes: usize, max_headers: usize) -> Option<ConnectHead<'_>> {
    // Cheap refusal of everything else before any parsing.
    if !bytes.starts_with(b"CONNECT ") {
        return None;
    }
    let mut fields = [httparse::EMPTY_HEADER; FIELDS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        _ => return None,
    };
    if len > max_header_bytes || req.headers.len() > max_headers {
        return None;
    }
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return None,
    };
    let target = req.path?;
    if target.is_empty() || target.len() > 512 || !target.bytes().all(host_byte) {
        return None;
    }
    let mut proxy_authorization = None;
    let mut close = version == Version::HTTP_10;
    for h in req.headers.iter() {
        let name = h.name;
        if ["content-length", "transfer-encoding", "upgrade", "expect"].iter().any(|n| name.eq_ignore_ascii_case(n)) {
            return None;
        }
        if name.eq_ignore_ascii_case("proxy-authorization") {
            proxy_authorization = proxy_authorization.or(Some(h.value));
        } else if name.eq_ignore_ascii_case("connection")
            && h.value.split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
        {
            close = true;
        }
    }
    Some(ConnectHead { target, version, proxy_authorization, close, len })
}

/// A byte of an authority-form target the fast path takes: host name and IP literal
/// characters and the port separator (anything else, such as userinfo, goes to hyper).
fn host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'[' | b']')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Option<ConnectHead<'_>> {
        parse(s.as_bytes(), 32 * 1024, 100)
    }

    #[test]
    fn a_plain_connect_is_taken() {
        let h = head(
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic eDp5\r\n\r\nrest",
        )
        .unwrap_or_else(|| panic!("not taken"));
        assert_eq!(h.target, "example.com:443");
        assert_eq!(h.version, Version::HTTP_11);
        assert_eq!(h.proxy_authorization, Some(&b"Basic eDp5"[..]));
        assert!(!h.close);
        assert_eq!(
            h.len,
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic eDp5\r\n\r\n"
                .len()
        );
        let v6 = head("CONNECT [::1]:443 HTTP/1.0\r\n\r\n").unwrap_or_else(|| panic!("not taken"));
        assert_eq!((v6.target, v6.close), ("[::1]:443", true));
        let ten = head("CONNECT a:1 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap_or_else(|| panic!("x"));
        assert!(ten.close, "HTTP/1.0 closes after a refusal");
        let proxy = head("CONNECT a:1 HTTP/1.1\r\nProxy-Connection: close\r\n\r\n").unwrap_or_else(|| panic!("x"));
        assert!(!proxy.close, "Proxy-Connection is not looked at");
        let closed =
            head("CONNECT a:1 HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n").unwrap_or_else(|| panic!("x"));
        assert!(closed.close);
    }

    #[test]
    fn the_first_proxy_authorization_counts() {
        let h = head("CONNECT a:1 HTTP/1.1\r\nProxy-Authorization: one\r\nProxy-Authorization: two\r\n\r\n")
            .unwrap_or_else(|| panic!("not taken"));
        assert_eq!(h.proxy_authorization, Some(&b"one"[..]));
    }

    #[test]
    fn anything_unusual_is_left_to_hyper() {
        for s in [
            "GET http://a/ HTTP/1.1\r\n\r\n",
            "CONNECT a:1 HTTP/1.1\r\nHost: a\r\n",  // not complete yet
            "CONNECT a:1 HTTP/2.0\r\n\r\n",         // httparse refuses it
            "CONNECT user@a:1 HTTP/1.1\r\n\r\n",    // userinfo
            "CONNECT http://a:1/ HTTP/1.1\r\n\r\n", // not authority-form
            "CONNECT a%2e:1 HTTP/1.1\r\n\r\n",      // escapes
            "CONNECT a:1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
            "CONNECT a:1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "CONNECT a:1 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "CONNECT a:1 HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
            "CONNECT a:1 HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "connect a:1 HTTP/1.1\r\n\r\n",
        ] {
            assert!(head(s).is_none(), "{s:?} was taken");
        }
        // Over the configured limits: hyper answers them.
        let s = "CONNECT a:1 HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n";
        assert!(parse(s.as_bytes(), 32 * 1024, 1).is_none());
        assert!(parse(s.as_bytes(), 10, 100).is_none());
        let many: String = (0..FIELDS + 1).map(|i| format!("X-{i}: v\r\n")).collect();
        assert!(head(&format!("CONNECT a:1 HTTP/1.1\r\n{many}\r\n")).is_none());
    }
}
