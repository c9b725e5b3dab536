//! A fake GitHub API over TLS: verifies the App's RS256 JWT with the test public key,
//! answers the installation lookup and issues expiring installation tokens, counting
//! every mint.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use super::tls::TestCa;

pub struct FakeGithubApi {
    pub addr: SocketAddr,
    pub mints: Arc<AtomicUsize>,
    /// (repositories, contents permission) of each mint.
    pub requests: Arc<Mutex<Vec<serde_json::Value>>>,
    /// PEM of the App's private key, for the gateway's config.
    pub private_key_pem: String,
    /// Requests that came under GitHub Enterprise Server's `/api/v3` prefix.
    pub prefixed: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Ctx {
    public_pem: Vec<u8>,
    mints: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<serde_json::Value>>>,
    token_ttl_secs: u64,
    prefixed: Arc<AtomicUsize>,
}

/// An RSA key pair from the openssl command line (PEM private key, PEM public key).
fn rsa_keys() -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("app.pem");
    let status = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&key)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl (is it installed?)");
    assert!(status.success());
    let out = std::process::Command::new("openssl").args(["pkey", "-pubout", "-in"]).arg(&key).output().unwrap();
    (std::fs::read_to_string(&key).unwrap(), String::from_utf8(out.stdout).unwrap())
}

impl FakeGithubApi {
    /// Issues tokens valid for `token_ttl_secs`.
    pub fn start(ca: &TestCa, token_ttl_secs: u64) -> FakeGithubApi {
        let (private_key_pem, public_pem) = rsa_keys();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let mints = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let prefixed = Arc::new(AtomicUsize::new(0));
        let ctx = Arc::new(Ctx {
            public_pem: public_pem.into_bytes(),
            mints: mints.clone(),
            requests: requests.clone(),
            token_ttl_secs,
            prefixed: prefixed.clone(),
        });
        let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config.clone());
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let (stream, _) = tokio::select! {
                        _ = &mut stop_rx => break,
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    };
                    let (ctx, acceptor) = (ctx.clone(), acceptor.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(stream).await else { return };
                        let svc = service_fn(move |req| {
                            let ctx = ctx.clone();
                            async move { Ok::<_, Infallible>(route(req, &ctx).await) }
                        });
                        let _ = http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
                    });
                }
            });
        });
        FakeGithubApi { addr, mints, requests, private_key_pem, prefixed, stop: Some(stop_tx), thread: Some(thread) }
    }

    pub fn mint_count(&self) -> usize {
        self.mints.load(Ordering::SeqCst)
    }
}

impl Drop for FakeGithubApi {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn reply(status: u16, body: serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn route(req: Request<Incoming>, ctx: &Ctx) -> Response<Full<Bytes>> {
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(&ctx.public_pem).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    match jsonwebtoken::decode::<serde_json::Value>(&bearer, &key, &validation) {
        Ok(t) if t.claims["iss"] == "1234" => {}
        _ => return reply(401, serde_json::json!({"message": "Bad credentials"})),
    }
    // GitHub Enterprise Server serves the same API under /api/v3.
    let path = match req.uri().path().strip_prefix("/api/v3") {
        Some(rest) => {
            ctx.prefixed.fetch_add(1, Ordering::SeqCst);
            rest.to_string()
        }
        None => req.uri().path().to_string(),
    };
    let method = req.method().clone();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    if method == "GET" && path.starts_with("/repos/") && path.ends_with("/installation") {
        return reply(200, serde_json::json!({"id": 42}));
    }
    if method == "POST" && path == "/app/installations/42/access_tokens" {
        let n = ctx.mints.fetch_add(1, Ordering::SeqCst) + 1;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // A repository the installation cannot reach (GitHub says 422).
        if v["repositories"][0].as_str().is_some_and(|r| r.contains("missing")) {
            return reply(422, serde_json::json!({"message": "There is at least one repository that does not exist"}));
        }
        ctx.requests.lock().unwrap().push(v);
        let expires = std::time::SystemTime::now() + std::time::Duration::from_secs(ctx.token_ttl_secs);
        return reply(
            201,
            serde_json::json!({"token": format!("ghs_testtoken{n}"), "expires_at": humantime::format_rfc3339_seconds(expires).to_string()}),
        );
    }
    reply(404, serde_json::json!({"message": "Not Found"}))
}
