//! Transparent mode on loopback: clients with no proxy settings reach allowed names
//! through the SNI and Host listeners, identified by their source address; denials
//! are logged with reasons; the DNS firewall's answer mode answers allowed names with
//! the gateway's address. The namespace test with nftables redirects is in
//! tests/transparent_netns.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{RData, RecordType};
use support::gateway::TestGateway;
use support::origin::TestOrigin;
use support::tls::TestCa;
use support::{STANDARD_CONFIG, curl, standard_policy};

/// The standard policy, with sandbox `sbx-a` claiming 127.0.0.1 and `sbx-b`
/// claiming 127.0.0.3; 127.0.0.2 belongs to no sandbox.
fn policy() -> String {
    standard_policy()
        .replace("policy = \"a\"\n", "policy = \"a\"\naddresses = [\"127.0.0.1\"]\n")
        .replace("policy = \"b\"\n", "policy = \"b\"\naddresses = [\"127.0.0.3/32\"]\n")
        .replace("\"portless.test\"]", "\"portless.test\", \"git.test:*\"]")
}

/// A gateway whose transparent listeners dial `https_port` and `http_port`.
fn gateway(https_port: u16, http_port: u16, extra: &str) -> TestGateway {
    let base = STANDARD_CONFIG.replace(
        "\"b-only.test\" = [\"127.0.0.1\"]\n",
        "\"b-only.test\" = [\"127.0.0.1\"]\n\"git.test\" = [\"127.0.0.1\"]\n",
    );
    let config = format!(
        "{base}\n[transparent]\nhttps_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
         https_port = {https_port}\nhttp_port = {http_port}\n{extra}"
    );
    TestGateway::start(&config, &policy())
}

fn ca() -> TestCa {
    TestCa::new(&["tls.test", "origin.test", "blocked.origin.test", "b-only.test", "git.test"])
}

/// curl with no proxy, connecting `name:443` to the HTTPS listener.
fn curl_https(gw: &TestGateway, ca: &TestCa, name: &str, extra: &[&str]) -> support::CurlOutput {
    let listen = gw.transparent_addr("https");
    let connect_to = format!("{name}:443:127.0.0.1:{}", listen.port());
    let url = format!("https://{name}/hello");
    let mut args = vec!["--noproxy", "*", "--cacert", ca.ca_pem_path.to_str().unwrap(), "--connect-to", &connect_to];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args)
}

fn access(gw: &TestGateway, target: &str) -> serde_json::Value {
    gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["target"] == target).remove(0)
}

#[test]
fn https_by_sni_reaches_allowed_names_and_refuses_the_rest() {
    let ca = ca();
    let origin = TestOrigin::https(&ca);
    let gw = gateway(origin.port(), 9, "");
    let target = |name: &str| format!("{name}:{}", origin.port());

    let ok = curl_https(&gw, &ca, "tls.test", &[]);
    assert_eq!((ok.exit, ok.status), (0, 200), "{}", ok.stderr);
    let rec = access(&gw, &target("tls.test"));
    assert_eq!((rec["sandbox"].as_str(), rec["decision"].as_str()), (Some("sbx-a"), Some("allow")), "{rec}");
    assert_eq!(rec["method"], "TLS");
    assert!(rec["bytes_down"].as_u64().unwrap() > 0, "{rec}");
    // The origin saw the client's own request: nothing was terminated.
    assert!(origin.recorded().iter().any(|r| r.uri == "/hello"));

    // A deny rule, and a name the policy does not list: a TLS alert, and the reason
    // in the log.
    let denied = curl_https(&gw, &ca, "blocked.origin.test", &[]);
    assert_ne!(denied.exit, 0);
    assert!(denied.stderr.contains("alert") || denied.stderr.contains("denied"), "{}", denied.stderr);
    let rec = access(&gw, &target("blocked.origin.test"));
    assert_eq!((rec["decision"].as_str(), rec["reason"].as_str()), (Some("deny"), Some("host_denied")), "{rec}");
    assert_eq!(rec["rule"], "blocked.origin.test");
    let not_listed = curl_https(&gw, &ca, "b-only.test", &[]);
    assert_ne!(not_listed.exit, 0);
    assert_eq!(access(&gw, &target("b-only.test"))["reason"], "host_not_allowed");

    // The same names from 127.0.0.3 are sandbox sbx-b's, whose policy lists only
    // b-only.test; from 127.0.0.2, nobody's.
    let as_b = curl_https(&gw, &ca, "tls.test", &["--interface", "127.0.0.3"]);
    assert_ne!(as_b.exit, 0);
    let recs = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["sandbox"] == "sbx-b");
    assert_eq!(recs[0]["reason"], "host_not_allowed", "{}", recs[0]);
    let nobody = curl_https(&gw, &ca, "tls.test", &["--interface", "127.0.0.2"]);
    assert_ne!(nobody.exit, 0);
    let recs = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["reason"] == "auth_required");
    assert!(recs[0]["client_addr"].as_str().unwrap().starts_with("127.0.0.2:"), "{}", recs[0]);
    assert!(recs[0]["sandbox"].is_null());
}

