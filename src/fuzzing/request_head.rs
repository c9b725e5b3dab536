//! The whole request path, from raw client bytes to the upstream dial, in process:
//! the bytes are served by the real proxy connection handler (hyper, authentication,
//! policy, the git route, forwarding) whose resolver records dials instead of making
//! them. Property: nothing is dialled unless the input carried the credentials of a
//! sandbox whose policy allows that target, and the address is one the target resolves
//! to and the egress filter lets through.

#![allow(clippy::panic, reason = "the fuzz harness fails loudly when it cannot set itself up")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::addr::{Host, Target};
use crate::door::ConnInfo;
use crate::proxy::Shared;

const TOKEN_A: &str = "fuzz-token-a-2f6b";
const TOKEN_B: &str = "fuzz-token-b-9c1e";

const POLICY: &str = r#"
[policies.a]
allow = ["allowed.test", "*.wild.test:*", "mixed.test:*", "private.test:*", "127.0.0.1:8080"]
deny = ["deny.wild.test"]
git = { repos = ["acme/*"], push = ["refs/heads/agent/*"] }

[policies.b]
allow = ["other.test:443"]

[[sandboxes]]
id = "sbx-a"
token_sha256 = "A"
policy = "a"

[[sandboxes]]
id = "sbx-b"
token_sha256 = "B"
policy = "b"
"#;

const CONFIG: &str = r#"
[proxy]
header_read_timeout = "1s"
connect_timeout = "1s"
response_header_timeout = "1s"
sandbox_max_concurrent = 0
sandbox_max_per_second = 0
[policy]
dir = "policy"
watch_interval = "0s"
[admin]
listen = "127.0.0.1:0"
[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
timeout = "200ms"
[resolver.hosts]
"allowed.test" = ["127.0.0.1"]
"other.test" = ["127.0.0.1"]
"a.wild.test" = ["127.0.0.1"]
"deny.wild.test" = ["127.0.0.1"]
"private.test" = ["127.0.0.2"]
"mixed.test" = ["127.0.0.2", "127.0.0.1"]
"github.test" = ["127.0.0.1"]
"notlisted.test" = ["127.0.0.1"]
[egress]
allow = ["127.0.0.1/32"]
[github]
web_url = "https://github.test"
api_url = "https://api.github.test"
[github.token_files]
acme = "acme.token"
"#;

struct Harness {
    rt: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    dials: Arc<Mutex<Vec<(Target, SocketAddr)>>>,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("egress-fuzz-request-head-{}", std::process::id()));
        let hash = |t: &str| hex::encode(crate::auth::token_sha256(t));
        let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).unwrap_or_else(|e| panic!("{p}: {e}"));
        std::fs::create_dir_all(dir.join("policy")).unwrap_or_else(|e| panic!("fuzz dir: {e}"));
        write(
            "policy/fuzz.toml",
            &POLICY
                .replace("\"A\"", &format!("\"{}\"", hash(TOKEN_A)))
                .replace("\"B\"", &format!("\"{}\"", hash(TOKEN_B))),
        );
        write("gateway.toml", CONFIG);
        write("acme.token", "ghs_fuzzupstreamtoken\n");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
        let dials: Arc<Mutex<Vec<(Target, SocketAddr)>>> = Arc::default();
        let sink = dials.clone();
        let recorder: crate::resolve::DialRecorder = Arc::new(move |t: &Target, a: SocketAddr| {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push((t.clone(), a));
        });
        let config = crate::config::load(&dir.join("gateway.toml")).unwrap_or_else(|e| panic!("fuzz config: {e}"));
        let shared = rt
            .block_on(async { crate::gateway::build_shared_recording(config, recorder) })
            .unwrap_or_else(|e| panic!("fuzz gateway: {e}"));
        Harness { rt, shared, dials }
    })
}

/// Whether `data` carries `token`: in clear (Bearer, a route header) or inside any run
/// of base64 (Basic), padded or not.
fn carries(data: &[u8], token: &str) -> bool {
    let contains = |hay: &[u8]| hay.windows(token.len()).any(|w| w == token.as_bytes());
    if contains(data) {
        return true;
    }
    let b64 = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_');
    data.split(|c| !b64(c)).filter(|run| run.len() >= 8).any(|run| {
        let trimmed: Vec<u8> = run.iter().copied().filter(|c| *c != b'=').collect();
        [&base64::engine::general_purpose::STANDARD_NO_PAD, &base64::engine::general_purpose::URL_SAFE_NO_PAD]
            .iter()
            .filter_map(|e| e.decode(&trimmed).ok())
            .any(|d| contains(&d))
    })
}

