//! Clocks for connections whose bodies nobody polls. A body's own idle timer
//! ([`super::bodies::IdleBody`]) and its revocation ([`super::registry::Revocable`])
//! act only when the body is polled, and hyper stops polling a body while the peer
//! it is written to does not read. Two guards close such connections anyway:
//!
//! - [`Watch`]: a served connection's activity count and its end token. The serving
//!   loop waits on [`Watch::quiet`] (no byte moved on the client socket for the idle
//!   timeout) and on the end token, which a sweep cancels when it ends a request the
//!   connection carries (the registry holds the token beside the request's own).
//! - [`Stalling`]: an upstream socket whose writes fail once none makes progress for
//!   the idle timeout (an origin that stops reading a request body), and whose write
//!   errors wait for the origin's early answer to be read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

/// A served connection's activity and its end. One per connection.
#[derive(Default)]
pub struct Watch {
    /// Bumped whenever bytes move on the connection; compared, never timed, so that
    /// a read or write costs no clock.
    moved: AtomicU64,
    end: CancellationToken,
    /// No lingering close ([`super::linger`]): hyper's connection has ended (the stream
    /// is an upgrade's now, a WebSocket or a CONNECT hyper served, and a shutdown is a
    /// relay passing on a half-close while the other direction is still read), or the
    /// gateway is draining.
    no_linger: AtomicBool,
}

/// Ticks per idle period: a silent connection closes between `idle` and 1.25 `idle`.
const TICKS: u32 = 4;

impl Watch {
    /// A watch whose end is `end` (an inspected connection's: a child of the token
    /// that ends the tunnel it runs in).
    pub fn with_end(end: CancellationToken) -> Self {
        Watch { moved: AtomicU64::new(0), end, no_linger: AtomicBool::new(false) }
    }

    /// Cancelled when a sweep ends a request on the connection: the serving loop then
    /// finishes the response in progress, if it can, and closes.
    pub fn end(&self) -> &CancellationToken {
        &self.end
    }

