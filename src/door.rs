//! The front door: what every entry path (CONNECT, absolute-form forwarding, the git
//! route, API routes) goes through before it does its own I/O.
//!
//! - [`identify`]: which sandbox (credentials, failure budget, VPC endpoint and
//!   client-certificate binding);
//! - [`authorize`]: the policy decision over a [`Subject`](crate::policy::Subject),
//!   shadow policies, report mode, limits, and the connection's registration (so
//!   reload and expiry sweeps can end it);
//! - [`record`]: every refusal answered and logged the same way, from one event (the
//!   [`AccessRecord`](crate::access_log::AccessRecord)).
//!
//! Handlers receive an [`Authorized`] request and never import the dispatcher
//! ([`crate::proxy`]) or each other.

pub mod admission;
pub mod bodies;
pub mod head_limits;
pub mod headers;
pub mod limits;
pub mod linger;
pub mod method_field;
pub mod record;
pub mod registry;
pub mod respond;
pub mod watch;

mod authorize;
mod identify;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::reload::Store;
use crate::resolve::Resolver;

pub use authorize::{Authorized, SANDBOX_CONNECTIONS_HINT, authorize, authorize_as, identified};
pub use identify::{AUTH_HINT, Presented, Remembered, identify, identify_by_address};
pub use record::{Abandoned, Refusal, refuse};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the door and every handler share: configuration, the current policies, the
/// resolver, limits and the registry of live connections.
pub struct Door {
    pub config: Config,
    pub store: Store,
    pub resolver: Arc<Resolver>,
    /// Tunnels and upgraded connections outlive their request; they are tracked here so
    /// shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Every live connection, with the subject that authorized it; ends them all when
    /// in-flight work must stop (after the shutdown grace period).
    pub registry: registry::Registry,
    /// Per-sandbox concurrency and rate (`proxy.sandbox_max_*`).
    pub limits: limits::SandboxLimits,
    /// Per API route: the per-sandbox request budget (`sandbox_requests_per_minute`).
    pub route_budgets: HashMap<String, limits::SandboxLimits>,
    /// Policies' egress budgets, and with a shared store the fleet-wide limits.
    pub budgets: crate::budget::Budgets,
    /// Per client address: connections not yet authenticated, failed authentications.
    pub admission: Arc<admission::Admission>,
}

/// What a connection holds for as long as it, or any tunnel or upgraded exchange on it,
/// lives: its share (against its address until a request on it authenticates, then for
/// its sandbox) and its place under `proxy.max_connections` and in the gauges, which
/// the listener that accepted it decides (`()` for none). One allocation per
/// connection for both.
pub struct Held<S: ?Sized + Send + Sync = dyn Send + Sync> {
    pub share: admission::Pending,
    pub place: S,
}

/// Per-connection facts.
#[derive(Clone)]
pub struct ConnInfo {
    /// The client: the TCP peer, or the address a trusted PROXY header names.
    pub peer: SocketAddr,
    /// The AWS VPC endpoint the connection came through (PROXY protocol v2 TLV).
    pub vpce: Option<String>,
    /// With `proxy.tls_client_cn_is_sandbox`: the client certificate's subject CN,
    /// which must equal the authenticated sandbox id.
    pub client_cn: Option<String>,
    /// The connection's share and place ([`Held`]); tunnels and upgraded connections
    /// keep a clone, so they count until they close. Inside an inspected connection,
    /// the outer connection's, so that a WebSocket upgraded inside it counts too.
    pub held: Option<Arc<Held>>,
    /// Inside an inspected connection (TLS terminated by the gateway): the sandbox that
    /// opened it, which every request on it is.
    pub identity: Option<crate::auth::Identity>,
    /// On a connection hyper serves: the credentials its last request proved
    /// ([`Remembered`]), so that a keep-alive request presenting the same
    /// ones under the same state is not parsed and hashed again.
    pub remembered: Option<Arc<identify::Remembered>>,
    /// On a connection the gateway serves HTTP on (hyper, or an inspected connection):
    /// its activity and end ([`watch::Watch`]); requests authorized on it register
    /// its end token, so that a sweep ending one closes the connection too.
    pub watch: Option<Arc<watch::Watch>>,
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnInfo")
            .field("peer", &self.peer)
            .field("vpce", &self.vpce)
            .field("client_cn", &self.client_cn)
            .finish_non_exhaustive()
    }
}

