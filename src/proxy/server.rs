//! The accept loop on the proxy port: a semaphore caps connections, accept errors back
//! off, each connection is served by hyper's HTTP/1 server with a header-read timeout
//! and header limits, and shutdown stops accepting and lets connections finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioTimer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use std::convert::Infallible;
use std::net::SocketAddr;

use super::proxy_protocol::{self, Detect};
use super::{Shared, handle};
use crate::access_log::{AccessRecord, Kind};
use crate::config::ProxyProtocol;
use crate::door::head_limits;
use crate::door::watch::Watch;
use crate::door::{ConnInfo, Held, respond};
use crate::policy::DenyReason;

/// A connection's place: under `proxy.max_connections`, in its thread's count and in
/// the open-connections gauge, until the connection and any tunnel on it close.
pub struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _load: Option<Load>,
    _active: crate::metrics::ActiveGuard,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

/// Accepts until `shutdown` fires. Connections in progress are told to finish their
/// current request and close; the caller waits for them through `shared.tasks`.
/// `limit` holds `proxy.max_connections` places, shared by every accept loop; with
/// `place`, the loop is thread `me` of several and hands a connection to a thread
/// with fewer open connections ([`Placement::pick`]).
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    limit: Arc<Semaphore>,
    place: Option<(Arc<Placement>, usize)>,
) {
    let inherited = client_options_on_listener(&listener, shared.config.proxy.tcp_keepalive);
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(ok) => {
                backoff = Duration::from_millis(5);
                ok
            }
            Err(e) => {
                // EMFILE and friends: wait instead of spinning.
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            tracing::debug!(client_addr = %peer, "connection refused: proxy.max_connections reached");
            ::metrics::counter!(crate::metrics::PROXY_CONNECTIONS_REFUSED).increment(1);
            let generation = shared.store.snapshot().generation;
            let mut rec = AccessRecord::new(Kind::Unparsed, "", String::new(), peer, generation);
            rec.reason = Some(DenyReason::LimitExceeded.code());
            rec.status = 503;
            rec.emit();
            shared.tasks.spawn(refuse(stream));
            continue;
        };
        if !inherited {
            let _ = stream.set_nodelay(true);
            crate::resolve::set_keepalive(&stream, shared.config.proxy.tcp_keepalive);
        }
        let (shared, shutdown) = (shared.clone(), shutdown.clone());
        let Some((placement, me)) = &place else {
            let slot = Slot { _permit: permit, _load: None, _active: crate::metrics::ActiveGuard::connection() };
            shared.tasks.clone().spawn(connection_task(stream, peer, slot, shared, shutdown));
            continue;
        };
        let to = placement.pick(*me);
        let slot = Slot {
            _permit: permit,
            _load: Some(placement.count(to)),
            _active: crate::metrics::ActiveGuard::connection(),
        };
        if to == *me {
            shared.tasks.clone().spawn(connection_task(stream, peer, slot, shared, shutdown));
            continue;
        }
        // Another thread's reactor must own the socket: leave this one's, join that one's.
        let std_stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(client_addr = %peer, error = %e, "cannot hand a connection to another thread");
                continue;
            }
        };
        let handoff = async move {
            match TcpStream::from_std(std_stream) {
                Ok(stream) => connection_task(stream, peer, slot, shared, shutdown).await,
                Err(e) => tracing::debug!(client_addr = %peer, error = %e, "handed-over connection lost"),
            }
        };
        placement.spawn_on(to, handoff);
    }
}

/// The proxy threads' open-connection counts and runtimes.
pub struct Placement {
    load: Vec<AtomicUsize>,
    handles: Vec<tokio::runtime::Handle>,
    tasks: tokio_util::task::TaskTracker,
}

