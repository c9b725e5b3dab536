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
                let target = req.path.unwrap_or_default();
                if let Some((_, rest)) = target.split_once("://") {
                    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
                    let name =
                        |a: &str| a.rsplit_once(':').map_or(a, |(h, _)| h).trim_end_matches('.').to_ascii_lowercase();
                    if name(authority) != name(&host) {
                        return Err(ReadError::Malformed(
                            "the request line names another host than the Host header".into(),
                        ));
                    }
                }
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
