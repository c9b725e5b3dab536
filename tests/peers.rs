//! Sandbox-to-sandbox rules and allow-all policies on loopback. Sandbox `sbx-runner`
//! claims 127.0.0.2 and `sbx-db` 127.0.0.3, both private under the test config (only
//! 127.0.0.1 is an egress exception); a peer origin listens on 127.0.0.3. A peer is
//! reached as `ID.sandboxes.internal:PORT` only when both policies agree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use support::gateway::TestGateway;
use support::origin::TestOrigin;
use support::{STANDARD_CONFIG, TOKEN_A, TOKEN_B, curl, sha256_hex};

/// A tiny HTTP server on 127.0.0.3 (the peer's address) that records who connected.
struct PeerOrigin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<SocketAddr>>>,
}

impl PeerOrigin {
    fn start() -> PeerOrigin {
        Self::start_on("127.0.0.3:0")
    }

    fn start_on(addr: &str) -> PeerOrigin {
        let listener = TcpListener::bind(addr).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                record.lock().unwrap().push(s.peer_addr().unwrap());
                std::thread::spawn(move || {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let mut buf = [0u8; 4096];
                    let mut head = Vec::new();
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\npeer!\n");
                });
            }
        });
        PeerOrigin { addr, seen }
    }
}

fn policy(db_accepts: &str) -> String {
    policy_at(db_accepts, "127.0.0.3")
}

fn policy_at(db_accepts: &str, db_address: &str) -> String {
    format!(
        r#"
[policies.runner]
allow = []
peers = ["team-a/db*", "sbx-cache"]
deny = ["*.sandboxes.internal:22"]

[policies.db]
allow = []
accept_from = [{db_accepts}]

[policies.lonely]
allow = []
peers = ["sbx-db"]

[policies.open]
allow_all = true
deny = ["blocked.origin.test"]

[policies.wide]
allow_all = true

[[sandboxes]]
id = "sbx-runner"
token_sha256 = "{a}"
policy = "runner"
addresses = ["127.0.0.2"]
labels = ["team-a/runner"]

[[sandboxes]]
id = "sbx-db"
token_sha256 = "{b}"
policy = "db"
addresses = ["{db_address}"]
labels = ["team-a/db"]

# Misconfigured: the gateway's own address.
[[sandboxes]]
id = "sbx-cache"
token_sha256 = "{b}"
policy = "db"
addresses = ["127.0.0.1"]

[[sandboxes]]
id = "sbx-lonely"
token_sha256 = "{b}"
policy = "lonely"

[[sandboxes]]
id = "sbx-open"
token_sha256 = "{a}"
policy = "open"
"#,
        a = sha256_hex(TOKEN_A),
        b = sha256_hex(TOKEN_B)
    )
}

fn gateway(peer_port: u16) -> TestGateway {
    let config = format!(
        "{STANDARD_CONFIG}\n[transparent]\nhttp_listen = \"127.0.0.1:0\"\nhttp_port = {peer_port}\n\n\
         [dns]\nlisten = \"127.0.0.1:0\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [\"127.0.0.1\"]\n\
         answer = \"gateway\"\n"
    );
    TestGateway::start(&config, &policy("\"sbx-runner\""))
}

fn via(gw: &TestGateway, user: &str, token: &str, url: &str, tunnel: bool) -> support::CurlOutput {
    let proxy = gw.proxy_url(user, token);
    let mut args = vec!["-x", proxy.as_str()];
    if tunnel {
        args.push("-p");
    }
    args.push(url);
    curl(&args)
}

