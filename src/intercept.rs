//! Handler: TLS inspection. A CONNECT (or transparent connection) to a host the
//! sandbox's policy lists in `inspect` is terminated here with a leaf certificate
//! minted for the name (`intercept::ca`); the requests inside (HTTP/1.1 or HTTP/2, by
//! ALPN) are served one by one and each is decided on its own. The dispatcher
//! chooses, per request, the git route, an API route or [`request::handle`], which
//! decides request rules, swaps placeholder secrets (`intercept::secrets`) and sends
//! the request on over a verified TLS connection from the sandbox's own pool.

pub mod ca;
pub mod charset;
pub mod github_api;
pub mod placeholders;
pub mod request;
pub mod secrets;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;

use crate::addr::{Host, Target};
use crate::config::InterceptConfig;
use crate::door::ProxyBody;
use crate::door::watch::{Watch, Watched};
use crate::https_client::{Clients, HttpsConnector};
use crate::resolve::Resolver;

/// What inspection runs with: the CA and the upstream client.
pub struct Intercept {
    pub ca: ca::Authority,
    /// One pool per sandbox; verifies upstream certificates against the system roots
    /// plus `intercept.upstream_ca_file`; resumes TLS sessions.
    pub clients: Clients,
}

impl Intercept {
    /// `stall`: how long an upstream write may make no progress (the idle timeout).
    pub fn new(cfg: &InterceptConfig, resolver: Arc<Resolver>, stall: Duration) -> Result<Intercept, String> {
        let ca = ca::Authority::load(&cfg.ca_cert_file, &cfg.ca_key_file, cfg.leaf_ttl)?;
        let tls = crate::https_client::client_config(cfg.upstream_ca_file.as_deref())?;
        Ok(Intercept { ca, clients: Clients::new(HttpsConnector::new(resolver, tls, stall)) })
    }
}

/// Terminates the client's TLS on `io` as `target`'s host. A ClientHello whose SNI
/// names another host is refused: the name decided is the name served.
pub async fn accept<IO>(ca: &ca::Authority, io: IO, target: &Target, timeout: Duration) -> Result<TlsStream<IO>, String>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(timeout, acceptor).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("not a TLS ClientHello: {e}")),
        Err(_) => return Err("no TLS ClientHello in time".into()),
    };
    if let Some(sni) = start.client_hello().server_name() {
        let same = match &target.host {
            Host::Name(n) => sni.trim_end_matches('.').eq_ignore_ascii_case(n),
            Host::Ip(_) => false,
        };
        if !same {
            return Err(format!("the TLS server name {sni:?} is not the inspected host {}", target.host));
        }
    }
    let config = ca.server_config(&target.host)?;
    match tokio::time::timeout(timeout, start.into_stream(config)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(format!("TLS handshake failed: {e}")),
        Err(_) => Err("TLS handshake timed out".into()),
    }
}

/// Serves HTTP (HTTP/2 when the client chose it by ALPN, else HTTP/1.1 with upgrades)
/// on an inspected connection, each request through `handler`, until the client
/// closes, `watch`'s end is cancelled (a sweep ended the tunnel or a request on it), or
/// no byte moves for `quiet` ([`crate::door::watch::serve`]).
pub async fn serve<IO, F, Fut>(
    tls: TlsStream<IO>,
    watch: Arc<Watch>,
    header_timeout: Duration,
    hard: crate::door::head_limits::Hard,
    quiet: Duration,
    handler: F,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let service = service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler(req).await) }
    });
    let io = TokioIo::new(Watched::new(tls, watch.clone()));
    let result = if h2 {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        let list = u32::try_from(hard.head_bytes).unwrap_or(u32::MAX);
        b.timer(TokioTimer::new()).max_concurrent_streams(128).max_header_list_size(list);
        crate::door::watch::serve(b.serve_connection(io, service), &watch, quiet, None).await
    } else {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .max_header_size(hard.head_bytes)
            .max_headers(hard.fields)
            .max_buf_size(hard.buffer)
            .keep_alive(true);
        crate::door::watch::serve(b.serve_connection(io, service).with_upgrades(), &watch, quiet, None).await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "inspected connection ended with an error");
    }
}
