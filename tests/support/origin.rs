//! `TestOrigin`: a real HTTP/1.1 server on 127.0.0.1:0 (optionally behind TLS) that
//! records every request it receives. Routes:
//! `/echo` (JSON of what arrived), `/bytes/N`, `/upload` (counts the body), `/ws`
//! (101 upgrade, then echoes bytes), `/sleep/MS`, `/git/...` (`git http-backend` CGI).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tls::TestCa;

#[derive(Debug, Clone)]
pub struct Recorded {
    /// The connection the request came on (the gateway's upstream socket).
    pub peer: SocketAddr,
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
    /// Over TLS: whether the connection resumed an earlier TLS session.
    pub resumed: Option<bool>,
}

pub struct TestOrigin {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Default)]
struct Ctx {
    peer: Option<SocketAddr>,
    requests: Arc<Mutex<Vec<Recorded>>>,
    git_root: Option<PathBuf>,
    /// Every path is a repository path (`/OWNER/REPO.git/...`), as on GitHub.
    github_layout: bool,
    resumed: Option<bool>,
}

impl TestOrigin {
    pub fn http() -> TestOrigin {
        Self::start(None, None)
    }

    pub fn https(ca: &TestCa) -> TestOrigin {
        Self::start(Some(ca.server_config.clone()), None)
    }

    /// Serves the bare repositories under `root` at `/git/NAME.git` via `git http-backend`.
    pub fn git(root: PathBuf) -> TestOrigin {
        Self::start(None, Some(root))
    }

    /// Like [`git`], over TLS, with the repositories at `/OWNER/REPO.git` (GitHub's layout).
    pub fn git_https(ca: &TestCa, root: PathBuf) -> TestOrigin {
        Self::start_with(Some(ca.server_config.clone()), Some(root), true)
    }

    fn start(tls: Option<Arc<rustls::ServerConfig>>, git_root: Option<PathBuf>) -> TestOrigin {
        Self::start_with(tls, git_root, false)
    }

