//! A bare CONNECT relay: the floor under any proxy on this machine. It reads the
//! CONNECT head, dials the address it names, answers 200 and splices both ways with the
//! gateway's own zero-copy relay; no authentication, no policy, no access log, no HTTP
//! parser, no limits. What the gateway spends beyond it is what its features cost, and
//! a figure this cannot reach is out of reach for any relay built this way on the same
//! machine. It runs as a child process (the bench binary started again with
//! `LOAD_RELAY_LISTEN` set), so its CPU and memory are measured like a peer's.

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

/// One connection: `CONNECT ip:port` in, 200 out, then both directions until they end.
async fn tunnel(mut client: TcpStream) -> io::Result<()> {
    client.set_nodelay(true)?;
    let upstream = {
        let mut buf = [0u8; 1024];
        let mut n = 0;
        let end = loop {
            let got = client.read(&mut buf[n..]).await?;
            n += got;
            if let Some(i) = find(&buf[..n], b"\r\n\r\n") {
                break i + 4;
            }
            // Closed, or a head too long for a bare relay: drop the connection.
            if got == 0 || n == buf.len() {
                return Ok(());
            }
        };
        let target: SocketAddr = std::str::from_utf8(&buf[..end])
            .ok()
            .and_then(|h| h.strip_prefix("CONNECT ")?.split(' ').next()?.parse().ok())
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
