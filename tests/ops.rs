//! Running it in production: the admin listener (metrics, health, readiness, status,
//! reload), reload by signal, and the drain on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::raw::{self, status};
use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, TestOrigin, basic, curl, standard_policy};

/// A CONNECT to `host:port` as `user`: the connection and the response head.
fn connect(gw: &TestGateway, host: &str, port: u16, user: &str, token: &str) -> (std::net::TcpStream, String) {
    let mut s = raw::connect(gw.addr);
    let req = format!("CONNECT {host}:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic(user, token));
    s.write_all(req.as_bytes()).unwrap();
    let head = raw::read_head(&mut s);
    (s, head)
}

/// An open tunnel to `host:port` for sbx-a.
fn tunnel(gw: &TestGateway, host: &str, port: u16) -> std::net::TcpStream {
    let (s, head) = connect(gw, host, port, "sbx-a", TOKEN_A);
    assert_eq!(status(&head), 200, "{head}");
    s
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let resp =
        raw::request(addr, format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes());
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status(&resp), body)
}

fn post(addr: SocketAddr, path: &str, auth: Option<&str>) -> (u16, String) {
    let auth = auth.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!("POST {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n");
    let resp = raw::request(addr, req.as_bytes());
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status(&resp), body)
}

fn scrape(gw: &TestGateway) -> prometheus_parse::Scrape {
    let (code, text) = get(gw.admin_addr(), "/metrics");
    assert_eq!(code, 200);
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text")
}

