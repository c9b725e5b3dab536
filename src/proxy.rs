//! The proxy on port 4002: CONNECT tunnels and absolute-form HTTP forwarding, both
//! through one decision path (identify, normalise, decide, resolve and vet, act, record).

pub mod admission;
pub mod bodies;
pub mod connect;
pub mod forward;
pub mod limits;
pub mod logged_body;
pub mod proxy_protocol;
pub mod registry;
pub mod respond;
pub mod server;
pub mod threads;
pub mod tls;
pub mod tunnel;
pub mod upstream;
pub mod zero_copy;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::auth;
use crate::config::Config;
use crate::policy::{Decision, DenyReason};
use crate::reload::{State, Store};
use crate::resolve::Resolver;
use respond::Denial;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
pub type UpstreamClient = Client<upstream::VettingConnector, forward::CountingBody<Incoming>>;

/// What every connection handler shares.
pub struct Shared {
    pub config: Config,
    pub store: Store,
    pub resolver: Arc<Resolver>,
    /// One pooled client per proxy thread ([`Shared::client`]), so a pooled upstream
    /// connection is driven by the thread whose requests use it.
    pub clients: Vec<UpstreamClient>,
    /// Tunnels and upgraded connections outlive their request; they are tracked here so
    /// shutdown can wait for them.
    pub tasks: TaskTracker,
    /// Fires when in-flight work must stop (after the shutdown grace period).
    pub hard_stop: CancellationToken,
    /// Set on shutdown: `/readyz` answers 503 from then on.
    pub draining: std::sync::atomic::AtomicBool,
    pub tunnels: registry::Registry,
    pub limits: limits::SandboxLimits,
    /// Per client address: connections not yet authenticated, failed authentications.
    pub admission: Arc<admission::Admission>,
    /// Set when the proxy port speaks TLS.
    pub tls: Option<tls::TlsState>,
    /// The git route's upstream client and GitHub credentials.
    pub git: crate::git::upstream::GitRoute,
    /// The API routes' upstream client and request budgets.
    pub routes: crate::routes::Routes,
}

impl Shared {
    /// The calling proxy thread's upstream client (the first one off those threads).
    pub fn client(&self) -> &UpstreamClient {
        let i = threads::current().unwrap_or(0);
        &self.clients[i % self.clients.len()]
    }

