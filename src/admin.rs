//! The admin listener (default 127.0.0.1:9090): `GET /metrics` (Prometheus text),
//! `GET /healthz` (the process serves), `GET /readyz` (policies loaded and not
//! draining), `GET /v1/status` (JSON), `POST /v1/reload` (bearer token from
//! `admin.token_file`, or loopback clients only when none is set).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::proxy::Shared;

pub struct Admin {
    pub shared: Arc<Shared>,
    pub metrics: Option<PrometheusHandle>,
}

pub async fn serve(listener: TcpListener, admin: Arc<Admin>, shutdown: CancellationToken) {
    if let Some(handle) = admin.metrics.clone() {
        // Histogram summaries need periodic upkeep when the recorder is not the
        // exporter's own HTTP server.
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => handle.run_upkeep(),
                }
            }
        });
    }
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(route(req, peer, &admin).await) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn route(req: Request<Incoming>, peer: SocketAddr, admin: &Admin) -> Response<Full<Bytes>> {
    let shared = &admin.shared;
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => match &admin.metrics {
            Some(h) => reply(StatusCode::OK, "text/plain; version=0.0.4", h.render()),
            None => reply(StatusCode::NOT_FOUND, "text/plain", "metrics recorder not installed\n".into()),
        },
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::GET, "/readyz") => {
            if shared.draining.load(Ordering::Relaxed) {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into())
            } else if !shared.budgets.store_healthy() {
                // Still serving, at this instance's share of each budget.
                reply(StatusCode::OK, "text/plain", "ready (limit store unreachable: counting locally)\n".into())
            } else {
                reply(StatusCode::OK, "text/plain", "ready\n".into())
            }
        }
        (&Method::GET, "/v1/status") => {
            let st = shared.store.snapshot();
            let body = serde_json::json!({
                "policy_generation": st.generation,
                "policy_loaded_at": humantime::format_rfc3339_seconds(st.loaded_at).to_string(),
                "policy_source": shared.config.policy.source.describe(),
                "policies": st.policies.policies.len(),
                "sandboxes": st.policies.sandboxes.len(),
                "last_reload_error": shared.store.last_error(),
                "draining": shared.draining.load(Ordering::Relaxed),
                "in_flight": shared.tasks.len(),
                "limit_store": if shared.budgets.is_shared() { "redis" } else { "local" },
                "limit_store_healthy": shared.budgets.store_healthy(),
                "limit_store_syncs": shared.budgets.syncs(),
                "config_file_changed": shared.config_drift(),
            });
            reply(StatusCode::OK, "application/json", body.to_string())
        }
        (&Method::GET, path) if path.starts_with("/v1/sandboxes/") => {
            if !authorized(&req, peer, shared.config.admin.token.as_deref()) {
                return reply(
                    StatusCode::UNAUTHORIZED,
                    "application/json",
                    r#"{"error":"admin token required (Authorization: Bearer ...)"}"#.into(),
                );
            }
            let id = &path["/v1/sandboxes/".len()..];
            let policy = req.uri().query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("policy=")));
            match usage(shared, id, policy).await {
                Ok(body) => reply(StatusCode::OK, "application/json", body.to_string()),
                Err(e) => {
                    reply(StatusCode::NOT_FOUND, "application/json", serde_json::json!({ "error": e }).to_string())
                }
            }
        }
        (&Method::POST, "/v1/reload") => {
            if !authorized(&req, peer, shared.config.admin.token.as_deref()) {
                return reply(
                    StatusCode::UNAUTHORIZED,
                    "application/json",
                    r#"{"error":"admin token required (Authorization: Bearer ...)"}"#.into(),
                );
            }
            match crate::proxy::reload_off_thread(shared).await {
                Ok(generation) => reply(
                    StatusCode::OK,
                    "application/json",
                    serde_json::json!({ "reloaded": true, "policy_generation": generation,
                        "config_file_changed": shared.config_drift() })
                    .to_string(),
                ),
                Err(e) => reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "application/json",
                    serde_json::json!({ "reloaded": false, "error": e.to_string(),
                        "policy_generation": shared.store.snapshot().generation,
                        "config_file_changed": shared.config_drift() })
                    .to_string(),
                ),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// `GET /v1/sandboxes/ID[?policy=NAME]`: a sandbox's budgets, what it spent in the
/// current windows, its open connections and its last refusals. `policy` names the
/// policy of a sandbox known only from signed tokens.
async fn usage(shared: &Shared, id: &str, policy: Option<&str>) -> Result<serde_json::Value, String> {
    let st = shared.store.snapshot();
    let policy = match (st.policies.sandbox(id), policy) {
        (_, Some(name)) => st.policies.policies.get(name).cloned().ok_or_else(|| format!("no policy {name:?}"))?,
        (Some(s), None) => s.policy.clone(),
        (None, None) => {
            return Err(format!(
                "no sandbox {id:?} in the policy files (for a signed token's sandbox add ?policy=NAME)"
            ));
        }
    };
    let budgets = &shared.budgets;
    let spec = policy.budget().cloned();
    let spent = budgets.spent(id, spec.as_deref()).await;
    let open = shared.registry.open_for(id);
    Ok(serde_json::json!({
        "sandbox": id,
        "policy": policy.name(),
        "store": if budgets.is_shared() { "shared" } else { "local" },
        "store_healthy": budgets.store_healthy(),
        "window_secs": spec.as_ref().map(|s| s.window.as_secs()),
        "budgets": spent,
        "open_connections": open.len(),
        "open": open,
        "recent_refusals": crate::access_log::recent::of(id),
    }))
}

fn authorized(req: &Request<Incoming>, peer: SocketAddr, token: Option<&str>) -> bool {
    match token {
        None => peer.ip().is_loopback(),
        Some(expected) => req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|got| bool::from(got.as_bytes().ct_eq(expected.as_bytes()))),
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    resp
}