/// Scrapes until `ready` holds (the counters behind a request are written as it ends,
/// which can be just after the client has its answer); panics after 5 s.
fn scrape_until(gw: &TestGateway, ready: impl Fn(&prometheus_parse::Scrape) -> bool) -> prometheus_parse::Scrape {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = scrape(gw);
        if ready(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "metrics never reached the expected state: {:?}", s.samples);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
            prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[test]
fn open_connections_and_tunnels_are_gauged() {
    let (gw, origin) = support::start_http();
    let gauges = |gw: &TestGateway| {
        let s = scrape(gw);
        (value(&s, "egress_proxy_connections_active", &[]), value(&s, "egress_proxy_tunnels_active", &[]))
    };
    let mut tunnel = raw::connect(gw.addr);
    let target = format!("origin.test:{}", origin.port());
    let auth = basic("sbx-a", TOKEN_A);
    write!(tunnel, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n").unwrap();
    assert_eq!(status(&raw::read_head(&mut tunnel)), 200);
    // One client connection carrying one tunnel: the gauges are asynchronous to the
    // answer, so wait for them with a deadline rather than reading them once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while gauges(&gw) != (1.0, 1.0) {
        assert!(Instant::now() < deadline, "gauges stay at {:?} with one tunnel open", gauges(&gw));
        std::thread::sleep(Duration::from_millis(20));
    }

    drop(tunnel);
    let deadline = Instant::now() + Duration::from_secs(5);
    while gauges(&gw) != (0.0, 0.0) {
        assert!(Instant::now() < deadline, "gauges stay at {:?} after the tunnel closed", gauges(&gw));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn metrics_are_scraped_and_labels_stay_bounded() {
    let origin = TestOrigin::http();
    let config = format!(
        "{STANDARD_CONFIG}\n[dns]\nlisten = \"127.0.0.1:0\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [\"127.0.0.1\"]\n"
    );
    let gw = TestGateway::start(&config, &standard_policy());
    let proxy = gw.proxy_url("sbx-a", TOKEN_A);
    assert_eq!(curl(&["-x", &proxy, &format!("http://origin.test:{}/bytes/5000", origin.port())]).status, 200);
    assert_eq!(curl(&["-x", &proxy, &format!("http://example.com:{}/", origin.port())]).status, 403);
    let dns = gw.dns_addr();
    let q = support::dns::query("pypi.org.", hickory_proto::rr::RecordType::A, None);
    support::dns::udp(dns, &q);

    let s = scrape_until(&gw, |s| {
        value(s, "egress_proxy_requests_total", &[("kind", "forward"), ("decision", "allow")]) >= 1.0
            && value(s, "egress_proxy_denials_total", &[("reason", "host_not_allowed")]) >= 1.0
            && value(s, "egress_dns_queries_total", &[("result", "blocked"), ("transport", "udp")]) >= 1.0
    });
    assert_eq!(value(&s, "egress_proxy_requests_total", &[("kind", "forward"), ("decision", "allow")]), 1.0);
    assert_eq!(value(&s, "egress_proxy_denials_total", &[("reason", "host_not_allowed")]), 1.0);
    assert!(value(&s, "egress_proxy_bytes_total", &[("kind", "forward"), ("direction", "down")]) >= 5000.0);
    assert_eq!(value(&s, "egress_dns_queries_total", &[("result", "blocked"), ("transport", "udp")]), 1.0);
    assert_eq!(value(&s, "egress_policy_generation", &[]), 1.0);
    assert!(s.samples.iter().any(|x| x.metric.starts_with("egress_proxy_request_duration_seconds")));
    let (_, text) = get(gw.admin_addr(), "/metrics");
    for secret in ["origin.test", "example.com", "sbx-a", TOKEN_A, "pypi.org"] {
        assert!(!text.contains(secret), "{secret} must not appear in metrics");
    }
}

#[test]
fn health_readiness_and_status() {
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let admin = gw.admin_addr();
    assert_eq!(get(admin, "/healthz").0, 200);
    assert_eq!(get(admin, "/readyz").0, 200);
    let (code, body) = get(admin, "/v1/status");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["policy_generation"], 1);
    assert_eq!(v["sandboxes"], 3);
    assert!(v["last_reload_error"].is_null());
    assert_eq!(get(admin, "/nope").0, 404);
}

fn deny_status(gw: &TestGateway, origin: &TestOrigin) -> u16 {
    curl(&["-x", &gw.proxy_url("sbx-b", support::TOKEN_B), &format!("http://origin.test:{}/echo", origin.port())])
        .status
}

#[test]
fn reload_by_http_and_signal_keeps_old_policy_on_error() {
    let origin = TestOrigin::http();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let admin = gw.admin_addr();
    let policy_file = gw.dir.path().join("policy/test.toml");
    assert_eq!(deny_status(&gw, &origin), 403, "sbx-b may not reach origin.test yet");

    // Allow origin.test for policy b, reload over HTTP (loopback, no token configured).
    let widened =
        standard_policy().replace("allow = [\"b-only.test:*\"]", "allow = [\"b-only.test:*\", \"origin.test:*\"]");
    std::fs::write(&policy_file, &widened).unwrap();
    let (code, body) = post(admin, "/v1/reload", None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"policy_generation\":2"), "{body}");
    assert_eq!(deny_status(&gw, &origin), 200);

    // A broken file: 422, the old policy stays, status says why.
    std::fs::write(&policy_file, "[policies.b]\nallow = [\"*\"]\n").unwrap();
    let (code, body) = post(admin, "/v1/reload", None);
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("test.toml") && body.contains("policies.b.allow[0]"), "{body}");
    assert_eq!(deny_status(&gw, &origin), 200, "previous policy still in force");
    let (_, status_body) = get(admin, "/v1/status");
    assert!(status_body.contains("policies.b.allow[0]"), "{status_body}");
    let s = scrape_until(&gw, |s| value(s, "egress_policy_reloads_total", &[("result", "error")]) >= 1.0);
    assert_eq!(value(&s, "egress_policy_reloads_total", &[("result", "error")]), 1.0);

    // Revert by SIGHUP.
    std::fs::write(&policy_file, standard_policy()).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded" && v["generation"] == 3);
    assert_eq!(deny_status(&gw, &origin), 403);
}

#[test]
fn reload_requires_the_admin_token_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let token_path = dir.path().join("admin-token");
    std::fs::write(&token_path, "admin-secret-0123456789\n").unwrap();
    let config =
        format!("{STANDARD_CONFIG}\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n", token_path.display());
    let gw = TestGateway::start(&config, &standard_policy());
    let admin = gw.admin_addr();
    assert_eq!(post(admin, "/v1/reload", None).0, 401);
    assert_eq!(post(admin, "/v1/reload", Some("wrong-wrong-wrong-wrong")).0, 401);
    assert_eq!(post(admin, "/v1/reload", Some("admin-secret-0123456789")).0, 200);
    assert!(!gw.log_text().contains("admin-secret"));
}

