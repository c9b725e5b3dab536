//! Wiring: bind the listeners, then run until shutdown, draining as a load-balanced
//! instance should.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{self, Admin};
use crate::config::{Config, ConfigError};
use crate::dns::DnsServer;
use crate::door::Door;
use crate::proxy::{self, Shared};
use crate::reload::Store;
use crate::resolve::Resolver;

/// The git route and the API routes: HTTPS clients whose connections are resolved,
/// vetted and dialled like sandbox traffic.
fn upstream_routes(
    config: &Config,
    resolver: &Arc<Resolver>,
) -> Result<(crate::git::handler::GitRoute, crate::routes::Routes), GatewayError> {
    let gh = &config.github;
    let tls = crate::https_client::client_config(gh.ca_file.as_deref())
        .map_err(|e| GatewayError::Github(format!("github.ca_file: {e}")))?;
    // Git bodies may idle for `github.idle_timeout`: an upstream write may stall as long.
    let stall = config.proxy.tunnel_idle_timeout.max(gh.idle_timeout);
    let connector = crate::https_client::HttpsConnector::new(resolver.clone(), tls, stall);
    let credentials = crate::git::credentials::Credentials::new(gh, connector.clone()).map_err(GatewayError::Github)?;
    let clients = || crate::https_client::Clients::new(connector.clone());
    let routes = crate::routes::Routes { clients: clients() };
    Ok((crate::git::handler::GitRoute { clients: clients(), credentials }, routes))
}

/// Everything the proxy port needs, without listeners: loaded policies, the resolver,
/// upstream clients, TLS state.
pub fn build_shared(config: Config) -> Result<Arc<Shared>, GatewayError> {
    build_shared_with(config, |_| {})
}

/// [`build_shared`] for the request-head fuzz target: dials are recorded by
/// `recorder` instead of made.
#[cfg(feature = "fuzzing")]
pub fn build_shared_recording(
    config: Config,
    recorder: crate::resolve::DialRecorder,
) -> Result<Arc<Shared>, GatewayError> {
    build_shared_with(config, |resolver| resolver.record_dials_instead(recorder))
}

