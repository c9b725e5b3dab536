//! A socket with bytes already read from it read again first: the first head the
//! CONNECT fast path read and did not take (hyper then parses it as if it had read it
//! itself), or a ClientHello the transparent listener read to find the name. Writes go
//! straight to the socket, vectored as the socket's own are.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub struct Replayed {
    head: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl Replayed {
    /// `inner`, read from `head` first (nothing is allocated for an empty one).
    pub fn new(head: Vec<u8>, inner: TcpStream) -> Replayed {
        Replayed { head, at: 0, inner }
    }

    /// The socket and the bytes of the head not read yet.
    pub fn into_parts(mut self) -> (TcpStream, Vec<u8>) {
        self.head.drain(..self.at);
        (self.inner, self.head)
    }
}

impl AsyncRead for Replayed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.head.len() {
            let n = buf.remaining().min(this.head.len() - this.at);
            buf.put_slice(&this.head[this.at..this.at + n]);
            this.at += n;
            if this.at == this.head.len() {
                // Read again in full: a long-lived connection does not keep it.
                (this.head, this.at) = (Vec::new(), 0);
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_head_is_read_before_the_socket_and_what_is_left_is_handed_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let mut r = Replayed::new(b"head-".to_vec(), accepted);
        peer.write_all(b"socket").await.unwrap();
        let mut two = [0u8; 2];
        r.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"he");
        let (mut socket, rest) = r.into_parts();
        assert_eq!(rest, b"ad-", "the unread part of the head");
        let mut got = [0u8; 6];
        socket.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"socket");

        let mut whole = Replayed::new(b"ab".to_vec(), socket);
        peer.write_all(b"cd").await.unwrap();
        let mut got = [0u8; 4];
        whole.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");
        whole.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        peer.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");
        assert!(whole.into_parts().1.is_empty());
    }
}
