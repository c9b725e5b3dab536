//! TLS inspection benchmark: egress-gateway's inspection against mitmproxy's
//! (`mitmdump`, same interception: a leaf per name, requests sent on over verified TLS),
//! in one run on loopback, with the gateway's opaque CONNECT tunnel and a direct
//! connection to the same TLS origin as references. Run it with
//! `bash benches/intercept.sh` (installs mitmproxy from PyPI, builds the release binary).
//!
//! Per proxy:
//! - keep-alive: `LOAD_CONNS` connections, each CONNECT + TLS once, then requests back to
//!   back for `LOAD_SECONDS`: requests per second, p50 and p99, and the proxy process's
//!   CPU per request (utime + stime from /proc);
//! - new connections: one at a time for `LOAD_SECONDS`, each CONNECT + TLS + one request
//!   + close: p50 and p99 of the whole exchange, and CPU per connection.
//!
//! Targets (#21): keep-alive requests per second at least 10x mitmproxy's; under 2 ms
//! added p50 per new inspected connection, over the same connection through the
//! gateway's opaque tunnel.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout, reason = "a bench")]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "load/origin.rs"]
#[allow(dead_code, reason = "the load bench's origins: this bench serves only its HTTP answer")]
mod origin;

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "bench-token-5c1e2a9d";

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// A CA and a certificate for `localhost`; the CA is written to `dir/origin-ca.pem`.
fn origin_tls(dir: &Path) -> Arc<rustls::ServerConfig> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "bench origin CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    std::fs::write(dir.join("origin-ca.pem"), ca.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
        .unwrap();
    Arc::new(cfg)
}

async fn origin(tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { continue };
            let _ = s.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(t) = acceptor.accept(s).await {
                    origin::serve_http(t).await;
                }
            });
        }
    });
    addr
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

struct Proxy {
    name: &'static str,
    addr: Option<SocketAddr>,
    user: &'static str,
    ca: PathBuf,
    pid: Option<u32>,
    _child: Option<ChildGuard>,
}

