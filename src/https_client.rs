//! A connector for upstreams the gateway itself talks to over HTTPS (GitHub, its API,
//! inspected hosts): every connection is resolved, vetted and dialled like sandbox
//! traffic, then TLS is verified against the platform's roots plus an optional extra
//! CA file. HTTP/1.1 unless a request asks for HTTP/2 ([`Version::Http2`]): then the
//! upstream is offered both by ALPN, and HTTP/2 is spoken where it accepts it.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::addr;
use crate::dial::UpstreamAddr;
use crate::door::ProxyBody;
use crate::door::watch::Stalling;
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
        if certs.is_empty() {
            // A file of anything else would have left only the system's roots.
            return Err(format!("{}: expected PEM certificates, found none", path.display()));
        }
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
    stall: Duration,
    /// The connections this connector opened that are still open, pooled or in use.
    open: Arc<AtomicUsize>,
}

/// One open connection, counted in its connector's `open` until dropped.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(count: &Arc<AtomicUsize>) -> Open {
        count.fetch_add(1, Ordering::Relaxed);
        Open(count.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HttpsConnector {
    /// Connections whose writes make no progress for `stall` (the idle timeout) fail:
    /// an upstream that stops reading a request body does not hold one for ever.
    pub fn new(resolver: Arc<Resolver>, tls: rustls::ClientConfig, stall: Duration) -> Self {
        let open = Arc::default();
        HttpsConnector { resolver, tls: tokio_rustls::TlsConnector::from(Arc::new(tls)), stall, open }
    }

    /// The same connector with TLS sessions of its own: a session (or ticket) one
    /// sandbox's connection got is never resumed by another's, so an upstream cannot
    /// link two sandboxes as one client by their resumptions. With `Version::Http2` it
    /// offers `h2` before `http/1.1`.
    fn with_own_sessions(&self, version: Version) -> HttpsConnector {
        let mut tls = (**self.tls.config()).clone();
        tls.resumption = rustls::client::Resumption::in_memory_sessions(SESSIONS_PER_SANDBOX);
        if version == Version::Http2 {
            tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        }
        HttpsConnector {
            resolver: self.resolver.clone(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            stall: self.stall,
            open: Arc::default(),
        }
    }
}

/// TLS sessions a sandbox's client keeps for resumption (a few per upstream host).
const SESSIONS_PER_SANDBOX: usize = 32;

pub struct Stream {
    io: Io,
    peer: std::net::SocketAddr,
    _open: Open,
}

enum Io {
    Plain(TokioIo<Stalling<TcpStream>>),
    Tls(Box<TokioIo<TlsStream<Stalling<TcpStream>>>>),
}

impl tower_service::Service<Uri> for HttpsConnector {
    type Response = Stream;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (resolver, tls, stall, open) = (self.resolver.clone(), self.tls.clone(), self.stall, self.open.clone());
        Box::pin(async move {
            let https = uri.scheme_str() == Some("https");
            let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
            let target = addr::parse_authority(authority, Some(if https { 443 } else { 80 }))
                .map_err(|e| DialError::ResolveFailed(format!("invalid upstream authority: {e}")))?;
            let (tcp, peer) = resolver.dial(&target).await?;
            let _open = Open::new(&open);
            let tcp = Stalling::new(tcp, stall);
            if !https {
                return Ok(Stream { io: Io::Plain(TokioIo::new(tcp)), peer, _open });
            }
            let name = match &target.host {
                addr::Host::Name(n) => ServerName::try_from(n.clone()),
                addr::Host::Ip(ip) => Ok(ServerName::IpAddress((*ip).into())),
            }
            .map_err(|e| DialError::Unreachable(io::Error::other(e)))?;
            let stream = tls.connect(name, tcp).await.map_err(DialError::Unreachable)?;
            Ok(Stream { io: Io::Tls(Box::new(TokioIo::new(stream))), peer, _open })
        })
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        let connected = Connected::new().extra(UpstreamAddr(self.peer));
        match &self.io {
            Io::Tls(s) if s.inner().get_ref().1.alpn_protocol() == Some(b"h2") => connected.negotiated_h2(),
            _ => connected,
        }
    }
}

impl Read for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One sandbox's HTTPS client: its own pool of upstream connections.
pub type HttpsClient = hyper_util::client::legacy::Client<HttpsConnector, ProxyBody>;

/// How long an unused upstream connection stays pooled, and an unused sandbox's client
/// kept.
const IDLE: Duration = Duration::from_secs(60);
/// Idle connections a sandbox keeps per upstream host.
const IDLE_PER_HOST: usize = 16;
/// Above this many sandboxes' clients, unused ones are swept (at most once per [`IDLE`]).
const SWEEP_ABOVE: usize = 256;
/// Upstream connections one sandbox's client may hold open, pooled or in use, before
/// it is replaced by a fresh one (its idle connections then close). The per-host idle
/// limit alone would let a sandbox that names many hosts (a wildcard it may inspect)
/// keep thousands of idle upstream connections, and their descriptors, for [`IDLE`].
const OPEN_PER_SANDBOX: usize = 256;

/// The HTTPS clients of TLS inspection, the git route and the API routes: one per
/// sandbox, each with its own connection pool. A connection is reused only by the
/// sandbox that opened it, so what one sandbox's exchange leaves on a connection (a
/// late or misframed response) can never answer another sandbox's request.
pub struct Clients {
    connector: HttpsConnector,
    pools: Mutex<Pools>,
    /// [`OPEN_PER_SANDBOX`] (smaller in tests).
    open_limit: usize,
}

struct Pools {
    by_sandbox: HashMap<(Arc<str>, Version), Pooled>,
    swept: Instant,
}

struct Pooled {
    client: HttpsClient,
    used: Instant,
    /// The client's open connections ([`HttpsConnector::open`]).
    open: Arc<AtomicUsize>,
}

/// What a request may be sent as upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// HTTP/1.1 only (an upgrade, a WebSocket, needs it; so do the git and API routes,
    /// whose handlers frame bodies themselves).
    Http1,
    /// HTTP/2 where the upstream offers it, else HTTP/1.1: for requests a client sent
    /// over HTTP/2 (gRPC needs HTTP/2 end to end, and its trailers).
    Http2,
}

