//! Signed sandbox tokens end to end: minted by the CLI, presented by curl through the
//! real gateway; every bad form refused with the right reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::process::Command;
use std::time::Duration;

use base64::Engine;
use support::raw::{self, status};
use support::{STANDARD_CONFIG, TestGateway, TestOrigin, basic, curl, standard_policy};

const HS_SECRET: &str = "hs256-test-secret-0123456789abcdefghij";

struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hs.secret"), HS_SECRET).unwrap();
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        std::fs::write(dir.path().join("ed.key"), kp.serialize_pem()).unwrap();
        std::fs::write(dir.path().join("ed.pub"), kp.public_key_pem()).unwrap();
        std::fs::write(dir.path().join("revoked.txt"), "# revoked sandboxes and token ids\n").unwrap();
        Keys { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `[tokens]` with an HS256 key and an EdDSA key (with or without its private half).
    fn section(&self, with_private: bool) -> String {
        let private =
            if with_private { format!("private_key_file = \"{}\"\n", self.path("ed.key")) } else { String::new() };
        format!(
            "\n[tokens]\nmax_ttl = \"2h\"\nleeway = \"5s\"\nrevocation_file = \"{}\"\n\n[[tokens.keys]]\nkid = \"k-hs\"\nalg = \"HS256\"\nsecret_file = \"{}\"\n\n[[tokens.keys]]\nkid = \"k-ed\"\nalg = \"EdDSA\"\npublic_key_file = \"{}\"\n{private}",
            self.path("revoked.txt"),
            self.path("hs.secret"),
            self.path("ed.pub"),
        )
    }
}

fn mint(gw: &TestGateway, args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["token", "mint", "--config"])
        .arg(gw.config_path())
        .args(args)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn hs256(claims: &serde_json::Value, kid: &str, secret: &str) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, claims, &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn get_via(gw: &TestGateway, origin: &TestOrigin, user: &str, token: &str) -> String {
    let req = format!(
        "GET http://origin.test:{}/echo HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        origin.port(),
        basic(user, token)
    );
    raw::request(gw.addr, req.as_bytes())
}

#[test]
fn minted_tokens_are_accepted_for_their_policy() {
    let keys = Keys::new();
    let origin = TestOrigin::http();
    let config = format!("{STANDARD_CONFIG}{}", keys.section(true));
    let gw = TestGateway::start(&config, &standard_policy());
    for kid in ["k-hs", "k-ed"] {
        // A sandbox id that no policy file lists: the token alone names its policy.
        let token = mint(&gw, &["--kid", kid, "--sandbox", "sbx-dyn-1", "--policy", "a", "--ttl", "10m"]).unwrap();
        let url = format!("http://origin.test:{}/echo", origin.port());
        let out = curl(&["-x", &format!("http://sbx-dyn-1:{token}@{}", gw.addr), &url]);
        assert_eq!(out.status, 200, "{kid}: {out:?}");
        let rec = gw.access_for(&format!("origin.test:{}", origin.port()));
        assert_eq!(rec["sandbox"], "sbx-dyn-1");
        assert_eq!(rec["policy"], "a");
        assert!(!gw.log_text().contains(&token), "token never logged");
        assert!(!format!("{:?}", origin.recorded()).contains(&token), "token never forwarded");
    }
    // The policy still decides: policy b does not allow origin.test.
    let token = mint(&gw, &["--kid", "k-hs", "--sandbox", "sbx-dyn-2", "--policy", "b"]).unwrap();
    assert_eq!(status(&get_via(&gw, &origin, "sbx-dyn-2", &token)), 403);

    assert!(
        mint(&gw, &["--kid", "k-hs", "--sandbox", "s", "--policy", "nope"]).unwrap_err().contains("no policy named")
    );
    assert!(
        mint(&gw, &["--kid", "k-hs", "--sandbox", "s", "--policy", "a", "--ttl", "3h"])
            .unwrap_err()
            .contains("max_ttl")
    );
    assert!(mint(&gw, &["--kid", "k-x", "--sandbox", "s", "--policy", "a"]).unwrap_err().contains("no key with kid"));
}