/// One connection in a thread's count, until dropped.
pub struct Load {
    placement: Arc<Placement>,
    thread: usize,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.placement.load[self.thread].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Placement {
    pub fn new(handles: Vec<tokio::runtime::Handle>, tasks: tokio_util::task::TaskTracker) -> Placement {
        Placement { load: handles.iter().map(|_| AtomicUsize::new(0)).collect(), handles, tasks }
    }

    /// The thread for a connection thread `me` accepted: `me`, unless another has
    /// fewer open connections by more than one and an eighth, which keeps hand-overs
    /// (two extra system calls) rare once loads are even while a handful of bulk
    /// tunnels still spread across threads.
    pub fn pick(&self, me: usize) -> usize {
        let load = |i: usize| self.load.get(i).map_or(usize::MAX, |l| l.load(Ordering::Relaxed));
        let (least, least_load) = (0..self.load.len()).map(|i| (i, load(i))).min_by_key(|&(_, l)| l).unwrap_or((me, 0));
        if load(me) > least_load + least_load / 8 { least } else { me }
    }

    fn count(self: &Arc<Self>, thread: usize) -> Load {
        if let Some(l) = self.load.get(thread) {
            l.fetch_add(1, Ordering::Relaxed);
        }
        Load { placement: self.clone(), thread }
    }

    fn spawn_on(&self, thread: usize, fut: impl Future<Output = ()> + Send + 'static) {
        if let Some(h) = self.handles.get(thread) {
            self.tasks.spawn_on(fut, h);
        }
    }
}

/// TCP_NODELAY and keepalive for client connections. Linux copies both from the
/// listening socket to every socket it accepts, which saves four system calls per
/// connection; elsewhere, or if the listener refuses them, each connection gets them
/// itself (`false`).
fn client_options_on_listener(listener: &TcpListener, keepalive: Duration) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let sock = socket2::SockRef::from(listener);
    sock.set_tcp_nodelay(true).is_ok() && sock.set_tcp_keepalive(&crate::resolve::keepalive_params(keepalive)).is_ok()
}

/// A client connection's task: [`connection`], then the tunnel it became on the fast
/// path, if it became one, in the same task (a second task per CONNECT cost a setup
/// its spawn, scheduling and cell).
///
/// `connection`'s state (about 5 KB) is boxed and freed before the tunnel runs, so an
/// idle tunnel holds only its own state. The box also keeps this future small: a
/// task's future is moved whole on its way into its task, and its stage written whole
/// when it ends, which cost a setup about 4,000 instructions of copying.
async fn connection_task(
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    if let Some(tunnel) = Box::pin(connection(stream, peer, slot, shared, shutdown)).await {
        tunnel.await;
    }
}

/// One admitted client connection: PROXY header and allow-list admission, the TLS
/// handshake when configured, then hyper until the connection closes or is upgraded;
/// or the tunnel to run, when its first request is a CONNECT the fast path
/// (`super::first_request`) authorized. Hyper's and the TLS path's state lives in a
/// box freed when hyper lets go of the connection, because a stale waker that hyper
/// leaves in the socket's registration can keep a task's cell alive for as long as a
/// tunnel on the socket runs.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) -> Option<crate::connect::Tunnel> {
    let mut stream = stream;
    // A peer that is not a trusted proxy is held to its share before the PROXY header
    // wait (up to header_read_timeout) too; a trusted proxy's clients are held to
    // theirs once the header names them.
    let cfg = &shared.config.proxy;
    let early =
        if cfg.proxy_protocol != ProxyProtocol::Off && !cfg.trusted_proxies.iter().any(|n| n.contains(&peer.ip())) {
            match shared.admission.admit(peer.ip()) {
                Some(p) => Some(p),
                None => {
                    refuse_over_share(stream, peer, None, &shared).await;
                    return None;
                }
            }
        } else {
            None
        };
    let mut conn = admit(&mut stream, peer, &shared).await?;
    let pending = match early {
        Some(p) => p,
        None => match shared.admission.admit(conn.peer.ip()) {
            Some(p) => p,
            None => {
                refuse_over_share(stream, conn.peer, conn.vpce.clone(), &shared).await;
                return None;
            }
        },
    };
    conn.held = Some(Arc::new(Held { share: pending, place: slot }));
    match &shared.tls {
        // A client that sends its first byte just before the header-read timeout gets
        // that timeout again from hyper: at most twice it, once.
        None => match super::first_request(stream, &conn, &shared, &shutdown).await {
            crate::connect::First::Tunnel(tunnel) => return Some(tunnel),
            crate::connect::First::Serve(stream) => Box::pin(serve_connection(stream, conn, shared, shutdown)).await,
            crate::connect::First::Closed => {}
        },
        Some(tls) => Box::pin(tls_connection(stream, tls.acceptor(), conn, shared, shutdown)).await,
    }
    None
}

