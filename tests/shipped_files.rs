//! Every shipped config and policy file loads, and the config CLI reports errors with
//! the file, the key and what was expected.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

use std::path::Path;
use std::process::Command;

use egress_gateway::config;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
}

#[test]
fn every_shipped_config_and_policy_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let cfg = config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            if path.ends_with("demo.toml") {
                // The demo's policy is generated at start-up, with its token.
                let (demo, _token) = egress_gateway::demo::config().unwrap();
                config::load_policies(&demo).unwrap_or_else(|e| panic!("{e}"));
            } else {
                config::load_policies(&cfg).unwrap_or_else(|e| panic!("{e}"));
            }
            n += 1;
        }
    }
    assert!(n >= 2, "expected config/gateway.toml and config/demo.toml");
    let cfg = config::load(&dir.join("gateway.toml")).unwrap();
    let set = config::load_policies(&cfg).unwrap();
    assert!(set.sandbox("sbx-example").is_some());
    assert_eq!(cfg.proxy.listen.to_string(), "0.0.0.0:4002");
}

#[test]
fn config_validate_cli() {
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/gateway.toml");
    let out = bin().args(["config", "validate", "--config"]).arg(&good).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("valid"));

    let out = bin().args(["config", "validate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "the built-in demo is valid");

    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[proxy]\nlisen = \"0.0.0.0:1\"\n", "unknown field `lisen`"),
        ("[proxy]\nlisten = \"nope\"\n", "proxy.listen: expected IP:PORT"),
        ("[proxy]\nheader_read_timeout = \"ten\"\n", "line 2, column 23: proxy.header_read_timeout: invalid value"),
        ("[egress]\ndeny = [\"10.0.0.0/33\"]\n", "egress.deny[0]: expected"),
        ("[log]\nformat = \"xml\"\n", "log.format: expected"),
        ("[egress]\npeer_suffix = \"com\"\n", "egress.peer_suffix: expected a domain name of two labels or more"),
        (
            "[proxy]\nallowed_clients = [\"builtin\"]\n",
            "allowed_clients[0]: expected an IP address or a CIDR, got \"builtin\"",
        ),
        (
            "[[tokens.keys]]\nkid = \"a\"\nalg = \"HS256\"\nsecret_env = \"X\"\n[[tokens.keys]]\nkid = \"a\"\nalg = \"HS256\"\nsecret_env = \"X\"\n",
            "tokens.keys[1].kid: key id \"a\" is defined twice",
        ),
        // A bare word is a target to tracing: it would have switched every line off.
        ("[log]\nlevel = \"warning\"\n", "log.level: expected a level"),
        ("[log]\nlevel = \"info,egress_gateway::dns=loud\"\n", "log.level: expected a level"),
        ("[log]\nflush_interval = \"5s\"\n", "log.flush_interval: expected at most 1s"),
        ("[proxy]\nthreads = 1000\n", "proxy.threads: expected 0 (one per CPU) to 256"),
        // Counts that would panic a semaphore, or exhaust descriptors at start-up.
        ("[proxy]\nmax_connections = 9223372036854775807\n", "proxy.max_connections: expected 1 to 1000000"),
        ("[policy]\ndir = \"missing\"\n", "policy.dir: expected a directory"),
        // Durations: one that would overflow a clock, one the kernel refuses, a busy loop.
        ("[proxy]\nconnect_timeout = \"100000y\"\n", "proxy.connect_timeout: expected a duration from 1ms to 365d"),
        ("[drain]\ndelay = \"100000y\"\n", "drain.delay: expected a duration from 0s to 365d"),
        ("[proxy]\ntcp_keepalive = \"10h\"\n", "proxy.tcp_keepalive: expected a duration from 1s to 9h, got 10h"),
        ("[policy]\nwatch_interval = \"1ns\"\n", "policy.watch_interval: expected a duration from 100ms"),
        ("[tokens]\nleeway = \"2h\"\n", "tokens.leeway: expected a duration from 0s to 1h"),
        ("[tokens]\nexpiry_grace = \"soon\"\n", "tokens.expiry_grace: expected a duration such as \"60s\" or \"off\""),
        (
            "[dns]\nhostnames = [\"gw.internal\"]\naddresses = [\"10.0.0.1\"]\ntcp_max_per_client = 0\n",
            "dns.tcp_max_per_client: expected at least 1",
        ),
        (
            "[resolver.hosts]\n\"a.test\" = [\"127.0.0.1\"]\n\"A.test.\" = [\"127.0.0.2\"]\n",
            "names a host another entry names",
        ),
        // A static token file is read on each clone, and checked at start-up.
        ("[github.token_files]\nacme = \"missing.token\"\n", "github.token_files.acme: cannot read"),
        ("[github.token_files]\nacme = \"empty.token\"\n", "empty.token is empty: expected the token"),
        (
            "[github.token_files]\nacme = \"full.token\"\nAcme = \"full.token\"\n",
            "names an owner another entry names (owners ignore case)",
        ),
    ];
    std::fs::write(dir.path().join("empty.token"), "\n").unwrap();
    std::fs::write(dir.path().join("full.token"), "ghs_NEVER_SHOWN\n").unwrap();
    for (text, expect) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = bin().args(["config", "validate", "--config"]).arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(err.contains("bad.toml") && err.contains(expect), "{text}: {err}");
        assert!(!err.contains("NEVER_SHOWN"), "a token is echoed: {err}");
    }
    // What serving reads at start-up is read by validate too: keys, secrets.
    std::fs::create_dir_all(dir.path().join("p")).unwrap();
    let path = dir.path().join("keys.toml");
    std::fs::write(
        &path,
        "[policy]\ndir = \"p\"\n[[tokens.keys]]\nkid = \"k1\"\nalg = \"HS256\"\nsecret_file = \"missing.key\"\n",
    )
    .unwrap();
    let out = bin().args(["config", "validate", "--config"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("keys.toml: tokens.keys[0].secret_file: cannot read ") && err.contains("missing.key"),
        "{err}"
    );
    // A secret given where TOML is expected (a key file as --config, a token pasted
    // into the wrong key) is never repeated: only where it went wrong, and why.
    for text in ["SUPERSECRET-0123456789abcdef\n", "[github]\ntoken = \"ghp_SUPERSECRET\"\n"] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = bin().args(["config", "validate", "--config"]).arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(err.contains("bad.toml: line ") && !err.contains("SUPERSECRET"), "{text}: {err}");
    }

    std::fs::create_dir(dir.path().join("policy")).unwrap();
    std::fs::write(dir.path().join("policy/p.toml"), "[policies.x]\nallow = [\"ok.example\", \"*.*.bad\"]\n").unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, "[policy]\ndir = \"policy\"\n").unwrap();
    let out = bin().args(["config", "validate", "--config"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("p.toml: policies.x.allow[1] (line 2)"), "{err}");
}

