//! Raw TCP helpers for requests that real clients refuse to send.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect gateway");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s
}

/// Connects from the loopback source address `from` (any of 127.0.0.0/8): how a test
/// plays a second client address.
pub fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddr::from((from, 0)).into())?;
    sock.connect(&addr.into())?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// Sends `request` and reads until the peer closes or the read times out.
pub fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = connect(addr);
    s.write_all(request).expect("write");
    read_all(&mut s)
}

pub fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one response head (up to the blank line) and returns it.
pub fn read_head(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => out.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of the first response in `resp`.
pub fn status(resp: &str) -> u16 {
    resp.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Reads one response: its head, then `Content-Length` bytes of body (none if absent).
pub fn read_response(s: &mut TcpStream) -> String {
    let head = read_head(s);
    let len = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    let _ = s.read_exact(&mut body);
    format!("{head}{}", String::from_utf8_lossy(&body))
}

/// Sends `request` on a new connection and reads exactly one response.
pub fn request(addr: SocketAddr, request: impl AsRef<[u8]>) -> String {
    let mut s = connect(addr);
    s.write_all(request.as_ref()).expect("write");
    read_response(&mut s)
}