fn build_shared_with(config: Config, prepare: impl FnOnce(&mut Resolver)) -> Result<Arc<Shared>, GatewayError> {
    let loaded = crate::reload::load(&config)?;
    let mut resolver = Resolver::with_keepalive(
        &config.resolver,
        config.egress.filter.clone(),
        config.proxy.connect_timeout,
        config.proxy.tcp_keepalive,
    )
    .map_err(GatewayError::Resolver)?;
    prepare(&mut resolver);
    let resolver = Arc::new(resolver);
    let tls = match &config.proxy.tls {
        Some((cert, key)) => {
            Some(crate::proxy::tls::TlsState::load(cert, key, config.proxy.tls_client_ca.as_deref(), &config.file)?)
        }
        None => None,
    };
    let (git, routes) = upstream_routes(&config, &resolver)?;
    let intercept = match &config.intercept {
        Some(cfg) => Some(Arc::new(
            crate::intercept::Intercept::new(cfg, resolver.clone(), config.proxy.tunnel_idle_timeout)
                .map_err(|e| GatewayError::Intercept(format!("{}: {e}", config.file)))?,
        )),
        None => None,
    };
    // With a shared store the per-second and per-route limits are counted there.
    let shared_store = matches!(config.limits.store, crate::config::LimitStore::Redis { .. });
    let limits = crate::door::limits::SandboxLimits::new(
        config.proxy.sandbox_max_concurrent,
        if shared_store { 0 } else { config.proxy.sandbox_max_per_second },
    );
    let (route_budgets, budgets) = if shared_store {
        let fleet = crate::budget::FleetLimits {
            per_second: config.proxy.sandbox_max_per_second,
            routes: config.routes.iter().map(|r| (r.name.clone(), r.sandbox_requests_per_minute)).collect(),
        };
        (Default::default(), crate::budget::Budgets::shared(config.limits.deny_on_store_error, fleet))
    } else {
        (crate::routes::budgets(&config.routes), crate::budget::Budgets::local())
    };
    let admission = Arc::new(crate::door::admission::Admission::with_sandbox_cap(
        config.proxy.max_unauthenticated_per_client,
        config.proxy.auth_failures_per_second,
        config.proxy.sandbox_max_connections,
    ));
    if shared_store {
        let limits = limits.clone();
        budgets.set_active_source(Box::new(move || limits.active_counts()));
    }
    let door = Door {
        store: Store::new(loaded),
        config,
        resolver,
        tasks: TaskTracker::new(),
        registry: Default::default(),
        limits,
        route_budgets,
        budgets,
        admission,
    };
    let shared = Arc::new(Shared {
        door,
        draining: AtomicBool::new(false),
        tls,
        git,
        routes,
        intercept,
        config_drift: Default::default(),
    });
    let weak = Arc::downgrade(&shared);
    shared.resolver.set_peers(Arc::new(move |name: &str| {
        let shared = weak.upgrade()?;
        let state = shared.store.snapshot();
        let suffix = &state.policies.peer_suffix;
        let id = name.strip_suffix(suffix.as_str())?.strip_suffix('.').filter(|id| !id.is_empty())?;
        Some(
            state.policies.peer_address(id).ok_or_else(|| {
                format!("sandbox {id:?} has no single address to be reached at (sandboxes[].addresses)")
            }),
        )
    }));
    Ok(shared)
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("github: {0}")]
    Github(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot bind {what} listener {addr}: {error}")]
    Bind { what: &'static str, addr: SocketAddr, error: std::io::Error },
    #[error("cannot start resolver: {0}")]
    Resolver(std::io::Error),
    #[error("cannot start the proxy threads: {0}")]
    Threads(std::io::Error),
    #[error("limits.store: {0}")]
    LimitStore(String),
    #[error("intercept: {0}")]
    Intercept(String),
}

/// How the gateway is told to stop. `drain` starts the drain (readiness off, accept for
/// `drain.delay`, then stop accepting and wait up to `drain.timeout`); `skip_delay`
/// makes it skip the delay (an operator's Ctrl-C); `force` ends everything at once.
#[derive(Clone, Default)]
pub struct Shutdown {
    pub drain: CancellationToken,
    pub force: CancellationToken,
    pub skip_delay: Arc<AtomicBool>,
}

pub struct Gateway {
    shared: Arc<Shared>,
    proxy: TcpListener,
    admin: TcpListener,
    dns: Option<DnsServer>,
    /// `[transparent]` listeners.
    transparent: Vec<(TcpListener, crate::transparent::Listener)>,
    /// `limits.store` when it is Redis.
    limit_store: Option<crate::budget::store::Store>,
}

impl Gateway {
    /// Loads the policies, builds the resolver, installs the metrics recorder and binds
    /// every listener, so that errors surface before anything is served.
    pub async fn bind(config: Config) -> Result<Gateway, GatewayError> {
        crate::metrics::install();
        let shared = build_shared(config)?;
        let bind = |what: &'static str, addr: SocketAddr| async move {
            TcpListener::bind(addr).await.map_err(|error| GatewayError::Bind { what, addr, error })
        };
        let config = &shared.config;
        let proxy = bind("proxy", config.proxy.listen).await?;
        let admin = bind("admin", config.admin.listen).await?;
        let dns = match &config.dns {
            Some(d) => Some(DnsServer::bind(d, may_reach(&shared)).await.map_err(|error| GatewayError::Bind {
                what: "dns",
                addr: d.listen,
                error,
            })?),
            None => None,
        };
        let mut transparent = Vec::new();
        if let Some(t) = &config.transparent {
            if let Some(a) = t.https_listen {
                transparent.push((bind("transparent https", a).await?, crate::transparent::Listener::Https));
            }
            if let Some(a) = t.http_listen {
                transparent.push((bind("transparent http", a).await?, crate::transparent::Listener::Http));
            }
        }
        let mut own: Vec<SocketAddr> = [proxy.local_addr(), admin.local_addr()].into_iter().flatten().collect();
        own.extend(dns.as_ref().and_then(|d| d.local_addr().ok()));
        own.extend(transparent.iter().filter_map(|(l, _)| l.local_addr().ok()));
        shared.resolver.set_own_listeners(own);
        let limit_store = limit_store(config)?;
        Ok(Gateway { shared, proxy, admin, dns, transparent, limit_store })
    }

    /// Builds everything [`Gateway::bind`] builds but its listeners (keys, secrets,
    /// certificates, upstream clients, the limit store's client), so that a config
    /// that validates is one that serves. The loaded state, to report on.
    pub fn check(config: Config) -> Result<Arc<Shared>, GatewayError> {
        let shared = build_shared(config)?;
        limit_store(&shared.config)?;
        Ok(shared)
    }

    /// The transparent listeners' addresses, HTTPS then HTTP, where configured.
    pub fn transparent_addr(&self, kind: crate::transparent::Listener) -> Option<SocketAddr> {
        self.transparent.iter().find(|(_, k)| *k == kind).and_then(|(l, _)| l.local_addr().ok())
    }

    pub fn proxy_addr(&self) -> std::io::Result<SocketAddr> {
        self.proxy.local_addr()
    }

    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    pub fn dns_addr(&self) -> Option<SocketAddr> {
        self.dns.as_ref().and_then(|d| d.local_addr().ok())
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves until `shutdown.drain` fires, then drains and returns.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), GatewayError> {
        let addr = |a: std::io::Result<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
        let (proxy_addr, admin_addr) = (addr(self.proxy_addr()), addr(self.admin_addr()));
        let dns_addr = self.dns_addr().map(|a| a.to_string());
        let transparent_https = self.transparent_addr(crate::transparent::Listener::Https).map(|a| a.to_string());
        let transparent_http = self.transparent_addr(crate::transparent::Listener::Http).map(|a| a.to_string());
        let Gateway { shared, proxy, admin, dns, transparent, limit_store } = self;
        let st = shared.store.snapshot();
        tracing::info!(
            proxy = %proxy_addr,
            admin = %admin_addr,
            dns = dns_addr,
            transparent_https,
            transparent_http,
            policies = st.policies.policies.len(),
            sandboxes = st.policies.sandboxes.len(),
            proxy_threads = shared.config.proxy.threads,
            "listening"
        );
        drop(st);

        let stop_accepting = CancellationToken::new();
        let proxy_threads = proxy::threads::AcceptThreads::start(proxy, shared.clone(), stop_accepting.clone())
            .map_err(GatewayError::Threads)?;
        let transparent_tasks: Vec<_> = transparent
            .into_iter()
            .map(|(listener, kind)| {
                let limit = proxy_threads.limit();
                tokio::spawn(proxy::transparent::serve(listener, kind, shared.clone(), stop_accepting.clone(), limit))
            })
            .collect();
        let admin_stop = CancellationToken::new();
        let admin_state = Arc::new(Admin { shared: shared.clone(), metrics: crate::metrics::install() });
        let admin_task = tokio::spawn(admin::serve(admin, admin_state, admin_stop.clone()));
        // Not stopped with accepting either: a reload while connections drain (a
        // revocation during a rolling deploy) still ends what it no longer allows.
        let reload_stop = CancellationToken::new();
        let reloader = tokio::spawn(reload_on_sighup(shared.clone(), reload_stop.clone()));
        let watcher = tokio::spawn(reload_on_change(shared.clone(), reload_stop.clone()));
        // Not stopped with accepting: connections being drained still end at expiry.
        let expiry = tokio::spawn(end_expired_connections(shared.clone()));
        let dns_task = dns.map(|d| tokio::spawn(d.run(stop_accepting.clone())));
        // Runs until the very end: drained tunnels still spend.
        let store_stop = CancellationToken::new();
        let mut store_task = None;
        if let Some(store) = limit_store {
            let store = Arc::new(store);
            shared.budgets.set_store(store.clone());
            let interval = shared.config.limits.sync_interval;
            let run = crate::budget::store::run(shared.budgets.clone(), store, interval, store_stop.clone());
            store_task = Some(tokio::spawn(run));
        }
        if !shared.budgets.is_shared() {
            let (budgets, stop) = (shared.budgets.clone(), store_stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => budgets.sweep(),
                    }
                }
            });
        }
        let _store_stop = store_stop.clone().drop_guard();

        shutdown.drain.cancelled().await;
        shared.draining.store(true, Ordering::Relaxed);
        let drain = shared.config.drain;
        let skip = shutdown.skip_delay.load(Ordering::Relaxed);
        tracing::info!(
            delay_s = if skip { 0 } else { drain.delay.as_secs() },
            timeout_s = drain.timeout.as_secs(),
            "draining: not ready; still accepting until the delay ends"
        );
        if !skip {
            tokio::select! {
                _ = tokio::time::sleep(drain.delay) => {}
                _ = shutdown.force.cancelled() => {}
            }
        }
        stop_accepting.cancel();
        proxy_threads.stopped().await;
        for t in transparent_tasks {
            let _ = t.await;
        }
        if let Some(t) = dns_task {
            let _ = t.await;
        }
        tracing::info!(in_flight = shared.tasks.len(), "stopped accepting; waiting for in-flight work");
        shared.tasks.close();
        let finished = tokio::select! {
            r = tokio::time::timeout(drain.timeout, shared.tasks.wait()) => r.is_ok(),
            _ = shutdown.force.cancelled() => false,
        };
        if !finished {
            tracing::warn!(in_flight = shared.tasks.len(), "drain ended early; closing what is left");
            shared.registry.end_all();
            let _ = tokio::time::timeout(Duration::from_secs(2), shared.tasks.wait()).await;
        }
        // The store's last sync hands over what the drained work spent.
        store_stop.cancel();
        if let Some(t) = store_task {
            let _ = tokio::time::timeout(crate::budget::STORE_TIMEOUT * 2, t).await;
        }
        expiry.abort();
        reload_stop.cancel();
        reloader.abort();
        watcher.abort();
        admin_stop.cancel();
        let _ = admin_task.await;
        tracing::info!(clean = finished, "stopped");
        Ok(())
    }
}

