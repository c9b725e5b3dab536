//! Byte relay for CONNECT tunnels and upgraded connections: both directions at once,
//! half-close propagated, an idle timeout over both directions, byte counts.
//! TCP-to-TCP tunnels go through [`zero_copy`] (splice on Linux, nothing held while
//! idle); other streams use one fixed buffer per direction for the tunnel's life.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::{Dir, Flow, Meter};

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
    /// A byte budget the tunnel counts against is spent.
    Budget,
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
struct Activity<'m> {
    start: Instant,
    last_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    meter: Option<&'m Meter>,
}

impl<'m> Activity<'m> {
    fn new(meter: Option<&'m Meter>) -> Activity<'m> {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            meter,
        }
    }

    fn gate(&'m self, dir: Dir) -> Gate<'m> {
        Gate { activity: self, dir }
    }

    /// Runs `copy_both` until it ends, the tunnel idles for `idle`, or `cancel` fires.
    /// With `keepalive`, TCP keepalive is switched on for its socket once the tunnel has
    /// been open for half the keepalive time: the many short tunnels never pay its
    /// three system calls, and a long one's first probe still follows at most one and
    /// a half keepalive times of silence.
    async fn supervise(
        &self,
        copy_both: std::pin::Pin<&mut impl Future<Output = End>>,
        idle: Duration,
        cancel: &CancellationToken,
        keepalive: Option<(&TcpStream, Duration)>,
    ) -> Outcome {
        let watchdog = async {
            let mut arm = keepalive.map(|(socket, after)| (self.start + after / 2, socket, after));
            loop {
                let now = Instant::now();
                let idle_at = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle;
                if now >= idle_at {
                    return End::Idle;
                }
                let mut deadline = idle_at;
                if let Some((at, socket, after)) = arm {
                    if now >= at {
                        crate::resolve::set_keepalive(socket, after);
                        arm = None;
                    } else {
                        deadline = deadline.min(at);
                    }
                }
                tokio::time::sleep_until(deadline).await;
            }
        };
        let spent = async {
            match self.meter {
                Some(m) => m.exhausted().cancelled().await,
                None => std::future::pending().await,
            }
        };
        let end = tokio::select! {
            e = copy_both => e,
            e = watchdog => e,
            _ = cancel.cancelled() => End::Shutdown,
            _ = spent => End::Budget,
        };
        let end = match self.meter {
            Some(m) => {
                m.finish();
                if m.exhausted().is_cancelled() { End::Budget } else { end }
            }
            None => end,
        };
        Outcome { up: self.up.load(Ordering::Relaxed), down: self.down.load(Ordering::Relaxed), end }
    }
}

/// One direction's view of the tunnel: its byte count, the idle clock and its budgets.
struct Gate<'a> {
    activity: &'a Activity<'a>,
    dir: Dir,
}

impl Gate<'_> {
    /// `n` bytes moved: counted, the tunnel is not idle, and they count against its
    /// budgets. A direction checks the answer after every chunk: a busy direction may
    /// not yield to the supervisor for many chunks.
    fn moved(&self, n: usize) -> Flow {
        let a = self.activity;
        let count = if self.dir == Dir::Up { &a.up } else { &a.down };
        count.fetch_add(n as u64, Ordering::Relaxed);
        let now = u64::try_from(a.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        a.last_ms.store(now, Ordering::Relaxed);
        a.meter.map_or(Flow::Go, |m| m.add(self.dir, n as u64))
    }

    /// After [`Flow::Wait`]: true once more may move, false when a budget is spent.
    async fn room(&self) -> bool {
        match self.activity.meter {
            Some(m) => m.room(self.dir).await,
            None => true,
        }
    }
}

impl zero_copy::Gate for Gate<'_> {
    /// Whether a chunk's answer lets the direction go on (waiting if it must).
    async fn go_on(&self, n: usize) -> bool {
        match self.moved(n) {
            Flow::Go => true,
            Flow::Wait => self.room().await,
            Flow::Stop => false,
        }
    }
}

/// Runs both directions: one that ends cleanly (a half-close) lets the other run on;
/// one that fails (a reset, a spent budget) ends the tunnel at once, so that a client
/// that reset its side does not hold the upstream (and its connection place) until
/// the idle timeout.
async fn both_unless_failed<A, B>(mut a: Pin<&mut A>, mut b: Pin<&mut B>) -> End
where
    A: Future<Output = std::io::Result<()>>,
    B: Future<Output = std::io::Result<()>>,
{
    tokio::select! {
        ra = &mut a => match ra {
            Ok(()) => end_of(Ok(()), b.await),
            Err(_) => End::Error,
        },
        rb = &mut b => match rb {
            Ok(()) => end_of(a.await, Ok(())),
            Err(_) => End::Error,
        },
    }
}