#[test]
fn bad_tokens_are_refused_with_reasons() {
    let keys = Keys::new();
    let origin = TestOrigin::http();
    // Ten refusals in a row from one address are this test's point, not a flood: the
    // failure rate (tests/security_http.rs) is raised so each is checked.
    let config = format!("{STANDARD_CONFIG}{}", keys.section(true))
        .replace("[proxy]\n", "[proxy]\nauth_failures_per_second = 1000\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let t = now();
    let claims = |sub: &str, iat: u64, exp: u64| serde_json::json!({"sub": sub, "pol": "a", "iat": iat, "exp": exp});
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let good = hs256(&claims("sbx-x", t, t + 600), "k-hs", HS_SECRET);
    let payload = good.split('.').nth(1).unwrap();
    let cases = [
        (hs256(&claims("sbx-x", t - 4000, t - 3600), "k-hs", HS_SECRET), "sbx-x", "token_expired"),
        (hs256(&claims("sbx-x", t, t + 600), "k-hs", "another-secret-0123456789abcdefghijkl"), "sbx-x", "auth_invalid"),
        (hs256(&claims("sbx-x", t, t + 600), "k-unknown", HS_SECRET), "sbx-x", "auth_invalid"),
        (hs256(&claims("sbx-x", t, t + 600), "k-ed", HS_SECRET), "sbx-x", "auth_invalid"),
        (hs256(&claims("sbx-x", t + 3600, t + 4000), "k-hs", HS_SECRET), "sbx-x", "auth_invalid"),
        (hs256(&claims("sbx-x", t, t + 6 * 3600), "k-hs", HS_SECRET), "sbx-x", "auth_invalid"),
        (hs256(&serde_json::json!({"sub": "sbx-x", "pol": "a"}), "k-hs", HS_SECRET), "sbx-x", "auth_invalid"),
        (
            hs256(&serde_json::json!({"sub": "sbx-x", "pol": "zzz", "exp": t + 60}), "k-hs", HS_SECRET),
            "sbx-x",
            "auth_invalid",
        ),
        (good.clone(), "sbx-other", "auth_invalid"),
        (format!("{}.{payload}.", b64.encode(r#"{"alg":"none","typ":"JWT","kid":"k-hs"}"#)), "sbx-x", "auth_invalid"),
    ];
    for (i, (token, user, reason)) in cases.iter().enumerate() {
        let resp = get_via(&gw, &origin, user, token);
        assert_eq!(status(&resp), 407, "case {i}: {resp}");
        assert!(resp.contains(&format!("x-egress-deny-reason: {reason}")), "case {i}: {resp}");
        assert!(!resp.contains(token.as_str()), "token echoed");
        // Which keys and algorithms exist is not told to a forged token (cases 1-3).
        for secret in ["signature", "key id", "algorithm"] {
            assert!(!resp.contains(secret), "case {i} tells the {secret}: {resp}");
        }
    }
    assert_eq!(status(&get_via(&gw, &origin, "sbx-x", &good)), 200);
    assert!(origin.recorded().len() == 1);
}

#[test]
fn a_verify_only_instance_cannot_mint() {
    let keys = Keys::new();
    let gw = TestGateway::start(&format!("{STANDARD_CONFIG}{}", keys.section(false)), &standard_policy());
    let err = mint(&gw, &["--kid", "k-ed", "--sandbox", "s", "--policy", "a"]).unwrap_err();
    assert!(err.contains("no signing key"), "{err}");
}

#[test]
fn revocation_applies_on_reload() {
    let keys = Keys::new();
    let origin = TestOrigin::http();
    let gw = TestGateway::start(&format!("{STANDARD_CONFIG}{}", keys.section(true)), &standard_policy());
    let t1 = mint(&gw, &["--kid", "k-hs", "--sandbox", "sbx-r1", "--policy", "a", "--jti", "tok-1"]).unwrap();
    let t2 = mint(&gw, &["--kid", "k-ed", "--sandbox", "sbx-r2", "--policy", "a"]).unwrap();
    assert_eq!(status(&get_via(&gw, &origin, "sbx-r1", &t1)), 200);
    assert_eq!(status(&get_via(&gw, &origin, "sbx-r2", &t2)), 200);
    assert_eq!(status(&get_via(&gw, &origin, "sbx-a", support::TOKEN_A)), 200);
    std::fs::write(keys.dir.path().join("revoked.txt"), "tok-1\nsbx-r2  # compromised\nsbx-a\n").unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    for (user, token) in [("sbx-r1", t1.as_str()), ("sbx-r2", t2.as_str()), ("sbx-a", support::TOKEN_A)] {
        let resp = get_via(&gw, &origin, user, token);
        assert_eq!(status(&resp), 407, "{user}: {resp}");
        // A signed token is told why.
        if user != "sbx-a" {
            assert!(resp.contains("token has been revoked"), "{user}: {resp}");
        }
    }
}

#[test]
fn check_honours_a_tokens_policy_and_repo_narrowing() {
    let keys = Keys::new();
    let policy = format!("{}\n[policies.g]\ngit = {{ repos = [\"acme/*\"] }}\n", standard_policy());
    let gw = TestGateway::start(&format!("{STANDARD_CONFIG}{}", keys.section(true)), &policy);
    let token = mint(&gw, &["--kid", "k-hs", "--sandbox", "sbx-g", "--policy", "g", "--repo", "acme/widgets"]).unwrap();
    let check = |target: &str| {
        Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
            .args(["check", "--config"])
            .arg(gw.config_path())
            .args(["--sandbox", "sbx-g", "--token", &token, target])
            .output()
            .unwrap()
    };
    let out = check("https://github.com/acme/widgets.git");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let out = check("https://github.com/acme/tools.git");
    assert_eq!(out.status.code(), Some(1), "the token narrows acme/* to acme/widgets");
    assert!(String::from_utf8_lossy(&out.stdout).contains("repo_not_connected"));
}

/// Opens a CONNECT tunnel to the origin for `user` and returns its socket after the 200.
fn open_tunnel(gw: &TestGateway, origin: &TestOrigin, user: &str, token: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = raw::connect(gw.addr);
    let target = format!("origin.test:{}", origin.port());
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {}\r\n\r\n", basic(user, token))
        .unwrap();
    let head = raw::read_head(&mut s);
    assert_eq!(status(&head), 200, "{user}: {head}");
    s
}

/// Reads until the gateway closes `s` (EOF or reset), discarding data; panics if it is
/// still open at `deadline`.
fn wait_closed(s: &mut std::net::TcpStream, what: &str, deadline: std::time::Instant) {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
        assert!(std::time::Instant::now() < deadline, "{what} is still open");
    }
}

/// A tunnel still carries traffic: an HTTP request through it is answered.
fn still_open(s: &mut std::net::TcpStream) {
    use std::io::Write;
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: origin.test\r\n\r\n").unwrap();
    assert_eq!(status(&raw::read_head(s)), 200);
}

/// A credential that the new state refuses ends every connection it authenticated, at
/// the reload that refuses it: a revoked `jti`, a replaced signing key, a rotated static
/// token; tunnels and long forwarded responses alike. A connection opened with a signed
/// token also ends once the token expires (after `tokens.expiry_grace`).
#[test]
fn open_connections_end_when_their_credential_is_revoked_rotated_or_expires() {
    let keys = Keys::new();
    let origin = TestOrigin::http();
    let config = format!("{STANDARD_CONFIG}{}", keys.section(true))
        .replace("leeway = \"5s\"", "leeway = \"5s\"\nexpiry_grace = \"1s\"");
    assert!(config.contains("expiry_grace"));
    let gw = TestGateway::start(&config, &standard_policy());
    let t = now();
    let revoked_jti = mint(&gw, &["--kid", "k-hs", "--sandbox", "sbx-r1", "--policy", "a", "--jti", "tok-1"]).unwrap();
    let ed_signed = mint(&gw, &["--kid", "k-ed", "--sandbox", "sbx-r2", "--policy", "a"]).unwrap();
    let kept = mint(&gw, &["--kid", "k-hs", "--sandbox", "sbx-r4", "--policy", "a", "--jti", "tok-4"]).unwrap();
    let short = hs256(&serde_json::json!({"sub": "sbx-r3", "pol": "a", "iat": t, "exp": t + 2}), "k-hs", HS_SECRET);

    let mut by_jti = open_tunnel(&gw, &origin, "sbx-r1", &revoked_jti);
    let mut by_ed = open_tunnel(&gw, &origin, "sbx-r2", &ed_signed);
    let mut by_static = open_tunnel(&gw, &origin, "sbx-a", support::TOKEN_A);
    let mut control = open_tunnel(&gw, &origin, "sbx-r4", &kept);
    // A forwarded response that streams for 30 s.
    let mut streaming = raw::connect(gw.addr);
    {
        use std::io::Write;
        let req = format!(
            "GET http://origin.test:{}/slow/300/100 HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
            origin.port(),
            basic("sbx-a", support::TOKEN_A)
        );
        streaming.write_all(req.as_bytes()).unwrap();
        assert_eq!(status(&raw::read_head(&mut streaming)), 200);
    }

    // Expiry first: the short token's tunnel ends about a second after its exp.
    let mut by_short = open_tunnel(&gw, &origin, "sbx-r3", &short);
    wait_closed(&mut by_short, "the tunnel of an expired token", std::time::Instant::now() + Duration::from_secs(10));
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "connections ended: their signed tokens expired");
    still_open(&mut control);

    // Revoke tok-1, replace the k-ed key, rotate sbx-a's static token; reload.
    std::fs::write(keys.dir.path().join("revoked.txt"), "tok-1\n").unwrap();
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    std::fs::write(keys.dir.path().join("ed.key"), kp.serialize_pem()).unwrap();
    std::fs::write(keys.dir.path().join("ed.pub"), kp.public_key_pem()).unwrap();
    let rotated =
        standard_policy().replace(&support::sha256_hex(support::TOKEN_A), &support::sha256_hex("a-new-token"));
    std::fs::write(gw.dir.path().join("policy/test.toml"), rotated).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");

    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    wait_closed(&mut by_jti, "the tunnel of a revoked jti", deadline);
    wait_closed(&mut by_ed, "the tunnel of a replaced signing key", deadline);
    wait_closed(&mut by_static, "the tunnel of a rotated static token", deadline);
    wait_closed(&mut streaming, "a forwarded response of a rotated static token", deadline);
    still_open(&mut control);
}

/// An upload whose response has already ended is still held by its request: a reload
/// that rotates the sandbox's token cuts it, and nothing sent after the reload reaches
/// the origin.
#[test]
fn an_upload_outliving_its_response_is_cut_by_revocation() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    // An origin that answers at once and keeps reading the body.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(Vec::<u8>::new()));
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (rx, cl) = (received.clone(), closed.clone());
    std::thread::spawn(move || {
        let Ok((mut c, _)) = listener.accept() else { return };
        let mut buf = [0u8; 4096];
        let mut answered = false;
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    rx.lock().unwrap().extend_from_slice(&buf[..n]);
                    if !answered && rx.lock().unwrap().windows(4).any(|w| w == b"\r\n\r\n") {
                        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
                        answered = true;
                    }
                }
            }
        }
        cl.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut s = raw::connect(gw.addr);
    write!(
        s,
        "POST http://origin.test:{port}/upload HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {}\r\n\
         Transfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n",
        basic("sbx-a", support::TOKEN_A)
    )
    .unwrap();
    assert_eq!(status(&raw::read_head(&mut s)), 200);
    let rotated =
        standard_policy().replace(&support::sha256_hex(support::TOKEN_A), &support::sha256_hex("a-new-token"));
    std::fs::write(gw.dir.path().join("policy/test.toml"), rotated).unwrap();
    gw.signal("HUP");
    // The sweep that follows the reload ends the request.
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "closing a connection");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !closed.load(std::sync::atomic::Ordering::SeqCst) {
        let _ = s.write_all(b"10\r\nafter-revocation\r\n");
        assert!(std::time::Instant::now() < deadline, "the upload to the origin is still open");
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
    assert!(got.contains("first") && !got.contains("after-revocation"), "{got}");
}