/// The shared limit store's client (`limits.store`), when there is one.
fn limit_store(config: &Config) -> Result<Option<crate::budget::store::Store>, GatewayError> {
    match &config.limits.store {
        crate::config::LimitStore::Redis { url, password, ca } => {
            crate::budget::store::Store::new(url, password.as_ref(), ca.as_deref())
                .map(Some)
                .map_err(|e| GatewayError::LimitStore(e.to_string()))
        }
        crate::config::LimitStore::Local => Ok(None),
    }
}

/// How long the watcher waits for changed files to hold still before it reloads them.
const SETTLE: Duration = Duration::from_millis(100);

/// Polls the files a reload reads and reloads when any changes (`policy.watch_interval`).
/// Polling needs no platform support and is cheap at this scale: a few stat calls.
async fn reload_on_change(shared: Arc<Shared>, stop: CancellationToken) {
    let Some(interval) = shared.config.policy.watch_interval else { return };
    let fingerprint = || {
        let config = shared.config.clone();
        tokio::task::spawn_blocking(move || crate::reload::fingerprint(&config))
    };
    let mut last = shared.store.files_at_start();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let Ok(mut now) = fingerprint().await else { continue };
        if now == last {
            continue;
        }
        // A file still being written: wait until the files hold still (briefly, a few
        // times at most) rather than load half of one.
        for _ in 0..10 {
            tokio::time::sleep(SETTLE).await;
            match fingerprint().await {
                Ok(again) if again != now => now = again,
                _ => break,
            }
        }
        last = now;
        tracing::info!("policy files changed; reloading");
        let _ = crate::proxy::reload_off_thread(&shared).await;
    }
}

