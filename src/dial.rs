//! The connector behind absolute-form forwarding: every new upstream connection is
//! resolved, vetted and dialled by [`Resolver::dial`]; the pool reuses them per origin.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::addr;
use crate::resolve::{DialError, Resolver};

/// The vetted address a forwarded response came from (response extension).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAddr(pub SocketAddr);

#[derive(Clone)]
pub struct VettingConnector {
    resolver: Arc<Resolver>,
}

impl VettingConnector {
    pub fn new(resolver: Arc<Resolver>) -> Self {
        VettingConnector { resolver }
    }
}

impl tower_service::Service<Uri> for VettingConnector {
    type Response = UpstreamStream;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamStream, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let resolver = self.resolver.clone();
        Box::pin(async move {
            let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
            let target = addr::parse_authority(authority, Some(80))
                .map_err(|e| DialError::ResolveFailed(format!("invalid upstream authority: {e}")))?;
            let (stream, addr) = resolver.dial(&target).await?;
            Ok(UpstreamStream { io: TokioIo::new(stream), addr })
        })
    }
}

pub struct UpstreamStream {
    io: TokioIo<TcpStream>,
    addr: SocketAddr,
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        Connected::new().extra(UpstreamAddr(self.addr))
    }
}

impl Read for UpstreamStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for UpstreamStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Finds the dial error inside a client error, if the failure was in connecting.
pub fn dial_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a DialError> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(d) = e.downcast_ref::<DialError>() {
            return Some(d);
        }
        cur = e.source();
    }
    None
}