impl Clients {
    pub fn new(connector: HttpsConnector) -> Self {
        let pools = Pools { by_sandbox: HashMap::new(), swept: Instant::now() };
        Clients { connector, pools: Mutex::new(pools), open_limit: OPEN_PER_SANDBOX }
    }

    /// `sandbox`'s client for `version`, made on first use.
    pub fn for_sandbox(&self, sandbox: &Arc<str>, version: Version) -> HttpsClient {
        let now = Instant::now();
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (sandbox.clone(), version);
        // A dropped client's idle connections close; one in use finishes its exchange.
        if let Some(p) = pools.by_sandbox.get_mut(&key) {
            if p.open.load(Ordering::Relaxed) < self.open_limit {
                p.used = now;
                return p.client.clone();
            }
            tracing::debug!(sandbox = %sandbox, open = self.open_limit, "upstream connection pool full: replaced");
        }
        if pools.by_sandbox.len() >= SWEEP_ABOVE && now.duration_since(pools.swept) >= IDLE {
            pools.by_sandbox.retain(|_, p| now.duration_since(p.used) < IDLE);
            pools.swept = now;
        }
        let connector = self.connector.with_own_sessions(version);
        let open = connector.open.clone();
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(IDLE_PER_HOST)
            .set_host(true)
            .build(connector);
        pools.by_sandbox.insert(key, Pooled { client: client.clone(), used: now, open });
        client
    }

    /// Upstream connections open for `sandbox`'s current clients, pooled or in use.
    pub fn open(&self, sandbox: &str) -> usize {
        let pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        pools.by_sandbox.iter().filter(|((s, _), _)| &**s == sandbox).map(|(_, p)| p.open.load(Ordering::Relaxed)).sum()
    }

    /// Drops every sandbox's client and its idle connections (on reload: a peer that
    /// moved, or a sandbox id given to someone else, must not inherit a connection).
    /// A connection in use finishes its exchange and then closes.
    pub fn clear(&self) {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner).by_sandbox.clear();
    }
}