#[test]
fn peers_are_reached_only_when_both_policies_agree() {
    let peer = PeerOrigin::start();
    let gw = gateway(peer.addr.port());
    let url = format!("http://sbx-db.sandboxes.internal:{}/x", peer.addr.port());

    // runner -> db: runner's peers match db's label, db accepts runner. Through a
    // CONNECT tunnel and through absolute-form forwarding.
    for tunnel in [true, false] {
        let out = via(&gw, "sbx-runner", TOKEN_A, &url, tunnel);
        assert_eq!((out.status, out.body.as_str()), (200, "peer!\n"), "tunnel={tunnel}: {}", out.stderr);
    }
    let rec = gw.wait_for_access(1, |v| v["decision"] == "allow" && v["sandbox"] == "sbx-runner").remove(0);
    assert_eq!(rec["rule"], "peers \"team-a/db*\"", "{rec}");
    assert_eq!(rec["upstream_addr"], peer.addr.to_string(), "dialled exactly the peer's address");

    // lonely asks for db, but db does not accept it; db asks for nobody.
    let out = via(&gw, "sbx-lonely", TOKEN_B, &url, false);
    assert_eq!(out.status, 403, "{}", out.body);
    assert!(
        out.body.contains("\"reason\":\"peer_not_allowed\"") && out.body.contains("does not accept"),
        "{}",
        out.body
    );
    let back = format!("http://sbx-runner.sandboxes.internal:{}/", peer.addr.port());
    let out = via(&gw, "sbx-db", TOKEN_B, &back, false);
    assert_eq!(out.status, 403);
    assert!(out.body.contains("to policies.db.peers"), "{}", out.body);
    // A name no sandbox has, and the peer's address asked for directly: refused.
    let out =
        via(&gw, "sbx-runner", TOKEN_A, &format!("http://sbx-nope.sandboxes.internal:{}/", peer.addr.port()), false);
    assert_eq!(out.status, 403);
    let out = via(&gw, "sbx-runner", TOKEN_A, &format!("http://127.0.0.3:{}/", peer.addr.port()), false);
    assert_eq!(out.status, 403, "{}", out.body);
    assert_eq!(peer.seen.lock().unwrap().len(), 2, "only the two agreed requests reached the peer");

    // Transparent: runner (from 127.0.0.2, no credentials) names the peer in Host.
    let listen = gw.transparent_addr("http");
    let connect_to = format!("sbx-db.sandboxes.internal:80:127.0.0.1:{}", listen.port());
    let out = curl(&[
        "--noproxy",
        "*",
        "--interface",
        "127.0.0.2",
        "--connect-to",
        &connect_to,
        "http://sbx-db.sandboxes.internal/",
    ]);
    assert_eq!((out.status, out.body.as_str()), (200, "peer!\n"), "{}", out.stderr);
    // DNS answer mode resolves allowed peers for the asking sandbox only.
    let dns = gw.dns_addr();
    let ask = |from: &str, name: &str| {
        let s = support::dns::udp_socket(from);
        s.send_to(&support::dns::query(name, RecordType::A, None).to_vec().unwrap(), dns).unwrap();
        let mut buf = [0u8; 2048];
        let n = s.recv(&mut buf).unwrap();
        hickory_proto::op::Message::from_vec(&buf[..n]).unwrap()
    };
    let r = ask("127.0.0.2", "sbx-db.sandboxes.internal.");
    assert_eq!((r.metadata.response_code, r.answers.len()), (ResponseCode::NoError, 1));
    assert_eq!(ask("127.0.0.3", "sbx-runner.sandboxes.internal.").metadata.response_code, ResponseCode::NXDomain);

    // check explains a peer decision with the rule's file and line.
    let cfg = gw.config_path();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["check", "--config", cfg.to_str().unwrap(), "--sandbox", "sbx-runner", "--json"])
        .arg(format!("sbx-db.sandboxes.internal:{}", peer.addr.port()))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["decision"].as_str(), v["rule_list"].as_str()), (Some("allow"), Some("peers")), "{v}");
    assert!(v["rule_location"].as_str().unwrap().ends_with("test.toml:4"), "{v}");

    // A peer given the gateway's own address does not open the gateway's ports.
    for port in [gw.admin_addr().port(), gw.addr.port()] {
        let out =
            via(&gw, "sbx-runner", TOKEN_A, &format!("http://sbx-cache.sandboxes.internal:{port}/v1/status"), false);
        assert_eq!(out.status, 403, "{} {}", out.body, out.stderr);
        assert!(out.body.contains("\"reason\":\"address_denied\""), "{}", out.body);
    }

    // `deny` beats the agreement: a peer on a denied port is refused before any dial.
    let out = via(&gw, "sbx-runner", TOKEN_A, "http://sbx-db.sandboxes.internal:22/", false);
    assert_eq!(out.status, 403, "{} {}", out.body, out.stderr);
    let rec = gw.wait_for_access(1, |v| v["target"] == "sbx-db.sandboxes.internal:22").remove(0);
    assert_eq!(
        (rec["reason"].as_str(), rec["rule"].as_str()),
        (Some("host_denied"), Some("*.sandboxes.internal:22")),
        "{rec}"
    );
}

