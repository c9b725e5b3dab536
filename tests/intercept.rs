//! TLS inspection end to end: the real gateway with a CA made by `egress-gateway ca
//! init`, real clients (curl, Python `requests`, Node, git) trusting it, a real TLS
//! origin with its own test CA, and `git http-backend` behind the git route.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use base64::Engine;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::tls::TestCa;
use support::{TOKEN_A, TOKEN_B, TestGateway, TestOrigin, sha256_hex};

const SECRET: &str = "sk-real+value/7d1e0c";
/// A value only policy `b` may lend.
const B_ONLY: &str = "bk-policy-b-only-4c9e";
/// A second sandbox under policy a.
const TOKEN_A2: &str = "token-a2-93c1e0b7d5f24a68";

struct World {
    gw: TestGateway,
    origin: TestOrigin,
    gw_ca: PathBuf,
    origin_ca: TestCa,
    _dir: tempfile::TempDir,
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_egress-gateway")
}

/// The gateway's CA, made by the CLI as an operator would.
fn make_ca(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let out = Command::new(bin())
        .args(["ca", "init", "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "ca init: {}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

fn policy(port: u16) -> String {
    format!(
        r#"
[policies.a]
inspect = ["inspect.test:*", "evil.test:*", "pinned.test:*", "neveronly.test:*", "grpc.test:*"]
allow = ["plain.test:*", "pinned.test:*"]

[[policies.a.requests]]
host = "inspect.test"
methods = ["GET", "POST"]
paths = ["/echo", "/echo/**", "/ws"]
action = "allow"

[[policies.a.requests]]
host = "inspect.test"
paths = ["/echo/admin/**"]
action = "deny"

[[policies.a.requests]]
host = "evil.test"
methods = ["GET"]
action = "allow"

[[policies.a.requests]]
host = "evil.test"
methods = ["POST"]
paths = ["/echo/form"]
action = "allow"

[[policies.a.requests]]
host = "grpc.test"
paths = ["/echo.Echo/Say"]
action = "allow"

[policies.b]
inspect = ["inspect.test:{port}"]

[[sandboxes]]
id = "sbx-a"
token_sha256 = "{a}"
policy = "a"

[[sandboxes]]
id = "sbx-b"
token_sha256 = "{b}"
policy = "b"

[[sandboxes]]
id = "sbx-a2"
token_sha256 = "{a2}"
policy = "a"
"#,
        a = sha256_hex(TOKEN_A),
        b = sha256_hex(TOKEN_B),
        a2 = sha256_hex(TOKEN_A2),
    )
}

fn world() -> World {
    world_with("")
}

/// With more `[proxy]` keys.
fn world_with(proxy: &str) -> World {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_ca(dir.path());
    let origin_ca = TestCa::new(&["inspect.test", "evil.test", "pinned.test", "plain.test", "grpc.test"]);
    let origin = TestOrigin::https(&origin_ca);
    let secret_file = dir.path().join("openai.key");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let b_only_file = dir.path().join("b-only.key");
    std::fs::write(&b_only_file, format!("{B_ONLY}\n")).unwrap();
    let config = format!(
        r#"
[proxy]
header_read_timeout = "2s"
connect_timeout = "2s"
{proxy}

[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
[resolver.hosts]
"inspect.test" = ["127.0.0.1"]
"evil.test" = ["127.0.0.1"]
"pinned.test" = ["127.0.0.1"]
"plain.test" = ["127.0.0.1"]
"neveronly.test" = ["127.0.0.1"]
"grpc.test" = ["127.0.0.1"]

[egress]
allow = ["127.0.0.1/32"]

[intercept]
ca_cert_file = "{cert}"
ca_key_file = "{key}"
never = ["pinned.test", "neveronly.test"]
upstream_ca_file = "{origin_ca}"

[[secrets]]
name = "openai"
value_file = "{secret}"
hosts = ["inspect.test:*"]
body = true
query = true

[[secrets]]
name = "bonly"
value_file = "{b_only}"
hosts = ["inspect.test:*"]
policies = ["b"]
"#,
        cert = cert.display(),
        key = key.display(),
        origin_ca = origin_ca.ca_pem_path.display(),
        secret = secret_file.display(),
        b_only = b_only_file.display(),
    );
    let gw = TestGateway::start(&config, &policy(origin.port()));
    World { gw, origin, gw_ca: cert, origin_ca, _dir: dir }
}

struct Reply {
    status: u16,
    version: String,
    headers: String,
    body: String,
}

fn curl(w: &World, ca: &Path, extra: &[&str], url: &str) -> Reply {
    let dir = tempfile::tempdir().unwrap();
    let headers = dir.path().join("h");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert", ca.to_str().unwrap(), "-x", &w.gw.proxy_url("sbx-a", TOKEN_A)])
        .args(["-D", headers.to_str().unwrap(), "-w", "\n@@%{http_code} %{http_version}"])
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, codes) = stdout.rsplit_once("\n@@").unwrap_or((&stdout, "0 0"));
    let (status, version) = codes.split_once(' ').unwrap_or(("0", "0"));
    Reply {
        status: status.parse().unwrap_or(0),
        version: version.to_string(),
        headers: std::fs::read_to_string(headers).unwrap_or_default().to_ascii_lowercase(),
        body: format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
    }
}

#[test]
fn requests_are_decided_one_by_one_and_refusals_say_why() {
    let w = world();
    let url = |host: &str, path: &str| format!("https://{host}:{}{path}", w.origin.port());

    // Allowed: forwarded over a fresh, verified TLS connection; the client trusts the
    // gateway's CA only.
    let r = curl(&w, &w.gw_ca, &[], &url("inspect.test", "/echo?x=1"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("\"method\":\"GET\""), "{}", r.body);
    assert_eq!(w.origin.recorded().len(), 1);

    // HTTP/2 by ALPN.
    let r = curl(&w, &w.gw_ca, &["--http2"], &url("inspect.test", "/echo/h2"));
    assert_eq!((r.status, r.version.as_str()), (200, "2"), "{}", r.body);

    // A refused method, a denied path and an unlisted path: 403 with the reason.
    for (args, path, rule) in [
        (vec!["-X", "DELETE"], "/echo", None),
        (vec!["-X", "delete"], "/echo", None),
        // A POST that asks to be run as a DELETE is judged as one too.
        (vec!["-X", "POST"], "/echo?_method=DELETE", None),
        // As PHP reads the name (`.` for `_`).
        (vec!["-X", "POST"], "/echo?.method=DELETE", None),
        (vec!["-X", "get"], "/Echo/Admin/users", Some("deny * inspect.test/echo/admin/**")),
        (vec![], "/echo/admin", Some("deny * inspect.test/echo/admin/**")),
        (vec![], "/echo/admin/users", Some("deny * inspect.test/echo/admin/**")),
        (vec![], "/other", None),
    ] {
        let before = w.origin.recorded().len();
        let r = curl(&w, &w.gw_ca, &args, &url("inspect.test", path));
        assert_eq!(r.status, 403, "{path}: {}", r.body);
        assert!(r.headers.contains("x-egress-deny-reason: request_not_allowed"), "{}", r.headers);
        assert!(r.body.contains("request_not_allowed"), "{}", r.body);
        if let Some(rule) = rule {
            assert!(r.body.contains(rule), "the refusal names the rule: {}", r.body);
        } else {
            assert!(r.body.contains("requests"), "the refusal says how to allow it: {}", r.body);
        }
        assert_eq!(w.origin.recorded().len(), before, "nothing refused reaches the origin");
    }
    // Nor a form body that names the method (Rails, Laravel and Symfony run it as a
    // DELETE): the body ends before it is whole, so the origin never runs it.
    for args in [
        vec!["--data", "a=1&_method=DELETE"],
        vec!["--data", "%5Fmethod=delete"],
        vec!["-F", "a=1", "-F", "_method=DELETE"],
        vec!["--http1.1", "-H", "Transfer-Encoding: chunked", "--data", "_method=DELETE"],
        vec![
            "-H",
            "Content-Type: multipart/mixed; boundary=b",
            "--data-binary",
            "--b\r\nContent-ID: _method\r\n\r\nDELETE\r\n--b--\r\n",
        ],
        // Laravel reads a JSON body's top-level `_method` key.
        vec!["-H", "Content-Type: application/json", "--data-binary", r#"{"a":[1,"}"],"\u005fmethod":"delete"}"#],
        // `post` is a POST (PHP under Apache upper-cases it); PHP's built-in server
        // reads `Content_Type` as the type.
        vec![
            "-X",
            "post",
            "-H",
            "Content-Type:",
            "-H",
            "Content_Type: application/json",
            "--data-binary",
            r#"{"_method":"DELETE"}"#,
        ],
    ] {
        // (The head may have gone: the origin records heads, not whole requests.)
        let r = curl(&w, &w.gw_ca, &args, &url("inspect.test", "/echo"));
        assert_eq!(r.status, 403, "{args:?}: {}", r.body);
        assert!(r.headers.contains("x-egress-deny-reason: request_not_allowed"), "{}", r.headers);
        assert!(r.body.contains("_method=DELETE asks the upstream to run this POST as DELETE"), "{}", r.body);
    }
    // A method the rules allow, or another field, goes through.
    // A compressed form cannot be read for the field where another method is refused.
    let gz = ["-H", "Content-Encoding: gzip", "--data-binary", "x"];
    let r = curl(&w, &w.gw_ca, &gz, &url("inspect.test", "/echo"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("cannot be read for a _method field"), "{}", r.body);
    let json = ["-H", "Content-Type: application/json", "--data-binary"];
    for args in [
        vec!["--data", "_method=GET&x=1"],
        vec!["--data", "x_method=DELETE"],
        vec!["-F", "_method=GET"],
        [&json[..], &[r#"{"_method":"get","b":{"_method":"DELETE"}}"#]].concat(),
        [&json[..], &[r#"{"a":{"_method":"DELETE"}}"#]].concat(),
    ] {
        let r = curl(&w, &w.gw_ca, &args, &url("inspect.test", "/echo"));
        assert_eq!(r.status, 200, "{args:?}: {}", r.body);
    }
    // Traversal cannot dodge the deny rule: such a path is not judged at all.
    for path in ["/echo/x/../admin/users", "/echo/%2e%2e/admin/users", "/echo%2Fadmin/users", "/echo/admin./users"] {
        let r = curl(&w, &w.gw_ca, &["--path-as-is"], &url("inspect.test", path));
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert!(r.headers.contains("x-egress-deny-reason: bad_request"), "{}", r.headers);
    }
    // A tunnel inside the inspected connection is not judged as a request: refused.
    let r = curl(&w, &w.gw_ca, &["--http1.1", "-X", "CONNECT"], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("CONNECT inside an inspected connection"), "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(r.body.trim()).unwrap();
    assert_eq!(v["sandbox"], "sbx-a", "the refusal names the sandbox of the outer CONNECT: {}", r.body);

    // Another policy without request rules: inspected, so every request is refused.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert", w.gw_ca.to_str().unwrap()])
        .args(["-x", &w.gw.proxy_url("sbx-b", TOKEN_B), "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(url("inspect.test", "/echo"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");

    // A client that does not trust the gateway's CA fails its handshake.
    let r = curl(&w, &w.origin_ca.ca_pem_path, &[], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 0, "{}", r.body);

    let access = w.gw.wait_for_access(1, |l| l["kind"] == "inspect" && l["reason"] == "request_not_allowed");
    assert!(access.iter().any(|l| l["rule"].as_str().is_some_and(|r| r.contains("admin"))), "{access:?}");
}

/// `proxy.max_header_bytes` holds inside an inspected connection, over HTTP/1.1 and
/// HTTP/2, with the reason (hyper's own limits there had been its defaults).
#[test]
fn inspected_heads_over_the_limits_are_refused_with_the_reason() {
    let w = world();
    let url = format!("https://inspect.test:{}/echo", w.origin.port());
    let big = format!("X-Big: {}", "a".repeat(40 * 1024));
    for version in ["--http1.1", "--http2"] {
        let r = curl(&w, &w.gw_ca, &[version, "-H", &big], &url);
        assert_eq!(r.status, 431, "{version}: {}", r.body);
        assert!(r.headers.contains("x-egress-deny-reason: request_too_large"), "{}", r.headers);
        assert!(r.body.contains("(proxy.max_header_bytes)"), "{}", r.body);
        assert_eq!(r.headers.contains("connection: close"), version == "--http1.1", "{}", r.headers);
    }
    assert!(w.origin.recorded().is_empty(), "{:?}", w.origin.recorded());
    let r = curl(&w, &w.gw_ca, &["-H", &big[..20 * 1024]], &url);
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn sandboxes_never_share_an_upstream_connection() {
    // Requests on separate client connections reuse their sandbox's pooled upstream
    // connection, and never another sandbox's, even one under the same policy: what one
    // sandbox's exchange leaves on a connection (a late or misframed response) must not
    // answer another's request.
    let w = world();
    let url = |path: &str| format!("https://inspect.test:{}{path}", w.origin.port());
    let turns = [("sbx-a", TOKEN_A, "/echo"), ("sbx-a", TOKEN_A, "/echo"), ("sbx-a2", TOKEN_A2, "/echo")];
    for (i, (sandbox, token, path)) in turns.into_iter().chain([("sbx-a", TOKEN_A, "/echo")]).enumerate() {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert", w.gw_ca.to_str().unwrap()])
            .args(["-x", &w.gw.proxy_url(sandbox, token), "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(url(path))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "turn {i}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let peers: Vec<_> = w.origin.recorded().iter().map(|r| r.peer).collect();
    assert_eq!(peers.len(), 4, "{peers:?}");
    assert_eq!(peers[0], peers[1], "a sandbox reuses its own pooled connection: {peers:?}");
    assert_ne!(peers[2], peers[0], "sbx-a2 got sbx-a's connection: {peers:?}");
    assert_eq!(peers[3], peers[0], "sbx-a's connection stayed its own: {peers:?}");

    // After a request with a body the connection is not used again: an upstream that
    // ignored the body would read it as the start of the next request.
    for extra in [&["-d", "a=1"][..], &[]] {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert", w.gw_ca.to_str().unwrap()])
            .args(["-x", &w.gw.proxy_url("sbx-a", TOKEN_A), "-o", "/dev/null", "-w", "%{http_code}"])
            .args(extra)
            .arg(url("/echo"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{}", String::from_utf8_lossy(&out.stderr));
    }
    let recorded = w.origin.recorded();
    let (post, get) = (&recorded[4], &recorded[5]);
    assert_eq!((post.method.as_str(), post.peer), ("POST", peers[0]), "a POST takes the kept connection");
    assert_ne!(get.peer, post.peer, "the connection that carried a body was used again");

    // A reload (which may move a peer, or give a sandbox id to someone else) drops
    // every pooled connection.
    w.gw.signal("HUP");
    w.gw.wait_for_log(std::time::Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert", w.gw_ca.to_str().unwrap()])
        .args(["-x", &w.gw.proxy_url("sbx-a", TOKEN_A), "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(url("/echo"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let after = w.origin.recorded().last().unwrap().peer;
    assert_ne!(after, peers[0], "a pooled connection outlived the reload");
}

#[test]
fn sandboxes_never_resume_each_others_tls_sessions() {
    // Each request closes its upstream connection (`/close`), so each takes a new one.
    // A sandbox resumes its own TLS session; another sandbox, even under the same
    // policy, starts afresh: a shared session would let the upstream link the two.
    let w = world();
    let url = format!("https://evil.test:{}/close", w.origin.port());
    for (i, (sandbox, token)) in [("sbx-a", TOKEN_A), ("sbx-a", TOKEN_A), ("sbx-a2", TOKEN_A2)].into_iter().enumerate()
    {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert", w.gw_ca.to_str().unwrap()])
            .args(["-x", &w.gw.proxy_url(sandbox, token), "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(&url)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "turn {i}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let seen: Vec<_> = w.origin.recorded().iter().map(|r| (r.peer, r.resumed)).collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen[0].0 != seen[1].0 && seen[1].0 != seen[2].0, "each request had its own connection: {seen:?}");
    assert_eq!(seen[0].1, Some(false), "{seen:?}");
    assert_eq!(seen[1].1, Some(true), "sbx-a resumes its own session: {seen:?}");
    assert_eq!(seen[2].1, Some(false), "sbx-a2 resumed sbx-a's session: {seen:?}");
}

#[test]
fn placeholders_are_swapped_on_their_host_and_refused_elsewhere() {
    let w = world();
    let url = |host: &str, path: &str| format!("https://{host}:{}{path}", w.origin.port());
    let auth = "Authorization: Bearer EGRESS_SECRET_openai";

    let r = curl(&w, &w.gw_ca, &["-H", auth, "--data", "key=EGRESS_SECRET_openai"], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = w.origin.recorded().pop().unwrap();
    let got = seen.headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone());
    assert_eq!(got.as_deref(), Some(format!("Bearer {SECRET}").as_str()), "the origin gets the real value");
    assert!(!r.body.contains(SECRET), "the value is redacted from what the sandbox reads: {}", r.body);
    assert!(r.body.contains("Bearer [REDACTED]"), "{}", r.body);
    // The body's placeholder was replaced (the length grew by the difference).
    let expected_len = format!("key={SECRET}").len();
    assert!(r.body.contains(&format!("\"body_len\":{expected_len}")), "{}", r.body);

    // Inside Basic credentials, as `curl -u` sends them: encoded again, and the
    // echoed header redacted.
    let r = curl(&w, &w.gw_ca, &["-u", "user:EGRESS_SECRET_openai"], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = w.origin.recorded().pop().unwrap();
    let got = seen.headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone());
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{SECRET}"));
    assert_eq!(got, Some(format!("Basic {basic}")));
    assert!(!r.body.contains(&basic) && r.body.contains("Basic [REDACTED]"), "{}", r.body);

    // Not inside a body under a content coding: what the gateway reads there is not
    // what the upstream decodes.
    let encoded =
        ["-H", "content-encoding: br", "-H", "content-type: text/plain", "--data", "key=EGRESS_SECRET_openai"];
    let r = curl(&w, &w.gw_ca, &encoded, &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains(&format!("\"body_len\":{}", "key=EGRESS_SECRET_openai".len())), "{}", r.body);

    // In a body, a placeholder inside an unfinished JSON escape is refused: the
    // upstream would read `\u` and the value's first four characters as one.
    // (The body streams: the head may have gone, the body stops before the value.)
    let r = curl(&w, &w.gw_ca, &["--data", r#"{"v":"\uEGRESS_SECRET_openai"}"#], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: secret_not_allowed"), "{}", r.headers);
    assert!(r.body.contains("EGRESS_SECRET_openai in the body follows an unfinished escape"), "{}", r.body);
    // Nor where the upstream could read the value in another charset: its bytes would
    // come back as other characters, past the redactor. Declared in the head, in a
    // multipart part, or sniffed from UTF-16 JSON padded past the escape check.
    let mut utf16: Vec<u8> = r#"{"v":""#.encode_utf16().flat_map(u16::to_le_bytes).collect();
    utf16.extend(b"++++++++++++EGRESS_SECRET_openai");
    let utf16_file = w._dir.path().join("utf16.json");
    std::fs::write(&utf16_file, &utf16).unwrap();
    let utf16_arg = format!("@{}", utf16_file.display());
    let part = "--b\r\nContent-Disposition: form-data; name=k\r\nContent-Type: text/plain; charset=utf-16le\r\n\r\nEGRESS_SECRET_openai\r\n--b--\r\n";
    for args in [
        &["-H", "Content-Type: text/plain; charset=utf-16le", "--data-binary", "EGRESS_SECRET_openai"][..],
        &["-H", "Content-Type: application/json", "--data-binary", &utf16_arg],
        &["-H", "Content-Type: multipart/form-data; boundary=b", "--data-binary", part],
    ] {
        let r = curl(&w, &w.gw_ca, args, &url("inspect.test", "/echo"));
        assert_eq!(r.status, 403, "{args:?}: {}", r.body);
        assert!(r.body.contains("charset other than UTF-8"), "{args:?}: {}", r.body);
    }
    // The word in prose declares nothing.
    let prose = r#"{"q":"Which charset does this page use?","key":"EGRESS_SECRET_openai"}"#;
    let r = curl(&w, &w.gw_ca, &["--data-binary", prose], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    // A multipart part in base64 would be decoded upstream into other bytes.
    let b64_part = "--b\r\nContent-Disposition: form-data; name=k\r\nContent-Transfer-Encoding: base64\r\n\r\nEGRESS_SECRET_openai\r\n--b--\r\n";
    let args = ["-H", "Content-Type: multipart/form-data; boundary=b", "--data-binary", b64_part];
    let r = curl(&w, &w.gw_ca, &args, &url("inspect.test", "/echo"));
    assert_eq!(r.status, 403, "{}", r.body);
    // UTF-8, declared or not, is the value's own bytes.
    let r = curl(
        &w,
        &w.gw_ca,
        &["-H", "Content-Type: text/plain; charset=UTF-8", "--data-binary", "EGRESS_SECRET_openai"],
        &url("inspect.test", "/echo"),
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // In the query (query = true), swapped escaped; an upstream echoing its URL echoes
    // the escaped value, which is redacted too.
    let r = curl(&w, &w.gw_ca, &[], &url("inspect.test", "/echo?key=EGRESS_SECRET_openai"));
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = w.origin.recorded().pop().unwrap();
    assert_eq!(seen.uri, "/echo?key=sk-real%2Bvalue%2F7d1e0c");
    assert!(!r.body.contains("%2Bvalue") && r.body.contains("[REDACTED]"), "{}", r.body);

    // A placeholder glued to a % escape would be altered by an upstream that decodes.
    let r = curl(&w, &w.gw_ca, &[], &url("inspect.test", "/echo?key=%4EGRESS_SECRET_openai"));
    assert_eq!(r.status, 403, "{}", r.body);
    // A value stored by one request comes back redacted in another's response, which
    // carried no placeholder.
    let r = curl(&w, &w.gw_ca, &["-H", &format!("x-echo: {SECRET}")], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(SECRET), "{}", r.body);
    // Whoever asks: a value only policy b may lend is redacted from sbx-a's answers too.
    let r = curl(&w, &w.gw_ca, &["-H", &format!("x-echo: {B_ONLY}")], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(B_ONLY) && r.body.contains("[REDACTED]"), "{}", r.body);
    // Or in base64 after a prefix, as Basic credentials carry it.
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{SECRET}"));
    let r = curl(&w, &w.gw_ca, &["-H", &format!("x-echo: Basic {basic}")], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(&basic[8..24]) && r.body.contains("[REDACTED]"), "{}", r.body);
    // So does one an upstream re-cased or escaped.
    let shout = SECRET.to_ascii_uppercase();
    let r = curl(&w, &w.gw_ca, &["-H", &format!("x-echo: {shout}")], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(&shout) && r.body.contains("[REDACTED]"), "{}", r.body);
    // A GET with a body is not sent on.
    let r = curl(&w, &w.gw_ca, &["-X", "GET", "--data", "x"], &url("inspect.test", "/echo"));
    assert_eq!(r.status, 400, "{}", r.body);
    // Nor is a body under a transfer coding the gateway's own framing would hide.
    let gzip = ["--http1.1", "-H", "Transfer-Encoding: gzip, chunked", "--data", "x"];
    let r = curl(&w, &w.gw_ca, &gzip, &url("inspect.test", "/echo"));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("Transfer-Encoding other than chunked"), "{}", r.body);

    // Never on an upgraded connection, whose bytes are not redacted.
    let ws = ["-H", auth, "-H", "Upgrade: websocket", "-H", "Connection: Upgrade", "--http1.1"];
    let r = curl(&w, &w.gw_ca, &ws, &url("inspect.test", "/ws"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: secret_not_allowed"), "{}", r.headers);
    // Nor on a host with values bound to it, placeholder or not: a value stored
    // upstream could come back in the stream.
    let r = curl(&w, &w.gw_ca, &ws[2..], &url("inspect.test", "/ws"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: secret_not_allowed"), "{}", r.headers);

    // Never over plain HTTP, where the value would travel in clear.
    let r = curl(&w, &w.gw_ca, &["-H", auth], &format!("http://inspect.test:{}/echo", w.origin.port()));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: secret_not_allowed"), "{}", r.headers);

    // The same placeholder to another (allowed, inspected) host is refused and logged.
    let before = w.origin.recorded().len();
    let r = curl(&w, &w.gw_ca, &["-H", auth], &url("evil.test", "/echo"));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: secret_not_allowed"), "{}", r.headers);
    assert_eq!(w.origin.recorded().len(), before);
    w.gw.wait_for_log(std::time::Duration::from_secs(5), |l| {
        l["msg"].as_str().is_some_and(|m| m.contains("placeholder was sent to a host it is not bound to"))
    });
    // And evil.test without a placeholder is fine.
    assert_eq!(curl(&w, &w.gw_ca, &[], &url("evil.test", "/echo")).status, 200);
    assert!(!w.gw.log_text().contains(SECRET), "the value is never logged");
}

#[test]
fn plain_http_to_an_inspected_host_sends_on_only_what_was_judged() {
    let w = world();
    // A host with secrets bound is reached over HTTPS only: a value stored upstream
    // would come back unredacted in a plain HTTP answer.
    let r = curl(&w, &w.gw_ca, &[], &format!("http://inspect.test:{}/echo", w.origin.port()));
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("reached over HTTPS only"), "{}", r.body);
    // Another inspected host (no secrets bound) is judged request by request.
    let url = format!("http://evil.test:{}/echo", w.origin.port());
    // A GET the rules allow, carrying a second request as its body: an upstream that
    // ignores a GET's body would read it as a request no rule judged.
    let smuggled = "GET /echo/admin/users HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    let r = curl(&w, &w.gw_ca, &["-X", "GET", "--data-binary", smuggled], &url);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: bad_request"), "{}", r.headers);
    assert!(r.body.contains("GET or HEAD request with a body"), "{}", r.body);
    // A method or URL override would have the upstream run what no rule judged.
    for field in ["X-HTTP-Method-Override: DELETE", "x_original_url: /echo/admin/users"] {
        let r = curl(&w, &w.gw_ca, &["-H", field], &url);
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        assert!(r.body.contains("override field"), "{}", r.body);
    }
    // An upgrade to h2c would be a pipe no rule judges.
    let h2c = [
        "-H",
        "Connection: Upgrade, HTTP2-Settings",
        "-H",
        "Upgrade: h2c",
        "-H",
        "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
    ];
    let r = curl(&w, &w.gw_ca, &h2c, &url);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("only WebSocket upgrades"), "{}", r.body);
    assert!(w.origin.recorded().is_empty(), "neither reached the origin");
    // A form that names another method is judged as that method too, over plain HTTP
    // as inside TLS.
    let form = format!("http://evil.test:{}/echo/form", w.origin.port());
    let r = curl(&w, &w.gw_ca, &["--data", "a=1&_method=DELETE"], &form);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: request_not_allowed"), "{}", r.headers);
    assert!(r.body.contains("_method=DELETE asks the upstream"), "{}", r.body);
    // The same method goes on (to an origin that speaks only TLS, whose answer is no
    // HTTP: hence the 502).
    let r = curl(&w, &w.gw_ca, &["--data", "a=1&_method=POST"], &form);
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: upstream_invalid"), "{}", r.headers);
    // A form the watch cannot read is refused before any dial: with nothing listening
    // there, the answer is still the refusal, not `502`.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://evil.test:{}/echo/form", closed.local_addr().unwrap().port());
    drop(closed);
    let two_types = ["-H", "Content-Type: text/plain", "-H", "Content-Type: application/x-www-form-urlencoded"];
    let r = curl(&w, &w.gw_ca, &[&two_types[..], &["--data", "a=1"]].concat(), &nowhere);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.headers.contains("x-egress-deny-reason: request_not_allowed"), "{}", r.headers);

    // On one client connection, a plain-HTTP upstream connection that carried a body
    // is not used again: an upstream that ignored the body would read it as the start
    // of the next request, which no rule judged.
    let plain = TestOrigin::http();
    let at = |path: &str| format!("http://evil.test:{}{path}", plain.port());
    let proxy = w.gw.proxy_url("sbx-a", TOKEN_A);
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{num_connects}\n", "-x", &proxy, &at("/echo")])
        .args(["--next", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n", "-x", &proxy, "-d", "a=1"])
        .arg(at("/echo/form"))
        .args(["--next", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n", "-x", &proxy, &at("/echo")])
        .output()
        .unwrap();
    let codes = String::from_utf8_lossy(&out.stdout);
    assert_eq!(codes, "200 1\n200 0\n200 0\n", "one client connection: {}", String::from_utf8_lossy(&out.stderr));
    let peers: Vec<_> = plain.recorded().iter().map(|r| (r.method.clone(), r.peer)).collect();
    assert_eq!(peers.len(), 3, "{peers:?}");
    assert_eq!(peers[0].1, peers[1].1, "the POST takes the kept connection: {peers:?}");
    assert_ne!(peers[2].1, peers[1].1, "the connection that carried a body was used again: {peers:?}");
}

#[test]
fn pinned_hosts_in_never_stay_opaque_tunnels() {
    let w = world();
    // The origin's own certificate reaches the client: it trusts only the origin's CA.
    let r = curl(&w, &w.origin_ca.ca_pem_path, &[], &format!("https://pinned.test:{}/anything", w.origin.port()));
    assert_eq!(r.status, 200, "{}", r.body);
    // Tunnelled, not inspected: no request rule applied (/anything is in none).
    let access = w.gw.wait_for_access(1, |l| l["kind"] == "connect");
    assert!(access.iter().all(|l| l["decision"] == "allow"), "{access:?}");
    // A host only inspect lists, which intercept.never keeps a tunnel, is refused: an
    // opaque tunnel would skip every request rule.
    let r = curl(&w, &w.origin_ca.ca_pem_path, &[], &format!("https://neveronly.test:{}/x", w.origin.port()));
    assert_eq!(r.status, 0, "{}", r.body);
    assert!(r.body.contains("403") || r.headers.contains("403"), "{} {}", r.headers, r.body);
    // A host that is only allowed is a tunnel too.
    let r = curl(&w, &w.origin_ca.ca_pem_path, &[], &format!("https://plain.test:{}/x", w.origin.port()));
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Runs a Python script with the gateway's address, the origin's port, the gateway's
/// CA and sbx-a's token as its arguments; it must succeed. Its standard output.
fn python_through(w: &World, script: &str) -> String {
    let out = Command::new("python3")
        .args(["-c", script, &w.gw.addr.to_string(), &w.origin.port().to_string(), w.gw_ca.to_str().unwrap(), TOKEN_A])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn websocket_upgrades_through_an_inspected_host() {
    let w = world();
    let script = r#"
import socket, ssl, sys, base64
gw, port, ca, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
host, p = gw.rsplit(":", 1)
s = socket.create_connection((host, int(p)), timeout=10)
auth = base64.b64encode(("sbx-a:" + token).encode()).decode()
s.sendall(f"CONNECT evil.test:{port} HTTP/1.1\r\nHost: evil.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["http/1.1"])
t = ctx.wrap_socket(s, server_hostname="evil.test")
t.sendall(f"GET /ws HTTP/1.1\r\nHost: evil.test:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += t.recv(1)
assert head.startswith(b"HTTP/1.1 101"), head
t.sendall(b"ping-through-inspection")
got = b""
while len(got) < 23:
    got += t.recv(64)
print(got.decode())
"#;
    assert_eq!(python_through(&w, script).trim(), "ping-through-inspection");
}

#[test]
fn websockets_inside_inspected_connections_count_for_their_sandbox() {
    // Two connections per sandbox. A WebSocket upgraded inside an inspected connection
    // outlives that connection's own handling and must go on holding its place: with
    // two open, a third CONNECT is refused.
    let w = world_with("sandbox_max_connections = 2");
    let script = r#"
import socket, ssl, sys, base64, time
gw, port, ca, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
host, p = gw.rsplit(":", 1)
auth = base64.b64encode(("sbx-a:" + token).encode()).decode()

def head_of(s):
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            break
        head += c
    return head

def connect():
    s = socket.create_connection((host, int(p)), timeout=10)
    s.sendall(f"CONNECT evil.test:{port} HTTP/1.1\r\nHost: evil.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
    return s, head_of(s)

open_ws = []
for i in range(2):
    s, head = connect()
    assert head.startswith(b"HTTP/1.1 200"), head
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    t = ctx.wrap_socket(s, server_hostname="evil.test")
    t.sendall(f"GET /ws HTTP/1.1\r\nHost: evil.test:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".encode())
    head = head_of(t)
    assert head.startswith(b"HTTP/1.1 101"), head
    t.sendall(b"ping")
    got = b""
    while len(got) < 4:
        got += t.recv(64)
    open_ws.append(t)
# The inspected connections' own handling has ended by now; only the WebSockets hold.
time.sleep(0.5)
s, head = connect()
print(head.split(b"\r\n")[0].decode())
for t in open_ws:
    t.sendall(b"pong")
    got = b""
    while len(got) < 4:
        got += t.recv(64)
print("still open")
"#;
    let stdout = python_through(&w, script);
    assert!(stdout.starts_with("HTTP/1.1 429"), "a third connection while two WebSockets are open: {stdout}");
    assert!(stdout.contains("still open"), "{stdout}");
}

#[test]
fn python_requests_and_node_trust_the_bundle_and_read_the_refusal() {
    let w = world();
    let bundle = w._dir.path().join("bundle.pem");
    let out = Command::new(bin())
        .args(["ca", "bundle", "--ca", w.gw_ca.to_str().unwrap(), "--out", bundle.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let env = Command::new(bin()).args(["ca", "env", "--bundle", bundle.to_str().unwrap()]).output().unwrap();
    let env = String::from_utf8_lossy(&env.stdout).into_owned();
    for var in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CARGO_HTTP_CAINFO"] {
        assert!(env.contains(&format!("export {var}=")), "{env}");
    }
    let proxy = w.gw.proxy_url("sbx-a", TOKEN_A);
    let base = format!("https://inspect.test:{}", w.origin.port());

    let py = r#"
import os, sys, requests
base = sys.argv[1]
ok = requests.get(base + "/echo")
no = requests.delete(base + "/echo")
print(ok.status_code, no.status_code, no.headers.get("X-Egress-Deny-Reason"), no.json()["reason"])
"#;
    let out = Command::new("python3")
        .args(["-c", py, &base])
        .env("HTTPS_PROXY", &proxy)
        .env("REQUESTS_CA_BUNDLE", &bundle)
        .env_remove("NO_PROXY")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "200 403 request_not_allowed request_not_allowed");

    // Node: undici's ProxyAgent, trusting the bundle through NODE_EXTRA_CA_CERTS.
    let clients = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients");
    if !clients.join("node_modules/undici").exists() {
        panic!("tests/clients/node_modules is missing: run (cd tests/clients && npm install)");
    }
    let js = r#"
const { ProxyAgent, fetch } = require('undici');
const [base, proxy] = process.argv.slice(1);
(async () => {
  const dispatcher = new ProxyAgent(proxy);
  const ok = await fetch(base + '/echo', { dispatcher });
  const no = await fetch(base + '/echo', { method: 'PUT', dispatcher });
  console.log(ok.status, no.status, no.headers.get('x-egress-deny-reason'));
})().catch((e) => { console.error(e); process.exit(1); });
"#;
    let out = Command::new("node")
        .args(["-e", js, &base, &proxy])
        .current_dir(&clients)
        .env("NODE_EXTRA_CA_CERTS", &bundle)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "200 403 request_not_allowed");
}

#[test]
fn check_explains_request_rules_with_file_and_line() {
    let w = world();
    let run = |args: &[&str]| -> Output {
        Command::new(bin())
            .args(["check", "--config", w.gw.config_path().to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    let url = format!("https://inspect.test:{}/echo/admin/x", w.origin.port());
    let out = run(&["--sandbox", "sbx-a", &url]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("request_not_allowed") && text.contains("test.toml:"), "{text}");
    let ok_url = format!("https://inspect.test:{}/echo", w.origin.port());
    let out = run(&["--sandbox", "sbx-a", "--method", "post", &ok_url]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("EGRESS_SECRET_openai"), "check names the placeholder bound to the host: {text}");
    let out = run(&["--sandbox", "sbx-a", "--method", "DELETE", &ok_url]);
    assert_eq!(out.status.code(), Some(1));

    // policy test: table-driven cases with methods on an inspected host.
    let cases = w._dir.path().join("cases.toml");
    std::fs::write(
        &cases,
        format!(
            "[[case]]\nsandbox = \"sbx-a\"\ntarget = \"{ok_url}\"\nmethod = \"POST\"\nexpect = \"allow\"\n\
             [[case]]\nsandbox = \"sbx-a\"\ntarget = \"{ok_url}\"\nmethod = \"DELETE\"\nexpect = \"deny\"\n\
             reason = \"request_not_allowed\"\n"
        ),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["policy", "test", "--config", w.gw.config_path().to_str().unwrap(), cases.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn config_errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let policy_dir = dir.path().join("policy");
    std::fs::create_dir(&policy_dir).unwrap();
    std::fs::write(policy_dir.join("p.toml"), "[policies.x]\ninspect = [\"a.test\"]\n").unwrap();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(&cfg, "[policy]\ndir = \"policy\"\n").unwrap();
    let out = Command::new(bin()).args(["config", "validate", "--config", cfg.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("p.toml") && err.contains("policies.x.inspect[0]") && err.contains("[intercept]"), "{err}");

    let (cert, key) = make_ca(dir.path());
    let rules = "[policies.x]\ninspect = [\"a.test\"]\n[[policies.x.requests]]\nhost = \"a.test\"\nmethods = [\"G T\"]\naction = \"allow\"\n";
    std::fs::write(policy_dir.join("p.toml"), rules).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[policy]\ndir = \"policy\"\n[intercept]\nca_cert_file = \"{}\"\nca_key_file = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let out = Command::new(bin()).args(["config", "validate", "--config", cfg.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("policies.x.requests[0].methods (line 3)"), "{err}");
}

fn git(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .envs(envs.iter().copied())
        .output()
        .expect("run git")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "git failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn git_clone_of_a_plain_github_url_takes_the_git_route() {
    let root = tempfile::tempdir().unwrap();
    for (owner, name) in [("acme", "widgets"), ("other", "secret")] {
        let bare = root.path().join(owner).join(format!("{name}.git"));
        std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
        ok(git(root.path(), &["init", "--bare", bare.to_str().unwrap()], &[]));
        ok(git(&bare, &["config", "http.receivepack", "true"], &[]));
        let work = root.path().join(format!("seed-{name}"));
        std::fs::create_dir(&work).unwrap();
        ok(git(&work, &["init"], &[]));
        std::fs::write(work.join("README"), format!("{name}\n")).unwrap();
        ok(git(&work, &["add", "README"], &[]));
        ok(git(&work, &["commit", "-m", "seed"], &[]));
        ok(git(&work, &["push", bare.to_str().unwrap(), "HEAD:refs/heads/main"], &[]));
        ok(git(&bare, &["symbolic-ref", "HEAD", "refs/heads/main"], &[]));
    }
    let origin_ca = TestCa::new(&["github.test"]);
    let github = TestOrigin::git_https(&origin_ca, root.path().to_path_buf());
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_ca(dir.path());
    let token = dir.path().join("acme.token");
    std::fs::write(&token, "ghs_static_test_token\n").unwrap();
    let config = format!(
        r#"
[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
[resolver.hosts]
"github.test" = ["127.0.0.1"]

[egress]
allow = ["127.0.0.1/32"]

[github]
web_url = "https://github.test:{web}"
api_url = "https://api.github.test:9"
ca_file = "{ca}"
[github.token_files]
acme = "{token}"

[intercept]
ca_cert_file = "{cert}"
ca_key_file = "{key}"
"#,
        web = github.port(),
        ca = origin_ca.ca_pem_path.display(),
        token = token.display(),
        cert = cert.display(),
        key = key.display(),
    );
    let policy = format!(
        r#"
[policies.agents]
inspect = ["github.test"]
git = {{ repos = ["acme/widgets"], push = ["refs/heads/agent/*"] }}

[[sandboxes]]
id = "sbx-a"
token_sha256 = "{a}"
policy = "agents"
"#,
        a = sha256_hex(TOKEN_A)
    );
    let gw = TestGateway::start(&config, &policy);
    let proxy = gw.proxy_url("sbx-a", TOKEN_A);
    let ca = cert.to_str().unwrap();
    let envs = [("HTTPS_PROXY", proxy.as_str()), ("GIT_SSL_CAINFO", ca)];
    let work = tempfile::tempdir().unwrap();

    // The URL as an agent writes it: no insteadOf, no token of its own.
    ok(git(work.path(), &["clone", "https://github.test/acme/widgets.git", "w"], &envs));
    assert_eq!(std::fs::read_to_string(work.path().join("w/README")).unwrap(), "widgets\n");
    let auth: Vec<String> = github
        .recorded()
        .iter()
        .filter_map(|r| r.headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone()))
        .collect();
    assert!(
        !auth.is_empty() && auth.iter().all(|a| a.starts_with("Basic ")),
        "the gateway's token is injected: {auth:?}"
    );

    // A repository the policy does not connect: refused in git's own terms.
    let out = git(work.path(), &["clone", "https://github.test/other/secret.git", "s"], &envs);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("repo_not_connected"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A push to a ref outside git.push: the report-status names it.
    let clone = work.path().join("w");
    std::fs::write(clone.join("NEW"), "x\n").unwrap();
    ok(git(&clone, &["add", "NEW"], &[]));
    ok(git(&clone, &["commit", "-m", "x"], &[]));
    let out = git(&clone, &["push", "origin", "HEAD:refs/heads/main"], &envs);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("git_ref_denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(git(&clone, &["push", "origin", "HEAD:refs/heads/agent/x"], &envs));
    let refs = ok(git(&root.path().join("acme/widgets.git"), &["for-each-ref", "--format=%(refname)"], &[]));
    assert!(refs.contains("refs/heads/agent/x") && !refs.contains("refs/heads/main\nrefs/heads/main"), "{refs}");
    assert!(!gw.log_text().contains("ghs_static_test_token"));
}

#[test]
fn lint_suggest_and_replay_understand_request_rules() {
    let w = world();
    let cfg = w.gw.config_path();
    let cli = |args: &[&str]| -> (Option<i32>, String) {
        let out = Command::new(bin()).args(args).output().unwrap();
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    // Policy b inspects inspect.test without a request rule; policy a's rule for
    // evil.test is applied, pinned.test is overridden by intercept.never.
    let (_, lint) = cli(&["policy", "lint", "--config", cfg.to_str().unwrap()]);
    assert!(lint.contains("no request rule allows anything on it"), "{lint}");
    assert!(lint.contains("intercept.never lists this host"), "{lint}");
    assert!(!lint.contains("is not in policies.a.inspect"), "{lint}");
    assert!(!lint.contains("uninspected"), "every policy inspects the host secrets are bound to: {lint}");
    // A policy that tunnels to that host uninspected: a value stored there comes back
    // unredacted through the tunnel.
    let extra = cfg.parent().unwrap().join("policy/tunnel.toml");
    std::fs::write(&extra, "[policies.c]\nallow = [\"inspect.test\"]\n").unwrap();
    let (_, lint) = cli(&["policy", "lint", "--config", cfg.to_str().unwrap()]);
    std::fs::remove_file(&extra).unwrap();
    assert!(
        lint.contains("policies.c.allow \"inspect.test\": tunnels to inspect.test uninspected, where secrets name=\"openai\" is bound"),
        "{lint}"
    );

    let url = format!("https://inspect.test:{}/other/path?secret=1", w.origin.port());
    assert_eq!(curl(&w, &w.gw_ca, &[], &url).status, 403);
    w.gw.wait_for_access(1, |l| l["kind"] == "inspect" && l["reason"] == "request_not_allowed");
    let log = w._dir.path().join("access.jsonl");
    std::fs::write(&log, w.gw.log_text()).unwrap();
    let (code, text) = cli(&["policy", "suggest", "--log", log.to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("[[policies.a.requests]]") && text.contains("paths = [\"/other/path\"]"), "{text}");
    assert!(!text.contains("secret=1"), "the query is never logged, so never suggested: {text}");
    let (code, text) = cli(&["policy", "replay", "--log", log.to_str().unwrap(), "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("0 records"), "{text}");
}

#[test]
fn github_api_writes_are_judged_by_git_rules_and_keep_their_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_ca(dir.path());
    let origin_ca = TestCa::new(&["api.test"]);
    let origin = TestOrigin::https(&origin_ca);
    let config = format!(
        r#"
[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
[resolver.hosts]
"api.test" = ["127.0.0.1"]
[egress]
allow = ["127.0.0.1/32"]
[github]
api_url = "https://api.test:{port}/api/v3"
[intercept]
ca_cert_file = "{cert}"
ca_key_file = "{key}"
upstream_ca_file = "{ca}"
"#,
        port = origin.port(),
        cert = cert.display(),
        key = key.display(),
        ca = origin_ca.ca_pem_path.display(),
    );
    let policy = format!(
        r#"
[policies.a]
mode = "report"
inspect = ["api.test:*"]
git = {{ repos = ["acme/widgets"], push = ["refs/heads/agent/*"] }}
[[policies.a.requests]]
host = "api.test"
action = "allow"
[[sandboxes]]
id = "sbx-a"
token_sha256 = "{a}"
policy = "a"
"#,
        a = sha256_hex(TOKEN_A)
    );
    let gw = TestGateway::start(&config, &policy);
    let w = World { gw, origin, gw_ca: cert, origin_ca, _dir: dir };
    let url = |path: &str| format!("https://api.test:{}{path}", w.origin.port());
    let cases: &[(&str, &str, &str, u16, &str)] = &[
        // A write whose ref is not in its body: the body goes on intact.
        ("POST", "/api/v3/repos/acme/widgets/git/blobs", r#"{"content":"x"}"#, 200, "\"body_len\":15"),
        ("PUT", "/api/v3/repos/acme/widgets/contents/a.txt", r#"{"branch":"agent/x"}"#, 200, "\"body_len\":20"),
        ("PUT", "/api/v3/repos/acme/widgets/contents/a.txt", r#"{"branch":"main"}"#, 403, "git_ref_denied"),
        ("PUT", "/api/v3/repos/acme/widgets/contents/a.txt", r#"{"message":"default branch"}"#, 403, "git_ref_denied"),
        ("DELETE", "/api/v3/repos/acme/widgets/git/refs/heads/main", "", 403, "git_ref_denied"),
        ("DELETE", "/api/v3/repos/acme/widgets/git/ref%73/heads/main", "", 403, "git_ref_denied"),
        ("delete", "/api/v3/repos/acme/widgets/git/refs/heads/main", "", 403, "git_ref_denied"),
        (
            "POST",
            "/api/v3/repos/acme/widgets/Git/Refs/",
            r#"{"ref":"refs/heads/main","sha":"x"}"#,
            403,
            "git_ref_denied",
        ),
        (
            "POST",
            "/api/v3/repos/acme/widgets/git/refs",
            r#"{"ref":"refs/heads/agent/y","sha":"x"}"#,
            200,
            "\"method\":\"POST\"",
        ),
        ("POST", "/api/v3/repos/other/secret/git/blobs", r#"{"content":"x"}"#, 403, "repo_not_connected"),
        ("PUT", "/api/v3/repos/acme/widgets/pulls/3/merge", r#"{}"#, 403, "git_ref_denied"),
        ("POST", "/api/v3/repositories/42/git/refs", r#"{"ref":"refs/heads/agent/z"}"#, 403, "git_write_denied"),
        (
            "POST",
            "/api/graphql",
            r#"{"query":"mutation { createCommitOnBranch(input: {}) { x } }"}"#,
            403,
            "git_write_denied",
        ),
        ("POST", "/api/graphql", r#"{"query":"query { viewer { login } }"}"#, 200, "\"method\":\"POST\""),
        // JSON escapes spell the same mutation to GitHub; a body that is not JSON is not judged.
        (
            "POST",
            "/api/graphql",
            r#"{"query":"mutation { \u0063reateRef(input: {}) { x } }"}"#,
            403,
            "git_write_denied",
        ),
        ("POST", "/api/graphql", "query { viewer { login } }", 400, "bad_request"),
        // A mutation sent in the URL is judged as one in a body is.
        (
            "GET",
            "/api/graphql?query=mutation+%7B+c%72eateRef(input%3A%7B%7D)+%7B+x+%7D+%7D",
            "",
            403,
            "git_write_denied",
        ),
        ("GET", "/api/graphql?query=%7B+viewer+%7B+login+%7D+%7D", "", 200, "\"method\":\"GET\""),
        // A ref named in the query is judged too (Rails merges it with the body's);
        // the singular git/ref path is judged as the plural.
        (
            "PUT",
            "/api/v3/repos/acme/widgets/contents/a.txt?branch=main",
            r#"{"branch":"agent/x"}"#,
            403,
            "git_ref_denied",
        ),
        ("DELETE", "/api/v3/repos/acme/widgets/git/ref/heads/main", "", 403, "git_ref_denied"),
        // A body that names its ref must parse: a lone surrogate would hide the tag.
        ("PATCH", "/api/v3/repos/acme/widgets/releases/1", r#"{"tag_name":"v9","x":"\ud800"}"#, 400, "bad_request"),
        ("POST", "/api/v3/repos/acme/widgets/git/refs", "/**/{\"ref\":\"refs/heads/main\"}", 400, "bad_request"),
        // A release creates its tag; keys and collaborators grant write access.
        ("POST", "/api/v3/repos/acme/widgets/releases", r#"{"tag_name":"v9"}"#, 403, "git_ref_denied"),
        (
            "POST",
            "/api/v3/repos/other/secret/keys",
            r#"{"key":"ssh-ed25519 x","read_only":false}"#,
            403,
            "git_write_denied",
        ),
        ("PUT", "/api/v3/repos/acme/widgets/collaborators/evil", "", 403, "git_write_denied"),
        ("PUT", "/api/v3/orgs/acme/teams/agents/repos/acme/widgets", "", 403, "git_write_denied"),
        // GitHub reads `heads%2Fmain` as `heads/main`: a write the git rules cannot
        // judge is refused, in report mode too.
        ("PATCH", "/api/v3/repos/acme/widgets/git/refs/heads%2Fmain", r#"{"sha":"x"}"#, 400, "bad_request"),
        ("POST", "/api/v3/repos/other/secret/dispatches", r#"{"event_type":"x"}"#, 403, "repo_not_connected"),
        ("POST", "/api/v3/repos/acme/widgets/dispatches", r#"{"event_type":"x"}"#, 200, "\"method\":\"POST\""),
        ("GET", "/api/v3/repos/other/secret/git/refs", "", 200, "\"method\":\"GET\""),
    ];
    for (method, path, body, status, needle) in cases {
        let mut args = vec!["-X", method, "--path-as-is"];
        if !body.is_empty() {
            args.extend(["-H", "content-type: application/json", "--data", body]);
        }
        let r = curl(&w, &w.gw_ca, &args, &url(path));
        assert_eq!(r.status, *status, "{method} {path}: {}", r.body);
        assert!(r.body.contains(needle), "{method} {path}: {}", r.body);
    }
}

#[test]
fn a_reload_that_refuses_a_stalled_inspected_request_closes_its_connection() {
    // The idle timeout is 300 s: only the sweep can end this exchange in time. The
    // request rule changes, not the host: the tunnel's own registration stays allowed,
    // the request's does not, and the client has stopped reading its body.
    let w = world();
    let script = r#"
import socket, ssl, sys, base64, time
gw, port, ca, token = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
host, p = gw.rsplit(":", 1)
auth = base64.b64encode(("sbx-a:" + token).encode()).decode()
s = socket.create_connection((host, int(p)), timeout=10)
s.sendall(f"CONNECT evil.test:{port} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["http/1.1"])
t = ctx.wrap_socket(s, server_hostname="evil.test")
t.sendall(f"GET /bytes/134217728 HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += t.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
print("streaming", flush=True)
sys.stdin.readline()
total = 0
try:
    while True:
        c = t.recv(65536)
        if not c:
            break
        total += len(c)
    print("closed", total)
except socket.timeout:
    print("still open", total)
except (ConnectionResetError, ssl.SSLError) as e:
    print("closed", total)
"#;
    use std::io::{BufRead, Write};
    let mut child = Command::new("python3")
        .args(["-c", script, &w.gw.addr.to_string(), &w.origin.port().to_string(), w.gw_ca.to_str().unwrap(), TOKEN_A])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "streaming");
    let narrowed = policy(w.origin.port())
        .replace("host = \"evil.test\"\nmethods = [\"GET\"]", "host = \"evil.test\"\nmethods = [\"POST\"]");
    assert_ne!(narrowed, policy(w.origin.port()));
    std::fs::write(w.gw.dir.path().join("policy/test.toml"), narrowed).unwrap();
    w.gw.signal("HUP");
    w.gw.wait_for_log(std::time::Duration::from_secs(5), |v| {
        v["msg"] == "closing a connection" && v["target"].as_str().is_some_and(|t| t.contains("/bytes/"))
    });
    // A second later the grace is over: then let the client read what is left.
    std::thread::sleep(std::time::Duration::from_secs(2));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let total: u64 = rest.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
    assert!(rest.starts_with("closed") && total < 134217728, "{rest}");
}

/// A Python gRPC server (grpcio) on TLS with the origin's certificate, stopped on drop.
struct GrpcServer {
    child: std::process::Child,
    port: u16,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn grpc_server(ca: &TestCa) -> GrpcServer {
    use std::io::BufRead;
    let script = r#"
import grpc, sys
from concurrent import futures
def say(req, ctx):
    ctx.set_trailing_metadata((("x-trailer", "from-origin"),))
    return b"echo:" + req
h = grpc.method_handlers_generic_handler("echo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)})
s = grpc.server(futures.ThreadPoolExecutor(2))
s.add_generic_rpc_handlers((h,))
creds = grpc.ssl_server_credentials([(open(sys.argv[2], "rb").read(), open(sys.argv[1], "rb").read())])
print(s.add_secure_port("127.0.0.1:0", creds), flush=True)
s.start()
s.wait_for_termination()
"#;
    let mut child = Command::new("python3")
        .args(["-c", script, ca.cert_pem_path.to_str().unwrap(), ca.key_pem_path.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    // The server prints its port, or exits (and the read ends) if it cannot start.
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().parse().unwrap_or_else(|_| panic!("the gRPC server did not start: {line:?}"));
    GrpcServer { child, port }
}

#[test]
fn grpc_through_an_inspected_host_keeps_http2_and_trailers_and_shows_refusals() {
    let w = world();
    let server = grpc_server(&w.origin_ca);
    // grpcio reads the proxy from https_proxy, as it would in a sandbox.
    let script = r#"
import grpc, sys
port, ca = sys.argv[1], sys.argv[2]
ch = grpc.secure_channel(f"grpc.test:{port}", grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read()))
reply, call = ch.unary_unary("/echo.Echo/Say").with_call(b"hi", timeout=20)
print("reply", reply.decode(), dict(call.trailing_metadata()).get("x-trailer"))
try:
    ch.unary_unary("/echo.Echo/Drop")(b"x", timeout=20)
    print("refused no")
except grpc.RpcError as e:
    print("refused", e.code().name, e.details())
"#;
    let out = Command::new("python3")
        .args(["-c", script, &server.port.to_string(), w.gw_ca.to_str().unwrap()])
        .env("https_proxy", w.gw.proxy_url("sbx-a", TOKEN_A))
        .env_remove("grpc_proxy")
        .env_remove("no_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_grpc_proxy")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // The origin only speaks HTTP/2: the call went through as HTTP/2, trailers included.
    assert!(text.contains("reply echo:hi from-origin"), "{text}");
    // The refusal reached the caller as a gRPC status with the reason and the fix.
    let refused = text.lines().find(|l| l.starts_with("refused")).unwrap_or_default();
    assert!(refused.starts_with("refused PERMISSION_DENIED request_not_allowed"), "{text}");
    assert!(refused.contains("/echo.Echo/Drop"), "{text}");
    let log = w.gw.log_text();
    assert!(log.contains("/echo.Echo/Say") && log.contains("/echo.Echo/Drop"), "both calls are in the access log");
}

/// A Node HTTP/2 origin (on the origin's certificate) and a Node HTTP/2 client that
/// reaches it through the gateway (CONNECT, then TLS with the gateway's CA). The client
/// sends request trailers; the origin answers with the gateway's own refusal fields
/// forged in its head and trailers, and tells what trailers it got. Then the client asks for a tunnel inside.
#[test]
fn http2_request_trailers_are_dropped_tunnels_refused_and_an_origin_cannot_forge_a_refusal() {
    let w = world();
    let js = r#"
const http = require('http'), http2 = require('http2'), tls = require('tls'), fs = require('fs');
const [proxy, gwCa, cert, key] = process.argv.slice(1);
const server = http2.createSecureServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) });
server.on('stream', (stream, headers) => {
  let got = {};
  stream.on('trailers', (t) => { got = t; });
  stream.on('data', () => {});
  stream.on('end', () => {
    stream.respond({ ':status': 200, 'content-type': 'application/grpc',
      'x-egress-deny-reason': 'host_not_allowed', 'proxy-status': 'egress-gateway; error=forged',
      'x-egress-budget': 'download_bytes' }, { waitForTrailers: true });
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0',
      'x-egress-deny-reason': 'host_not_allowed', 'proxy-status': 'egress-gateway; error=forged' }));
    stream.end(JSON.stringify({ smuggled: got['x-smuggled'] || null }));
  });
});
server.listen(0, '127.0.0.1', () => {
  const port = server.address().port;
  const u = new URL(proxy);
  const auth = Buffer.from(decodeURIComponent(u.username) + ':' + decodeURIComponent(u.password)).toString('base64');
  const req = http.request({ host: u.hostname, port: u.port, method: 'CONNECT', path: `grpc.test:${port}`,
    headers: { 'proxy-authorization': 'Basic ' + auth } });
  req.on('connect', (res, socket) => {
    if (res.statusCode !== 200) { console.log('connect', res.statusCode); process.exit(1); }
    const client = http2.connect(`https://grpc.test:${port}`, { createConnection: () =>
      tls.connect({ socket, servername: 'grpc.test', ca: fs.readFileSync(gwCa), ALPNProtocols: ['h2'] }) });
    const s = client.request({ ':method': 'POST', ':path': '/echo.Echo/Say',
      'content-type': 'application/grpc', te: 'trailers' }, { waitForTrailers: true });
    s.on('wantTrailers', () => s.sendTrailers({ 'x-smuggled': 'EGRESS_SECRET_openai' }));
    let head = {}, body = '', trailers = {};
    s.on('response', (h) => { head = h; });
    s.on('trailers', (t) => { trailers = t; });
    s.on('data', (d) => { body += d; });
    s.on('end', () => {
      const forged = (f) => head[f] || trailers[f] || null;
      const first = { status: head[':status'], deny: forged('x-egress-deny-reason'),
        proxyStatus: forged('proxy-status'), budget: forged('x-egress-budget'), body,
        grpcStatus: trailers['grpc-status'] || head['grpc-status'] };
      // Then a tunnel inside the inspected connection, as HTTP/2 asks for one.
      const t = client.request({ ':method': 'CONNECT', ':authority': 'elsewhere.test:443' });
      t.on('response', (h) => {
        first.tunnel = h[':status'];
        first.tunnelReason = h['x-egress-deny-reason'] || null;
        console.log(JSON.stringify(first));
        process.exit(0);
      });
      t.on('error', (e) => { first.tunnel = String(e); console.log(JSON.stringify(first)); process.exit(0); });
    });
    s.end('\0\0\0\0\x02hi');
  });
  req.end();
});
setTimeout(() => { console.log('timeout'); process.exit(1); }, 20000).unref();
"#;
    let out = Command::new("node")
        .args(["-e", js, &w.gw.proxy_url("sbx-a", TOKEN_A), w.gw_ca.to_str().unwrap()])
        .args([w.origin_ca.cert_pem_path.to_str().unwrap(), w.origin_ca.key_pem_path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}\n{}", String::from_utf8_lossy(&out.stderr), w.gw.log_text());
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    // The request's trailers were judged by no rule: they never reached the origin.
    assert_eq!(v["body"], r#"{"smuggled":null}"#, "{v}");
    // The origin's answer reached the client as its own: not made a refusal, and
    // without the gateway's refusal headers.
    assert_eq!((v["status"].as_u64(), v["grpcStatus"].as_str()), (Some(200), Some("0")), "{v}");
    assert!(v["deny"].is_null() && v["proxyStatus"].is_null() && v["budget"].is_null(), "{v}");
    // An HTTP/2 CONNECT inside it is refused, not judged as a request for `/`.
    assert_eq!((v["tunnel"].as_u64(), v["tunnelReason"].as_str()), (Some(400), Some("bad_request")), "{v}");
}