struct ChildGuard(Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

fn start_gateway(dir: &Path, bin: &Path) -> (SocketAddr, u32, ChildGuard) {
    let (cert, key) = (dir.join("gw-ca.pem"), dir.join("gw-ca.key"));
    let ok = Command::new(bin)
        .args(["ca", "init", "--force", "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::create_dir_all(dir.join("policy")).unwrap();
    let hash = hex::encode(egress_gateway::auth::token_sha256(TOKEN));
    std::fs::write(
        dir.join("policy/bench.toml"),
        format!(
            "[policies.inspect]\ninspect = [\"localhost:*\"]\n[[policies.inspect.requests]]\nhost = \"localhost\"\n\
             methods = [\"GET\"]\naction = \"allow\"\n[policies.tunnel]\nallow = [\"localhost:*\"]\n\
             [[sandboxes]]\nid = \"inspect\"\ntoken_sha256 = \"{hash}\"\npolicy = \"inspect\"\n\
             [[sandboxes]]\nid = \"tunnel\"\ntoken_sha256 = \"{hash}\"\npolicy = \"tunnel\"\n"
        ),
    )
    .unwrap();
    let cfg = format!(
        "[log]\nformat = \"json\"\nlevel = \"info\"\n[policy]\ndir = \"policy\"\nwatch_interval = \"0s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n[proxy]\nthreads = 1\nsandbox_max_per_second = 0\n\
         sandbox_max_concurrent = 0\nauth_failures_per_second = 0\n[resolver]\nnameservers = [\"127.0.0.1:9\"]\n\
         hosts_file = false\n[resolver.hosts]\n\"localhost\" = [\"127.0.0.1\"]\n[egress]\nallow = [\"127.0.0.1/32\"]\n\
         [intercept]\nca_cert_file = \"{}\"\nca_key_file = \"{}\"\nupstream_ca_file = \"{}\"\n",
        cert.display(),
        key.display(),
        dir.join("origin-ca.pem").display()
    );
    std::fs::write(dir.join("gateway.toml"), cfg).unwrap();
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(dir.join("gateway.toml"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().expect("gateway exited").unwrap();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
            && v["msg"] == "listening"
        {
            break v["proxy"].as_str().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let pid = child.id();
    (addr, pid, ChildGuard(child))
}

fn start_mitmproxy(dir: &Path) -> Option<(SocketAddr, u32, ChildGuard)> {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let confdir = dir.join("mitm");
    std::fs::create_dir_all(&confdir).unwrap();
    let child = Command::new("mitmdump")
        .args(["-q", "--listen-host", "127.0.0.1", "--listen-port", &port.to_string()])
        .args(["--set", &format!("confdir={}", confdir.display())])
        .args(["--set", &format!("ssl_verify_upstream_trusted_ca={}", dir.join("origin-ca.pem").display())])
        .args(["--set", "connection_strategy=lazy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let guard = ChildGuard(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() || !confdir.join("mitmproxy-ca-cert.pem").exists() {
        if Instant::now() > deadline {
            eprintln!("mitmdump did not start in 30 s");
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = guard.0.id();
    Some((addr, pid, guard))
}

fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        let c: CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn open(p: &Proxy, origin: SocketAddr, tls: &tokio_rustls::TlsConnector) -> std::io::Result<Tls> {
    let target = format!("localhost:{}", origin.port());
    let s = match p.addr {
        None => TcpStream::connect(origin).await?,
        Some(proxy) => {
            let mut s = TcpStream::connect(proxy).await?;
            let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:{TOKEN}", p.user));
            let head =
                format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
            s.write_all(head.as_bytes()).await?;
            let mut buf = Vec::new();
            let mut b = [0u8; 1];
            while find(&buf, b"\r\n\r\n").is_none() {
                if s.read(&mut b).await? == 0 {
                    return Err(std::io::Error::other("proxy closed"));
                }
                buf.push(b[0]);
            }
            if !buf.starts_with(b"HTTP/1.1 200") && !buf.starts_with(b"HTTP/1.0 200") {
                return Err(std::io::Error::other(String::from_utf8_lossy(&buf).into_owned()));
            }
            s
        }
    };
    s.set_nodelay(true)?;
    tls.connect(ServerName::try_from("localhost").unwrap(), s).await
}

async fn request(t: &mut Tls, host: &str, buf: &mut Vec<u8>) -> std::io::Result<()> {
    t.write_all(format!("GET /x HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes()).await?;
    t.flush().await?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = t.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed mid-response"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                return Err(std::io::Error::other(head));
            }
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(());
            }
        }
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

struct Row {
    name: &'static str,
    ka_rps: f64,
    ka_p50: f64,
    ka_p99: f64,
    ka_cpu_us: f64,
    new_p50: f64,
    new_p99: f64,
    new_cpu_us: f64,
}

async fn measure(p: &Proxy, origin: SocketAddr, secs: u64, conns: u64) -> Row {
    let tls = tokio_rustls::TlsConnector::from(client_config(&p.ca));
    let host = format!("localhost:{}", origin.port());
    // Keep-alive.
    let cpu0 = p.pid.map(cpu_seconds);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let tls = tls.clone();
        let host = host.clone();
        let p2 = Proxy { name: p.name, addr: p.addr, user: p.user, ca: p.ca.clone(), pid: None, _child: None };
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut t = open(&p2, origin, &tls).await.unwrap_or_else(|e| panic!("{}: {e}", p2.name));
            let mut buf = Vec::new();
            while Instant::now() < deadline {
                let s = Instant::now();
                request(&mut t, &host, &mut buf).await.unwrap_or_else(|e| panic!("{}: {e}", p2.name));
                lat.push(s.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = lat.len() as f64;
    let ka_cpu_us = match (p.pid, cpu0) {
        (Some(pid), Some(c0)) => (cpu_seconds(pid) - c0) / n * 1e6,
        _ => f64::NAN,
    };
    let (ka_p50, ka_p99) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99));
    // New connections, one at a time.
    let cpu0 = p.pid.map(cpu_seconds);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut new = Vec::new();
    let mut buf = Vec::new();
    while Instant::now() < deadline {
        let s = Instant::now();
        let mut t = open(p, origin, &tls).await.unwrap_or_else(|e| panic!("{}: {e}", p.name));
        request(&mut t, &host, &mut buf).await.unwrap_or_else(|e| panic!("{}: {e}", p.name));
        new.push(s.elapsed());
        let _ = t.shutdown().await;
    }
    let new_cpu_us = match (p.pid, cpu0) {
        (Some(pid), Some(c0)) => (cpu_seconds(pid) - c0) / new.len() as f64 * 1e6,
        _ => f64::NAN,
    };
    Row {
        name: p.name,
        ka_rps: n / elapsed,
        ka_p50,
        ka_p99,
        ka_cpu_us,
        new_p50: pct(&mut new, 0.5),
        new_p99: pct(&mut new, 0.99),
        new_cpu_us,
    }
}

fn main() {
    let secs = env_u64("LOAD_SECONDS", 5);
    let conns = env_u64("LOAD_CONNS", 4);
    let bin = PathBuf::from(std::env::var("LOAD_GATEWAY").unwrap_or_else(|_| "target/release/egress-gateway".into()));
    assert!(bin.exists(), "{} missing: cargo build --release first (benches/intercept.sh does)", bin.display());
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let origin = rt.block_on(origin(origin_tls(dir.path())));
    let (gw, gw_pid, gw_child) = start_gateway(dir.path(), &bin);
    let mut proxies = vec![
        Proxy { name: "direct", addr: None, user: "", ca: dir.path().join("origin-ca.pem"), pid: None, _child: None },
        Proxy {
            name: "gateway-tunnel",
            addr: Some(gw),
            user: "tunnel",
            ca: dir.path().join("origin-ca.pem"),
            pid: Some(gw_pid),
            _child: None,
        },
        Proxy {
            name: "gateway-inspect",
            addr: Some(gw),
            user: "inspect",
            ca: dir.path().join("gw-ca.pem"),
            pid: Some(gw_pid),
            _child: Some(gw_child),
        },
    ];
    match start_mitmproxy(dir.path()) {
        Some((addr, pid, child)) => proxies.push(Proxy {
            name: "mitmproxy",
            addr: Some(addr),
            user: "x",
            ca: dir.path().join("mitm/mitmproxy-ca-cert.pem"),
            pid: Some(pid),
            _child: Some(child),
        }),
        None => eprintln!("mitmdump not found or did not start: pip install mitmproxy (benches/intercept.sh does)"),
    }
    let only = std::env::var("LOAD_ONLY").unwrap_or_default();
    let mut rows = Vec::new();
    for p in &proxies {
        if !only.is_empty() && !only.split(',').any(|o| o == p.name) {
            continue;
        }
        eprintln!("measuring {} ({secs} s keep-alive with {conns} connections, {secs} s new connections)", p.name);
        rows.push(rt.block_on(measure(p, origin, secs, conns)));
    }
    println!("\n| path | keep-alive req/s | p50 ms | p99 ms | CPU µs/req | new conn p50 ms | p99 ms | CPU µs/conn |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.3} | {:.3} | {:.1} | {:.3} | {:.3} | {:.0} |",
            r.name, r.ka_rps, r.ka_p50, r.ka_p99, r.ka_cpu_us, r.new_p50, r.new_p99, r.new_cpu_us
        );
    }
    let get = |n: &str| rows.iter().find(|r| r.name == n);
    if let (Some(g), Some(m)) = (get("gateway-inspect"), get("mitmproxy")) {
        let ratio = g.ka_rps / m.ka_rps;
        println!(
            "\nkeep-alive req/s, inspect vs mitmproxy: {ratio:.1}x (target >= 10x: {}); CPU per request {:.2}x mitmproxy's; \
             new-connection p50 {:.2}x",
            if ratio >= 10.0 { "met" } else { "missed" },
            g.ka_cpu_us / m.ka_cpu_us,
            g.new_p50 / m.new_p50
        );
    }
    if let (Some(g), Some(t)) = (get("gateway-inspect"), get("gateway-tunnel")) {
        let added = g.new_p50 - t.new_p50;
        println!(
            "added p50 per new inspected connection over the opaque tunnel: {added:.3} ms (target < 2 ms: {}); \
             CPU per new connection {:.0} µs against the tunnel's {:.0} µs",
            if added < 2.0 { "met" } else { "missed" },
            g.new_cpu_us,
            t.new_cpu_us
        );
    }
}
