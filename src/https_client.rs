//! A connector for upstreams the gateway itself talks to over HTTPS (GitHub, its API):
//! every connection is resolved, vetted and dialled like sandbox traffic, then TLS is
//! verified against the platform's roots plus an optional extra CA file.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::addr;
use crate::dial::UpstreamAddr;
use crate::door::ProxyBody;
use crate::policy::DenyReason;
use crate::resolve::{DialError, Resolver};

/// Builds the client TLS configuration: platform roots plus `extra_ca` (PEM).
pub fn client_config(extra_ca: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = extra_ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: expected PEM certificates: {e}", path.display()))?;
        for c in certs {
            roots.add(c).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

#[derive(Clone)]
pub struct HttpsConnector {
    resolver: Arc<Resolver>,
    tls: tokio_rustls::TlsConnector,
}

impl HttpsConnector {
    pub fn new(resolver: Arc<Resolver>, tls: rustls::ClientConfig) -> Self {
        HttpsConnector { resolver, tls: tokio_rustls::TlsConnector::from(Arc::new(tls)) }
    }
}

pub enum Stream {
    Plain(TokioIo<TcpStream>, std::net::SocketAddr),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>, std::net::SocketAddr),
}

impl tower_service::Service<Uri> for HttpsConnector {
    type Response = Stream;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (resolver, tls) = (self.resolver.clone(), self.tls.clone());
        Box::pin(async move {
            let https = uri.scheme_str() == Some("https");
            let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
            let target = addr::parse_authority(authority, Some(if https { 443 } else { 80 }))
                .map_err(|e| DialError::ResolveFailed(format!("invalid upstream authority: {e}")))?;
            let (tcp, peer) = resolver.dial(&target).await?;
            if !https {
                return Ok(Stream::Plain(TokioIo::new(tcp), peer));
            }
            let name = match &target.host {
                addr::Host::Name(n) => ServerName::try_from(n.clone()),
                addr::Host::Ip(ip) => Ok(ServerName::IpAddress((*ip).into())),
            }
            .map_err(|e| DialError::Unreachable(io::Error::other(e)))?;
            let stream = tls.connect(name, tcp).await.map_err(DialError::Unreachable)?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream)), peer))
        })
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(_, a) | Stream::Tls(_, a) => Connected::new().extra(UpstreamAddr(*a)),
        }
    }
}

impl Read for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s, _) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The client the git route and the API routes send with.
pub type HttpsClient = hyper_util::client::legacy::Client<HttpsConnector, ProxyBody>;

/// Sends `req` and waits up to `timeout` for the response headers. A failure maps to a
/// deny reason and a detail that names the upstream as `what`.
pub async fn send(
    client: &HttpsClient,
    req: http::Request<ProxyBody>,
    timeout: std::time::Duration,
    what: &str,
) -> Result<http::Response<hyper::body::Incoming>, (DenyReason, String)> {
    match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(match crate::dial::dial_error(&e) {
            Some(d) => (d.reason(), d.to_string()),
            None => (DenyReason::UpstreamUnreachable, format!("{what} could not be reached")),
        }),
        Err(_) => Err((DenyReason::UpstreamTimeout, format!("{what} did not answer in time"))),
    }
}