/// Sends `req` over `sandbox`'s own connections and waits up to `timeout` for the
/// response headers. A failure maps to a deny reason and a detail that names the
/// upstream as `what`.
pub async fn send(
    clients: &Clients,
    sandbox: &Arc<str>,
    req: http::Request<ProxyBody>,
    timeout: Duration,
    what: &str,
) -> Result<http::Response<hyper::body::Incoming>, (DenyReason, String)> {
    send_as(clients, sandbox, req, timeout, what, Version::Http1).await
}

/// [`send`], as `version` allows.
pub async fn send_as(
    clients: &Clients,
    sandbox: &Arc<str>,
    req: http::Request<ProxyBody>,
    timeout: Duration,
    what: &str,
    version: Version,
) -> Result<http::Response<hyper::body::Incoming>, (DenyReason, String)> {
    let client = clients.for_sandbox(sandbox, version);
    match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(match (crate::dial::dial_error(&e), crate::dial::body_failure(&e)) {
            (Some(d), _) => (d.reason(), d.client_hint()),
            (None, Some(body)) => (DenyReason::BadRequest, format!("the request body could not be sent: {body}")),
            (None, None) => match crate::dial::unreadable_answer(&e) {
                Some(hint) => (DenyReason::UpstreamInvalid, format!("{what}: {hint}")),
                None => (DenyReason::UpstreamUnreachable, format!("{what} could not be reached")),
            },
        }),
        Err(_) => Err((DenyReason::UpstreamTimeout, format!("{what} did not answer in time"))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// An origin on 127.0.0.1 answering every request on a kept connection; counts the
    /// connections open at its end.
    async fn origin(open: Arc<AtomicUsize>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let open = open.clone();
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let ok = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                            if ok.is_err() {
                                break;
                            }
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        port
    }

    fn clients(limit: usize) -> Clients {
        let text =
            "[egress]\nallow = [\"127.0.0.1/32\"]\n[resolver]\nnameservers = [\"127.0.0.1:9\"]\nhosts_file = false\n";
        let cfg = crate::config::parse(text, &crate::config::DisplayPath("t.toml".into()), Path::new(".")).unwrap();
        let resolver =
            Arc::new(Resolver::new(&cfg.resolver, cfg.egress.filter.clone(), Duration::from_secs(5)).unwrap());
        let tls = client_config(None).unwrap();
        let mut c = Clients::new(HttpsConnector::new(resolver, tls, Duration::from_secs(30)));
        c.open_limit = limit;
        c
    }

    async fn get(c: &Clients, sandbox: &Arc<str>, port: u16) {
        let req = http::Request::get(format!("http://127.0.0.1:{port}/")).body(crate::door::respond::empty()).unwrap();
        let resp = send(c, sandbox, req, Duration::from_secs(5), "origin").await.map_err(|e| e.1).unwrap();
        http_body_util::BodyExt::collect(resp.into_body()).await.unwrap();
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_sandbox_naming_many_hosts_keeps_a_bounded_number_of_upstream_connections() {
        let c = clients(3);
        let open = Arc::new(AtomicUsize::new(0));
        let sandbox: Arc<str> = "sbx".into();
        let other: Arc<str> = "other".into();
        let mut ports = Vec::new();
        for _ in 0..8 {
            ports.push(origin(open.clone()).await);
        }
        // Another sandbox's pooled connection is not touched by this one's.
        get(&c, &other, ports[0]).await;
        let mut most = 0;
        for &port in &ports {
            get(&c, &sandbox, port).await;
            most = most.max(c.open("sbx"));
        }
        assert_eq!(most, 3, "the pool fills up to its limit, and no further");
        // Every host left a kept connection, but the replaced pools' closed: the
        // origins see at most the limit, plus the other sandbox's one.
        until("replaced pools close their idle connections", || open.load(Ordering::SeqCst) <= 3 + 1).await;
        assert_eq!(c.open("other"), 1, "the other sandbox keeps its connection");
        // Without the limit, every host keeps one.
        let c = clients(usize::MAX);
        let open = Arc::new(AtomicUsize::new(0));
        let mut ports = Vec::new();
        for _ in 0..8 {
            ports.push(origin(open.clone()).await);
        }
        for &port in &ports {
            get(&c, &sandbox, port).await;
        }
        assert_eq!(c.open("sbx"), 8);
        until("every host keeps its connection", || open.load(Ordering::SeqCst) == 8).await;
    }
}