#[test]
fn sigterm_drains_in_flight_downloads() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG
        .replace("[drain]\ndelay = \"0s\"\ntimeout = \"2s\"", "[drain]\ndelay = \"1s\"\ntimeout = \"10s\"");
    let mut gw = TestGateway::start(&config, &standard_policy());
    let admin = gw.admin_addr();
    let proxy = gw.addr;

    // A 3-second download (30 chunks, 100 ms apart) started before the signal.
    let mut download = raw::connect(proxy);
    let req = format!(
        "GET http://origin.test:{}/slow/30/100 HTTP/1.1\r\nProxy-Authorization: {}\r\nConnection: close\r\n\r\n",
        origin.port(),
        basic("sbx-a", TOKEN_A)
    );
    download.write_all(req.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    gw.signal("TERM");

    gw.wait_for_log(Duration::from_secs(2), |v| v["msg"].as_str().is_some_and(|m| m.starts_with("draining")));
    assert_eq!(get(admin, "/readyz").0, 503, "not ready at once");
    // During the delay new connections are still served.
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/echo", origin.port())]);
    assert_eq!(out.status, 200, "{out:?}");
    // After it, the listener is gone.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(signalled.elapsed()));
    assert!(std::net::TcpStream::connect(proxy).is_err(), "new connections refused after the delay");

    let body = raw::read_all(&mut download);
    assert!(body.starts_with("HTTP/1.1 200"), "{}", &body[..body.len().min(100)]);
    assert!(body.matches('s').count() >= 30 * 1024, "the whole download arrived");
    let code = gw.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0));
    assert!(signalled.elapsed() < Duration::from_secs(8));
}

#[test]
fn a_tunnel_still_open_when_the_drain_times_out_is_ended_and_logged() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG
        .replace("[drain]\ndelay = \"0s\"\ntimeout = \"2s\"", "[drain]\ndelay = \"0s\"\ntimeout = \"1s\"");
    let mut gw = TestGateway::start(&config, &standard_policy());
    let _tunnel = tunnel(&gw, "origin.test", origin.port());
    gw.signal("TERM");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "drain ended early; closing what is left");
    // Ended by the gateway, not by its exit: the tunnel's task finishes and logs it.
    let rec = gw.wait_for_log(Duration::from_secs(3), |v| v["log"] == "access" && v["kind"] == "connect");
    assert_eq!(rec["status"], 200, "{rec}");
    assert_eq!(gw.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn per_sandbox_limits_answer_429_and_spare_other_sandboxes() {
    use std::io::Read;
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nsandbox_max_concurrent = 2\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let connect = |user: &str, token: &str| connect(&gw, "origin.test", origin.port(), user, token);
    let (_t1, h1) = connect("sbx-a", TOKEN_A);
    let (_t2, h2) = connect("sbx-a", TOKEN_A);
    assert_eq!((status(&h1), status(&h2)), (200, 200));
    let (mut t3, h3) = connect("sbx-a", TOKEN_A);
    assert_eq!(status(&h3), 429, "{h3}");
    assert!(h3.contains("limit_exceeded"), "{h3}");
    let mut body = [0u8; 512];
    let n = t3.read(&mut body).unwrap_or(0);
    assert!(String::from_utf8_lossy(&body[..n]).contains("sandbox_max_concurrent"));
    // Another sandbox is unaffected.
    let (_t4, h4) = connect("sbx-r", support::TOKEN_B);
    assert_eq!(status(&h4), 200, "{h4}");
    drop((_t1, _t2));
}

#[test]
fn a_revoked_sandboxs_open_tunnel_is_closed_on_reload() {
    let origin = TestOrigin::http();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut revoked = tunnel(&gw, "origin.test", origin.port());
    revoked.write_all(b"GET /echo HTTP/1.1\r\nHost: origin.test\r\n\r\n").unwrap();
    assert_eq!(status(&raw::read_response(&mut revoked)), 200, "the tunnel works");
    // Another tunnel whose target stays allowed must survive the reload.
    let mut kept = tunnel(&gw, "tls.test", origin.port());
    revoke_origin_and_see_it_closed(&gw, revoked);
    kept.write_all(b"GET /echo HTTP/1.1\r\nHost: tls.test\r\n\r\n").unwrap();
    assert_eq!(status(&raw::read_response(&mut kept)), 200, "allowed tunnel untouched");
}

#[test]
fn a_forwarded_request_waiting_upstream_is_refused_when_a_reload_revokes_it() {
    // An upstream that takes the request and never answers: the exchange waits in
    // `Registration::unless_ended` until the reload ends it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut client = raw::connect(gw.addr);
    let req = format!(
        "GET http://origin.test:{port}/slow HTTP/1.1\r\nHost: origin.test:{port}\r\nProxy-Authorization: {}\r\n\r\n",
        basic("sbx-a", TOKEN_A)
    );
    client.write_all(req.as_bytes()).unwrap();
    // Wait until the request has reached the upstream, then revoke its host.
    let (mut upstream, _) = silent.accept().unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    upstream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        use std::io::Read;
        let n = upstream.read(&mut buf).unwrap();
        assert!(n > 0, "the upstream saw the request");
        got.extend_from_slice(&buf[..n]);
    }
    let narrowed = standard_policy().replace("\"origin.test:*\", ", "");
    std::fs::write(gw.dir.path().join("policy/test.toml"), narrowed).unwrap();
    gw.signal("HUP");
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let answer = raw::read_response(&mut client);
    assert_eq!(raw::status(&answer), 403, "{answer}");
    assert!(answer.contains("x-egress-deny-reason: revoked"), "ended by the reload, and says so: {answer}");
    assert!(answer.contains("no longer allows it"), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("proxy-authenticate"), "no credential would help: {answer}");
    drop(upstream);
}

