//! The name a plain-HTTP client asks for: the `Host` header of its first request,
//! read (bounded) and kept, to be replayed upstream untouched.

use std::time::Duration;

use tokio::net::TcpStream;

use super::ReadError;

/// Reads the first request head (at most `max_bytes`, `max_headers` fields); returns
/// the `Host` value and every byte read (the head and whatever followed it).
pub async fn read(
    stream: &mut TcpStream,
    timeout: Duration,
    max_bytes: usize,
    max_headers: usize,
) -> Result<(String, String, Vec<u8>), ReadError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    loop {
        super::read_more(stream, &mut buf, deadline).await?;
        let mut headers = vec![httparse::EMPTY_HEADER; max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or_default().to_string();
                let mut hosts = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host"));
                let host = match (hosts.next(), hosts.next()) {
                    (Some(h), None) => std::str::from_utf8(h.value)
                        .map_err(|_| ReadError::Malformed("the Host header is not text".into()))?
                        .trim()
                        .to_string(),
                    (None, _) => return Err(ReadError::Malformed("the request has no Host header".into())),
                    (Some(_), Some(_)) => return Err(ReadError::Malformed("the request has two Host headers".into())),
                };
                // The first request must name one host: a CONNECT, or an absolute-form
                // target whose authority is not the Host, would be routed by the origin
                // to a host the gateway did not decide.
                if method.eq_ignore_ascii_case("CONNECT") {
                    return Err(ReadError::Malformed(
                        "CONNECT is for the proxy port, not a transparent listener".into(),
                    ));
                }
                names_only(req.path.unwrap_or_default(), &host).map_err(|e| ReadError::Malformed(e.into()))?;
                return Ok((method, host, buf));
            }
            Ok(httparse::Status::Partial) if buf.len() >= max_bytes => return Err(ReadError::TooLarge),
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(ReadError::TooLarge),
            Err(e) => return Err(ReadError::Malformed(format!("not an HTTP request: {e}"))),
        }
        if buf.len() >= max_bytes {
            return Err(ReadError::TooLarge);
        }
    }
}

/// A first request's target must name no host but `host`: origin-form (`/...`), `*`,
/// or an `http://` URL whose authority, parsed as strictly as a CONNECT target (no
/// userinfo, no `%`), is the same host. Any other spelling could be read by the
/// origin (or a proxy or CDN behind it) as another host than the one decided.
fn names_only(target: &str, host: &str) -> Result<(), &'static str> {
    if target.starts_with('/') || target == "*" {
        return Ok(());
    }
    const OTHER: &str = "the request line names another host than the Host header";
    let rest = target
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
        .and_then(|_| target.get(7..))
        .ok_or("the request target is neither a path nor an http:// URL")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    match (crate::addr::parse_authority(authority, Some(80)), crate::addr::parse_authority(host, Some(80))) {
        (Ok(named), Ok(decided)) if named.host == decided.host => Ok(()),
        _ => Err(OTHER),
    }
}

#[cfg(test)]
mod tests {
    use super::names_only;

    #[test]
    fn the_request_line_names_only_the_decided_host() {
        for ok in ["/x", "*", "http://origin.test/x", "HTTP://ORIGIN.test.:8080/x?y", "http://origin.test"] {
            assert_eq!(names_only(ok, "origin.test"), Ok(()), "{ok}");
        }
        for bad in [
            "http://origin.test:80@evil.test/x",
            "http://origin.test:@evil.test/x",
            "http://evil.test@origin.test/x",
            "http://evil.test/x",
            "http://origin.test%2eevil.test/",
            "https://origin.test/x",
            "origin.test/x",
            "http:/origin.test/x",
            "http://",
        ] {
            assert!(names_only(bad, "origin.test").is_err(), "{bad}");
        }
    }
}
