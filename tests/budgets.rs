//! Egress budgets on loopback: request, byte and new-host budgets counted by one
//! instance, and the same budgets (and the per-second limit) shared by two instances
//! through a real `redis-server`, including what happens while Redis is down.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::gateway::{TestGateway, basic};
use support::origin::TestOrigin;
use support::raw;
use support::{STANDARD_CONFIG, TOKEN_A, sha256_hex};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
/// What a tunnel may move past a spent byte budget before the gateway sees it: one
/// report batch (64 KiB) and the chunks in flight (up to 256 KiB each; docs/budgets.md).
const TUNNEL_SLACK: u64 = 64 * KIB + 512 * KIB;

/// A TCP server that counts every byte it receives; a connection that starts with
/// `GET /big` gets 4 MiB back instead.
struct ByteSink {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
}

impl ByteSink {
    fn start() -> ByteSink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let count = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let count = count.clone();
                std::thread::spawn(move || {
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut first = true;
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if first && buf[..n].starts_with(b"GET /big") {
                                    let body = vec![b'x'; (4 * MIB) as usize];
                                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\n");
                                    let _ = s.write_all(&body);
                                    return;
                                }
                                first = false;
                                count.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        ByteSink { addr, received }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits until the count has not moved for 300 ms (the last bytes are in).
    fn settled(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = u64::MAX;
        while Instant::now() < deadline {
            let now = self.received();
            if now == last {
                return now;
            }
            last = now;
            std::thread::sleep(Duration::from_millis(300));
        }
        self.received()
    }
}

/// Budgets count in windows aligned to the epoch: a test that counts in one hour-long
/// window starts at least a minute before it ends.
fn clear_of_the_hour() {
    let into = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() % 3600;
    if into > 3540 {
        std::thread::sleep(Duration::from_secs(3601 - into));
    }
}

fn policy(budget_rules: &str) -> String {
    format!(
        r#"
[policies.budgeted]
allow = ["origin.test:*", "a.deep.wild.test:*", "b-only.test:*", "tls.test:*", "127.0.0.1:*"]
{budget_rules}

[[sandboxes]]
id = "sbx-a"
token_sha256 = "{a}"
policy = "budgeted"
"#,
        a = sha256_hex(TOKEN_A),
    )
}

/// Sends a CONNECT for `target` as sbx-a; returns the stream and the response head.
fn connect(gw: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = raw::connect(gw);
    let auth = basic("sbx-a", TOKEN_A);
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n").unwrap();
    let head = raw::read_head(&mut s);
    (s, head)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

/// Writes into an open tunnel until the gateway closes it (or `cap` bytes are sent);
/// returns what was written.
fn upload_until_closed(mut s: TcpStream, cap: u64) -> u64 {
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = vec![b'u'; 32 * 1024];
    let mut sent = 0;
    while sent < cap {
        match s.write(&chunk) {
            Ok(n) => sent += n as u64,
            Err(_) => break,
        }
    }
    sent
}

/// How many times `gw` has synced with its shared store.
fn syncs(gw: &TestGateway) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&admin_get(gw.admin_addr(), "/v1/status").1).unwrap();
    v["limit_store_syncs"].as_u64().unwrap()
}

/// Starts the gateway on `gateway.toml` in `d` (with its `policy/` and any files the
/// config names already there), its log in `d/stderr.log`: for configs whose files must
/// exist before start-up.
fn serve_in(d: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(d.join("gateway.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("stderr.log")).unwrap())
        .spawn()
        .unwrap()
}

fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    let resp = raw::exchange(admin, format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (raw::status(&resp), body)
}

#[test]
fn requests_and_new_hosts_budgets_refuse_with_their_name_and_retry_after() {
    clear_of_the_hour();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let gw = TestGateway::start(
        STANDARD_CONFIG,
        &policy("[policies.budgeted.budget]\nwindow = \"1h\"\nrequests = 5\nnew_hosts = 2\n"),
    );
    // Two hosts, four requests.
    for target in ["origin.test", "a.deep.wild.test", "origin.test", "a.deep.wild.test"] {
        let (_s, head) = connect(gw.addr, &format!("{target}:{port}"));
        assert_eq!(raw::status(&head), 200, "{target}: {head}");
    }
    // A third host: new_hosts is spent, and the refusal spends no request.
    let (_s, head) = connect(gw.addr, &format!("b-only.test:{port}"));
    assert_eq!(raw::status(&head), 429, "{head}");
    assert_eq!(header(&head, "x-egress-budget"), Some("new_hosts"));
    let (_s, head) = connect(gw.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
    // The requests budget is spent now.
    let (mut s, head) = connect(gw.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 429, "{head}");
    assert_eq!(header(&head, "x-egress-deny-reason"), Some("limit_exceeded"));
    assert_eq!(header(&head, "x-egress-budget"), Some("requests"));
    let retry: u64 = header(&head, "retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "Retry-After {retry}: the window's end");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    assert!(body.contains("budget requests of 5 per 3600s is spent"), "{body}");

    let refused = gw.wait_for_access(2, |v| v["reason"] == "limit_exceeded");
    let budgets: Vec<&str> = refused.iter().filter_map(|v| v["budget"].as_str()).collect();
    assert_eq!(budgets, ["new_hosts", "requests"], "{refused:?}");

    // The admin listener and the usage command show what was spent.
    let (status, body) = admin_get(gw.admin_addr(), "/v1/sandboxes/sbx-a");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let used = |name: &str| {
        v["budgets"].as_array().unwrap().iter().find(|b| b["budget"] == name).map(|b| b["used"].as_u64().unwrap())
    };
    assert_eq!(used("requests"), Some(5), "{v}");
    assert_eq!(used("new_hosts"), Some(2), "{v}");
    assert_eq!(v["recent_refusals"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(admin_get(gw.admin_addr(), "/v1/sandboxes/nobody").0, 404);

    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["usage", "--sandbox", "sbx-a", "--admin", &gw.admin_addr().to_string(), "--config"])
        .arg(gw.config_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("requests") && text.contains("5 of 5"), "{text}");
    assert!(text.contains("budget=new_hosts"), "{text}");
}

#[test]
fn a_tunnel_is_closed_when_its_upload_budget_is_spent_and_downloads_count_too() {
    clear_of_the_hour();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let limit = 512 * KIB;
    let gw = TestGateway::start(
        STANDARD_CONFIG,
        &policy(
            "[policies.budgeted.budget]\nupload_bytes = \"512KiB\"\n\
             [[policies.budgeted.budget.hosts]]\nhost = \"tls.test\"\ndownload_bytes = \"1MiB\"\n",
        ),
    );
    let (s, head) = connect(gw.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
    let sent = upload_until_closed(s, 64 * MIB);
    let got = sink.settled();
    assert!(sent < 64 * MIB, "the tunnel was never closed ({sent} bytes sent)");
    assert!(
        got >= limit && got <= limit + TUNNEL_SLACK,
        "the origin got {got} bytes of a {limit}-byte budget; sent {sent}; {}",
        gw.log_text()
    );
    let closed =
        gw.wait_for_log(Duration::from_secs(10), |v| v["msg"] == "tunnel closed: its sandbox spent a byte budget");
    assert_eq!(closed["budget"], "upload_bytes", "{closed}");
    let rec = gw.wait_for_access(1, |v| v["kind"] == "connect" && v["budget"] == "upload_bytes");
    assert_eq!(rec[0]["reason"], "limit_exceeded");

    // Spent: new tunnels are refused until the window ends.
    let (_s, head) = connect(gw.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 429, "{head}");
    assert_eq!(header(&head, "x-egress-budget"), Some("upload_bytes"));

    // A host override counts downloads from that host only.
    let gw = TestGateway::start(
        STANDARD_CONFIG,
        &policy(
            "[policies.budgeted.budget]\n\
             [[policies.budgeted.budget.hosts]]\nhost = \"tls.test\"\ndownload_bytes = \"1MiB\"\n",
        ),
    );
    let fetch = |host: &str| {
        let (mut s, head) = connect(gw.addr, &format!("{host}:{port}"));
        assert_eq!(raw::status(&head), 200, "{head}");
        s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        got
    };
    let other = fetch("origin.test");
    assert!(other > 4 * MIB, "another host is not counted: {other}");
    let capped = fetch("tls.test");
    assert!((MIB..MIB + TUNNEL_SLACK).contains(&capped), "download cut at the budget: {capped}");
    let (_s, head) = connect(gw.addr, &format!("tls.test:{port}"));
    assert_eq!(header(&head, "x-egress-budget"), Some("hosts[tls.test].download_bytes"), "{head}");
    let (_s, head) = connect(gw.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
}

#[test]
fn budget_config_errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    let cases = [
        ("[policies.p.budget]\nupload_bytes = \"lots\"\n", "policies.p.budget.upload_bytes", "expected a size"),
        ("[policies.p.budget]\nwindow = \"1.5s\"\n", "policies.p.budget.window", "whole seconds"),
        ("[policies.p.budget]\n[[policies.p.budget.hosts]]\nhost = \"a b\"\n", "hosts[0].host", "hostname"),
        ("[policies.p.budget]\nuploads = 1\n", "unknown field", "uploads"),
    ];
    // `config validate` with this policy file and gateway config: its stderr, if it failed.
    let validate = |policy: &str, config: &str| -> Option<String> {
        std::fs::write(dir.path().join("policy/p.toml"), policy).unwrap();
        std::fs::write(dir.path().join("gateway.toml"), format!("[policy]\ndir = \"policy\"\n{config}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
            .args(["config", "validate", "--config"])
            .arg(dir.path().join("gateway.toml"))
            .output()
            .unwrap();
        (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for (text, key, what) in cases {
        let err = validate(&format!("[policies.p]\nallow = []\n{text}"), "").expect(text);
        assert!(err.contains("p.toml") && err.contains(key) && err.contains(what), "{text}: {err}");
    }
    std::fs::write(dir.path().join("empty"), "\n").unwrap();
    for (store, what) in [
        ("store = \"memcached://x\"", "limits.store"),
        ("store = \"reddis://user:secret@127.0.0.1:1/0\"", "got \"[redacted]@127.0.0.1:1/0\""),
        ("store = \"redis://user:secret@127.0.0.1:1/0\"", "redis_password_file"),
        ("on_store_error = \"maybe\"", "limits.on_store_error"),
        // A Redis setting beside the local store: the store line was lost.
        ("redis_password_file = \"p\"", "limits.redis_password_file: only with a Redis store"),
        ("redis_ca_file = \"ca.pem\"", "limits.redis_ca_file: only with a Redis store"),
        ("store = \"redis://127.0.0.1:1/0\"\nredis_password_file = \"empty\"", "empty: expected the password"),
        // What the Redis client refuses is a config error naming the key, not a start-up one.
        ("store = \"redis://127.0.0.1:1/zero\"", "limits.store: expected redis://HOST:PORT/DB"),
    ] {
        let err = validate("[policies.p]\nallow = []\n", &format!("[limits]\n{store}\n")).expect(store);
        assert!(err.contains(what), "{store}: {err}");
        assert!(!err.contains("secret"), "the password is echoed: {err}");
    }
}

/// A `redis-server` on a free loopback port, stopped on drop.
struct Redis {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut r = Redis { port, child: None, dir: tempfile::tempdir().unwrap() };
        r.restart();
        r
    }

    fn restart(&mut self) {
        self.restart_with(&[]);
    }

    fn restart_with(&mut self, extra: &[&str]) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "no"])
            .args(extra)
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        // With a password, PING answers NOAUTH: still up.
        while !self.command("PING").is_some_and(|l| l == "+PONG" || l.starts_with("-NOAUTH")) {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// One inline command; its reply's first line.
    fn command(&self, cmd: &str) -> Option<String> {
        self.reply(cmd).map(|r| r.lines().next().unwrap_or("").to_string())
    }

    /// One inline command; its whole reply (one read).
    fn reply(&self, cmd: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(format!("{cmd}\r\n").as_bytes()).ok()?;
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Inline commands; the first `lines` reply lines (reading for up to 2 s).
    fn reply_all(&self, cmds: &str, lines: usize) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
        s.write_all(format!("{cmds}\r\n").as_bytes()).ok()?;
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 512];
        while got.iter().filter(|&&b| b == b'\n').count() < lines && Instant::now() < deadline {
            if let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        Some(String::from_utf8_lossy(&got).into_owned())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn shared_config(redis: &Redis, extra: &str) -> String {
    format!("{STANDARD_CONFIG}\n[limits]\nstore = \"{}\"\nsync_interval = \"50ms\"\n{extra}", redis.url())
}

fn poll(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_instances_share_one_upload_budget_through_redis() {
    clear_of_the_hour();
    let redis = Redis::start();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let limit = 2 * MIB;
    let rules = "[policies.budgeted.budget]\nupload_bytes = \"2MiB\"\n";
    let a = TestGateway::start(&shared_config(&redis, ""), &policy(rules));
    let b = TestGateway::start(&shared_config(&redis, ""), &policy(rules));

    // Upload through both at once, each as much as it will take.
    let (sa, head) = connect(a.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
    let (sb, head) = connect(b.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
    let ta = std::thread::spawn(move || upload_until_closed(sa, 64 * MIB));
    let tb = std::thread::spawn(move || upload_until_closed(sb, 64 * MIB));
    let (sent_a, sent_b) = (ta.join().unwrap(), tb.join().unwrap());
    assert!(sent_a < 64 * MIB && sent_b < 64 * MIB, "both tunnels are closed ({sent_a}, {sent_b})");
    let got = sink.settled();
    // One budget for the fleet: at most one lease (256 KiB) per instance past it, and
    // what a tunnel moves before it reports. Counted per instance it would be 4 MiB.
    let bound = limit + 2 * 256 * KIB + 2 * TUNNEL_SLACK;
    assert!(
        got >= limit && got <= bound,
        "the origin got {got} bytes of one {limit}-byte fleet budget (bound {bound})"
    );

    // Both instances now refuse new tunnels, and show the fleet's total.
    for gw in [&a, &b] {
        poll("the spent budget to reach both instances", || {
            raw::status(&connect(gw.addr, &format!("origin.test:{port}")).1) == 429
        });
        let (_, body) = admin_get(gw.admin_addr(), "/v1/sandboxes/sbx-a");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let used = v["budgets"][0]["used"].as_u64().unwrap();
        assert!(used >= limit, "{v}");
    }
}

#[test]
fn the_per_second_limit_holds_across_two_instances() {
    let redis = Redis::start();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    // 64 a second: a lease of 8 per instance, so at most 80 in any second for the
    // fleet; counted per instance it would be 128.
    let config = shared_config(&redis, "").replace("[proxy]\n", "[proxy]\nsandbox_max_per_second = 64\n");
    let a = TestGateway::start(&config, &policy(""));
    let b = TestGateway::start(&config, &policy(""));
    let targets = [a.addr, b.addr];
    // 100 requests within one second, alternating between the instances. A burst
    // that straddles a second boundary is retried (up to 5 times).
    for attempt in 0..5 {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        std::thread::sleep(Duration::from_millis(1000 - u64::from(now.subsec_millis())) + Duration::from_millis(20));
        let second = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let admitted = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (admitted, refused) = (admitted.clone(), refused.clone());
                std::thread::spawn(move || {
                    for i in 0..25 {
                        let gw = targets[(t + i) % 2];
                        match raw::status(&connect(gw, &format!("origin.test:{port}")).1) {
                            200 => admitted.fetch_add(1, Ordering::Relaxed),
                            429 => refused.fetch_add(1, Ordering::Relaxed),
                            other => panic!("status {other}"),
                        };
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        if end != second {
            eprintln!("attempt {attempt}: the burst crossed a second boundary; again");
            continue;
        }
        let (admitted, refused) = (admitted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
        assert_eq!(admitted + refused, 100);
        assert!(admitted <= 80, "{admitted} of 100 admitted in one second under a fleet limit of 64/s");
        assert!(admitted >= 8, "only {admitted} admitted");
        return;
    }
    panic!("no burst fit in one second in 5 attempts");
}

#[test]
fn without_redis_both_instances_count_locally_and_reconcile_when_it_returns() {
    clear_of_the_hour();
    let mut redis = Redis::start();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let rules = "[policies.budgeted.budget]\nrequests = 1000\n";
    let a = TestGateway::start(&shared_config(&redis, ""), &policy(rules));
    let b = TestGateway::start(&shared_config(&redis, ""), &policy(rules));
    let strict = TestGateway::start(&shared_config(&redis, "on_store_error = \"deny\"\n"), &policy(rules));
    for gw in [&a, &b, &strict] {
        assert_eq!(raw::status(&connect(gw.addr, &format!("origin.test:{port}")).1), 200);
    }
    let ready = |gw: &TestGateway| admin_get(gw.admin_addr(), "/readyz").1;
    poll("the heartbeat of three instances", || redis.command("ZCARD egress:v1:instances").as_deref() == Some(":3"));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let key = format!("egress:v1:sbx-a:requests:3600:{}", now / 3600);
    poll("the three requests in Redis", || redis.reply(&format!("GET {key}")).as_deref() == Some("$1\r\n3\r\n"));

    redis.stop();
    for gw in [&a, &b, &strict] {
        poll("readyz to report the store unreachable", || ready(gw).contains("limit store unreachable"));
    }
    // Both keep serving, at their share of the budget; `deny` refuses instead.
    for _ in 0..5 {
        for gw in [&a, &b] {
            let (_s, head) = connect(gw.addr, &format!("origin.test:{port}"));
            assert_eq!(raw::status(&head), 200, "{head}");
        }
    }
    let (_s, head) = connect(strict.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 429, "{head}");
    assert_eq!(header(&head, "x-egress-budget"), Some("limits.store"));
    let warned = a.wait_for_log(Duration::from_secs(5), |v| v["target"] == "egress_gateway::budget::store");
    assert!(warned["msg"].as_str().unwrap().contains("limit store unreachable"), "{warned}");

    // Redis returns (empty: it kept nothing): the counts spent meanwhile are handed over.
    redis.restart();
    for gw in [&a, &b, &strict] {
        poll("readyz to report the store back", || ready(gw) == "ready\n");
    }
    // Ten requests spent while it was away (the strict instance's refusal spent
    // nothing), and the three from before it, which the restarted Redis lost: each
    // instance sees the store's new boot mark and hands its own over again.
    poll("the outage's counts and those before it in Redis", || {
        redis.reply(&format!("GET {key}")).as_deref() == Some("$2\r\n13\r\n")
    });
    let (_s, head) = connect(strict.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
}

#[test]
fn redis_auth_comes_from_the_password_file_and_is_never_logged() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut redis = Redis { port, child: None, dir: tempfile::tempdir().unwrap() };
    let password = "s3cret-redis-password-4711";
    redis.restart_with(&["--requirepass", password]);
    // The file is read at start-up. With the wrong password the instance counts
    // locally and says so; with the right one it syncs.
    for (pass, healthy) in [("not-the-password", false), (password, true)] {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("policy")).unwrap();
        std::fs::write(d.path().join("policy/test.toml"), policy("[policies.budgeted.budget]\nrequests = 100\n"))
            .unwrap();
        std::fs::write(d.path().join("redis.pass"), format!("{pass}\n")).unwrap();
        let config = format!(
            "[log]\nformat = \"json\"\n[policy]\ndir = \"policy\"\nwatch_interval = \"0s\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}\nredis_password_file = \"redis.pass\"\n",
            shared_config(&redis, "")
        );
        std::fs::write(d.path().join("gateway.toml"), config).unwrap();
        let mut child = serve_in(d.path());
        let log = || std::fs::read_to_string(d.path().join("stderr.log")).unwrap_or_default();
        if healthy {
            poll("the instance's heartbeat in Redis", || {
                redis
                    .reply_all(&format!("AUTH {password}\r\nZCARD egress:v1:instances"), 2)
                    .is_some_and(|r| r.ends_with(":1\r\n"))
            });
        } else {
            poll("the refused AUTH to be logged", || log().contains("limit store unreachable"));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(!log().contains(password), "the Redis password is in the log: {}", log());
    }
}

#[test]
fn headers_count_against_byte_budgets_and_the_gateway_is_not_a_destination() {
    clear_of_the_hour();
    let origin = TestOrigin::http();
    let gw = TestGateway::start(STANDARD_CONFIG, &policy("[policies.budgeted.budget]\nupload_bytes = \"32KiB\"\n"));
    let auth = basic("sbx-a", TOKEN_A);
    let padding = "p".repeat(6000);
    // Forwarded requests without bodies: 6 KB of headers each spend the budget.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let req = format!(
            "GET http://origin.test:{}/ HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\nX-Pad: {padding}\r\nConnection: close\r\n\r\n",
            origin.addr.port()
        );
        let resp = raw::request(gw.addr, req);
        statuses.push(raw::status(&resp));
        if raw::status(&resp) == 429 {
            assert_eq!(header(&resp, "x-egress-budget"), Some("upload_bytes"), "{resp}");
        }
    }
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    assert!((5..=6).contains(&ok), "32 KiB of 6 KB heads: {statuses:?}");
    assert!(statuses.ends_with(&[429, 429]), "{statuses:?}");

    // The admin listener is on loopback, which this config lets sandboxes reach: the
    // gateway still never dials its own listeners.
    let gw = TestGateway::start(STANDARD_CONFIG, &policy(""));
    for own in [gw.admin_addr(), gw.addr] {
        let (_s, head) = connect(gw.addr, &own.to_string());
        assert_eq!(raw::status(&head), 403, "{own}: {head}");
        assert_eq!(header(&head, "x-egress-deny-reason"), Some("address_denied"), "{head}");
        assert!(head.contains("the gateway's own listeners"), "{head}");
    }
}

#[test]
fn a_host_another_instance_counted_stays_allowed() {
    clear_of_the_hour();
    let redis = Redis::start();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let rules = "[policies.budgeted.budget]\nnew_hosts = 2\n";
    let a = TestGateway::start(&shared_config(&redis, ""), &policy(rules));
    let b = TestGateway::start(&shared_config(&redis, ""), &policy(rules));
    for host in ["origin.test", "a.deep.wild.test"] {
        assert_eq!(raw::status(&connect(a.addr, &format!("{host}:{port}")).1), 200);
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let key = format!("egress:v1:sbx-a:new_hosts:3600:{}", now / 3600);
    poll("both hosts in Redis", || redis.command(&format!("SCARD {key}")).as_deref() == Some(":2"));
    // B counts one of them, then syncs (twice, so one sync started after it): it now
    // knows the fleet has two hosts, and which. The other one stays allowed there,
    // a third is refused.
    assert_eq!(raw::status(&connect(b.addr, &format!("origin.test:{port}")).1), 200);
    let start = syncs(&b);
    poll("two syncs of B", || syncs(&b) >= start + 2);
    let (_s, head) = connect(b.addr, &format!("b-only.test:{port}"));
    assert_eq!(header(&head, "x-egress-budget"), Some("new_hosts"), "{head}");
    let (_s, head) = connect(b.addr, &format!("a.deep.wild.test:{port}"));
    assert_eq!(raw::status(&head), 200, "a host the fleet counted: {head}");
}

#[test]
fn open_tunnels_count_across_the_fleet() {
    let redis = Redis::start();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let config = shared_config(&redis, "").replace("[proxy]\n", "[proxy]\nsandbox_max_concurrent = 4\n");
    let a = TestGateway::start(&config, &policy(""));
    let b = TestGateway::start(&config, &policy(""));
    // Both know each other (one sync each), then A holds three tunnels and says so.
    poll("both instances alive", || redis.command("ZCARD egress:v1:instances").as_deref() == Some(":2"));
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let (s, head) = connect(a.addr, &format!("origin.test:{port}"));
            assert_eq!(raw::status(&head), 200, "{head}");
            s
        })
        .collect();
    let (sa, sb) = (syncs(&a), syncs(&b));
    poll("A to publish and B to read it", || syncs(&a) >= sa + 2 && syncs(&b) >= sb + 3);
    // One more fits the fleet's four; a second does not.
    let (_one, head) = connect(b.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 200, "{head}");
    let (_s, head) = connect(b.addr, &format!("origin.test:{port}"));
    assert_eq!(raw::status(&head), 429, "{head}");
    assert!(head.contains("sandbox_max_concurrent"), "{head}");
    // A closes its tunnels: B may open more once it hears.
    drop(held);
    poll("B to admit again", || raw::status(&connect(b.addr, &format!("origin.test:{port}")).1) == 200);
}

#[test]
fn redis_over_tls_is_verified_against_the_configured_ca() {
    let ca = support::tls::TestCa::new(&["localhost"]);
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let tls_port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut redis = Redis { port, child: None, dir: tempfile::tempdir().unwrap() };
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (cert, key, ca_pem) = (path(&ca.cert_pem_path), path(&ca.key_pem_path), path(&ca.ca_pem_path));
    let tls_port_s = tls_port.to_string();
    // The plain port is for this test's own checks; the gateway uses the TLS port.
    redis.restart_with(&[
        "--tls-port",
        &tls_port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca_pem,
        "--tls-auth-clients",
        "no",
    ]);
    for (trusts_ca, synced) in [(false, false), (true, true)] {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("policy")).unwrap();
        std::fs::write(d.path().join("policy/test.toml"), policy("[policies.budgeted.budget]\nrequests = 100\n"))
            .unwrap();
        let ca_line = if trusts_ca { format!("redis_ca_file = \"{ca_pem}\"\n") } else { String::new() };
        let config = format!(
            "[log]\nformat = \"json\"\n[policy]\ndir = \"policy\"\nwatch_interval = \"0s\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             {STANDARD_CONFIG}\n[limits]\nstore = \"rediss://localhost:{tls_port}/0\"\nsync_interval = \"50ms\"\n{ca_line}"
        );
        std::fs::write(d.path().join("gateway.toml"), config).unwrap();
        let mut child = serve_in(d.path());
        let log = || std::fs::read_to_string(d.path().join("stderr.log")).unwrap_or_default();
        if synced {
            poll("the heartbeat over TLS", || redis.command("ZCARD egress:v1:instances").as_deref() == Some(":1"));
        } else {
            // The system's roots do not hold the test CA: the certificate is refused.
            poll("the unverified server to be refused", || log().contains("limit store unreachable"));
            assert_eq!(redis.command("ZCARD egress:v1:instances").as_deref(), Some(":0"));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A reload that changes a policy's egress budget ends the tunnels counted against the
/// old one (they would go on under it, or uncounted); a reload that leaves the budget
/// as it was leaves them open.
#[test]
fn a_reload_that_changes_the_budget_ends_tunnels_counted_against_the_old_one() {
    clear_of_the_hour();
    let sink = ByteSink::start();
    let target = format!("127.0.0.1:{}", sink.addr.port());
    let rules = "[policies.budgeted.budget]\nupload_bytes = \"1GiB\"\n";
    let gw = TestGateway::start(STANDARD_CONFIG, &policy(rules));
    let file = gw.dir.path().join("policy/test.toml");
    let (mut s, head) = connect(gw.addr, &target);
    assert_eq!(raw::status(&head), 200, "{head}");
    s.write_all(&[b'u'; 64 * 1024]).unwrap();

    // The same budget, written again: the tunnel stays.
    std::fs::write(&file, policy(rules)).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(10), |v| v["msg"] == "policies reloaded" && v["generation"] == 2);
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut byte = [0u8; 1];
    assert!(s.read(&mut byte).is_err(), "still open after a reload that kept the budget");
    s.write_all(&[b'u'; 1024]).unwrap();

    // A smaller budget: the tunnel ends, and says why in the log.
    std::fs::write(&file, policy("[policies.budgeted.budget]\nupload_bytes = \"1MiB\"\n")).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(10), |v| v["reason"] == "its policy's egress budget changed");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(matches!(s.read(&mut byte), Ok(0) | Err(_)), "the tunnel was ended");
    // New tunnels count against the new budget.
    let (s2, head) = connect(gw.addr, &target);
    assert_eq!(raw::status(&head), 200, "{head}");
    let sent = upload_until_closed(s2, 64 << 20);
    assert!(sent < 8 << 20, "cut near the new 1 MiB budget, not the old 1 GiB: {sent}");
}

/// What an instance spent since its last sync is handed over as it stops, not lost
/// with it (the sync interval here, 10 s, is longer than the test takes).
#[test]
fn a_stopping_instance_hands_over_its_last_spending() {
    clear_of_the_hour();
    let redis = Redis::start();
    let sink = ByteSink::start();
    let port = sink.addr.port();
    let config = shared_config(&redis, "").replace("sync_interval = \"50ms\"", "sync_interval = \"10s\"");
    let mut gw = TestGateway::start(&config, &policy("[policies.budgeted.budget]\nrequests = 1000\n"));
    poll("the first sync", || syncs(&gw) >= 1);
    for _ in 0..3 {
        assert_eq!(raw::status(&connect(gw.addr, &format!("origin.test:{port}")).1), 200);
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let key = format!("egress:v1:sbx-a:requests:3600:{}", now / 3600);
    // Only the start-up sync ran (checked: a slow machine may reach the next one).
    if syncs(&gw) == 1 {
        assert_eq!(redis.reply(&format!("GET {key}")).as_deref(), Some("$-1\r\n"), "nothing synced yet");
    }
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(30)).is_some(), "the gateway stopped");
    assert_eq!(redis.reply(&format!("GET {key}")).as_deref(), Some("$1\r\n3\r\n"));
}
