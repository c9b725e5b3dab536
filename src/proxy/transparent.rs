//! Accept loops for the transparent listeners (`[transparent]`): the same admission
//! as the proxy port (PROXY protocol from trusted peers, `proxy.allowed_clients`, the
//! per-address share, `proxy.max_connections`), then the transparent handler: for
//! TLS, the connection; for plain HTTP, each request of a connection hyper serves.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{Shared, server};
use crate::transparent::Listener;

/// Accepts on `listener` until `shutdown` fires; `limit` is shared with the proxy
/// port's accept loops (`proxy.max_connections` counts every client connection).
pub async fn serve(
    listener: TcpListener,
    kind: Listener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    limit: Arc<Semaphore>,
) {
    let Some(cfg) = shared.config.transparent.clone() else { return };
    let cfg = Arc::new(cfg);
    let mut backoff = Duration::from_millis(5);
    loop {
        let (mut stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => match a {
                Ok(ok) => {
                    backoff = Duration::from_millis(5);
                    ok
                }
                Err(e) => {
                    tracing::warn!(error = %e, "transparent accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            ::metrics::counter!(crate::metrics::PROXY_CONNECTIONS_REFUSED).increment(1);
            tracing::debug!(client_addr = %peer, "transparent connection refused: proxy.max_connections reached");
            continue;
        };
        let _ = stream.set_nodelay(true);
        crate::resolve::set_keepalive(&stream, shared.config.proxy.tcp_keepalive);
        let (shared, cfg, shutdown) = (shared.clone(), cfg.clone(), shutdown.clone());
        // Boxed, as the proxy port's connections are (`server`).
        shared.tasks.clone().spawn(Box::pin(async move {
            let active = crate::metrics::ActiveGuard::connection();
            // As on the proxy port: a peer that is not a trusted proxy is held to its
            // address's share before the PROXY header wait, so one address cannot hold
            // every slot by sending nothing.
            let proxy = &shared.config.proxy;
            let untrusted = proxy.proxy_protocol != crate::config::ProxyProtocol::Off
                && !proxy.trusted_proxies.iter().any(|n| n.contains(&peer.ip()));
            let early = match untrusted {
                true => match shared.admission.admit(peer.ip()) {
                    Some(p) => Some(p),
                    None => return over_share(peer),
                },
                false => None,
            };
            let Some(mut conn) = server::admit(&mut stream, peer, &shared).await else { return };
            let pending = match early {
                Some(p) => p,
                None => match shared.admission.admit(conn.peer.ip()) {
                    Some(p) => p,
                    None => return over_share(conn.peer),
                },
            };
            // The place under `proxy.max_connections` goes into what the connection holds,
            // so a tunnel or a WebSocket that outlives this task keeps it.
            conn.held = Some(Arc::new(crate::door::Held { share: pending, place: (permit, active) }));
            match kind {
                Listener::Https => {
                    let inspector = super::inspector(&shared);
                    crate::transparent::serve(stream, conn, &shared.door, &cfg, inspector).await;
                }
                Listener::Http => {
                    let port = crate::transparent::dialled_port(&stream, cfg.http_port);
                    let serve = server::Serve::TransparentHttp { port };
                    server::serve_stream(stream, conn, shared, shutdown, false, serve).await;
                }
            }
        }));
    }
}

fn over_share(client: std::net::SocketAddr) {
    tracing::debug!(client_addr = %client, "transparent connection closed: over its address's share");
    ::metrics::counter!(crate::metrics::PROXY_CONNECTIONS_REFUSED).increment(1);
}
