//! The proxy port (4002) and its dispatcher: accept loops, PROXY protocol, TLS, and
//! [`handle`], which picks the handler for each request (CONNECT, absolute-form
//! forwarding, the git route, API routes). Handlers go through the front door
//! ([`crate::door`]) and never import this module.

pub mod bad_target;
pub mod inspect;
pub mod proxy_protocol;
pub mod server;
pub mod threads;
pub mod tls;
pub mod transparent;

use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;

use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::door::{self, ConnInfo, Door, Entry, ProxyBody, Refusal};
use crate::policy::DenyReason;

/// What the proxy port serves with: the front door, and each handler's own state.
pub struct Shared {
    pub door: Door,
    /// Set on shutdown: `/readyz` answers 503 from then on.
    pub draining: std::sync::atomic::AtomicBool,
    /// Set when the proxy port speaks TLS.
    pub tls: Option<tls::TlsState>,
    pub git: crate::git::handler::GitRoute,
    pub routes: crate::routes::Routes,
    /// TLS inspection (`[intercept]`).
    pub intercept: Option<Arc<crate::intercept::Intercept>>,
    /// How the main config file differed from the one in force, at the last reload.
    pub config_drift: std::sync::Mutex<Option<crate::config::drift::Drift>>,
}

impl std::ops::Deref for Shared {
    type Target = Door;

    fn deref(&self) -> &Door {
        &self.door
    }
}

impl Shared {
    /// Reloads policies, shadow policies, token keys and revocations; on success ends
    /// open connections the new state no longer allows (`proxy.close_revoked_tunnels`).
    pub fn reload(&self) -> Result<u64, crate::config::ConfigError> {
        self.check_config_file();
        let generation = self.store.reload(&self.config)?;
        // Upstream HTTPS connections are not carried across a reload.
        self.git.clients.clear();
        self.routes.clients.clear();
        if let Some(intercept) = &self.intercept {
            intercept.clients.clear();
        }
        if let Some(tls) = &self.tls
            && let Err(e) = tls.reload()
        {
            tracing::error!(error = %e, "TLS certificate reload failed; keeping the previous certificate");
        }
        if self.config.proxy.close_revoked_tunnels {
            let closed = self.registry.close_disallowed(&self.store.snapshot());
            if closed > 0 {
                tracing::info!(closed, generation, "tunnels closed after reload");
            }
        }
        Ok(generation)
    }

    /// Compares the main config file with the one in force, says what an edit changed
    /// (it applies on restart), and keeps the answer for `/v1/status`.
    fn check_config_file(&self) {
        let Some(baseline) = &self.config.baseline else { return };
        let drift = baseline.drift();
        if let Some(d) = &drift {
            let file = baseline.path().display().to_string();
            let keys = d.keys.join(", ");
            match &d.error {
                Some(error) => tracing::error!(
                    file,
                    keys,
                    error,
                    "the main config file changed and would not load: a restart would fail; running on the config it \
                     started with"
                ),
                None => tracing::warn!(
                    file,
                    keys,
                    "the main config file changed; only policy, key and secret files reload: restart to apply"
                ),
            }
        }
        *self.config_drift.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = drift;
    }