/// A keep-alive connection's requests are checked again whenever they could be
/// decided differently: another credential, a reload that rotates the token, a signed
/// token that expired while the connection stayed open.
#[test]
fn keep_alive_requests_are_checked_again_when_the_answer_could_change() {
    use std::io::Write;
    let keys = Keys::new();
    let origin = TestOrigin::http();
    let config = format!("{STANDARD_CONFIG}{}", keys.section(true)).replace("leeway = \"5s\"", "leeway = \"0s\"");
    assert!(config.contains("leeway = \"0s\""));
    let gw = TestGateway::start(&config, &standard_policy());
    let get = |s: &mut std::net::TcpStream, user: &str, token: &str| {
        let req = format!(
            "GET http://origin.test:{}/echo HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
            origin.port(),
            basic(user, token)
        );
        s.write_all(req.as_bytes()).unwrap();
        raw::read_response(s)
    };

    // Another credential on the same connection is checked on its own.
    let mut s = raw::connect(gw.addr);
    assert_eq!(status(&get(&mut s, "sbx-a", support::TOKEN_A)), 200);
    let resp = get(&mut s, "sbx-a", "not-the-token");
    assert_eq!(status(&resp), 407, "{resp}");
    assert!(resp.contains("auth_invalid"), "{resp}");

    // A signed token that expires while its connection stays open is refused then.
    let t = now();
    let short = hs256(&serde_json::json!({"sub": "sbx-k1", "pol": "a", "iat": t, "exp": t + 2}), "k-hs", HS_SECRET);
    let mut s = raw::connect(gw.addr);
    assert_eq!(status(&get(&mut s, "sbx-k1", &short)), 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let resp = get(&mut s, "sbx-k1", &short);
        if status(&resp) == 407 {
            assert!(resp.contains("token_expired"), "{resp}");
            break;
        }
        assert_eq!(status(&resp), 200, "{resp}");
        assert!(std::time::Instant::now() < deadline, "the expired token was still accepted");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(now() > t + 2, "refused only after its exp");

    // A reload that rotates the static token refuses the old one on a kept connection.
    let mut s = raw::connect(gw.addr);
    assert_eq!(status(&get(&mut s, "sbx-a", support::TOKEN_A)), 200);
    let rotated =
        standard_policy().replace(&support::sha256_hex(support::TOKEN_A), &support::sha256_hex("a-new-token"));
    std::fs::write(gw.dir.path().join("policy/test.toml"), rotated).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    let resp = get(&mut s, "sbx-a", support::TOKEN_A);
    assert_eq!(status(&resp), 407, "{resp}");
}

#[test]
fn an_eddsa_private_key_from_another_pair_is_a_config_error() {
    let keys = Keys::new();
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    std::fs::write(keys.dir.path().join("ed.key"), other.serialize_pem()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("p")).unwrap();
    let cfg = dir.path().join("gw.toml");
    std::fs::write(&cfg, format!("[policy]\ndir = \"p\"\n{}", keys.section(true))).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["config", "validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("tokens.keys[1].private_key_file: expected the private half of public_key_file"), "{err}");
}