    /// Reloads policies, shadow policies, token keys and revocations; on success closes
    /// open tunnels the new state no longer allows (`proxy.close_revoked_tunnels`).
    pub fn reload(&self) -> Result<u64, crate::config::ConfigError> {
        let generation = self.store.reload(&self.config)?;
        if let Some(tls) = &self.tls
            && let Err(e) = tls.reload()
        {
            tracing::error!(error = %e, "TLS certificate reload failed; keeping the previous certificate");
        }
        if self.config.proxy.close_revoked_tunnels {
            let closed = self.tunnels.close_disallowed(&self.store.snapshot());
            if closed > 0 {
                tracing::info!(closed, generation, "tunnels closed after reload");
            }
        }
        Ok(generation)
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

/// Per-connection facts.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client: the TCP peer, or the address a trusted PROXY header names.
    pub peer: SocketAddr,
    /// The AWS VPC endpoint the connection came through (PROXY protocol v2 TLV).
    pub vpce: Option<String>,
    /// With `proxy.tls_client_cn_is_sandbox`: the client certificate's subject CN,
    /// which must equal the authenticated sandbox id.
    pub client_cn: Option<String>,
    /// The connection's place under `proxy.max_connections`; tunnels and upgraded
    /// connections keep a clone, so they count until they close.
    pub slot: Option<Arc<server::Slot>>,
    /// Counts against its address's unauthenticated share until a request on it
    /// authenticates.
    pub pending: Option<Arc<admission::Pending>>,
}

/// Entry point for every request on the proxy port.
pub async fn handle(req: Request<Incoming>, conn: &ConnInfo, shared: &Arc<Shared>) -> Response<ProxyBody> {
    let state = shared.store.snapshot();
    let gh_host = &shared.config.github.web_host;
    if req.method() == Method::CONNECT {
        connect::handle(req, conn, shared, state).await
    } else if req.uri().scheme_str() == Some("http")
        && req.uri().host().is_some_and(|h| h.eq_ignore_ascii_case(gh_host))
    {
        crate::git::upstream::handle(req, conn, shared, state, Entry::Absolute).await
    } else if req.uri().scheme_str() == Some("http")
        && req.uri().host().is_some_and(|h| crate::routes::is_route_host(&shared.config.routes, h))
    {
        crate::routes::handle(req, conn, shared, state, Entry::Absolute).await
    } else if req.uri().scheme().is_some() {
        forward::handle(req, conn, shared, state).await
    } else if req.uri().path().starts_with("/routes/") {
        crate::routes::handle(req, conn, shared, state, Entry::Origin).await
    } else if req
        .uri()
        .path()
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(gh_host.as_str()))
        .is_some_and(|r| r.starts_with('/'))
    {
        crate::git::upstream::handle(req, conn, shared, state, Entry::Origin).await
    } else {
        let mut rec = AccessRecord::with_vpce(
            Kind::Forward,
            req.method().as_str(),
            raw_target(&req.uri().to_string()),
            conn.peer,
            state.generation,
            conn.vpce.clone(),
        );
        let hint = "this is a forward proxy: send absolute-form requests (http://host/path) or CONNECT, \
                    e.g. curl -x http://SANDBOX_ID:TOKEN@gateway:4002 URL";
        reject(&mut rec, DenyReason::BadRequest, hint)
    }
}

/// What a sandbox is told when its proxy credentials are missing or wrong.
pub const AUTH_HINT: &str = "use http://SANDBOX_ID:TOKEN@gateway:4002 as the proxy URL";

/// Authenticates from `Proxy-Authorization`, and holds a sandbox bound to VPC endpoints
/// (`vpce = [...]`) to the endpoint the connection came through.
fn identify(
    state: &State,
    req: &Request<Incoming>,
    conn: &ConnInfo,
    shared: &Shared,
) -> Result<auth::Identity, auth::AuthError> {
    let value = req.headers().get(http::header::PROXY_AUTHORIZATION).map(|v| v.as_bytes());
    within_failure_budget(shared, conn, || {
        let identity = auth::authenticate_header(&state.policies, &state.tokens, value, crate::tokens::now())?;
        check_binding(&identity, conn)?;
        Ok(identity)
    })
}

/// Runs an authentication under the client address's budget of failures: over it, the
/// credential is not checked at all (`limit_exceeded`). A success ends the connection's
/// unauthenticated state; a failure (other than no credentials at all) spends budget.
pub fn within_failure_budget(
    shared: &Shared,
    conn: &ConnInfo,
    check: impl FnOnce() -> Result<auth::Identity, auth::AuthError>,
) -> Result<auth::Identity, auth::AuthError> {
    let ip = conn.peer.ip();
    if !shared.admission.may_try(ip) {
        return Err(auth::AuthError::TooManyFailures);
    }
    let result = check();
    if let Err(e) = &result
        && *e != auth::AuthError::Missing
    {
        shared.admission.failed(ip);
    }
    result
}

impl ConnInfo {
    /// A request on this connection was authorized (identity, policy and limits) for
    /// `sandbox`: the connection no longer counts against its address's unauthenticated
    /// share, and counts for the sandbox instead. A request the policy refuses does not
    /// count: refused requests cost nothing and would otherwise let one sandbox hold
    /// connections for free. `false`: the sandbox holds its share of connections.
    pub fn authorized(&self, sandbox: &str) -> bool {
        self.pending.as_ref().is_none_or(|p| p.authorized(sandbox))
    }
}

