//! Wiring: bind the listeners, then run until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{self, Config, ConfigError};
use crate::dns::DnsServer;
use crate::proxy::{self, Shared, upstream::VettingConnector};
use crate::reload::Store;
use crate::resolve::Resolver;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot bind proxy listener {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start resolver: {0}")]
    Resolver(std::io::Error),
    #[error("cannot bind DNS listener {addr}: {source}")]
    DnsBind { addr: SocketAddr, source: std::io::Error },
}

pub struct Gateway {
    shared: Arc<Shared>,
    proxy: TcpListener,
    dns: Option<DnsServer>,
}

impl Gateway {
    /// Loads the policies, builds the resolver and binds the proxy listener.
    pub async fn bind(config: Config) -> Result<Gateway, GatewayError> {
        let policies = config::load_policies(&config)?;
        let resolver = Resolver::new(&config.resolver, config.egress.filter.clone(), config.proxy.connect_timeout)
            .map_err(GatewayError::Resolver)?;
        let resolver = Arc::new(resolver);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .set_host(false)
            .build(VettingConnector::new(resolver.clone()));
        let addr = config.proxy.listen;
        let proxy = TcpListener::bind(addr).await.map_err(|source| GatewayError::Bind { addr, source })?;
        let dns = match &config.dns {
            Some(d) => {
                Some(DnsServer::bind(d).await.map_err(|source| GatewayError::DnsBind { addr: d.listen, source })?)
            }
            None => None,
        };
        crate::metrics::describe();
        let shared = Arc::new(Shared {
            store: Store::new(policies),
            config,
            resolver,
            client,
            tasks: TaskTracker::new(),
            hard_stop: CancellationToken::new(),
        });
        Ok(Gateway { shared, proxy, dns })
    }

    pub fn proxy_addr(&self) -> std::io::Result<SocketAddr> {
        self.proxy.local_addr()
    }

    pub fn dns_addr(&self) -> Option<SocketAddr> {
        self.dns.as_ref().and_then(|d| d.local_addr().ok())
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves until `shutdown` fires, then stops accepting, gives in-flight requests and
    /// tunnels up to `proxy.shutdown_timeout`, and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let dns_addr = self.dns_addr().map(|a| a.to_string());
        let Gateway { shared, proxy, dns } = self;
        let st = shared.store.snapshot();
        tracing::info!(
            proxy = %proxy.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            policies = st.policies.policies.len(),
            sandboxes = st.policies.sandboxes.len(),
            dns = dns_addr,
            "listening"
        );
        drop(st);
        let reloader = tokio::spawn(reload_on_sighup(shared.clone(), shutdown.clone()));
        let dns_task = dns.map(|d| tokio::spawn(d.run(shutdown.clone())));
        proxy::server::serve(proxy, shared.clone(), shutdown.clone()).await;
        reloader.abort();
        if let Some(t) = dns_task {
            let _ = t.await;
        }

        let timeout = shared.config.proxy.shutdown_timeout;
        tracing::info!(timeout_s = timeout.as_secs(), in_flight = shared.tasks.len(), "shutting down");
        shared.tasks.close();
        if tokio::time::timeout(timeout, shared.tasks.wait()).await.is_err() {
            tracing::warn!(in_flight = shared.tasks.len(), "shutdown timeout reached; closing what is left");
            shared.hard_stop.cancel();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), shared.tasks.wait()).await;
        }
        tracing::info!("stopped");
    }
}

#[cfg(unix)]
async fn reload_on_sighup(shared: Arc<Shared>, shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install SIGHUP handler; reload on signal disabled");
        return;
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = hup.recv() => if r.is_none() { return },
        }
        match shared.store.reload(&shared.config) {
            Ok(generation) => tracing::info!(generation, "policies reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "policy reload failed; keeping the previous policies")
            }
        }
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_shared: Arc<Shared>, _shutdown: CancellationToken) {}
