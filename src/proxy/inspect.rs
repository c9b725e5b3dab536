//! The dispatcher for inspected connections: terminates TLS (`intercept::accept`),
//! serves the requests inside (`intercept::serve`) and chooses each one's handler:
//! the git route for git smart-HTTP paths on the GitHub web host (so `git clone
//! https://github.com/...` through `HTTPS_PROXY` takes the git route, no `insteadOf`),
//! an API route for a route's host, and `intercept::request` for everything else.

use std::sync::Arc;

use http::{Request, Response, header};
use hyper::body::Incoming;

use super::Shared;
use crate::access_log::{AccessRecord, Kind, raw_target};
use crate::addr::{self, Target};
use crate::door::{self, ConnInfo, Entry, Inspected, Io, ProxyBody, Refusal};
use crate::policy::{DenyReason, Policy};

/// The dispatcher as the entry paths see it ([`door::Inspector`]).
pub struct Dispatch(pub Arc<Shared>);

impl door::Inspector for Dispatch {
    fn inspects(&self, policy: &Policy, target: &Target) -> bool {
        let Some(cfg) = &self.0.config.intercept else { return false };
        self.0.intercept.is_some() && !cfg.never_inspects(&target.host) && policy.inspects(target).is_some()
    }

    fn serve(
        &self,
        io: Box<dyn Io>,
        inspected: Inspected,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let shared = self.0.clone();
        Box::pin(async move {
            let Some(ic) = shared.intercept.clone() else { return };
            let timeout = shared.config.proxy.header_read_timeout;
            let Inspected { target, conn, cancel } = inspected;
            let tls = match crate::intercept::accept(&ic.ca, io, &target, timeout).await {
                Ok(tls) => tls,
                Err(e) => {
                    // A client that does not trust the gateway's CA ends here: say so.
                    tracing::info!(target = %target, error = %e, "inspected connection refused at the TLS handshake");
                    return;
                }
            };
            // Ended with the tunnel it runs in, and by a sweep that ends a request on it.
            let watch = Arc::new(door::watch::Watch::with_end(cancel.child_token()));
            let conn = ConnInfo { watch: Some(watch.clone()), ..conn };
            let (target, conn) = (Arc::new(target), Arc::new(conn));
            let quiet = super::server::quiet_limit(&shared.config);
            let cfg = &shared.config.proxy;
            let hard = door::head_limits::hard(cfg.max_header_bytes, cfg.max_headers);
            let handler = move |req: Request<Incoming>| {
                let (shared, conn, target) = (shared.clone(), conn.clone(), target.clone());
                async move { route(req, &conn, &shared, &target).await }
            };
            crate::intercept::serve(tls, watch, timeout, hard, quiet, handler).await;
        })
    }
}

/// One request inside an inspected connection to `target`; a gRPC call's refusal is
/// answered in gRPC's terms, the only ones its caller shows.
async fn route(req: Request<Incoming>, conn: &ConnInfo, shared: &Arc<Shared>, target: &Target) -> Response<ProxyBody> {
    let grpc = door::respond::is_grpc(&req);
    let resp = choose(req, conn, shared, target).await;
    if grpc && resp.headers().contains_key(door::respond::DENY_REASON_HEADER) {
        return door::respond::as_grpc(resp);
    }
    resp
}

async fn choose(
    mut req: Request<Incoming>,
    conn: &ConnInfo,
    shared: &Arc<Shared>,
    target: &Target,
) -> Response<ProxyBody> {
    let door = &shared.door;
    let state = door.store.snapshot();
    let shown = if target.port == 443 { target.host.to_string() } else { target.to_string() };
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    // The host a request names must be the host inspected: the name decided (and
    // whose certificate the client accepted) is the only one the gateway sends to.
    let named = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_string));
    let same = named.as_deref().is_none_or(|n| addr::parse_authority(n, Some(target.port)).is_ok_and(|t| t == *target));
    let absolute = format!("https://{shown}{pq}").parse::<http::Uri>();
    let refuse_for = |reason: DenyReason, hint: String| {
        let mut rec = AccessRecord::with_vpce(
            Kind::Inspect,
            req.method().as_str(),
            raw_target(&format!("https://{shown}{pq}")),
            conn.peer,
            state.generation,
            conn.vpce.clone(),
        );
        // The sandbox is known from the outer CONNECT, before any rule is looked at.
        if let Some(identity) = &conn.identity {
            rec.sandbox = Some(identity.sandbox.clone());
            rec.policy = Some(identity.policy.shared_name());
        }
        door::refuse(&mut rec, Refusal::new(reason, hint), Entry::Absolute)
    };
    let refuse = |hint: String| refuse_for(DenyReason::BadRequest, hint);
    // The proxy port's head limits hold inside an inspected connection too.
    let cfg = &door.config.proxy;
    if let Some(hint) =
        door::head_limits::over(req.method(), req.uri(), req.headers(), cfg.max_header_bytes, cfg.max_headers)
    {
        let h1 = req.version() < http::Version::HTTP_2;
        let resp = refuse_for(DenyReason::RequestTooLarge, hint);
        let mut resp = door::bodies::refuse_request(req, cfg.tunnel_idle_timeout, resp).await;
        // As on the proxy port, the connection ends with it (HTTP/2 has no such field).
        if h1 {
            resp.headers_mut().insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        return resp;
    }
    // A tunnel inside a tunnel would carry bytes no request rule sees, whichever
    // handler the host has (an API route's would even add its credential).
    if req.method() == http::Method::CONNECT {
        return refuse(
            "CONNECT inside an inspected connection is not supported; open a new CONNECT to the proxy".into(),
        );
    }
    let (true, Ok(absolute)) = (same, absolute) else {
        return refuse(format!("this connection is inspected for {shown}: a request inside it must name that host"));
    };
    *req.uri_mut() = absolute;

    let gh = &door.config.github;
    let host = target.host.as_name().unwrap_or_default();
    let is_git = host.eq_ignore_ascii_case(&gh.web_host)
        && crate::git::path::parse(req.method().as_str(), req.uri().path(), req.uri().query()).is_ok();
    if is_git {
        crate::git::handler::handle(req, conn, door, &shared.git, state, Entry::Absolute).await
    } else if crate::routes::is_route_host(&door.config.routes, host) {
        crate::routes::handle(req, conn, door, &shared.routes, state, Entry::Absolute).await
    } else {
        let Some(ic) = &shared.intercept else {
            return Response::new(crate::door::respond::empty());
        };
        crate::intercept::request::handle(req, conn, door, ic, state, target).await
    }
}
