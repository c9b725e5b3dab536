//! Byte relay for CONNECT tunnels and upgraded connections: both directions at once,
//! half-close propagated, an idle timeout over both directions, byte counts.
//! One fixed buffer per direction for the tunnel's life; nothing allocated per chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

/// Relays between `client` and `upstream` until both close, the tunnel idles for
/// `idle`, an error occurs, or `cancel` fires.
pub async fn relay<C, U>(client: C, upstream: U, idle: Duration, cancel: &CancellationToken) -> Outcome
where
    C: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    let start = Instant::now();
    let last_activity = AtomicU64::new(0);
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);

    let copy_both = async {
        let a = one_way(&mut cr, &mut uw, &up, &last_activity, start);
        let b = one_way(&mut ur, &mut cw, &down, &last_activity, start);
        let (ra, rb) = tokio::join!(a, b);
        if ra.is_ok() && rb.is_ok() { End::Closed } else { End::Error }
    };
    let watchdog = async {
        loop {
            let last = Duration::from_millis(last_activity.load(Ordering::Relaxed));
            let deadline = start + last + idle;
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
    Outcome { up: up.load(Ordering::Relaxed), down: down.load(Ordering::Relaxed), end }
}

async fn one_way<R, W>(
    r: &mut R,
    w: &mut W,
    count: &AtomicU64,
    last_activity: &AtomicU64,
    start: Instant,
) -> std::io::Result<()>
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
        let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last_activity.store(now, Ordering::Relaxed);
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