#[test]
fn token_cli_hashes_and_generates() {
    use std::io::Write;
    let mut child = bin()
        .args(["token", "hash"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"test\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    );

    let out = bin().args(["token", "generate"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let token = text.lines().find_map(|l| l.strip_prefix("token        = ")).unwrap();
    let hash = text.lines().find_map(|l| l.strip_prefix("token_sha256 = ")).unwrap();
    assert_eq!(hash, hex::encode(egress_gateway::auth::token_sha256(token)));
    assert!(token.len() >= 40);
}

#[test]
fn deployment_examples_are_well_formed_and_match_the_metrics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/deploy");
    let dashboard = std::fs::read_to_string(dir.join("grafana-dashboard.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    assert!(v["panels"].as_array().unwrap().len() >= 8);
    // Every metric the dashboard queries is one the gateway exports.
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs")).unwrap();
    for name in dashboard.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("egress_"))
    {
        let base = name.trim_end_matches("_bucket");
        assert!(src.contains(&format!("\"{base}\"")), "dashboard queries unknown metric {name}");
    }
    let ecs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ecs-sidecar-container.json")).unwrap()).unwrap();
    assert!(ecs["stopTimeout"].as_u64().unwrap() > 100, "stop timeout above drain delay + timeout");
    // The gateway.toml embedded in the Kubernetes example is a valid config.
    let k8s = std::fs::read_to_string(dir.join("kubernetes.yaml")).unwrap();
    let start = k8s.find("gateway.toml: |\n").unwrap() + "gateway.toml: |\n".len();
    let end = k8s[start..].find("\n---").unwrap() + start;
    let embedded: String =
        k8s[start..end].lines().map(|l| l.strip_prefix("    ").unwrap_or(l)).collect::<Vec<_>>().join("\n");
    let raw: Result<toml::Table, _> = toml::from_str(&embedded);
    assert!(raw.is_ok(), "{embedded}");
    let parsed = config::parse(&embedded, &config::DisplayPath("k8s".into()), Path::new("/"));
    // Files it names do not exist here; everything else must validate.
    if let Err(e) = parsed {
        let msg = e.to_string();
        assert!(msg.contains("admin.token_file"), "{msg}");
    }
    assert!(k8s.contains("terminationGracePeriodSeconds: 120"));

    // The transparent sidecar example: its gateway.toml and policy validate together.
    let k8s = std::fs::read_to_string(dir.join("kubernetes-transparent.yaml")).unwrap();
    let block = |key: &str| {
        let start = k8s.find(&format!("{key}: |\n")).unwrap() + key.len() + 4;
        let rest = &k8s[start..];
        let end = rest.find("\n  sandbox.toml: |").or_else(|| rest.find("\n---")).unwrap();
        rest[..end].lines().map(|l| l.strip_prefix("    ").unwrap_or(l)).collect::<Vec<_>>().join("\n")
    };
    let conf = tempfile::tempdir().unwrap();
    std::fs::create_dir(conf.path().join("policy")).unwrap();
    std::fs::write(conf.path().join("policy/sandbox.toml"), block("sandbox.toml")).unwrap();
    let gateway = block("gateway.toml").replace("/etc/egress-gateway/policy", "policy");
    std::fs::write(conf.path().join("gateway.toml"), gateway).unwrap();
    let out = bin().args(["config", "validate", "--config"]).arg(conf.path().join("gateway.toml")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(k8s.contains("transparent-sidecar.nft"));
}