/// Once a second, ends connections authenticated by a signed token that expired more
/// than `tokens.expiry_grace` ago, so a short-lived token cannot hold a tunnel for hours.
async fn end_expired_connections(shared: Arc<Shared>) {
    let Some(grace) = shared.config.tokens.expiry_grace else { return };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let closed = shared.registry.close_expired(crate::tokens::now(), grace.as_secs());
        if closed > 0 {
            tracing::info!(closed, "connections ended: their signed tokens expired");
        }
    }
}

#[cfg(unix)]
async fn reload_on_sighup(shared: Arc<Shared>, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install SIGHUP handler; reload on signal disabled");
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            r = hup.recv() => if r.is_none() { return },
        }
        // The outcome is logged and counted by the store.
        let _ = crate::proxy::reload_off_thread(&shared).await;
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_shared: Arc<Shared>, _stop: CancellationToken) {}

/// For the DNS firewall's answer mode: may the sandbox at this address (or the
/// instance's one sandbox, `transparent.sandbox`) reach `name` on a transparent port?
/// The same decision a transparent connection to the name gets.
fn may_reach(shared: &Arc<Shared>) -> crate::dns::MayReach {
    let shared = shared.clone();
    Arc::new(move |ip: std::net::IpAddr, name: &str| {
        let state = shared.store.snapshot();
        let transparent = shared.config.transparent.as_ref();
        let sandbox = match transparent.and_then(|t| t.sandbox.as_deref()) {
            Some(id) => state.policies.sandbox(id),
            None => state.policies.sandbox_at(ip),
        };
        let Some(sandbox) = sandbox else { return false };
        let ports = transparent.map_or([443, 80], |t| [t.https_port, t.http_port]);
        ports.iter().any(|port| {
            crate::addr::parse_authority(&format!("{name}:{port}"), None).is_ok_and(|t| {
                // As a transparent connection: a name, never an IP literal.
                if !matches!(t.host, crate::addr::Host::Name(_)) {
                    return false;
                }
                let subject = state.policies.subject_for(&sandbox.id, &t);
                crate::policy::decide(&sandbox.policy, &subject, None).permits()
            })
        })
    })
}