/// What a tunnel or upgraded exchange keeps of its connection for as long as it
/// lives: the connection's place under `proxy.max_connections`, and its count for the
/// sandbox under `proxy.sandbox_max_connections` (a tunnel is a connection the
/// sandbox holds).
#[derive(Clone)]
pub struct Place {
    _held: Option<Arc<Held>>,
}

impl ConnInfo {
    /// A connection from `peer` (through `vpce`), nothing else known of it yet.
    pub fn at(peer: SocketAddr, vpce: Option<String>) -> ConnInfo {
        ConnInfo { peer, vpce, client_cn: None, held: None, identity: None, remembered: None, watch: None }
    }

    /// What a tunnel started on this connection keeps of it ([`Place`]).
    pub fn place(&self) -> Place {
        Place { _held: self.held.clone() }
    }

    /// A request on this connection was authorized (identity, policy and limits) for
    /// `sandbox`: the connection no longer counts against its address's unauthenticated
    /// share, and counts for the sandbox instead. A request the policy refuses does not
    /// count: refused requests cost nothing and would otherwise let one sandbox hold
    /// connections for free. `false`: the sandbox holds its share of connections.
    pub fn authorized(&self, sandbox: &Arc<str>) -> bool {
        self.held.as_ref().is_none_or(|h| h.share.authorized(sandbox))
    }
}

/// A byte stream an inspected connection is served on (a CONNECT's upgraded
/// connection, a transparent listener's socket).
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// A connection to inspect, handed to the dispatcher once its destination was
/// authorized: the host, the connection (with the sandbox as its identity) and the
/// token that ends it.
pub struct Inspected {
    pub target: crate::addr::Target,
    pub conn: ConnInfo,
    pub cancel: CancellationToken,
}

/// What an entry path calls when a destination is to be inspected; the dispatcher
/// implements it, so that a handler never imports it (or the handlers it chooses).
pub trait Inspector: Send + Sync {
    /// True when `target` is inspected for a sandbox under `policy`.
    fn inspects(&self, policy: &crate::policy::Policy, target: &crate::addr::Target) -> bool;
    /// Terminates TLS on `io` and serves the requests inside until it closes.
    fn serve(
        &self,
        io: Box<dyn Io>,
        inspected: Inspected,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

/// Relays an upgraded exchange (`101`, WebSocket) as a tunnel, on a tracked task
/// that holds the connection's place and the request's hold, and emits its access
/// record when it ends; returns the `101` for the client, without hop-by-hop headers
/// but the upgrade's. Counted from before the `101` is written, so a scrape after it
/// sees it.
pub fn relay_upgraded(
    door: &Door,
    place: Place,
    hold: Arc<registry::Hold>,
    mut rec: crate::access_log::AccessRecord,
    client: hyper::upgrade::OnUpgrade,
    mut resp: http::Response<hyper::body::Incoming>,
) -> http::Response<ProxyBody> {
    let upstream = hyper::upgrade::on(&mut resp);
    let idle = door.config.proxy.tunnel_idle_timeout;
    let active = crate::metrics::ActiveGuard::tunnel();
    door.tasks.spawn(async move {
        let (_place, _active) = (place, active);
        let cancel = hold.registration().token().clone();
        if let (Ok(c), Ok(u)) = (client.await, upstream.await) {
            let meter = hold.meter().map(|m| &**m);
            let (c, u) = (hyper_util::rt::TokioIo::new(c), hyper_util::rt::TokioIo::new(u));
            let out = crate::relay::relay(c, u, idle, &cancel, meter).await;
            rec.bytes_up = out.up;
            rec.bytes_down = out.down;
            record::budget_ended(&mut rec, out.end, meter);
        }
        rec.emit();
    });
    let (mut parts, _) = resp.into_parts();
    headers::strip_upstream_response(&mut parts, true);
    http::Response::from_parts(parts, respond::empty())
}

/// How a request reached the gateway, which decides where credentials may be and how
/// a missing credential is challenged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Through the proxy (CONNECT or absolute-form): `Proxy-Authorization`, `407`.
    Absolute,
    /// Origin-form on the gateway itself (git, API routes): credentials may also come
    /// in `Authorization` (after a `401` challenge) or an API key header.
    Origin,
    /// An origin-form request sent to the proxy in absolute form for the gateway's own
    /// address (a client with `HTTP_PROXY` set): read as [`Entry::Origin`], challenged
    /// as a proxy challenges (`407`, which git waits for before it sends its proxy
    /// credential).
    OwnUrl,
    /// A request whose sandbox the connection established (a transparent listener's
    /// source address, an inspected connection's CONNECT): no credential can be asked
    /// of it, so a credentials refusal is `403`, without a challenge.
    Identified,
}
