//! Byte relay for CONNECT tunnels and upgraded connections: both directions at once,
//! half-close propagated, an idle timeout over both directions, byte counts.
//! TCP-to-TCP tunnels go through [`zero_copy`] (splice on Linux, nothing held while
//! idle); other streams use one fixed buffer per direction for the tunnel's life.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub mod zero_copy;

const BUF_SIZE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both sides closed.
    Closed,
    /// Neither side sent anything for the idle timeout.
    Idle,
    /// A read or write failed (reset, broken pipe).
    Error,
    /// The gateway is shutting down.
    Shutdown,
}

#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Client to upstream.
    pub up: u64,
    /// Upstream to client.
    pub down: u64,
    pub end: End,
}

/// Bytes and the time of the last one, shared by both directions and the watchdog.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0), up: AtomicU64::new(0), down: AtomicU64::new(0) }
    }

    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// Runs `copy_both` until it ends, the tunnel idles for `idle`, or `cancel` fires.
    async fn supervise(
        &self,
        copy_both: impl Future<Output = End>,
        idle: Duration,
        cancel: &CancellationToken,
    ) -> Outcome {
        let watchdog = async {
            loop {
                let deadline = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle;
                if Instant::now() >= deadline {
                    return End::Idle;
                }
                tokio::time::sleep_until(deadline).await;
            }
        };
        let end = tokio::select! {
            e = copy_both => e,
            e = watchdog => e,
            _ = cancel.cancelled() => End::Shutdown,
        };
        Outcome { up: self.up.load(Ordering::Relaxed), down: self.down.load(Ordering::Relaxed), end }
    }
}

fn end_of(a: std::io::Result<()>, b: std::io::Result<()>) -> End {
    if a.is_ok() && b.is_ok() { End::Closed } else { End::Error }
}

/// Relays between two TCP sockets (the CONNECT case): readiness-driven, zero-copy on
/// Linux, and holding no buffer while idle. `up_already` bytes were sent upstream
/// before the relay started (request bytes the client pipelined after CONNECT).
pub async fn relay_tcp(
    client: TcpStream,
    upstream: TcpStream,
    up_already: u64,
    idle: Duration,
    cancel: &CancellationToken,
) -> Outcome {
    let activity = Activity::new();
    activity.up.store(up_already, Ordering::Relaxed);
    let copy_both = async {
        let a = zero_copy::one_way(&client, &upstream, &activity.up, || activity.touch());
        let b = zero_copy::one_way(&upstream, &client, &activity.down, || activity.touch());
        let (ra, rb) = tokio::join!(a, b);
        end_of(ra, rb)
    };
    activity.supervise(copy_both, idle, cancel).await
}

/// Relays between any two byte streams (TLS client legs, upgraded HTTP connections)
/// with one fixed buffer per direction.
pub async fn relay<C, U>(client: C, upstream: U, idle: Duration, cancel: &CancellationToken) -> Outcome
where
    C: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    let activity = Activity::new();
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let copy_both = async {
        let a = one_way(&mut cr, &mut uw, &activity.up, || activity.touch());
        let b = one_way(&mut ur, &mut cw, &activity.down, || activity.touch());
        let (ra, rb) = tokio::join!(a, b);
        end_of(ra, rb)
    };
    activity.supervise(copy_both, idle, cancel).await
}

async fn one_way<R, W>(r: &mut R, w: &mut W, count: &AtomicU64, on_bytes: impl Fn()) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            // Propagate the half-close and keep the other direction running.
            let _ = w.shutdown().await;
            return Ok(());
        }
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        on_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn relays_both_ways_and_counts() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(async move { relay(client, upstream, Duration::from_secs(5), &cancel).await });
        client_peer.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        upstream_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        upstream_peer.write_all(b"world!").await.unwrap();
        let mut got = [0u8; 6];
        client_peer.read_exact(&mut got).await.unwrap();
        drop(client_peer);
        drop(upstream_peer);
        let out = task.await.unwrap();
        assert_eq!((out.up, out.down), (5, 6));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnels_end() {
        let (client, _cp) = tokio::io::duplex(64);
        let (upstream, _up) = tokio::io::duplex(64);
        let out = relay(client, upstream, Duration::from_secs(30), &CancellationToken::new()).await;
        assert_eq!(out.end, End::Idle);
    }
}