    fn start_with(
        tls: Option<Arc<rustls::ServerConfig>>,
        git_root: Option<PathBuf>,
        github_layout: bool,
    ) -> TestOrigin {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind origin");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let ctx = Ctx { peer: None, requests: Arc::default(), git_root, github_layout, resumed: None };
        let requests = ctx.requests.clone();
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
                loop {
                    let (stream, peer) = tokio::select! {
                        _ = &mut stop_rx => break,
                        a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    };
                    let ctx = Ctx { peer: Some(peer), ..ctx.clone() };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let svc = |ctx: Ctx| {
                            service_fn(move |req| {
                                let ctx = ctx.clone();
                                async move { Ok::<_, Infallible>(route(req, ctx).await) }
                            })
                        };
                        match acceptor {
                            Some(acc) => {
                                if let Ok(tls) = acc.accept(stream).await {
                                    let kind = tls.get_ref().1.handshake_kind();
                                    let resumed = Some(kind == Some(rustls::HandshakeKind::Resumed));
                                    let _ = http1::Builder::new()
                                        .serve_connection(TokioIo::new(tls), svc(Ctx { resumed, ..ctx }))
                                        .with_upgrades()
                                        .await;
                                }
                            }
                            None => {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), svc(ctx))
                                    .with_upgrades()
                                    .await;
                            }
                        }
                    });
                }
            });
        });
        TestOrigin { addr, requests, stop: Some(stop_tx), thread: Some(thread) }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for TestOrigin {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

async fn route(mut req: Request<Incoming>, ctx: Ctx) -> Response<Body> {
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    ctx.requests.lock().expect("lock").push(Recorded {
        peer: ctx.peer.expect("set per connection"),
        method: req.method().to_string(),
        uri: req.uri().to_string(),
        headers: headers.clone(),
        resumed: ctx.resumed,
    });
    let path = req.uri().path().to_string();
    if path == "/ws" {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on_upgrade.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        return Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .body(full(""))
            .expect("response");
    }
    if ctx.github_layout && path.contains("/tools-echo.git/") {
        // A GitHub that echoes the credential it was sent: in a header, a redirect and
        // its reason phrase.
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let token = auth
            .strip_prefix("Basic ")
            .and_then(|b| base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).ok())
            .and_then(|d| String::from_utf8(d).ok())
            .and_then(|d| d.strip_prefix("x-access-token:").map(str::to_string))
            .unwrap_or_default();
        let mut resp = Response::builder()
            .status(StatusCode::FOUND)
            .header("x-echo", auth.as_str())
            .header("x-token", token.as_str())
            .header(
                "location",
                format!("https://elsewhere.test/x?auth={}", auth.replace(' ', "%20").replace('=', "%3D")),
            )
            .header("x-unpadded", auth.trim_end_matches('='))
            .header("x-bare", base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &token))
            .body(full("moved"))
            .expect("response");
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::try_from(format!("Found {token}").into_bytes()).expect("phrase"));
        return resp;
    }
    if ctx.github_layout
        && let Some(root) = ctx.git_root.clone()
    {
        return cgi_git(req, path.trim_start_matches('/').to_string(), root).await;
    }
    if let Some(rest) = path.strip_prefix("/git/")
        && let Some(root) = ctx.git_root.clone()
    {
        return cgi_git(req, rest.to_string(), root).await;
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        return Response::new(full(vec![b'x'; n]));
    }
    if let Some(spec) = path.strip_prefix("/sse/") {
        // /sse/EVENTS/MS: server-sent events, one every MS milliseconds.
        let mut it = spec.split('/').map(|x| x.parse::<u64>().unwrap_or(1));
        let (events, ms) = (it.next().unwrap_or(1), it.next().unwrap_or(100));
        let body = SlowBody { remaining: events, every: Duration::from_millis(ms), sleep: None, sse: true };
        return Response::builder().header("content-type", "text/event-stream").body(body.boxed()).expect("response");
    }
    if let Some(spec) = path.strip_prefix("/slow/") {
        // /slow/CHUNKS/MS: CHUNKS chunks of 1 KiB, one every MS milliseconds.
        let mut it = spec.split('/').map(|x| x.parse::<u64>().unwrap_or(1));
        let (chunks, ms) = (it.next().unwrap_or(1), it.next().unwrap_or(100));
        let body = SlowBody { remaining: chunks, every: Duration::from_millis(ms), sleep: None, sse: false };
        return Response::new(body.boxed());
    }
    if path == "/close" {
        // The connection closes after this response: the next request needs a new one.
        return Response::builder().header("connection", "close").body(full("closing")).expect("response");
    }
    if path == "/redirect" {
        return Response::builder()
            .status(StatusCode::FOUND)
            .header("location", "http://169.254.169.254/latest/meta-data/")
            .body(full("moved"))
            .expect("response");
    }
    if let Some(ms) = path.strip_prefix("/sleep/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
        return Response::new(full("slept"));
    }
    if path == "/reason-echo" {
        // Echoes the API key in the status line's reason phrase and in a header name.
        let key = headers.iter().find(|(k, _)| k == "x-api-key").map(|(_, v)| v.clone()).unwrap_or_default();
        let mut resp = Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header(format!("x-{}", key.to_ascii_lowercase()).as_str(), "1")
            .body(full("no"))
            .expect("response");
        if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(format!("bad key {key}")) {
            resp.extensions_mut().insert(phrase);
        }
        return resp;
    }
    if path == "/escaped-echo" {
        // Echoes the API key as JSON may (`/` as `\/`; every symbol as `\u00XX`),
        // percent-encoded and upper-cased, in headers and in the body.
        let key = headers.iter().find(|(k, _)| k == "x-api-key").map(|(_, v)| v.clone()).unwrap_or_default();
        let escape = |upper: bool| -> String {
            key.bytes()
                .map(|b| match b {
                    b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => (b as char).to_string(),
                    b if upper => format!("%{b:02X}"),
                    b => format!("%{b:02x}"),
                })
                .collect()
        };
        let (pct, lower) = (escape(true), escape(false));
        let unicode: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\u{:04x}", c as u32) })
            .collect();
        let body =
            format!("{{\"key\":\"{}\",\"next\":\"/p?k={lower}\",\"strict\":\"{unicode}\"}}", key.replace('/', "\\/"));
        let shout = key.to_ascii_uppercase();
        return Response::builder().header("x-enc", pct).header("x-shout", shout).body(full(body)).expect("response");
    }
    if path == "/gzip-always" || path == "/gzip-if-asked" {
        // The request's headers as JSON, gzip-compressed (by the gzip program) always, or
        // only when the client accepts gzip.
        let asked = headers.iter().any(|(k, v)| k == "accept-encoding" && v.contains("gzip"));
        let echo = json!({ "headers": headers }).to_string();
        if path == "/gzip-if-asked" && !asked {
            return Response::new(full(echo));
        }
        return Response::builder()
            .header("content-encoding", "gzip")
            .body(full(gzip(echo.as_bytes())))
            .expect("response");
    }
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let body_len = match req.into_body().collect().await {
        Ok(b) => b.to_bytes().len(),
        Err(_) => 0,
    };
    let out = json!({ "method": method, "uri": uri, "headers": headers, "body_len": body_len });
    Response::builder().header("content-type", "application/json").body(full(out.to_string())).expect("response")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("gzip")
        .arg("-c")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn gzip");
    child.stdin.take().expect("stdin").write_all(data).expect("write to gzip");
    child.wait_with_output().expect("gzip output").stdout
}

/// Runs `git http-backend` as a CGI program for one request.
async fn cgi_git(req: Request<Incoming>, path_info: String, root: PathBuf) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{path_info}"))
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", "test")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn git http-backend");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let out = child.wait_with_output().await.expect("http-backend output");
    let _ = writer.await;
    let raw = out.stdout;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    let split = split.or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((end, sep)) = split else {
        return Response::builder().status(500).body(full("bad cgi output")).expect("response");
    };
    let mut resp = Response::builder();
    let mut status = 200;
    for line in String::from_utf8_lossy(&raw[..end]).lines() {
        if let Some((k, v)) = line.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("status") {
                status = v.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(500);
            } else {
                resp = resp.header(k.trim(), v);
            }
        }
    }
    resp.status(status).body(full(raw[end + sep..].to_vec())).expect("response")
}

/// A body that yields 1 KiB every `every`, `remaining` times: a long download.
struct SlowBody {
    remaining: u64,
    every: Duration,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Yield `data: N\n\n` events instead of 1 KiB chunks.
    sse: bool,
}

impl http_body::Body for SlowBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        if self.remaining == 0 {
            return std::task::Poll::Ready(None);
        }
        let every = self.every;
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Pending => std::task::Poll::Pending,
            std::task::Poll::Ready(()) => {
                self.sleep = None;
                self.remaining -= 1;
                let chunk = if self.sse {
                    Bytes::from(format!("data: {}\n\n", self.remaining))
                } else {
                    Bytes::from(vec![b's'; 1024])
                };
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
            }
        }
    }
}
