//! A lingering close for connections hyper serves. When the gateway answers before a
//! client has sent all of its request (an origin's early `413`, a refusal whose body
//! was not read, a head over the limits), hyper closes the socket with the client's
//! bytes unread, and the kernel then resets the connection: the client's next write
//! fails and it may never read the answer (curl: `Send failure: Broken pipe`). As
//! nginx and Squid do, the socket is instead shut for writing and what the client
//! still sends is read and dropped until it closes, for a bounded time.
//!
//! It runs inside [`super::watch::Watched`]'s shutdown, which hyper awaits before the
//! connection ends: the connection keeps its place meanwhile, and a connection hyper
//! drops without shutting it (a header-read timeout, an idle close) does not linger.
//! Nor does a stream hyper has handed to an upgrade: a relay that shuts it is passing
//! on the upstream's half-close, and the client's bytes are still the relay's to read.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Longest wait for the client's first bytes: a client that sends none by then had
/// nothing in flight (a complete request answered with `Connection: close`).
pub const FIRST: Duration = Duration::from_millis(500);
/// Longest wait for the client's next bytes while lingering.
pub const QUIET: Duration = Duration::from_secs(2);
/// Longest linger in all.
pub const TOTAL: Duration = Duration::from_secs(10);

/// A lingering close in progress (made only when a connection starts one).
pub struct Linger {
    buf: Vec<u8>,
    quiet: Pin<Box<Sleep>>,
    until: Instant,
    done: bool,
}

impl Default for Linger {
    fn default() -> Self {
        let now = Instant::now();
        Linger {
            buf: vec![0u8; 16 * 1024],
            quiet: Box::pin(tokio::time::sleep_until(now + FIRST)),
            until: now + TOTAL,
            done: false,
        }
    }
}

impl Linger {
    /// Reads and drops what `io` still sends: ready once it ends, fails, sends nothing
    /// for [`FIRST`] at first and [`QUIET`] after, or [`TOTAL`] has passed.
    pub fn poll_drain<R: AsyncRead + Unpin>(&mut self, io: &mut R, cx: &mut Context<'_>) -> Poll<()> {
        while !self.done {
            let mut rb = ReadBuf::new(&mut self.buf);
            match Pin::new(&mut *io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    let next = (Instant::now() + QUIET).min(self.until);
                    if next <= Instant::now() {
                        tracing::debug!("lingering close cut short: the client kept sending");
                        self.done = true;
                    } else {
                        self.quiet.as_mut().reset(next);
                    }
                }
                Poll::Ready(_) => self.done = true,
                Poll::Pending => {
                    if self.quiet.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.done = true;
                }
            }
        }
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn drain(io: &mut tokio::io::DuplexStream) {
        let mut l = Linger::default();
        std::future::poll_fn(|cx| l.poll_drain(io, cx)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_with_nothing_in_flight_is_waited_on_briefly() {
        let (mut a, _peer) = tokio::io::duplex(64);
        let started = Instant::now();
        drain(&mut a).await;
        assert_eq!(started.elapsed(), FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sending_client_is_read_until_it_closes_or_goes_quiet() {
        let (mut a, mut peer) = tokio::io::duplex(64);
        peer.write_all(b"rest of an upload").await.unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            peer.write_all(b"more").await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(peer);
        });
        let started = Instant::now();
        drain(&mut a).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2), "until the client closed");
        sender.await.unwrap();

        let (mut a, mut peer) = tokio::io::duplex(64);
        peer.write_all(b"x").await.unwrap();
        let started = Instant::now();
        drain(&mut a).await;
        assert_eq!(started.elapsed(), QUIET, "a quiet client is not waited on longer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_keeps_sending_is_cut_off() {
        let (mut a, mut peer) = tokio::io::duplex(64);
        peer.write_all(b"x").await.unwrap();
        let sender = tokio::spawn(async move {
            while peer.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let started = Instant::now();
        drain(&mut a).await;
        assert!(
            started.elapsed() >= TOTAL && started.elapsed() < TOTAL + Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        drop(a);
        sender.await.unwrap();
    }
}
