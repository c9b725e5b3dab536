//! The load benchmark's origins, all on 127.0.0.1: a keep-alive HTTP server with a small
//! body, a source that writes a fixed number of bytes to each connection and closes, and
//! a sink that holds connections open (for idle tunnels).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Origins {
    pub http: SocketAddr,
    pub source: SocketAddr,
    pub hold: SocketAddr,
}

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n";

impl Origins {
    pub async fn start(stream_bytes: u64) -> Origins {
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hold = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let o = Origins {
            http: http.local_addr().unwrap(),
            source: source.local_addr().unwrap(),
            hold: hold.local_addr().unwrap(),
        };
        tokio::spawn(accept_loop(http, |s| async move { serve_http(s).await }));
        tokio::spawn(accept_loop(source, move |s| async move { serve_source(s, stream_bytes).await }));
        tokio::spawn(accept_loop(hold, |mut s| async move {
            let mut b = [0u8; 64];
            while matches!(s.read(&mut b).await, Ok(n) if n > 0) {}
        }));
        o
    }
}

async fn accept_loop<F, Fut>(l: TcpListener, f: F)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        if let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(f(s));
        }
    }
}

/// A minimal HTTP/1.1 server: answers every request head with a 13-byte body, keeps the
/// connection open, and closes after a request that asked for `Connection: close`. Any
/// stream: the TLS inspection bench serves it behind rustls.
pub async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut filled = 0;
    loop {
        let Ok(n) = s.read(&mut buf[filled..]).await else { return };
        if n == 0 {
            return;
        }
        filled += n;
        let mut out = Vec::new();
        let mut close = false;
        while let Some(end) = find(&buf[..filled], b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            close |= head.contains("connection: close") || head.contains("http/1.0") && !head.contains("keep-alive");
            out.extend_from_slice(RESPONSE);
            buf.copy_within(end + 4..filled, 0);
            filled -= end + 4;
        }
        if !out.is_empty() && (s.write_all(&out).await.is_err() || s.flush().await.is_err()) {
            return;
        }
        if close || filled == buf.len() {
            return;
        }
    }
}

async fn serve_source(mut s: TcpStream, bytes: u64) {
    let chunk = vec![0x5au8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if s.write_all(&chunk[..n]).await.is_err() {
            return;
        }
        left -= n as u64;
    }
    let _ = s.shutdown().await;
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