#[test]
fn reload_under_continuous_load_fails_no_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let origin = TestOrigin::http();
    // The per-sandbox rate limit would answer 429 to this loop: lift it.
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nsandbox_max_per_second = 0\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let (addr, port) = (gw.addr, origin.port());
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            std::thread::spawn(move || {
                let req = format!(
                    "GET http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
                    basic("sbx-a", TOKEN_A)
                );
                let mut s = raw::connect(addr);
                // Bounded: at most 5,000 requests per worker.
                for _ in 0..5000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if s.write_all(req.as_bytes()).is_err() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        s = raw::connect(addr);
                        continue;
                    }
                    if status(&raw::read_response(&mut s)) == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let admin = gw.admin_addr();
    for i in 0..10 {
        if i % 2 == 0 {
            assert_eq!(post(admin, "/v1/reload", None).0, 200);
        } else {
            gw.signal("HUP");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let (_, status_body) = get(admin, "/v1/status");
    let v: serde_json::Value = serde_json::from_str(&status_body).unwrap();
    assert!(v["policy_generation"].as_u64().unwrap() >= 10, "{v}");
    assert!(ok.load(Ordering::Relaxed) > 100, "load ran: {}", ok.load(Ordering::Relaxed));
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed during reloads");
}

#[test]
fn https_proxy_listener_with_curl() {
    let origin_ca = support::tls::TestCa::new(&["tls.test"]);
    let origin = TestOrigin::https(&origin_ca);
    let proxy_ca = support::tls::TestCa::new(&["localhost", "127.0.0.1"]);
    let config = STANDARD_CONFIG.replace(
        "[proxy]\n",
        &format!(
            "[proxy]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            proxy_ca.cert_pem_path.display(),
            proxy_ca.key_pem_path.display()
        ),
    );
    let gw = TestGateway::start(&config, &standard_policy());
    let proxy = format!("https://sbx-a:{TOKEN_A}@127.0.0.1:{}", gw.addr.port());
    let out = curl(&[
        "--proxy",
        &proxy,
        "--proxy-cacert",
        proxy_ca.ca_pem_path.to_str().unwrap(),
        "--cacert",
        origin_ca.ca_pem_path.to_str().unwrap(),
        &format!("https://tls.test:{}/echo", origin.port()),
    ]);
    assert_eq!((out.exit, out.connect_status, out.status), (0, 200, 200), "{out:?}");
    // Plain HTTP on the TLS port gets no answer.
    let resp = raw::exchange(gw.addr, b"GET http://tls.test/ HTTP/1.1\r\n\r\n");
    assert!(!resp.starts_with("HTTP/1.1 200"), "{resp}");
    // An untrusted proxy certificate is refused by the client.
    let out = curl(&["--proxy", &proxy, &format!("https://tls.test:{}/echo", origin.port())]);
    assert_ne!(out.exit, 0);
}

#[test]
fn changed_policy_files_reload_by_themselves() {
    let origin = TestOrigin::http();
    let gw =
        TestGateway::start_with_policy_section(STANDARD_CONFIG, &standard_policy(), "watch_interval = \"200ms\"\n");
    assert_eq!(deny_status(&gw, &origin), 403);
    let widened =
        standard_policy().replace("allow = [\"b-only.test:*\"]", "allow = [\"b-only.test:*\", \"origin.test:*\"]");
    std::fs::write(gw.dir.path().join("policy/test.toml"), widened).unwrap();
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    assert_eq!(deny_status(&gw, &origin), 200);
}

#[test]
fn an_edit_to_the_main_config_is_reported_as_needing_a_restart() {
    // Watching every 200 ms: the edit alone is noticed, with no reload asked for.
    let gw =
        TestGateway::start_with_policy_section(STANDARD_CONFIG, &standard_policy(), "watch_interval = \"200ms\"\n");
    let admin = gw.admin_addr();
    let (_, body) = get(admin, "/v1/status");
    assert!(body.contains("\"config_file_changed\":null"), "{body}");

    let cfg = gw.config_path();
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("delay = \"0s\""), "{text}");
    std::fs::write(&cfg, format!("# tuned\n{}", text.replace("delay = \"0s\"", "delay = \"9s\""))).unwrap();
    let line = gw.wait_for_log(Duration::from_secs(5), |v| {
        v["msg"].as_str().is_some_and(|m| m.contains("the main config file changed; only policy"))
    });
    assert_eq!(line["keys"], "drain.delay", "{line}");
    assert_eq!(line["level"], "warn", "{line}");
    let (code, body) = post(admin, "/v1/reload", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["config_file_changed"], serde_json::json!({"keys": ["drain.delay"], "error": null}), "{body}");

    // Broken: a restart would fail, and the operator hears it now, with file and key.
    std::fs::write(&cfg, text.replace("delay = \"0s\"", "delay = \"soon\"")).unwrap();
    let (_, body) = post(admin, "/v1/reload", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let error = v["config_file_changed"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("gateway.toml") && error.contains("drain.delay"), "{body}");
    gw.wait_for_log(Duration::from_secs(5), |v| {
        v["level"] == "error" && v["msg"].as_str().is_some_and(|m| m.contains("a restart would fail"))
    });

    // Put back: nothing is pending any more.
    std::fs::write(&cfg, &text).unwrap();
    let (_, body) = post(admin, "/v1/reload", None);
    assert!(body.contains("\"config_file_changed\":null"), "{body}");
    let (_, body) = get(admin, "/v1/status");
    assert!(body.contains("\"config_file_changed\":null"), "{body}");
}

#[test]
fn a_second_signal_stops_at_once() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG
        .replace("[drain]\ndelay = \"0s\"\ntimeout = \"2s\"", "[drain]\ndelay = \"30s\"\ntimeout = \"60s\"");
    let mut gw = TestGateway::start(&config, &standard_policy());
    let mut download = raw::connect(gw.addr);
    let req = format!(
        "GET http://origin.test:{}/slow/600/100 HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        origin.port(),
        basic("sbx-a", TOKEN_A)
    );
    download.write_all(req.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    gw.signal("TERM");
    gw.wait_for_log(Duration::from_secs(2), |v| v["msg"].as_str().is_some_and(|m| m.starts_with("draining")));
    let second = Instant::now();
    gw.signal("TERM");
    assert_eq!(gw.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(second.elapsed() < Duration::from_secs(5), "exited {:?} after the second signal", second.elapsed());
}

#[test]
fn a_reload_while_draining_still_closes_what_it_revokes() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG
        .replace("[drain]\ndelay = \"0s\"\ntimeout = \"2s\"", "[drain]\ndelay = \"0s\"\ntimeout = \"30s\"");
    let mut gw = TestGateway::start(&config, &standard_policy());
    let revoked = tunnel(&gw, "origin.test", origin.port());
    gw.signal("TERM");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "stopped accepting; waiting for in-flight work");
    // The tunnel would run until the drain timeout; a revocation ends it now.
    revoke_origin_and_see_it_closed(&gw, revoked);
    // With nothing left in flight, the drain ends well before its timeout.
    assert_eq!(gw.wait_exit(Duration::from_secs(10)), Some(0));
}

/// Takes origin.test out of sbx-a's policy, reloads by signal, and sees `revoked` (a
/// tunnel to it) closed.
fn revoke_origin_and_see_it_closed(gw: &TestGateway, mut revoked: std::net::TcpStream) {
    use std::io::Read;
    let narrowed = standard_policy().replace("\"origin.test:*\", ", "");
    std::fs::write(gw.dir.path().join("policy/test.toml"), narrowed).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "tunnels closed after reload" && v["closed"] == 1);
    let mut buf = [0u8; 16];
    revoked.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert!(matches!(revoked.read(&mut buf), Ok(0) | Err(_)), "revoked tunnel closed");
}