#[test]
fn a_peer_that_stops_accepting_ends_open_tunnels() {
    let peer = PeerOrigin::start();
    let gw = gateway(peer.addr.port());
    let mut tunnel = support::raw::connect(gw.addr);
    let target = format!("sbx-db.sandboxes.internal:{}", peer.addr.port());
    write!(
        tunnel,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {}\r\n\r\n",
        support::gateway::basic("sbx-runner", TOKEN_A)
    )
    .unwrap();
    assert_eq!(support::raw::status(&support::raw::read_head(&mut tunnel)), 200);
    std::fs::write(gw.dir.path().join("policy/test.toml"), policy("\"sbx-someone-else\"")).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    tunnel.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    // The peer answers nothing unasked: the only way the read ends is the sweep.
    match tunnel.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("tunnel still open after the peer stopped accepting: {other:?}"),
    }
    let rec = gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "closing a connection");
    assert!(rec["target"].as_str().unwrap().starts_with("peer sbx-db"), "{rec}");
}

#[test]
fn a_peer_that_moves_is_followed_and_its_old_address_is_not() {
    let old = PeerOrigin::start();
    let new = PeerOrigin::start_on(&format!("127.0.0.4:{}", old.addr.port()));
    let gw = gateway(old.addr.port());
    let url = format!("http://sbx-db.sandboxes.internal:{}/x", old.addr.port());
    for _ in 0..3 {
        assert_eq!(via(&gw, "sbx-runner", TOKEN_A, &url, false).status, 200);
    }
    let mut tunnel = support::raw::connect(gw.addr);
    let target = format!("sbx-db.sandboxes.internal:{}", old.addr.port());
    write!(
        tunnel,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {}\r\n\r\n",
        support::gateway::basic("sbx-runner", TOKEN_A)
    )
    .unwrap();
    assert_eq!(support::raw::status(&support::raw::read_head(&mut tunnel)), 200);
    // Three forwarded requests and the tunnel: the origin's accept loop records the
    // tunnel's connection on its own time.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while old.seen.lock().unwrap().len() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = old.seen.lock().unwrap().len();
    assert_eq!(before, 4, "three requests and one tunnel reached the peer");

    // db moves to 127.0.0.4; 127.0.0.3 may now be anyone's.
    std::fs::write(gw.dir.path().join("policy/test.toml"), policy_at("\"sbx-runner\"", "127.0.0.4")).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    // The open tunnel to the old address is ended...
    tunnel.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    match tunnel.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("tunnel to the peer's old address still open: {other:?}"),
    }
    // ...and forwarded requests follow the peer, none reusing a pooled connection.
    for _ in 0..3 {
        let out = via(&gw, "sbx-runner", TOKEN_A, &url, false);
        assert_eq!(out.status, 200, "{}", out.body);
    }
    assert_eq!(old.seen.lock().unwrap().len(), before, "a request reached the peer's old address");
    assert_eq!(new.seen.lock().unwrap().len(), 3);
}

#[test]
fn sandbox_ids_that_differ_only_in_case_are_a_load_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    let p = "[policies.p]\nallow = []\n\n[[sandboxes]]\nid = \"Sbx-X\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\n\n\
             [[sandboxes]]\nid = \"SBX-X\"\ntoken_sha256 = \"@H@\"\npolicy = \"p\"\n"
        .replace("@H@", &sha256_hex("t"));
    std::fs::write(dir.path().join("policy/p.toml"), p).unwrap();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(&cfg, "[policy]\ndir = \"policy\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["config", "validate", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("differs only in case"), "{err}");
}

#[test]
fn allow_all_reaches_public_destinations_but_not_deny_rules_private_addresses_or_peers() {
    let origin = TestOrigin::http();
    let peer = PeerOrigin::start();
    let gw = gateway(peer.addr.port());
    let get = |host: &str| via(&gw, "sbx-open", TOKEN_A, &format!("http://{host}:{}/hello", origin.port()), false);
    let ok = get("origin.test");
    assert_eq!(ok.status, 200, "{}", ok.stderr);
    let rec = gw.access_for(&format!("origin.test:{}", origin.port()));
    assert_eq!(rec["rule"], "allow_all", "{rec}");
    let denied = get("blocked.origin.test");
    assert_eq!(denied.status, 403);
    assert!(denied.body.contains("host_denied"), "{}", denied.body);
    // rebind.test resolves to 127.0.0.2: the builtin deny set holds under allow_all.
    let private = get("rebind.test");
    assert_eq!(private.status, 403, "{}", private.body);
    assert!(private.body.contains("address_denied"), "{}", private.body);
    let out = via(&gw, "sbx-open", TOKEN_A, &format!("http://sbx-db.sandboxes.internal:{}/", peer.addr.port()), false);
    assert!(out.body.contains("peer_not_allowed"), "{}", out.body);

    // lint warns on allow_all with no deny rules in enforce mode (policy "wide"), not on "open".
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["policy", "lint", "--config", gw.config_path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("allow_all in enforce mode")).collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains("wide") || text.contains("policies.wide"), "{text}");
}