/// A connection on a TLS proxy listener: the handshake, then hyper.
async fn tls_connection(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    mut conn: ConnInfo,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let handshake = tokio::time::timeout(shared.config.proxy.header_read_timeout, acceptor.accept(stream));
    match handshake.await {
        Ok(Ok(tls_stream)) => {
            if shared.config.proxy.tls_client_cn_is_sandbox {
                conn.client_cn = super::tls::peer_cn(&tls_stream);
                if conn.client_cn.is_none() {
                    tracing::debug!(client_addr = %conn.peer, "client certificate without a subject CN");
                    return;
                }
            }
            serve_connection(tls_stream, conn, shared, shutdown).await
        }
        Ok(Err(e)) => tracing::debug!(client_addr = %conn.peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(client_addr = %conn.peer, "TLS handshake timed out"),
    }
}

/// Applies `proxy.proxy_protocol`: a header is believed only from `trusted_proxies`
/// (from anyone else it closes the connection); `required` closes connections without
/// one. Returns the connection's facts, with the real client address, or `None` to
/// close.
pub(super) async fn admit(stream: &mut TcpStream, peer: SocketAddr, shared: &Shared) -> Option<ConnInfo> {
    let cfg = &shared.config.proxy;
    let conn = admit_proxy_protocol(stream, peer, shared).await?;
    if !cfg.allowed_clients.is_empty() && !cfg.allowed_clients.iter().any(|n| n.contains(&conn.peer.ip())) {
        tracing::debug!(client_addr = %conn.peer, "connection closed: client not in proxy.allowed_clients");
        ::metrics::counter!(crate::metrics::PROXY_CLIENTS_REJECTED).increment(1);
        return None;
    }
    Some(conn)
}

async fn admit_proxy_protocol(stream: &mut TcpStream, peer: SocketAddr, shared: &Shared) -> Option<ConnInfo> {
    let cfg = &shared.config.proxy;
    if cfg.proxy_protocol == ProxyProtocol::Off {
        return Some(ConnInfo::at(peer, None));
    }
    let trusted = cfg.trusted_proxies.iter().any(|n| n.contains(&peer.ip()));
    let reject = |why: &'static str| {
        tracing::debug!(client_addr = %peer, why, "connection closed by PROXY protocol admission");
        ::metrics::counter!(crate::metrics::PROXY_PROTOCOL_REJECTED, "why" => why).increment(1);
        None
    };
    let kind = match proxy_protocol::sniff(stream, cfg.header_read_timeout).await {
        Ok(k) => k,
        Err(_) => return reject("timeout"),
    };
    match (kind, trusted, cfg.proxy_protocol) {
        (Detect::V1 | Detect::V2, false, _) => reject("untrusted_header"),
        (Detect::V1 | Detect::V2, true, _) => {
            match proxy_protocol::read_header(stream, kind, cfg.header_read_timeout).await {
                Ok(h) => Some(ConnInfo::at(h.source.unwrap_or(peer), h.vpce)),
                Err(_) => reject("malformed_header"),
            }
        }
        (_, _, ProxyProtocol::Required) => reject("missing_header"),
        _ => Some(ConnInfo::at(peer, None)),
    }
}

/// What the requests of a connection hyper serves go to.
#[derive(Debug, Clone, Copy)]
pub enum Serve {
    /// The proxy port: `super::handle` chooses the handler.
    Proxy,
    /// A plain-HTTP transparent listener: each request made absolute-form by
    /// `transparent::http_request` (`port` being the one the client dialled), then
    /// forwarded.
    TransparentHttp { port: u16 },
}

/// Serves one client byte stream (already admitted) until it closes or is upgraded.
pub async fn serve_connection<I>(stream: I, conn: ConnInfo, shared: Arc<Shared>, shutdown: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    serve_stream(stream, conn, shared, shutdown, false, Serve::Proxy).await
}

