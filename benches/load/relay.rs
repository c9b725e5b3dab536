//! A bare CONNECT relay and keep-alive forwarder: the floor under any proxy on this
//! machine. For a CONNECT it reads the head, dials the address it names, answers 200
//! and splices both ways with the gateway's own zero-copy relay. For absolute-form
//! requests (`GET http://ip:port/path`) it keeps one upstream connection per client
//! connection and, per request, rewrites the request line to origin-form, drops
//! `Proxy-Authorization`, and copies the response back by its `Content-Length` (the
//! bench's requests have no body). No authentication, no policy, no access log, no
//! HTTP parser, no limits, no pool. What the gateway spends beyond it is what its
//! features cost, and a figure this cannot reach is out of reach for any proxy built
//! this way on the same machine. It runs as a child process (the bench binary started
//! again with `LOAD_RELAY_LISTEN` set), so its CPU and memory are measured like a peer's.

use std::io;
use std::net::SocketAddr;

use egress_gateway::relay::zero_copy::one_way;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::origin::find;

/// The environment variable that turns the bench binary into the relay.
pub const LISTEN_VAR: &str = "LOAD_RELAY_LISTEN";

/// Serves on the address in [`LISTEN_VAR`] on tokio's default multi-threaded runtime,
/// one worker per CPU: work stealing spreads bulk tunnels over the workers without the
/// gateway's hand-over between threads.
pub fn serve(listen: &str) {
    let listener = std::net::TcpListener::bind(listen).unwrap();
    listener.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = TcpListener::from_std(listener).unwrap();
        loop {
            if let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = tunnel(client).await;
                });
            }
        }
    });
}

/// One connection: `CONNECT ip:port` in, 200 out, then both directions until they end;
/// or absolute-form requests, forwarded until the client closes.
async fn tunnel(mut client: TcpStream) -> io::Result<()> {
    client.set_nodelay(true)?;
    let upstream = {
        // A CONNECT head fits in 1 KiB on the stack, as in any lean relay, and the
        // buffer is gone before the tunnel runs; a forwarded request's connection
        // moves what it read to a buffer of its own.
        let mut buf = [0u8; 1024];
        let (n, end) = read_head(&mut client, &mut buf, 0).await?;
        let Some(target) = std::str::from_utf8(&buf[..end]).ok().and_then(|h| h.strip_prefix("CONNECT ")) else {
            let mut owned = vec![0u8; 16 * 1024];
            owned[..n].copy_from_slice(&buf[..n]);
            return forward(client, owned, n).await;
        };
        let target: SocketAddr = target
            .split(' ')
            .next()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| io::Error::other("not a CONNECT to an address"))?;
        let mut upstream = TcpStream::connect(target).await?;
        upstream.set_nodelay(true)?;
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        // Bytes the client sent after its head belong upstream.
        upstream.write_all(&buf[end..n]).await?;
        upstream
    };
    let _ = tokio::join!(one_way(&client, &upstream, &()), one_way(&upstream, &client, &()));
    Ok(())
}

/// Reads from `s` into `buf` (holding `n` bytes already) until it holds a whole head:
/// how many bytes it holds, and where the head ends. An error on a close, or on a head
/// too long for a bare relay.
async fn read_head(s: &mut TcpStream, buf: &mut [u8], mut n: usize) -> io::Result<(usize, usize)> {
    loop {
        if let Some(i) = find(&buf[..n], b"\r\n\r\n") {
            return Ok((n, i + 4));
        }
        if n == buf.len() {
            return Err(io::Error::other("head too long"));
        }
        match s.read(&mut buf[n..]).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            got => n += got,
        }
    }
}

/// Keep-alive forwarding of bodiless absolute-form requests over one upstream
/// connection (dialled for the first request's `ip:port`); `buf[..n]` holds what the
/// client sent so far.
async fn forward(mut client: TcpStream, mut buf: Vec<u8>, mut n: usize) -> io::Result<()> {
    let mut upstream: Option<TcpStream> = None;
    let mut out = Vec::with_capacity(1024);
    let mut resp = vec![0u8; 16 * 1024];
    let mut held = 0;
    loop {
        let (got, end) = read_head(&mut client, &mut buf, n).await?;
        let head = std::str::from_utf8(&buf[..end]).map_err(io::Error::other)?;
        let (line, rest) = head.split_once("\r\n").ok_or_else(|| io::Error::other("no request line"))?;
        let mut parts = line.splitn(3, ' ');
        let (method, uri, version) =
            (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let after = uri.strip_prefix("http://").ok_or_else(|| io::Error::other("not absolute-form"))?;
        let (authority, path) = after.find('/').map_or((after, "/"), |i| (&after[..i], &after[i..]));
        out.clear();
        for piece in [method, " ", path, " ", version, "\r\n"] {
            out.extend_from_slice(piece.as_bytes());
        }
        for h in rest.split_inclusive("\r\n") {
            if !h.get(..20).is_some_and(|p| p.eq_ignore_ascii_case("proxy-authorization:")) {
                out.extend_from_slice(h.as_bytes());
            }
        }
        let target = upstream.is_none().then(|| authority.parse::<SocketAddr>());
        buf.copy_within(end..got, 0);
        n = got - end;
        let up = match &mut upstream {
            Some(u) => u,
            None => {
                let target = target.unwrap_or_else(|| unreachable!()).map_err(io::Error::other)?;
                let u = TcpStream::connect(target).await?;
                u.set_nodelay(true)?;
                upstream.insert(u)
            }
        };
        up.write_all(&out).await?;
        // The response: its head, then Content-Length bytes.
        let (have, head_end) = read_head(up, &mut resp, held).await?;
        let len = std::str::from_utf8(&resp[..head_end])
            .map_err(io::Error::other)?
            .split("\r\n")
            .find_map(|h| h.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .ok_or_else(|| io::Error::other("no Content-Length"))?;
        let total = head_end + len;
        let mut have = have;
        while have < total {
            if total > resp.len() {
                return Err(io::Error::other("response too long"));
            }
            match up.read(&mut resp[have..]).await? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                got => have += got,
            }
        }
        client.write_all(&resp[..total]).await?;
        resp.copy_within(total..have, 0);
        held = have - total;
    }
}