    /// What [`Self::check_config_file`] found at the last reload.
    pub fn config_drift(&self) -> Option<crate::config::drift::Drift> {
        self.config_drift.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// Runs [`Shared::reload`] on a blocking thread, so that a slow load (tens of
/// thousands of sandboxes) never stalls the runtime serving the admin listener, the DNS
/// firewall or requests; they keep using the old state until the new one is swapped in.
pub async fn reload_off_thread(shared: &Arc<Shared>) -> Result<u64, crate::config::ConfigError> {
    let shared = shared.clone();
    match tokio::task::spawn_blocking(move || shared.reload()).await {
        Ok(result) => result,
        Err(e) => Err(crate::config::ConfigError::invalid(
            &crate::config::DisplayPath("<reload>".into()),
            "reload",
            format!("the reload task failed: {e}"),
        )),
    }
}

/// What CONNECT hands an inspected tunnel to, when `[intercept]` is configured.
fn inspector(shared: &Arc<Shared>) -> Option<Arc<dyn door::Inspector>> {
    shared.intercept.as_ref().map(|_| Arc::new(inspect::Dispatch(shared.clone())) as Arc<dyn door::Inspector>)
}

/// A plain-TCP connection's first request, when it is a plain CONNECT, served without
/// hyper (`connect::head`). Returns the socket, with what was read from it and not
/// taken in front, when hyper is to serve the connection (the first request is
/// something else, or the client may go on after a refusal); the tunnel to run when
/// it is one now.
pub async fn first_request(
    mut stream: tokio::net::TcpStream,
    conn: &ConnInfo,
    shared: &Arc<Shared>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> crate::connect::First {
    use crate::connect::{First, head};
    let cfg = &shared.config.proxy;
    let mut buf = [0u8; head::FIRST_READ];
    // On shutdown, a connection that has sent nothing yet is closed at once.
    let n = tokio::select! {
        n = head::read_first(&mut stream, &mut buf, cfg.header_read_timeout) => n,
        _ = shutdown.cancelled() => None,
    };
    let Some(n) = n else { return First::Closed };
    let Some(head) = head::parse(&buf[..n], cfg.max_header_bytes, cfg.max_headers) else {
        if let Some((method, target, hint)) = bad_target::refusal(&buf[..n]) {
            refuse_bad_target(stream, conn, shared, &method, &target, &hint).await;
            return First::Closed;
        }
        return First::Serve(crate::replayed::Replayed::new(buf[..n].to_vec(), stream));
    };
    let state = shared.store.snapshot();
    let early = &buf[head.len..n];
    crate::connect::handle_first(&head, early, stream, conn, &shared.door, state, inspector(shared)).await
}

/// Refuses a first request whose target hyper would refuse without a reason
/// ([`bad_target`]): `400 bad_request` with the hint, logged, and the connection closed.
async fn refuse_bad_target(
    mut stream: tokio::net::TcpStream,
    conn: &ConnInfo,
    shared: &Shared,
    method: &str,
    target: &str,
    hint: &str,
) {
    use tokio::io::AsyncWriteExt;
    let generation = shared.store.snapshot().generation;
    let mut rec =
        AccessRecord::with_vpce(Kind::Forward, method, raw_target(target), conn.peer, generation, conn.vpce.clone());
    let mut resp = door::refuse(&mut rec, Refusal::new(DenyReason::BadRequest, hint), Entry::Absolute);
    resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    let bytes = door::respond::serialize(resp).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), stream.write_all(&bytes)).await;
    let _ = stream.shutdown().await;
}

/// An absolute-form request for the gateway's own route or git URL
/// (`GET http://gateway:4002/routes/...`), which a client with `HTTP_PROXY` set sends
/// to the gateway as a proxy: served as the origin-form request it would have sent
/// without one ([`Entry::OwnUrl`]).
async fn own_url(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    shared: &Arc<Shared>,
    state: Arc<crate::reload::State>,
) -> Response<ProxyBody> {
    let door = &shared.door;
    let origin_form = req.uri().path_and_query().and_then(|p| p.as_str().parse::<http::Uri>().ok());
    if let Some(uri) = origin_form {
        *req.uri_mut() = uri;
    }
    if req.uri().path().starts_with("/routes/") {
        crate::routes::handle(req, conn, door, &shared.routes, state, Entry::OwnUrl).await
    } else {
        crate::git::handler::handle(req, conn, door, &shared.git, state, Entry::OwnUrl).await
    }
}

/// Entry point for every request on the proxy port: chooses the handler.
/// `upstream`: the connection's own upstream connection for forwarded requests.
pub async fn handle(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    upstream: &crate::forward::Upstream,
    shared: &Arc<Shared>,
) -> Response<ProxyBody> {
    let door = &shared.door;
    let state = door.store.snapshot();
    let gh_host = &door.config.github.web_host;
    let refuse = async |req: Request<Incoming>, hint: &str| {
        let mut rec = AccessRecord::with_vpce(
            Kind::Forward,
            req.method().as_str(),
            raw_target(&req.uri().to_string()),
            conn.peer,
            state.generation,
            conn.vpce.clone(),
        );
        let resp = door::refuse(&mut rec, Refusal::new(DenyReason::BadRequest, hint), Entry::Absolute);
        crate::door::bodies::refuse_request(req, door.config.proxy.tunnel_idle_timeout, resp).await
    };
    // A WebSocket handshake for a `ws://` URL (aiohttp sends it so) is the same request
    // as for `http://` (RFC 6455 3), and is dispatched as one: to the git route, an API
    // route or the gateway's own URLs as much as to `forward`.
    if req.uri().scheme_str().is_some_and(|s| s.eq_ignore_ascii_case("ws"))
        && crate::door::headers::is_websocket_upgrade(req.headers())
    {
        let mut parts = req.uri().clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    let origin_path = |path: &str| {
        path.starts_with("/routes/")
            || path.strip_prefix('/').and_then(|p| p.strip_prefix(gh_host.as_str())).is_some_and(|r| r.starts_with('/'))
    };
    // An absolute-form `http://` request's host, parsed once (`Uri::host` is not free).
    let absolute_host = if req.uri().scheme_str() == Some("http") { req.uri().host() } else { None };
    let to_github = absolute_host.is_some_and(|h| h.eq_ignore_ascii_case(gh_host));
    let to_route = absolute_host.is_some_and(|h| crate::routes::is_route_host(&door.config.routes, h));
    if req.method() == Method::CONNECT {
        crate::connect::handle(req, conn, door, state, inspector(shared)).await
    } else if let Some(hint) = crate::door::headers::unsupported_transfer_coding(req.headers()) {
        refuse(req, hint).await
    } else if to_github {
        crate::git::handler::handle(req, conn, door, &shared.git, state, Entry::Absolute).await
    } else if to_route {
        crate::routes::handle(req, conn, door, &shared.routes, state, Entry::Absolute).await
    } else if req.uri().scheme_str() == Some("http")
        && origin_path(req.uri().path())
        && req
            .uri()
            .authority()
            .and_then(|a| crate::addr::parse_authority(a.as_str(), Some(80)).ok())
            .is_some_and(|t| door.resolver.is_own_target(&t, &door.config.proxy.names))
    {
        // Boxed: its state need not sit in every request's future.
        Box::pin(own_url(req, conn, shared, state)).await
    } else if req.uri().scheme().is_some() {
        crate::forward::handle(req, conn, door, upstream, state).await
    } else if req.uri().path().starts_with("/routes/") {
        crate::routes::handle(req, conn, door, &shared.routes, state, Entry::Origin).await
    } else if origin_path(req.uri().path()) {
        crate::git::handler::handle(req, conn, door, &shared.git, state, Entry::Origin).await
    } else {
        let hint = "this is a forward proxy: send absolute-form requests (http://host/path) or CONNECT, \
                    e.g. curl -x http://SANDBOX_ID:TOKEN@gateway:4002 URL";
        refuse(req, hint).await
    }
}