/// The hint of a request refused because its sandbox holds its share of connections.
pub const SANDBOX_CONNECTIONS_HINT: &str = "this sandbox holds proxy.sandbox_max_connections open connections; \
                                            reuse them, or close some";

/// Holds an identity to the connection it came on: a sandbox bound to VPC endpoints
/// must come through one of them, and with mutual TLS the client certificate's CN
/// (when required to) must be the sandbox id.
pub fn check_binding(identity: &auth::Identity, conn: &ConnInfo) -> Result<(), auth::AuthError> {
    if !identity.vpce.is_empty() && !conn.vpce.as_ref().is_some_and(|v| identity.vpce.contains(v)) {
        return Err(auth::AuthError::WrongNetwork);
    }
    if let Some(cn) = &conn.client_cn
        && cn != &identity.sandbox
    {
        return Err(auth::AuthError::WrongCertificate);
    }
    Ok(())
}

/// What a request that passed identification, policy and limits carries on.
pub struct Authorized {
    pub identity: auth::Identity,
    /// The sandbox's concurrency slot, held for the life of the request or tunnel.
    pub permit: limits::Permit,
}

/// The shared front of CONNECT and forwarding: identify the sandbox, decide the target
/// (and under shadow policies), take a per-sandbox slot. Every refusal is recorded and
/// answered here.
fn authorize(
    rec: &mut AccessRecord,
    state: &State,
    req: &Request<Incoming>,
    conn: &ConnInfo,
    shared: &Shared,
    target: &crate::addr::Target,
) -> Result<Authorized, Box<Response<ProxyBody>>> {
    let identity = match identify(state, req, conn, shared) {
        Ok(s) => s,
        Err(
            e @ (auth::AuthError::WrongNetwork | auth::AuthError::WrongCertificate | auth::AuthError::TooManyFailures),
        ) => {
            return Err(Box::new(reject(rec, e.reason(), &e.to_string())));
        }
        Err(e) => return Err(Box::new(reject(rec, e.reason(), AUTH_HINT))),
    };
    let decision = identity.policy.decide(target);
    record_decision(rec, &identity, &decision);
    let subject = crate::dryrun::Subject::Host(target.clone());
    shadow_compare(rec, state, &identity.sandbox, &subject);
    if !decision.permits() {
        let reason = decision.reason().unwrap_or(DenyReason::HostNotAllowed);
        return Err(Box::new(deny_by_policy(rec, &identity.policy, &subject, &decision, reason)));
    }
    let permit = match shared.limits.acquire(&identity.sandbox) {
        Ok(p) => p,
        Err(e) => return Err(Box::new(reject(rec, DenyReason::LimitExceeded, &e.to_string()))),
    };
    if !conn.authorized(&identity.sandbox) {
        return Err(Box::new(reject(rec, DenyReason::LimitExceeded, SANDBOX_CONNECTIONS_HINT)));
    }
    Ok(Authorized { identity, permit })
}

/// How a request reached a route that the gateway answers for itself (git, API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Origin-form on the gateway itself: credentials may come in `Authorization`
    /// (after a 401 challenge).
    Origin,
    /// Absolute-form through the proxy: `Proxy-Authorization`.
    Absolute,
}

/// Records and answers a refusal on a route: like [`reject`], with an optional status
/// override, and on the origin-form entry `401` + `WWW-Authenticate` instead of `407`,
/// so clients that are not talking to a proxy (git, SDKs) send credentials.
pub fn deny_route(
    rec: &mut AccessRecord,
    reason: DenyReason,
    status: Option<http::StatusCode>,
    hint: &str,
    entry: Entry,
) -> Response<ProxyBody> {
    use http::header::{HeaderValue, PROXY_AUTHENTICATE, WWW_AUTHENTICATE};
    let mut resp = respond::deny(
        reason,
        &Denial {
            target: Some(&rec.target),
            sandbox: rec.sandbox.as_deref(),
            policy: rec.policy.as_deref(),
            rule: rec.rule.as_deref(),
            hint: Some(hint.to_string()),
        },
    );
    if let Some(s) = status {
        *resp.status_mut() = s;
    }
    if entry == Entry::Origin && resp.status() == http::StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
        resp.headers_mut().remove(PROXY_AUTHENTICATE);
        resp.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(respond::REALM));
    }
    respond::rephrase(&mut resp, reason, Some(hint));
    let rule = rec.rule.clone();
    finish(rec, reason, rule, resp)
}