/// Like [`serve_connection`], for `serve`'s requests; with `half_close`, a client's end
/// of input does not abort the request in progress (the fuzz harness writes its input,
/// then closes).
pub async fn serve_stream<I>(
    stream: I,
    conn: ConnInfo,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    half_close: bool,
    serve: Serve,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &shared.config.proxy;
    // hyper refuses a head over twice the byte limit (or over the field count) with a
    // bare 431; the service refuses the rest of what is over, saying which limit.
    let hard = head_limits::hard(cfg.max_header_bytes, cfg.max_headers);
    let mut builder = http1::Builder::new();
    builder
        .half_close(half_close)
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_read_timeout)
        .max_header_size(hard.head_bytes)
        .max_headers(hard.fields)
        .max_buf_size(hard.buffer)
        .keep_alive(true);
    let svc_shared = shared.clone();
    let remembered = Some(Arc::new(crate::door::Remembered::default()));
    let watch = Arc::new(Watch::default());
    let conn = ConnInfo { remembered, watch: Some(watch.clone()), ..conn };
    // The connection's facts and its upstream connection: one clone per request.
    let per_conn = Arc::new((conn.clone(), crate::forward::Upstream::default()));
    let service = service_fn(move |req| {
        let shared = svc_shared.clone();
        let per_conn = per_conn.clone();
        async move {
            // A head over `proxy.max_header_bytes` or `proxy.max_headers`: `431
            // request_too_large`, saying which, and the connection closed.
            let cfg = &shared.config.proxy;
            let over = head_limits::over(req.method(), req.uri(), req.headers(), cfg.max_header_bytes, cfg.max_headers);
            let resp = match (over, serve) {
                (Some(hint), _) => Box::pin(refuse_over_limits(req, &per_conn.0, &shared, serve, hint)).await,
                (None, Serve::Proxy) => handle(req, &per_conn.0, &per_conn.1, &shared).await,
                (None, Serve::TransparentHttp { port }) => transparent_http(req, &per_conn, &shared, port).await,
            };
            Ok::<_, Infallible>(resp)
        }
    });
    let io = crate::door::watch::served(stream, watch.clone());
    let connection = builder.serve_connection(io, service).with_upgrades();
    let result = crate::door::watch::serve(connection, &watch, quiet_limit(&shared.config), Some(&shutdown)).await;
    if let Err(e) = result {
        tracing::debug!(client_addr = %conn.peer, error = %e, "connection ended with an error");
        if let Some((reason, status)) = parser_refusal(&e) {
            let generation = shared.store.snapshot().generation;
            let mut rec =
                AccessRecord::with_vpce(Kind::Unparsed, "", String::new(), conn.peer, generation, conn.vpce.clone());
            rec.reason = Some(reason.code());
            rec.status = status;
            rec.emit();
        }
    }
}

/// The refusal of a head over the limits (`door::head_limits`): recorded, its body
/// drained as any refusal's is, and the connection closed.
async fn refuse_over_limits(
    req: hyper::Request<hyper::body::Incoming>,
    conn: &ConnInfo,
    shared: &Shared,
    serve: Serve,
    hint: String,
) -> hyper::Response<crate::door::ProxyBody> {
    let kind = match serve {
        Serve::TransparentHttp { .. } => Kind::Transparent,
        Serve::Proxy if req.method() == http::Method::CONNECT => Kind::Connect,
        Serve::Proxy => Kind::Forward,
    };
    let generation = shared.store.snapshot().generation;
    let target = crate::access_log::raw_target(&req.uri().to_string());
    let mut rec =
        AccessRecord::with_vpce(kind, req.method().as_str(), target, conn.peer, generation, conn.vpce.clone());
    let refusal = crate::door::Refusal::new(DenyReason::RequestTooLarge, hint);
    let resp = crate::door::refuse(&mut rec, refusal, crate::door::Entry::Absolute);
    let idle = shared.config.proxy.tunnel_idle_timeout;
    let mut resp = crate::door::bodies::refuse_request(req, idle, resp).await;
    resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    resp
}

/// A plain-HTTP transparent listener's request: made absolute-form by
/// `transparent::http_request`, then forwarded.
async fn transparent_http(
    req: hyper::Request<hyper::body::Incoming>,
    per_conn: &(ConnInfo, crate::forward::Upstream),
    shared: &Shared,
    port: u16,
) -> hyper::Response<crate::door::ProxyBody> {
    let sidecar = shared.config.transparent.as_ref().and_then(|c| c.sandbox.as_deref());
    let door = &shared.door;
    match crate::transparent::http_request(req, &per_conn.0, door, sidecar, port).await {
        Ok((req, conn)) => {
            let state = door.store.snapshot();
            crate::forward::handle_as(crate::access_log::Kind::Transparent, req, &conn, door, &per_conn.1, state).await
        }
        Err(refusal) => refusal,
    }
}