#[test]
fn python_urllib_without_proxy_settings_fetches_through_the_sni_listener() {
    let ca = ca();
    let origin = TestOrigin::https(&ca);
    let gw = gateway(origin.port(), 9, "");
    let listen = gw.transparent_addr("https");
    // The program resolves tls.test itself (here: to the gateway's listener, as the DNS
    // firewall's answer mode would) and knows nothing of proxies.
    let script = format!(
        r#"
import socket, ssl, urllib.request
real = socket.getaddrinfo
def fake(host, port, *a, **k):
    if host.endswith(".test"):
        return real("127.0.0.1", {port}, *a, **k)
    return real(host, port, *a, **k)
socket.getaddrinfo = fake
ctx = ssl.create_default_context(cafile="{ca}")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}), urllib.request.HTTPSHandler(context=ctx))
print(opener.open("https://tls.test/py", timeout=10).status)
try:
    opener.open("https://blocked.origin.test/", timeout=10)
    print("blocked name fetched")
except Exception as e:
    print("refused:", type(e).__name__)
"#,
        port = listen.port(),
        ca = ca.ca_pem_path.display()
    );
    let out = Command::new("python3").args(["-c", &script]).env_remove("HTTPS_PROXY").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("200"));
    assert!(lines.next().unwrap().starts_with("refused:"), "{stdout}");
    assert!(origin.recorded().iter().any(|r| r.uri == "/py"));
    assert_eq!(access(&gw, &format!("blocked.origin.test:{}", origin.port()))["reason"], "host_denied");
}