/// Records and answers a denial that happened before a sandbox was known, or for a
/// request that is malformed.
fn reject(rec: &mut AccessRecord, reason: DenyReason, hint: &str) -> Response<ProxyBody> {
    let resp = respond::deny(
        reason,
        &Denial {
            target: Some(&rec.target),
            sandbox: rec.sandbox.as_deref(),
            policy: rec.policy.as_deref(),
            hint: Some(hint.to_string()),
            ..Denial::default()
        },
    );
    finish(rec, reason, None, resp)
}

/// Records and answers a policy denial, with the same hint `check` gives.
fn deny_by_policy(
    rec: &mut AccessRecord,
    policy: &crate::policy::Policy,
    subject: &crate::dryrun::Subject,
    decision: &Decision<'_>,
    reason: DenyReason,
) -> Response<ProxyBody> {
    let rule = decision.rule();
    let hint = crate::dryrun::hint(policy, reason, subject, decision);
    let resp = respond::deny(
        reason,
        &Denial {
            target: Some(&rec.target),
            sandbox: rec.sandbox.as_deref(),
            policy: rec.policy.as_deref(),
            rule: rule.map(|r| r.text.as_str()),
            hint,
        },
    );
    let rule = rule.map(|r| r.text.clone());
    finish(rec, reason, rule, resp)
}

/// Records a refusal answered in a route's own terms (git's smart-HTTP refusals).
pub fn record_denial(
    rec: &mut AccessRecord,
    reason: DenyReason,
    rule: Option<String>,
    resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    finish(rec, reason, rule, resp)
}

fn finish(
    rec: &mut AccessRecord,
    reason: DenyReason,
    rule: Option<String>,
    resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    rec.decision = "deny";
    rec.reason = Some(reason.code());
    rec.rule = rule;
    rec.status = resp.status().as_u16();
    rec.emit();
    resp
}

/// Decides `subject` under the shadow policies too; a disagreement is recorded on the
/// access record and counted. Never changes what happens to the request.
fn shadow_compare(rec: &mut AccessRecord, state: &State, sandbox: &str, subject: &crate::dryrun::Subject) {
    let Some(shadow) = &state.shadow else { return };
    let shadow_label = match shadow.sandbox(sandbox) {
        Some(s) => crate::dryrun::decide(&s.policy, subject).label(),
        None => "deny",
    };
    if shadow_label != rec.decision {
        rec.shadow_decision = Some(shadow_label);
        ::metrics::counter!(crate::metrics::POLICY_SHADOW_DISAGREEMENTS, "live" => rec.decision, "shadow" => shadow_label)
            .increment(1);
    }
}

/// Fills the identity and decision fields of a record.
fn record_decision(rec: &mut AccessRecord, sandbox: &auth::Identity, decision: &Decision<'_>) {
    rec.sandbox = Some(sandbox.sandbox.clone());
    rec.policy = Some(sandbox.policy.name().to_string());
    rec.decision = decision.label();
    rec.reason = decision.reason().map(DenyReason::code);
    rec.rule = decision.rule().map(|r| r.text.clone());
    if decision.report_only && decision.reason().is_some() {
        tracing::info!(
            sandbox = %sandbox.sandbox,
            policy = sandbox.policy.name(),
            target = %rec.target,
            reason = decision.reason().map(DenyReason::code),
            "would_deny: policy in report mode let a denied request through"
        );
    }
}
