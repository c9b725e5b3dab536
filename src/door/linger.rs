//! A lingering close for connections hyper serves. When the gateway answers before a
//! client has sent all of its request (an origin's early `413`, a refusal with
//! `Connection: close`, a head over the limits), hyper closes the socket with the
//! client's bytes unread, and the kernel then resets the connection: the client's next
//! write fails and it may never read the answer (curl: `Send failure: Broken pipe`).
//! As nginx and Squid do, the socket is instead shut for writing and what the client
//! still sends is read and dropped until it closes, for a bounded time.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Longest wait for the client's next bytes while lingering.
const QUIET: Duration = Duration::from_secs(2);
/// Longest linger in all.
const TOTAL: Duration = Duration::from_secs(10);

/// Where a [`Kept`] stream goes when hyper drops it.
pub type Back<IO> = Arc<Mutex<Option<IO>>>;

/// A byte stream that, dropped before its client closed its side, is put in its
/// [`Back`] for [`linger`] rather than closed.
pub struct Kept<IO> {
    inner: Option<IO>,
    eof: bool,
    back: Back<IO>,
}

impl<IO> Kept<IO> {
    pub fn new(inner: IO) -> (Self, Back<IO>) {
        let back = Arc::new(Mutex::new(None));
        (Kept { inner: Some(inner), eof: false, back: back.clone() }, back)
    }
}

impl<IO> Drop for Kept<IO> {
    fn drop(&mut self) {
        if self.eof {
            return;
        }
        if let (Some(io), Ok(mut back)) = (self.inner.take(), self.back.lock()) {
            *back = Some(io);
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "stream already handed back")
}

impl<IO: AsyncRead + Unpin> AsyncRead for Kept<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let Some(io) = self.inner.as_mut() else { return Poll::Ready(Err(gone())) };
        let r = Pin::new(io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() == before && buf.remaining() > 0 {
            self.eof = true;
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Kept<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.inner.as_mut() {
            Some(io) => Pin::new(io).poll_write(cx, buf),
            None => Poll::Ready(Err(gone())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.inner.as_mut() {
            Some(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            None => Poll::Ready(Err(gone())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(io) => Pin::new(io).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// Shuts `io` for writing and reads what the client still sends until it closes, it
/// sends nothing for 2 s, 10 s have passed, or the gateway shuts down.
pub async fn linger<IO: AsyncRead + AsyncWrite + Unpin>(mut io: IO, shutdown: Option<&CancellationToken>) {
    let never = CancellationToken::new();
    let shutdown = shutdown.unwrap_or(&never);
    let drain = async {
        // Already shut if hyper closed it gracefully; then this does nothing.
        let _ = io.shutdown().await;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match tokio::time::timeout(QUIET, io.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => continue,
                _ => return,
            }
        }
    };
    tokio::select! {
        () = drain => {}
        _ = tokio::time::sleep(TOTAL) => tracing::debug!("lingering close cut short: the client kept sending"),
        () = shutdown.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_comes_back_unless_its_client_closed() {
        let (a, mut peer) = tokio::io::duplex(64);
        let (mut kept, back) = Kept::new(a);
        peer.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        kept.read_exact(&mut one).await.unwrap();
        drop(kept);
        assert!(back.lock().unwrap().is_some(), "open: handed back to linger");

        let (a, peer) = tokio::io::duplex(64);
        let (mut kept, back) = Kept::new(a);
        drop(peer);
        assert_eq!(kept.read(&mut one).await.unwrap(), 0);
        drop(kept);
        assert!(back.lock().unwrap().is_none(), "at its end: closed at once");
    }

    #[tokio::test(start_paused = true)]
    async fn lingering_ends_when_the_client_closes_or_goes_quiet() {
        let (a, mut peer) = tokio::io::duplex(64);
        let task = tokio::spawn(linger(a, None));
        peer.write_all(b"rest of an upload").await.unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty(), "shut for writing at once");
        drop(peer);
        task.await.unwrap();

        let (a, _peer) = tokio::io::duplex(64);
        let started = tokio::time::Instant::now();
        linger(a, None).await;
        assert_eq!(started.elapsed(), QUIET, "a quiet client is not waited on longer");
    }
}
