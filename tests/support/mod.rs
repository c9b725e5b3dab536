//! Test fixtures: the real gateway binary on 127.0.0.1:0, real origins (HTTP, TLS with
//! a test CA, `git http-backend` over CGI) on loopback, and raw-socket helpers.
#![allow(dead_code, unused_imports, reason = "each test binary uses a different subset")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "test fixtures fail loudly")]

pub mod dns;
pub mod gateway;
pub mod github_api;
pub mod origin;
pub mod raw;
pub mod static_https;
pub mod tls;

pub use gateway::{TestGateway, basic};
pub use origin::TestOrigin;

/// The sandbox tokens the standard test policy lists (by their SHA-256).
pub const TOKEN_A: &str = "token-a-5f1d2c9e8b7a6f5e4d3c2b1a";
pub const TOKEN_B: &str = "token-b-0a9b8c7d6e5f4a3b2c1d0e9f";

/// Which hosts the standard test config resolves, all on loopback. `rebind.test`
/// points at 127.0.0.2, which the test config treats as private (only 127.0.0.1 is an
/// egress exception): it stands for a public name that resolves to a private address.
pub const STANDARD_CONFIG: &str = r#"
[proxy]
header_read_timeout = "2s"
connect_timeout = "2s"
tunnel_idle_timeout = "30s"

[drain]
delay = "0s"
timeout = "2s"

[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
timeout = "1s"
[resolver.hosts]
"origin.test" = ["127.0.0.1"]
"tls.test" = ["127.0.0.1"]
"blocked.origin.test" = ["127.0.0.1"]
"a.deep.wild.test" = ["127.0.0.1"]
"b-only.test" = ["127.0.0.1"]
"rebind.test" = ["127.0.0.2"]
"mixed.test" = ["127.0.0.2", "127.0.0.1"]

[egress]
deny = ["builtin"]
allow = ["127.0.0.1/32"]
"#;

pub fn standard_policy() -> String {
    format!(
        r#"
[policies.a]
allow = ["origin.test:*", "tls.test:*", "*.origin.test:*", "*.wild.test:*", "rebind.test:*", "mixed.test:*",
         "127.0.0.1:*", "[::ffff:127.0.0.2]:*", "nxdomain.test:*", "portless.test"]
deny = ["blocked.origin.test"]

[policies.b]
allow = ["b-only.test:*"]

[policies.r]
mode = "report"
allow = []

[[sandboxes]]
id = "sbx-a"
token_sha256 = "{a}"
policy = "a"

[[sandboxes]]
id = "sbx-b"
token_sha256 = "{b}"
policy = "b"

[[sandboxes]]
id = "sbx-r"
token_sha256 = "{b}"
policy = "r"
"#,
        a = sha256_hex(TOKEN_A),
        b = sha256_hex(TOKEN_B),
    )
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(egress_gateway::auth::token_sha256(s))
}

/// What a curl run returned.
#[derive(Debug)]
pub struct CurlOutput {
    pub exit: i32,
    pub body: String,
    pub stderr: String,
    /// `%{http_code}`: the final response status (0 if none).
    pub status: u16,
    /// `%{http_connect}`: the proxy's answer to CONNECT (0 if none).
    pub connect_status: u16,
}

/// Runs curl with `args` plus `-s -w` markers, bounded by a 20 s timeout.
pub fn curl(args: &[&str]) -> CurlOutput {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "-w", "\n@@%{http_code} %{http_connect}"])
        .args(args)
        .output()
        .expect("run curl (is it installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, codes) = stdout.rsplit_once("\n@@").unwrap_or((&stdout, "0 0"));
    let mut codes = codes.split_whitespace().map(|c| c.parse().unwrap_or(0));
    CurlOutput {
        exit: out.status.code().unwrap_or(-1),
        body: body.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        status: codes.next().unwrap_or(0),
        connect_status: codes.next().unwrap_or(0),
    }
}

/// The standard gateway and a plain HTTP origin.
pub fn start_http() -> (TestGateway, TestOrigin) {
    let origin = TestOrigin::http();
    (TestGateway::start(STANDARD_CONFIG, &standard_policy()), origin)
}

/// The standard gateway and a TLS origin whose certificate (test CA) names the
/// standard test hosts.
pub fn start_tls() -> (TestGateway, TestOrigin, tls::TestCa) {
    let ca = tls::TestCa::new(&["tls.test", "origin.test", "rebind.test", "a.deep.wild.test"]);
    let origin = TestOrigin::https(&ca);
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    (gw, origin, ca)
}

/// curl through the gateway as `id:token`, trusting the test CA.
pub fn curl_via(gw: &TestGateway, ca: &tls::TestCa, id: &str, token: &str, url: &str) -> CurlOutput {
    curl(&["--cacert", ca.ca_pem_path.to_str().unwrap(), "-x", &gw.proxy_url(id, token), url])
}