#[test]
fn hellos_without_a_usable_name_are_refused_with_a_reason() {
    let ca = ca();
    let origin = TestOrigin::https(&ca);
    let gw = gateway(origin.port(), 9, "");
    let listen = gw.transparent_addr("https");
    // No SNI at all; an IP literal (not a host name); not TLS at all.
    let script = format!(
        r#"
import socket, ssl
for sni in (None, "127.0.0.1"):
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    s = socket.create_connection(("127.0.0.1", {port}), timeout=5)
    try:
        ctx.wrap_socket(s, server_hostname=sni)
        print("handshake completed")
    except (ssl.SSLError, OSError) as e:
        print("refused")
s = socket.create_connection(("127.0.0.1", {port}), timeout=5)
s.sendall(b"definitely not a ClientHello\r\n\r\n")
print("closed" if s.recv(100) is not None else "")
"#,
        port = listen.port()
    );
    let out = Command::new("python3").args(["-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["refused", "refused", "closed"], "{stdout}");
    let recs = gw.wait_for_access(3, |v| v["kind"] == "transparent" && v["reason"] == "bad_request");
    assert!(recs.iter().all(|r| r["decision"] == "deny" && r["status"] == 400), "{recs:?}");
    assert!(origin.recorded().is_empty(), "nothing reached the origin");
}

#[test]
fn http_by_host_header_forwards_and_denies_like_the_proxy() {
    let origin = TestOrigin::http();
    let gw = gateway(9, origin.port(), "");
    let listen = gw.transparent_addr("http");
    let get = |name: &str| {
        let connect_to = format!("{name}:80:127.0.0.1:{}", listen.port());
        curl(&["--noproxy", "*", "-i", "--connect-to", &connect_to, &format!("http://{name}/plain?x=1")])
    };
    let ok = get("origin.test");
    assert_eq!((ok.exit, ok.status), (0, 200), "{}", ok.stderr);
    let r = origin.recorded();
    assert!(r.iter().any(|r| r.uri.starts_with("/plain")), "{r:?}");
    let rec = access(&gw, &format!("origin.test:{}", origin.port()));
    assert_eq!((rec["method"].as_str(), rec["sandbox"].as_str()), (Some("GET"), Some("sbx-a")), "{rec}");

    let denied = get("blocked.origin.test");
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(denied.body.to_ascii_lowercase().contains("x-egress-deny-reason: host_denied"), "{}", denied.body);
    assert!(denied.body.contains("\"reason\":\"host_denied\""), "{}", denied.body);

    // No Host header: nothing to decide.
    let reply = support::raw::exchange(listen, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(support::raw::status(&reply), 400, "{reply}");
    assert!(reply.contains("no Host header"), "{reply}");
    // The request line must not name another host than the one decided, and CONNECT
    // belongs on the proxy port.
    let reply = support::raw::exchange(
        listen,
        b"GET http://blocked.origin.test/x HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(support::raw::status(&reply), 400, "{reply}");
    // Userinfo makes the decided name a user name and the host another: refused, and
    // nothing reaches the origin.
    let before = origin.recorded().len();
    for line in ["http://origin.test:80@blocked.origin.test/x", "http://origin.test:@blocked.origin.test/x"] {
        let head = format!("GET {line} HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n");
        let reply = support::raw::exchange(listen, head.as_bytes());
        assert_eq!(support::raw::status(&reply), 400, "{line}: {reply}");
    }
    assert_eq!(origin.recorded().len(), before);
    let reply =
        support::raw::exchange(listen, b"CONNECT blocked.origin.test:443 HTTP/1.1\r\nHost: origin.test\r\n\r\n");
    assert_eq!(support::raw::status(&reply), 400, "{reply}");
    let reply = support::raw::exchange(
        listen,
        b"GET http://ORIGIN.test./x HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(support::raw::status(&reply), 200, "the same host, written differently: {reply}");
}

/// Every request on a kept plain-HTTP connection is decided by its own `Host`: a
/// second request cannot ride on the first one's decision to another host.
#[test]
fn each_request_on_a_kept_http_connection_is_decided() {
    let origin = TestOrigin::http();
    let gw = gateway(9, origin.port(), "");
    let listen = gw.transparent_addr("http");
    let mut s = support::raw::connect(listen);
    let requests = [
        ("GET /first HTTP/1.1\r\nHost: origin.test\r\n\r\n", 200, None),
        ("GET /second HTTP/1.1\r\nHost: b-only.test\r\n\r\n", 403, Some("host_not_allowed")),
        ("GET /third HTTP/1.1\r\nHost: blocked.origin.test\r\n\r\n", 403, Some("host_denied")),
        ("GET http://b-only.test/x HTTP/1.1\r\nHost: origin.test\r\n\r\n", 400, Some("bad_request")),
        ("GET /fifth HTTP/1.1\r\nHost: origin.test\r\n\r\n", 200, None),
    ];
    // All written at once: pipelined requests are each decided too.
    let all: String = requests.iter().map(|(r, _, _)| *r).collect();
    s.write_all(all.as_bytes()).unwrap();
    for (req, code, reason) in requests {
        let resp = support::raw::read_response(&mut s);
        assert_eq!(support::raw::status(&resp), code, "{req}: {resp}");
        if let Some(reason) = reason {
            assert!(resp.contains(&format!("x-egress-deny-reason: {reason}")), "{req}: {resp}");
        }
    }
    let uris: Vec<String> = origin.recorded().iter().map(|r| r.uri.clone()).collect();
    assert_eq!(uris, ["/first", "/fifth"], "only the allowed requests reached the origin");
    let recs = gw.wait_for_access(5, |v| v["kind"] == "transparent");
    let denied: Vec<&str> = recs.iter().filter_map(|v| v["reason"].as_str()).collect();
    assert_eq!(denied, ["host_not_allowed", "host_denied", "bad_request"], "{recs:?}");
}

#[test]
fn with_proxy_protocol_on_an_untrusted_address_keeps_to_its_share() {
    let ca = ca();
    let origin = TestOrigin::https(&ca);
    let base = STANDARD_CONFIG.replace(
        "[proxy]\n",
        "[proxy]\nproxy_protocol = \"optional\"\ntrusted_proxies = [\"127.0.0.9/32\"]\nmax_unauthenticated_per_client = 2\n",
    );
    let config = format!("{base}\n[transparent]\nhttps_listen = \"127.0.0.1:0\"\nhttps_port = {}\n", origin.port());
    let gw = TestGateway::start(&config, &policy());
    let listen = gw.transparent_addr("https");
    // Two silent connections from 127.0.0.2 take its share; a third is closed at once,
    // and sandbox sbx-a (127.0.0.1) is still served.
    let _held: Vec<_> = (0..2).map(|_| support::raw::connect_from([127, 0, 0, 2], listen).unwrap()).collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut third = support::raw::connect_from([127, 0, 0, 2], listen).unwrap();
    third.set_read_timeout(Some(std::time::Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 8];
    let n = std::io::Read::read(&mut third, &mut buf);
    assert!(matches!(n, Ok(0)) || n.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset), "{n:?}");
    let ok = curl_https(&gw, &ca, "tls.test", &[]);
    assert_eq!((ok.exit, ok.status), (0, 200), "{}", ok.stderr);
}

#[test]
fn check_answers_the_same_for_transparent_and_connect() {
    let ca = ca();
    let origin = TestOrigin::https(&ca);
    let gw = gateway(origin.port(), 9, "");
    let cfg = gw.config_path();
    for (name, code) in [("tls.test", 0), ("blocked.origin.test", 1), ("b-only.test", 1)] {
        let target = format!("{name}:{}", origin.port());
        let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
            .args(["check", "--config", cfg.to_str().unwrap(), "--sandbox", "sbx-a", &target])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{}", String::from_utf8_lossy(&out.stdout));
        let live = curl_https(&gw, &ca, name, &[]);
        assert_eq!(live.exit == 0, code == 0, "{name}: {}", live.stderr);
    }
}

#[test]
fn git_clones_through_the_sni_listener_without_proxy_settings() {
    let ca = ca();
    let repos = tempfile::tempdir().unwrap();
    let bare = repos.path().join("acme/widgets.git");
    std::fs::create_dir_all(&bare).unwrap();
    let git = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new("git")
            .env("GIT_SSL_CAINFO", &ca.ca_pem_path)
            .env("GIT_TERMINAL_PROMPT", "0")
            .current_dir(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
            .args(args)
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(repos.path(), &["init", "--bare", bare.to_str().unwrap()]);
    let seed = repos.path().join("seed");
    std::fs::create_dir(&seed).unwrap();
    git(&seed, &["init"]);
    std::fs::write(seed.join("README"), "transparent\n").unwrap();
    git(&seed, &["add", "README"]);
    git(&seed, &["commit", "-m", "seed"]);
    git(&seed, &["push", bare.to_str().unwrap(), "HEAD:refs/heads/main"]);
    let github = TestOrigin::git_https(&ca, repos.path().to_path_buf());
    let gw = gateway(github.port(), 9, "");
    let listen = gw.transparent_addr("https");
    let work = tempfile::tempdir().unwrap();
    let url = format!("https://git.test:{}/acme/widgets.git", listen.port());
    let resolve = format!("http.curloptResolve=git.test:{}:127.0.0.1", listen.port());
    git(work.path(), &["-c", &resolve, "clone", &url, "w"]);
    assert_eq!(std::fs::read_to_string(work.path().join("w/README")).unwrap(), "transparent\n");
    let recs = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["decision"] == "allow");
    assert_eq!(recs[0]["target"], format!("git.test:{}", github.port()));
}

#[test]
fn dns_answer_mode_answers_what_the_asking_sandbox_may_reach() {
    let gw = gateway(
        443,
        80,
        "\n[dns]\nlisten = \"127.0.0.1:0\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [\"127.0.0.1\"]\nanswer = \"gateway\"\nanswer_ttl = 7\n",
    );
    let dns: SocketAddr = gw.dns_addr();
    let ask = |from: &str, name: &str, qtype: RecordType| {
        let s = support::dns::udp_socket(from);
        s.send_to(&support::dns::query(name, qtype, None).to_vec().unwrap(), dns).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.recv(&mut buf).expect("a DNS answer");
        hickory_proto::op::Message::from_vec(&buf[..n]).unwrap()
    };
    let ips = |m: &hickory_proto::op::Message| -> Vec<(String, u32)> {
        m.answers
            .iter()
            .map(|r| match &r.data {
                RData::A(a) => (a.0.to_string(), r.ttl),
                other => (format!("{other:?}"), r.ttl),
            })
            .collect()
    };
    // sbx-a (127.0.0.1) may reach tls.test and *.wild.test, not b-only.test.
    let r = ask("127.0.0.1", "tls.test.", RecordType::A);
    assert_eq!((r.metadata.response_code, ips(&r)), (ResponseCode::NoError, vec![("127.0.0.1".into(), 7)]));
    assert_eq!(ips(&ask("127.0.0.1", "x.deep.wild.test.", RecordType::A)).len(), 1);
    assert_eq!(ask("127.0.0.1", "b-only.test.", RecordType::A).metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(ask("127.0.0.1", "blocked.origin.test.", RecordType::A).metadata.response_code, ResponseCode::NXDomain);
    // HTTPS/SVCB: NODATA, so clients learn of no QUIC endpoint; AAAA with no IPv6
    // address configured: NODATA.
    for t in [RecordType::HTTPS, RecordType::SVCB, RecordType::AAAA] {
        let r = ask("127.0.0.1", "tls.test.", t);
        assert_eq!((r.metadata.response_code, r.answers.len()), (ResponseCode::NoError, 0), "{t}");
    }
    // sbx-b (127.0.0.3) may reach b-only.test only; 127.0.0.2 is nobody's.
    assert_eq!(ips(&ask("127.0.0.3", "b-only.test.", RecordType::A)).len(), 1);
    assert_eq!(ask("127.0.0.3", "tls.test.", RecordType::A).metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(ask("127.0.0.2", "tls.test.", RecordType::A).metadata.response_code, ResponseCode::NXDomain);
    // A name that is an IP literal is never answered: a transparent connection would
    // refuse it (policy a has a rule for 127.0.0.1).
    assert_eq!(ask("127.0.0.1", "127.0.0.1.", RecordType::A).metadata.response_code, ResponseCode::NXDomain);
    // The gateway's own name as before.
    assert_eq!(ips(&ask("127.0.0.2", "gateway.sandbox.internal.", RecordType::A)).len(), 1);
}

#[test]
fn overlapping_address_claims_are_a_load_error_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    let policy = "[policies.p]\nallow = []\n\n[[sandboxes]]\nid = \"one\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\n\
                  addresses = [\"10.1.0.0/16\"]\n\n[[sandboxes]]\nid = \"two\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\n\
                  addresses = [\"10.1.2.3\"]\n"
        .replace("@H@", &support::sha256_hex("t"));
    std::fs::write(dir.path().join("policy/p.toml"), policy).unwrap();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(&cfg, "[policy]\ndir = \"policy\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["config", "validate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("p.toml:8") && err.contains("p.toml:14") && err.contains("\"one\""), "{err}");
    // Host bits: a load error with the fix.
    std::fs::write(
        dir.path().join("policy/p.toml"),
        "[policies.p]\nallow = []\n\n[[sandboxes]]\nid = \"one\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\naddresses = [\"10.1.2.3/16\"]\n"
            .replace("@H@", &support::sha256_hex("t")),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["config", "validate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("addresses[0] (line 8)") && err.contains("10.1.0.0/16"), "{err}");
    // An IPv4-mapped network overlaps the IPv4 network it maps.
    let mapped = "[policies.p]\nallow = []\n\n[[sandboxes]]\nid = \"one\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\n\
                  addresses = [\"::ffff:10.1.0.0/112\"]\n\n[[sandboxes]]\nid = \"two\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\n\
                  addresses = [\"10.1.2.3\"]\n"
        .replace("@H@", &support::sha256_hex("t"));
    std::fs::write(dir.path().join("policy/p.toml"), mapped).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["config", "validate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    // A sidecar's one sandbox is every client: its listeners must be loopback.
    std::fs::write(
        &cfg,
        "[policy]\ndir = \"policy\"\n[transparent]\nhttps_listen = \"0.0.0.0:8443\"\nsandbox = \"one\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["config", "validate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("transparent.https_listen") && err.contains("loopback"), "{err}");
}

/// A gateway with its CA made by `ca init`, transparent listeners dialling an HTTPS
/// origin, and sbx-a's policy inspecting `b-only.test`, where it may `GET` `path`.
/// `proxy` adds `[proxy]` keys.
struct Inspecting {
    gw: TestGateway,
    cert: std::path::PathBuf,
    origin: TestOrigin,
    _dir: tempfile::TempDir,
}

fn inspecting(proxy: &str, path: &str) -> Inspecting {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
    let made = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["ca", "init", "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let ca = ca();
    let origin = TestOrigin::https(&ca);
    let config = format!(
        "{}\n[transparent]\nhttps_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\
         https_port = {}\nhttp_port = {}\n[intercept]\nca_cert_file = \"{}\"\nca_key_file = \"{}\"\n\
         upstream_ca_file = \"{}\"\n",
        STANDARD_CONFIG.replace("[proxy]\n", &format!("[proxy]\n{proxy}")),
        origin.port(),
        origin.port(),
        cert.display(),
        key.display(),
        ca.ca_pem_path.display()
    );
    let rules = format!(
        "deny = [\"blocked.origin.test\"]\ninspect = [\"b-only.test:*\"]\n\
         [[policies.a.requests]]\nhost = \"b-only.test\"\nmethods = [\"GET\"]\npaths = [\"{path}\"]\naction = \"allow\"\n"
    );
    let policy = policy().replace("deny = [\"blocked.origin.test\"]\n", &rules);
    let gw = TestGateway::start(&config, &policy);
    Inspecting { gw, cert, origin, _dir: dir }
}

/// A TLS connection to a host the policy inspects is inspected, as a CONNECT would be:
/// its requests are decided by request rules. The plain-HTTP listener, which does not
/// inspect, refuses a host listed only in `inspect`: a tunnel would skip every rule.
#[test]
fn transparent_tls_to_an_inspected_host_is_inspected() {
    let Inspecting { gw, cert, origin, _dir } = inspecting("", "/hello");
    let listen = gw.transparent_addr("https");
    let run = |extra: &[&str]| {
        let connect_to = format!("b-only.test:443:127.0.0.1:{}", listen.port());
        let mut args = vec!["--noproxy", "*", "--cacert", cert.to_str().unwrap(), "--connect-to", &connect_to];
        args.extend_from_slice(extra);
        args.push("https://b-only.test/hello");
        curl(&args)
    };
    // The client trusts the gateway's CA: the leaf is the gateway's, the request is
    // decided and sent on.
    let ok = run(&[]);
    assert_eq!((ok.exit, ok.status), (0, 200), "{} {}", ok.stderr, ok.body);
    assert_eq!(origin.recorded().len(), 1);
    let denied = run(&["-X", "POST"]);
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(denied.body.contains("request_not_allowed"), "{}", denied.body);
    assert_eq!(origin.recorded().len(), 1, "the refused request did not reach the origin");
    let rec = gw.wait_for_access(1, |v| v["kind"] == "inspect" && v["reason"] == "request_not_allowed");
    assert_eq!(rec[0]["sandbox"], "sbx-a", "{}", rec[0]);

    // Plain HTTP to the same host: decided request by request by the same rules, as
    // on the proxy port (the origin here speaks only TLS, so nothing reaches it).
    let http = gw.transparent_addr("http");
    let connect_to = format!("b-only.test:80:127.0.0.1:{}", http.port());
    let plain = curl(&["--noproxy", "*", "-X", "POST", "--connect-to", &connect_to, "http://b-only.test/hello"]);
    assert_eq!(plain.status, 403, "{}", plain.body);
    assert!(plain.body.contains("request_not_allowed"), "{}", plain.body);
    let rec = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["reason"] == "request_not_allowed");
    assert_eq!(rec[0]["method"], "POST", "{}", rec[0]);
    assert_eq!(origin.recorded().len(), 1);
}

/// A WebSocket upgraded inside an inspected transparent connection outlives the task
/// that accepted the connection; it keeps its place under `proxy.max_connections`, so
/// with two open a third connection is not accepted.
#[test]
fn websockets_inside_inspected_transparent_connections_keep_their_place() {
    let Inspecting { gw, cert, origin: _origin, _dir } = inspecting("max_connections = 2\n", "/ws");
    let listen = gw.transparent_addr("https");
    let script = r#"
import socket, ssl, sys, time
port, ca = int(sys.argv[1]), sys.argv[2]

def tls():
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx.wrap_socket(s, server_hostname="b-only.test")

def head_of(t):
    head = b""
    while b"\r\n\r\n" not in head:
        c = t.recv(1)
        if not c:
            break
        head += c
    return head

def echo(t, msg):
    t.sendall(msg)
    got = b""
    while len(got) < len(msg):
        got += t.recv(64)
    assert got == msg, got

open_ws = []
for i in range(2):
    t = tls()
    t.sendall(b"GET /ws HTTP/1.1\r\nHost: b-only.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    head = head_of(t)
    assert head.startswith(b"HTTP/1.1 101"), head
    echo(t, b"ping")
    open_ws.append(t)
# The accepting tasks have ended by now; only the WebSockets hold the places.
time.sleep(0.5)
try:
    t = tls()
    t.sendall(b"GET /ws HTTP/1.1\r\nHost: b-only.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    print("third:", head_of(t).split(b"\r\n")[0].decode() or "closed")
except (ssl.SSLError, OSError) as e:
    print("third: refused", type(e).__name__)
for t in open_ws:
    echo(t, b"pong")
print("still open")
"#;
    let out = Command::new("python3")
        .args(["-c", script, &listen.port().to_string(), cert.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("third: refused") || stdout.contains("third: closed"),
        "a third connection while two WebSockets hold both places: {stdout}"
    );
    assert!(stdout.contains("still open"), "{stdout}");
}