fn end_of(a: std::io::Result<()>, b: std::io::Result<()>) -> End {
    if a.is_ok() && b.is_ok() { End::Closed } else { End::Error }
}

/// Relays between two TCP sockets (the CONNECT case): readiness-driven, zero-copy on
/// Linux, and holding no buffer while idle. `up_already` bytes were sent upstream
/// before the relay started (request bytes the client pipelined after CONNECT).
/// `meter` counts the bytes against the tunnel's budgets. The upstream socket gets
/// TCP keepalive after `keepalive` from the relay (see `Activity::supervise`): it
/// comes from [`crate::resolve::Resolver::dial_for_relay`] without it.
pub async fn relay_tcp(
    client: TcpStream,
    upstream: TcpStream,
    up_already: u64,
    idle: Duration,
    keepalive: Duration,
    cancel: &CancellationToken,
    meter: Option<&Meter>,
) -> Outcome {
    let activity = Activity::new(meter);
    activity.up.store(up_already, Ordering::Relaxed);
    if let Some(m) = meter {
        m.add(Dir::Up, up_already);
    }
    let copy_both = async {
        let (up, down) = (activity.gate(Dir::Up), activity.gate(Dir::Down));
        // Pinned here and lent: passed by value, each direction's future would be
        // laid out twice in this one (about 460 bytes more per tunnel).
        let a = std::pin::pin!(zero_copy::one_way(&client, &upstream, &up));
        let b = std::pin::pin!(zero_copy::one_way(&upstream, &client, &down));
        both_unless_failed(a, b).await
    };
    // Pinned here and lent: passed by value into `supervise`, the copying future would
    // be laid out twice in this future (about 1.1 KiB more per tunnel, idle ones
    // included); boxed, it would cost an allocation per tunnel.
    tokio::pin!(copy_both);
    activity.supervise(copy_both, idle, cancel, Some((&upstream, keepalive))).await
}

/// Relays between any two byte streams (TLS client legs, upgraded HTTP connections)
/// with one fixed buffer per direction.
pub async fn relay<C, U>(
    client: C,
    upstream: U,
    idle: Duration,
    cancel: &CancellationToken,
    meter: Option<&Meter>,
) -> Outcome
where
    C: AsyncRead + AsyncWrite,
    U: AsyncRead + AsyncWrite,
{
    let activity = Activity::new(meter);
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let copy_both = async {
        let (up, down) = (activity.gate(Dir::Up), activity.gate(Dir::Down));
        let a = std::pin::pin!(one_way(&mut cr, &mut uw, &up));
        let b = std::pin::pin!(one_way(&mut ur, &mut cw, &down));
        both_unless_failed(a, b).await
    };
    // Pinned and lent, as in `relay_tcp`.
    tokio::pin!(copy_both);
    activity.supervise(copy_both, idle, cancel, None).await
}

async fn one_way<R, W>(r: &mut R, w: &mut W, gate: &Gate<'_>) -> std::io::Result<()>
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
        if !zero_copy::Gate::go_on(gate, n).await {
            return Err(zero_copy::spent());
        }
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
        let task = tokio::spawn(async move { relay(client, upstream, Duration::from_secs(5), &cancel, None).await });
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

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialled = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (dialled, accepted)
    }

    #[tokio::test]
    async fn the_upstream_gets_keepalive_once_the_tunnel_outlives_half_its_time() {
        let (client, _client_peer) = pair().await;
        let (upstream, _upstream_peer) = pair().await;
        // The same socket through another descriptor, to read its options while the
        // relay owns it.
        let probe = socket2::Socket::from(upstream.into_std().unwrap().try_clone().unwrap());
        let upstream = TcpStream::from_std(std::net::TcpStream::from(probe.try_clone().unwrap())).unwrap();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let keepalive = Duration::from_secs(2);
        let task = tokio::spawn(async move {
            relay_tcp(client, upstream, 0, Duration::from_secs(30), keepalive, &stop, None).await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!probe.keepalive().unwrap(), "a young tunnel pays no keepalive system calls");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !probe.keepalive().unwrap() {
            assert!(std::time::Instant::now() < deadline, "keepalive never switched on");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(probe.tcp_keepalive_time().unwrap(), keepalive);
        assert_eq!(probe.tcp_keepalive_interval().unwrap(), Duration::from_secs(10));
        cancel.cancel();
        assert_eq!(task.await.unwrap().end, End::Shutdown);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnels_end() {
        let (client, _cp) = tokio::io::duplex(64);
        let (upstream, _up) = tokio::io::duplex(64);
        let out = relay(client, upstream, Duration::from_secs(30), &CancellationToken::new(), None).await;
        assert_eq!(out.end, End::Idle);
    }
}
