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
    let gw = TestGateway::start(&format!("{STANDARD_CONFIG}{}", keys.section(true)), &standard_policy());
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