pub fn request_head(data: &[u8]) {
    run(data);
}

/// Serves `data`, checks the property on every recorded dial, and returns them.
fn run(data: &[u8]) -> Vec<(Target, SocketAddr)> {
    let h = harness();
    h.dials.lock().unwrap_or_else(|e| e.into_inner()).clear();
    h.rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let conn = ConnInfo::at(SocketAddr::from(([127, 0, 0, 1], 40000)), None);
        let serve = crate::proxy::server::serve_stream(
            server,
            conn,
            h.shared.clone(),
            CancellationToken::new(),
            true,
            crate::proxy::server::Serve::Proxy,
        );
        let talk = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut sink = [0u8; 8192];
            while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
        };
        // Bounded: a stuck connection is a finding (hang), reported as a failure.
        let both = async { tokio::join!(serve, talk) };
        assert!(tokio::time::timeout(Duration::from_secs(10), both).await.is_ok(), "connection hung");
    });
    let state = h.shared.store.snapshot();
    let (a, b) = (carries(data, TOKEN_A), carries(data, TOKEN_B));
    let dials: Vec<_> = h.dials.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
    for (target, addr) in &dials {
        let (target, addr) = (target, *addr);
        // The address is vetted and is one the target resolves to, on its port.
        assert_eq!(
            h.shared.resolver.filter().vet(addr.ip()).ok(),
            Some(addr.ip()),
            "unvetted dial {addr} for {target}"
        );
        assert_eq!(addr.port(), target.port, "port changed: {addr} for {target}");
        let resolves = match &target.host {
            Host::Ip(ip) => *ip == addr.ip(),
            Host::Name(n) => h.shared.config.resolver.hosts.get(n).is_some_and(|ips| ips.contains(&addr.ip())),
        };
        assert!(resolves, "{addr} is not an address of {target}");
        // A sandbox whose credentials were in the input allows it (the git route
        // dials the configured GitHub host for sandboxes with git rules).
        let allows = |id: &str| {
            state.policies.sandbox(id).is_some_and(|s| {
                s.policy.decide(target).permits()
                    || (target.host == Host::Name("github.test".into()) && target.port == 443 && id == "sbx-a")
            })
        };
        assert!(
            (a && allows("sbx-a")) || (b && allows("sbx-b")),
            "dialled {target} ({addr}) without an allowing credential"
        );
    }
    dials
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_finds_plain_and_basic_credentials() {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("sbx-a:{TOKEN_A}"));
        assert!(carries(format!("Proxy-Authorization: Basic {basic}\r\n").as_bytes(), TOKEN_A));
        assert!(carries(format!("Authorization: Bearer sbx-a:{TOKEN_A}").as_bytes(), TOKEN_A));
        assert!(!carries(b"Proxy-Authorization: Basic c2J4LWE6d3Jvbmc=\r\n", TOKEN_A));
    }

    fn connect(target: &str, id: &str, token: &str) -> String {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{token}"));
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {basic}\r\n\r\n")
    }

    /// The harness really sees dials: an allowed CONNECT is recorded once, at the
    /// vetted address only (mixed.test also resolves to a private one); a denied one,
    /// or one with a wrong token, is not.
    #[test]
    fn dials_are_recorded_only_for_allowed_requests() {
        let dials = run(connect("allowed.test:443", "sbx-a", TOKEN_A).as_bytes());
        assert_eq!(dials.len(), 1, "{dials:?}");
        let dials = run(connect("mixed.test:8443", "sbx-a", TOKEN_A).as_bytes());
        assert_eq!(dials.iter().map(|d| d.1.to_string()).collect::<Vec<_>>(), ["127.0.0.1:8443"]);
        assert!(run(connect("other.test:443", "sbx-a", TOKEN_A).as_bytes()).is_empty());
        assert!(run(connect("allowed.test:443", "sbx-a", TOKEN_B).as_bytes()).is_empty());
        assert!(run(connect("private.test:443", "sbx-a", TOKEN_A).as_bytes()).is_empty());
        assert_eq!(run(connect("other.test:443", "sbx-b", TOKEN_B).as_bytes()).len(), 1);
    }
}