/// How long a served connection may move no byte: the longest of the idle timeouts
/// (`proxy.tunnel_idle_timeout`, the git route's `github.idle_timeout`) and the wait
/// for response headers (a request waiting upstream is not idle).
pub fn quiet_limit(config: &crate::config::Config) -> Duration {
    let p = &config.proxy;
    p.tunnel_idle_timeout.max(p.response_header_timeout).max(config.github.idle_timeout)
}

/// The refusal hyper wrote on its own before it closed a connection (a bare 400, 414
/// or 431, for a request it could not parse or that broke `proxy.max_header_bytes` or
/// `proxy.max_headers`): the reason and status to log. `None` for every other error,
/// where nothing was answered.
fn parser_refusal(e: &hyper::Error) -> Option<(DenyReason, u16)> {
    if !e.is_parse() || e.is_parse_status() || e.is_parse_version_h2() {
        return None;
    }
    if e.is_parse_too_large() {
        // A head over the limits gets 431, a URI over 65,534 bytes 414; hyper tells the
        // two apart only in its message.
        let status = if e.to_string().contains("URI") { 414 } else { 431 };
        return Some((DenyReason::RequestTooLarge, status));
    }
    Some((DenyReason::BadRequest, 400))
}

/// Answers a connection from an address that holds its unauthenticated share with
/// `429 limit_exceeded`, logs it, and closes it.
async fn refuse_over_share(mut stream: TcpStream, client: SocketAddr, vpce: Option<String>, shared: &Shared) {
    tracing::debug!(client_addr = %client, "connection refused: its address holds its unauthenticated share");
    ::metrics::counter!(crate::metrics::PROXY_CONNECTIONS_REFUSED).increment(1);
    let generation = shared.store.snapshot().generation;
    let mut rec = AccessRecord::with_vpce(Kind::Unparsed, "", String::new(), client, generation, vpce);
    rec.reason = Some(DenyReason::LimitExceeded.code());
    rec.status = 429;
    rec.emit();
    let bytes = respond::over_client_share_bytes();
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&bytes)).await;
    let _ = stream.shutdown().await;
}

/// Answers a connection over the limit with `503 limit_exceeded` and closes it.
async fn refuse(mut stream: TcpStream) {
    let bytes = respond::over_capacity_bytes();
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&bytes)).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_a_thread_with_clearly_fewer() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap_or_else(|e| panic!("{e}"));
        let handles = vec![rt.handle().clone(), rt.handle().clone()];
        let p = Arc::new(Placement::new(handles, tokio_util::task::TaskTracker::new()));
        assert_eq!(p.pick(0), 0, "even loads: keep it");
        let first = p.count(0);
        assert_eq!(p.pick(0), 1, "1 against 0: hand it over");
        assert_eq!(p.pick(1), 1);
        let second = p.count(1);
        assert_eq!(p.pick(0), 0);
        drop(second);
        assert_eq!(p.pick(0), 1, "a closed connection leaves the count");
        drop(first);
        // Within an eighth, loads count as even: no hand-over (two system calls).
        let mut held: Vec<Load> = (0..17).map(|_| p.count(0)).collect();
        held.extend((0..16).map(|_| p.count(1)));
        assert_eq!(p.pick(0), 0, "17 against 16");
        held.push(p.count(0));
        held.push(p.count(0));
        assert_eq!(p.pick(0), 1, "19 against 16");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn accepted_sockets_inherit_nodelay_and_keepalive_from_the_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        assert!(client_options_on_listener(&listener, Duration::from_secs(37)));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let _client = TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("{e}"));
        let (accepted, _) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
        let sock = socket2::SockRef::from(&accepted);
        assert!(sock.tcp_nodelay().unwrap_or(false));
        assert!(sock.keepalive().unwrap_or(false));
        assert_eq!(sock.tcp_keepalive_time().ok(), Some(Duration::from_secs(37)));
        assert_eq!(sock.tcp_keepalive_interval().ok(), Some(Duration::from_secs(10)));
    }
}