    fn touch(&self) {
        self.moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved on the connection for `idle`.
    pub async fn quiet(&self, idle: Duration) {
        let tick = (idle / TICKS).max(Duration::from_millis(1));
        let mut seen = self.moved.load(Ordering::Relaxed);
        let mut silent = Duration::ZERO;
        loop {
            tokio::time::sleep(tick).await;
            let now = self.moved.load(Ordering::Relaxed);
            if now == seen {
                silent += tick;
                if silent >= idle {
                    return;
                }
            } else {
                (seen, silent) = (now, Duration::ZERO);
            }
        }
    }
}

/// A served HTTP connection (HTTP/1 with upgrades, or HTTP/2) that can be asked to
/// finish what is in progress and close.
pub trait Graceful: Future<Output = Result<(), hyper::Error>> {
    fn graceful(self: Pin<&mut Self>);
}

impl<I, S> Graceful for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<super::BoxError>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<super::BoxError>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<super::BoxError>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<super::BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn graceful(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// How long a connection whose request a sweep ended may take to finish the response
/// in progress (the refusal, in practice) before it is closed anyway.
const ENDED_GRACE: Duration = Duration::from_secs(1);

/// Wakes a served connection's task when one of its watchers fires, and remembers that
/// one did: the watchers are polled only then, not on every wake of the connection (a
/// keep-alive request wakes it several times; polling a timer and two cancellation
/// futures each time cost about 3% of the request).
struct Fired {
    fired: AtomicBool,
    task: atomic_waker::AtomicWaker,
}

impl std::task::Wake for Fired {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Drives a served connection until it ends, or closes it: at once when no byte moved
/// on it for `quiet` (a client that stopped reading a response, or a request body an
/// origin stopped reading: hyper no longer polls that body, so its own timers cannot
/// fire); after the response in progress, or [`ENDED_GRACE`], once `watch`'s end is
/// cancelled (a sweep ended a request on it); after the request in progress once
/// `drain` is.
pub async fn serve<C: Graceful>(
    connection: C,
    watch: &Watch,
    quiet: Duration,
    drain: Option<&CancellationToken>,
) -> Result<(), hyper::Error> {
    tokio::pin!(connection);
    let silent = watch.quiet(quiet);
    tokio::pin!(silent);
    let ended = watch.end().cancelled();
    tokio::pin!(ended);
    let drained = async {
        match drain {
            Some(d) => d.cancelled().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(drained);
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    let (mut draining, mut ending) = (false, false);
    // Set at first, so that the first poll registers every watcher.
    let fired = std::sync::Arc::new(Fired { fired: AtomicBool::new(true), task: atomic_waker::AtomicWaker::new() });
    let watchers = std::task::Waker::from(fired.clone());
    std::future::poll_fn(|cx| {
        fired.task.register(cx.waker());
        loop {
            if let Poll::Ready(r) = connection.as_mut().poll(cx) {
                // Before any task an upgrade woke runs (they share this thread).
                watch.no_linger.store(true, Ordering::Release);
                return Poll::Ready(r);
            }
            if !fired.fired.swap(false, Ordering::AcqRel) {
                return Poll::Pending;
            }
            let mut wcx = Context::from_waker(&watchers);
            let mut asked = false;
            if !draining && drained.as_mut().poll(&mut wcx).is_ready() {
                draining = true;
                asked = true;
                // A lingering close in progress ends at the next poll, just below.
                watch.no_linger.store(true, Ordering::Release);
            }
            if !ending && ended.as_mut().poll(&mut wcx).is_ready() {
                ending = true;
                asked = true;
                grace.as_mut().reset(tokio::time::Instant::now() + ENDED_GRACE);
            }
            if ending && grace.as_mut().poll(&mut wcx).is_ready() {
                tracing::debug!("connection closed: a sweep ended its request");
                return Poll::Ready(Ok(()));
            }
            if silent.as_mut().poll(&mut wcx).is_ready() {
                tracing::debug!(quiet_ms = quiet.as_millis() as u64, "connection closed: no byte moved on it");
                return Poll::Ready(Ok(()));
            }
            if !asked {
                return Poll::Pending;
            }
            // Asked to finish and close: the connection may be done at once.
            connection.as_mut().graceful();
        }
    })
    .await
}

/// A client stream as hyper serves it. A CONNECT hyper served takes its plain-TCP
/// client leg back by downcasting to this type (`connect::relay`), so the stream is
/// wrapped here and nowhere else: a wrapper added elsewhere would silently send those
/// tunnels through buffers instead of `splice`.
pub type Served<IO> = hyper_util::rt::TokioIo<Watched<IO>>;

pub fn served<IO>(inner: IO, watch: std::sync::Arc<Watch>) -> Served<IO> {
    hyper_util::rt::TokioIo::new(Watched::new(inner, watch))
}

/// A byte stream that tells its [`Watch`] when bytes move. Shut down (by hyper, as a
/// connection ends) while its client is still sending, it lingers
/// ([`super::linger`]).
pub struct Watched<IO> {
    inner: IO,
    watch: std::sync::Arc<Watch>,
    /// The client's end of input was read.
    ended: bool,
    linger: Option<Box<super::linger::Linger>>,
}

impl<IO> Watched<IO> {
    pub fn new(inner: IO, watch: std::sync::Arc<Watch>) -> Self {
        Watched { inner, watch, ended: false, linger: None }
    }

    pub fn into_inner(self) -> IO {
        self.inner
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.touch();
        } else if r.is_ready() && buf.remaining() > 0 {
            self.ended = true;
        }
        r
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.watch.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.watch.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    /// Shuts the stream for writing, then lingers unless the client already ended.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let no_linger = || this.watch.no_linger.load(Ordering::Acquire);
        if this.linger.is_none() {
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            if this.ended || no_linger() {
                return Poll::Ready(Ok(()));
            }
            this.linger = Some(Box::default());
        } else if no_linger() {
            return Poll::Ready(Ok(()));
        }
        match this.linger.as_mut() {
            Some(l) => l.poll_drain(&mut this.inner, cx).map(Ok),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// The clock of a write that waits: a write (or flush) pending for `limit` without
/// progress fails with `TimedOut`. Armed only while a write waits, so a connection
/// whose writes complete at once never touches the timer.
pub struct WriteStall {
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl WriteStall {
    pub fn new(limit: Duration) -> Self {
        WriteStall { limit, timer: None, armed: false }
    }

    /// Passes on a write's (or flush's) outcome; a pending one past the limit fails.
    pub fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.armed = false;
            return r;
        }
        let deadline = tokio::time::Instant::now() + self.limit;
        let timer = match &mut self.timer {
            Some(t) => {
                if !self.armed {
                    t.as_mut().reset(deadline);
                }
                t
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        self.armed = true;
        if timer.as_mut().poll(cx).is_ready() {
            self.armed = false;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the upstream accepted no byte for the idle timeout",
            )));
        }
        Poll::Pending
    }
}

/// An upstream socket whose writes fail after [`WriteStall`]'s limit without progress.
///
/// It also keeps an origin's early answer. An origin that answers before it has read
/// a request body (`413`, `401`) and closes resets the connection, and the next write
/// fails. The answer came before the reset, so it is still there to read, but hyper's
/// client fails the exchange on the write error whenever that error comes before its
/// next read, and the client got a `502` instead of the origin's answer. A write that
/// fails because the peer closed or reset the connection is therefore held (pending)
/// until a read has come to the end of the connection: the answer is read first. A
/// connection the peer reset never blocks a read, so the hold is short.
pub struct Stalling<IO> {
    inner: IO,
    stall: WriteStall,
    /// A write error held until reads reach the end, and whether they have.
    held: Option<io::Error>,
    read_ended: bool,
}

impl<IO> Stalling<IO> {
    pub fn new(inner: IO, limit: Duration) -> Self {
        Stalling { inner, stall: WriteStall::new(limit), held: None, read_ended: false }
    }

    /// A write's outcome, with a closed or reset connection's error held back until
    /// reads have reached the end. The task is woken at once, so its next turn reads.
    fn hold<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let r = match r {
            Poll::Ready(Err(e)) if !self.read_ended && peer_closed(&e) => {
                self.held = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            r => r,
        };
        self.stall.check(cx, r)
    }

    /// The held write error once reads have reached the end; pending before that.
    fn held<T>(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<T>>> {
        self.held.as_ref()?;
        if self.read_ended {
            return self.held.take().map(|e| Poll::Ready(Err(e)));
        }
        Some(self.stall.check(cx, Poll::Pending))
    }
}

/// Whether a write failed because the peer closed or reset the connection.
fn peer_closed(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted)
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stalling<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(result) = &r
            && (result.is_err() || (room && buf.filled().len() == before))
        {
            // The end of the connection (or a read error): a held write error may go.
            self.read_ended = true;
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stalling<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(held) = this.held(cx) {
            return held;
        }
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.hold(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(held) = this.held(cx) {
            return held;
        }
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.hold(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(held) = this.held(cx) {
            return held;
        }
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.hold(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn quiet_waits_for_silence_not_for_time() {
        let watch = std::sync::Arc::new(Watch::default());
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = Watched::new(a, watch.clone());
        let idle = Duration::from_secs(4);
        let quiet = watch.quiet(idle);
        tokio::pin!(quiet);
        // A byte every 3 s for 12 s: never silent for 4 s.
        for _ in 0..4 {
            tokio::select! {
                () = &mut quiet => panic!("a connection moving bytes is not quiet"),
                () = tokio::time::sleep(Duration::from_secs(3)) => {}
            }
            a.write_all(b"x").await.unwrap();
            let mut one = [0u8; 1];
            b.read_exact(&mut one).await.unwrap();
        }
        let start = tokio::time::Instant::now();
        quiet.await;
        let waited = start.elapsed();
        assert!(waited >= idle && waited <= idle + idle / TICKS + Duration::from_secs(1), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_waits_too_long_fails_and_one_that_moves_does_not() {
        let (a, mut b) = tokio::io::duplex(16);
        let mut a = Stalling::new(a, Duration::from_secs(5));
        // Drained every 2 s: each write waits less than the limit.
        let writer = async {
            a.write_all(&[7u8; 64]).await.unwrap();
            a
        };
        let reader = async {
            let mut got = 0;
            let mut buf = [0u8; 16];
            while got < 64 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                got += b.read(&mut buf).await.unwrap();
            }
        };
        let (mut a, ()) = tokio::join!(writer, reader);
        // Nobody reads now: the write fails after the limit.
        let start = tokio::time::Instant::now();
        let err = a.write_all(&[7u8; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed().as_secs(), 5);
    }
}
