//! CLI contract tests for `check` and `policy test|lint|replay|diff`: output and exit
//! codes (0 allow/ok, 1 deny/failures, 2 error), including malformed input; and shadow
//! policies in a running gateway.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, TestOrigin, curl, sha256_hex, standard_policy};

fn bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_egress-gateway")).args(args).output().expect("run binary")
}

fn text(o: &Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const POLICY: &str = r#"
[policies.python]
allow = ["pypi.org", "files.pythonhosted.org", "api.example.com:8443"]
deny = ["upload.pypi.org"]

[policies.git]
allow = []
git = { repos = ["acme/widgets"], push = ["refs/heads/agent/*"] }

[[sandboxes]]
id = "sbx-py"
token_sha256 = "@HASH@"
policy = "python"

[[sandboxes]]
id = "sbx-git"
token_sha256 = "@HASH@"
policy = "git"
"#;

/// A config dir with `gateway.toml` and `policy/p.toml`.
fn setup(policy: &str, extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policy")).unwrap();
    std::fs::write(dir.path().join("policy/p.toml"), policy.replace("@HASH@", &sha256_hex("tok-123"))).unwrap();
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(&cfg, format!("[policy]\ndir = \"policy\"\n{extra}")).unwrap();
    (dir, cfg)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn check_allow_deny_and_errors() {
    let (_d, cfg) = setup(POLICY, "");
    let (code, out, _) = text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-py", "https://pypi.org/simple/"]));
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ALLOW  sbx-py -> pypi.org:443  (policy python)"), "{out}");
    assert!(out.contains("rule:    allow \"pypi.org\" at ") && out.contains("p.toml:3"), "{out}");

    let (code, out, _) = text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-py", "upload.pypi.org:443"]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("reason:  host_denied") && out.contains("p.toml:4"), "{out}");

    let (code, out, _) =
        text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-py", "example.com:443", "--json"]));
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["reason"], "host_not_allowed");
    assert_eq!(
        v["hint"], "to allow it, add \"example.com\" to policies.python.allow",
        "smallest rule: bare host on a default port"
    );
    let (_, out, _) = text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-py", "example.com:9000", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["hint"], "to allow it, add \"example.com:9000\" to policies.python.allow");
    let (_, out, _) =
        text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-py", "api.example.com:443", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["reason"], "port_not_allowed");
    assert_eq!(v["rule"], "api.example.com:8443");

    for (args, expect) in [
        (vec!["--sandbox", "nobody", "pypi.org:443"], "unknown sandbox \"nobody\""),
        (vec!["--sandbox", "sbx-py", "pypi.org"], "write host:port or a URL"),
        (vec!["--sandbox", "sbx-py", "0x7f.1:443"], "not a valid IP literal"),
        (vec!["--sandbox", "sbx-py", "pypi.org:443", "--push", "refs/heads/x"], "--push needs a git URL"),
    ] {
        let mut full = vec!["check", "--config", s(&cfg)];
        full.extend(args);
        let (code, _, err) = text(&bin(&full));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(expect), "{err}");
    }
    let (bad_dir, bad_cfg) = setup("[policies.x]\nallow = [\"a.com\"\n", "");
    let (code, _, err) = text(&bin(&["check", "--config", s(&bad_cfg), "--sandbox", "s", "a.com:443"]));
    assert_eq!(code, 2);
    assert!(err.contains("p.toml") && err.contains("line 2"), "bad TOML shows file and line: {err}");
    assert_eq!(err.matches("line 2").count(), 1, "the cause is told once: {err}");
    drop(bad_dir);
    let (code, _, err) = text(&bin(&["check", "--config", "/nonexistent/gw.toml", "--sandbox", "s", "a.com:443"]));
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/gw.toml: cannot read: No such file"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "the cause is told once: {err}");
}

#[test]
fn check_git_token_and_resolve() {
    let (_d, cfg) = setup(
        POLICY,
        "[resolver]\nhosts_file = false\nnameservers = [\"127.0.0.1:9\"]\ntimeout = \"1s\"\n[resolver.hosts]\n\"pypi.org\" = [\"10.1.2.3\", \"151.101.0.223\"]\n\"files.pythonhosted.org\" = [\"169.254.169.254\"]\n",
    );
    let c = s(&cfg);
    let git = "https://github.com/acme/widgets.git";
    assert_eq!(bin(&["check", "--config", c, "--sandbox", "sbx-git", git]).status.code(), Some(0));
    let (code, out, _) =
        text(&bin(&["check", "--config", c, "--sandbox", "sbx-git", git, "--push", "refs/heads/main"]));
    assert_eq!(code, 1);
    assert!(
        out.contains("git_ref_denied") && out.contains("add \"refs/heads/main\" to policies.git.git.push"),
        "{out}"
    );
    let (code, _, _) =
        text(&bin(&["check", "--config", c, "--sandbox", "sbx-git", git, "--push", "refs/heads/agent/a"]));
    assert_eq!(code, 0);
    let (code, out, _) =
        text(&bin(&["check", "--config", c, "--sandbox", "sbx-git", "https://github.com/acme/other.git"]));
    assert_eq!(code, 1);
    assert!(out.contains("repo_not_connected"), "{out}");

    let (code, out, _) =
        text(&bin(&["check", "--config", c, "--sandbox", "sbx-py", "pypi.org:443", "--token", "tok-123"]));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("token:   valid"));
    let (code, out, _) =
        text(&bin(&["check", "--config", c, "--sandbox", "sbx-py", "pypi.org:443", "--token", "nope"]));
    assert_eq!(code, 1);
    assert!(out.contains("auth_invalid"), "{out}");

    // --resolve uses the gateway's resolver (static hosts here) and vets each address;
    // nothing is dialled.
    let (code, out, _) = text(&bin(&["check", "--config", c, "--sandbox", "sbx-py", "pypi.org:443", "--resolve"]));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("10.1.2.3") && out.contains("denied (in 10.0.0.0/8)"), "{out}");
    assert!(out.contains("151.101.0.223") && out.contains(" ok"), "{out}");
    let (code, out, _) = text(&bin(&[
        "check",
        "--config",
        c,
        "--sandbox",
        "sbx-py",
        "files.pythonhosted.org:443",
        "--resolve",
        "--json",
    ]));
    assert_eq!(code, 1, "only metadata addresses: the gateway would refuse");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["reason"], "address_denied");
    assert_eq!(v["addresses"][0]["denied_by"], "169.254.0.0/16");
}

/// Under `allow_all` an IP literal is allowed by the policy, and refused by
/// `egress.deny` when served: `check` says so without `--resolve` (nothing to look up).
#[test]
fn check_vets_ip_literals_as_serving_does() {
    let policy = format!(
        "{POLICY}\n[policies.open]\nallow_all = true\n\n[[sandboxes]]\nid = \"sbx-open\"\ntoken_sha256 = \"@HASH@\"\npolicy = \"open\"\n"
    );
    let (_d, cfg) = setup(&policy, "");
    for target in ["169.254.169.254:80", "10.0.0.1:443", "[fe80::1]:80", "127.0.0.1:9090"] {
        let (code, out, _) = text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-open", target, "--json"]));
        assert_eq!(code, 1, "{target}: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["reason"], "address_denied", "{target}: {out}");
    }
    let (code, out, _) = text(&bin(&["check", "--config", s(&cfg), "--sandbox", "sbx-open", "151.101.0.223:443"]));
    assert_eq!(code, 0, "a public address is allowed: {out}");
}

#[test]
fn policy_test_files() {
    let (d, cfg) = setup(POLICY, "");
    let good = d.path().join("good.toml");
    std::fs::write(&good, "[[case]]\nsandbox = \"sbx-py\"\ntarget = \"pypi.org:443\"\nexpect = \"allow\"\n\n[[case]]\nsandbox = \"sbx-py\"\ntarget = \"https://upload.pypi.org/\"\nexpect = \"deny\"\nreason = \"host_denied\"\n").unwrap();
    let (code, out, _) = text(&bin(&["policy", "test", "--config", s(&cfg), s(&good)]));
    assert_eq!((code, out.trim()), (0, "2 passed, 0 failed"));

    let bad = d.path().join("bad.toml");
    std::fs::write(&bad, "[[case]]\nsandbox = \"sbx-py\"\ntarget = \"pypi.org:443\"\nexpect = \"allow\"\n\n[[case]]\nname = \"npm\"\nsandbox = \"sbx-py\"\ntarget = \"registry.npmjs.org:443\"\nexpect = \"allow\"\n\n[[case]]\nsandbox = \"sbx-py\"\ntarget = \"example.com:443\"\nexpect = \"deny\"\nreason = \"host_denied\"\n").unwrap();
    let (code, out, _) = text(&bin(&["policy", "test", "--config", s(&cfg), s(&good), s(&bad)]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("bad.toml:6 (npm): sandbox sbx-py -> registry.npmjs.org:443"), "{out}");
    assert!(out.contains("expected allow, got deny (host_not_allowed)"), "{out}");
    assert!(out.contains("expected reason host_denied, got deny (host_not_allowed)"), "{out}");
    assert!(out.trim_end().ends_with("3 passed, 2 failed"), "{out}");

    let broken = d.path().join("broken.toml");
    std::fs::write(&broken, "[[case]]\nsandbox = \"sbx-py\"\nexpect = \"maybe\"\n").unwrap();
    let (code, _, err) = text(&bin(&["policy", "test", "--config", s(&cfg), s(&broken)]));
    assert_eq!(code, 2);
    assert!(err.contains("broken.toml"), "{err}");
}

#[test]
fn shipped_policies_pass_their_tests_and_lint() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = root.join("config/gateway.toml");
    let tests: Vec<PathBuf> =
        std::fs::read_dir(root.join("policy/tests")).unwrap().map(|e| e.unwrap().path()).collect();
    let mut args = vec!["policy".to_string(), "test".into(), "--config".into(), s(&cfg).into()];
    args.extend(tests.iter().map(|p| s(p).to_string()));
    let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway")).args(&args).output().unwrap();
    let (code, out, err) = text(&out);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = text(&bin(&["policy", "lint", "--config", s(&cfg), "--deny-warnings"]));
    assert_eq!(code, 0, "{out}");
}

#[test]
fn lint_reports_likely_mistakes() {
    let policy = r#"
[policies.p]
allow = ["*.com", "a.example.com", "a.example.com", "*.b.example.com:443", "10.1.0.0/16:*", "ok.example.org"]
deny = ["*.b.example.com"]

[policies.unused]
allow = ["x.example.org"]

[policies.pushy]
git = { push = ["refs/heads/*"] }

[[sandboxes]]
id = "s"
token_sha256 = "@HASH@"
policy = "p"

[[sandboxes]]
id = "t"
token_sha256 = "@HASH@"
policy = "pushy"
"#;
    let (_d, cfg) = setup(policy, "");
    let (code, out, _) = text(&bin(&["policy", "lint", "--config", s(&cfg)]));
    assert_eq!(code, 0, "warnings alone do not fail without --deny-warnings: {out}");
    for expect in [
        "p.toml:3: policies.p.allow \"*.com\": wildcard covers the public suffix \"com\"",
        "policies.p.allow \"a.example.com\": duplicate of the rule at",
        "policies.p.allow \"*.b.example.com:443\": fully shadowed by deny \"*.b.example.com\"",
        "policies.p.allow \"10.1.0.0/16:*\": every address it matches is in egress.deny",
        "policies.unused: no sandbox uses this policy",
        "git.push without git.repos",
        "0 errors, 6 warnings",
    ] {
        assert!(out.contains(expect), "missing {expect:?} in:\n{out}");
    }
    assert!(!out.contains("ok.example.org"), "{out}");
    assert_eq!(bin(&["policy", "lint", "--config", s(&cfg), "--deny-warnings"]).status.code(), Some(1));

    let (_d2, broken) = setup("[[sandboxes]]\nid = \"s\"\ntoken_sha256 = \"@HASH@\"\npolicy = \"missing\"\n", "");
    let (code, out, _) = text(&bin(&["policy", "lint", "--config", s(&broken)]));
    assert_eq!(code, 1);
    assert!(out.contains("error:") && out.contains("no policy named \"missing\""), "{out}");
}

#[test]
fn lint_warns_when_a_sandbox_may_send_trusted_proxy_headers() {
    let policy = "[policies.p]\nallow = [\"ok.example.org\"]\n\n[[sandboxes]]\nid = \"s\"\ntoken_sha256 = \"@HASH@\"\n\
                  policy = \"p\"\naddresses = [\"10.0.5.0/24\"]\n";
    let trusted = "[proxy]\nproxy_protocol = \"optional\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n";
    let (_d, cfg) = setup(policy, trusted);
    let (code, out, _) = text(&bin(&["policy", "lint", "--config", s(&cfg)]));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("sandboxes.s.addresses: overlaps proxy.trusted_proxies (10.0.0.0/8)"), "{out}");
    let apart = "[proxy]\nproxy_protocol = \"optional\"\ntrusted_proxies = [\"10.9.0.1/32\"]\n";
    let (_d, cfg) = setup(policy, apart);
    let (_, out, _) = text(&bin(&["policy", "lint", "--config", s(&cfg)]));
    assert!(out.contains("0 errors, 0 warnings"), "{out}");
}

#[test]
fn replay_summarises_changes_and_gates_on_new_denials() {
    let (d, cfg) = setup(POLICY, "");
    let log = d.path().join("access.jsonl");
    let line = |sbx: &str, kind: &str, target: &str, decision: &str, reason: Option<&str>| {
        serde_json::json!({"ts":"2026-11-30T00:00:00Z","log":"access","sandbox":sbx,"kind":kind,"method":"CONNECT",
            "target":target,"decision":decision,"reason":reason,"status":200})
        .to_string()
    };
    let mut lines = vec![
        line("sbx-py", "connect", "pypi.org:443", "allow", None),
        line("sbx-py", "connect", "pypi.org:443", "allow", None),
        line("sbx-py", "connect", "example.com:443", "deny", Some("host_not_allowed")),
        line("sbx-py", "connect", "files.pythonhosted.org:443", "deny", Some("address_denied")),
        r#"{"ts":"x","level":"info","msg":"listening"}"#.to_string(),
        r#"{"log":"access","kind":"connect","target":"pypi.org:443","decision":"deny","reason":"auth_required"}"#
            .to_string(),
        "not json".to_string(),
    ];
    std::fs::write(&log, lines.join("\n")).unwrap();
    let (code, out, _) = text(&bin(&["policy", "replay", "--log", s(&log), "--config", s(&cfg)]));
    assert_eq!(code, 0, "nothing allowed before is denied now: {out}");
    assert!(out.contains("allow -> deny: 0 targets"), "{out}");

    // New policy: pypi.org denied, example.com allowed.
    let newer = POLICY.replace("allow = [\"pypi.org\",", "allow = [\"example.com\",");
    let (_d2, new_cfg) = setup(&newer, "");
    lines.push(line("sbx-py", "connect", "pypi.org:443", "allow", None));
    std::fs::write(&log, lines.join("\n")).unwrap();
    let (code, out, _) = text(&bin(&["policy", "replay", "--log", s(&log), "--config", s(&new_cfg)]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("allow -> deny: 1 targets, 3 requests"), "{out}");
    assert!(out.contains("pypi.org:443") && out.contains("host_not_allowed"), "{out}");
    assert!(out.contains("deny -> allow: 1 targets, 1 requests") && out.contains("example.com:443"), "{out}");
    let (_, out, _) = text(&bin(&["policy", "replay", "--log", s(&log), "--config", s(&new_cfg), "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["allow_to_deny"][0]["requests"], 3);
    assert_eq!(v["skipped"], 2, "auth failure without sandbox, and the non-JSON line");

    let (code, _, err) = text(&bin(&["policy", "replay", "--log", "/nonexistent.jsonl", "--config", s(&cfg)]));
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.jsonl"), "{err}");
}

#[test]
fn diff_is_semantic_per_sandbox() {
    let (d, cfg) = setup(POLICY, "");
    let old = d.path().join("policy");
    let new = d.path().join("policy-new");
    std::fs::create_dir(&new).unwrap();
    let changed = POLICY
        .replace("deny = [\"upload.pypi.org\"]", "deny = []")
        .replace("\"api.example.com:8443\"]", "\"api.example.com:8443\", \"crates.io\"]")
        .replace("id = \"sbx-git\"", "id = \"sbx-new\"");
    // Rules reordered and reformatted: no change by themselves.
    std::fs::write(new.join("q.toml"), changed.replace("@HASH@", &sha256_hex("tok-123"))).unwrap();
    let (code, out, _) = text(&bin(&["policy", "diff", "--config", s(&cfg), s(&old), s(&new)]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("sandbox sbx-git: removed (was policy git)"), "{out}");
    assert!(out.contains("sandbox sbx-new: added (policy git)"), "{out}");
    assert!(out.contains("sandbox sbx-py:\n  + allow \"crates.io\"\n  - deny \"upload.pypi.org\""), "{out}");
    let (code, out, _) = text(&bin(&["policy", "diff", "--config", s(&cfg), s(&old), s(&old)]));
    assert_eq!((code, out.trim()), (0, "no changes"));
}

#[test]
fn shadow_policy_disagreements_are_logged_and_counted() {
    let origin = TestOrigin::http();
    let shadow = tempfile::tempdir().unwrap();
    // The shadow policy drops origin.test from policy a.
    let shadow_policy = standard_policy().replace("\"origin.test:*\", ", "");
    std::fs::write(shadow.path().join("p.toml"), shadow_policy).unwrap();
    let shadow_key = format!("shadow_dir = \"{}\"\n", shadow.path().display());
    let gw = TestGateway::start_with_policy_section(STANDARD_CONFIG, &standard_policy(), &shadow_key);
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/echo", origin.port())]);
    assert_eq!(out.status, 200, "the shadow never affects traffic: {out:?}");
    let rec = gw.access_for(&format!("origin.test:{}", origin.port()));
    assert_eq!(rec["decision"], "allow");
    assert_eq!(rec["shadow_decision"], "deny");
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://tls.test:{}/echo", origin.port())]);
    assert_eq!(out.status, 200);
    let rec = gw.access_for(&format!("tls.test:{}", origin.port()));
    assert!(rec["shadow_decision"].is_null(), "agreement is not logged: {rec}");
    let metrics =
        support::raw::request(gw.admin_addr(), b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert!(
        metrics.contains("egress_policy_shadow_disagreements_total{live=\"allow\",shadow=\"deny\"} 1"),
        "{metrics}"
    );
}

/// Report mode never applies where the gateway adds its own credential, and a tunnel to
/// GitHub beside git rules goes around them: lint warns on both, check explains both.
#[test]
fn lint_and_check_explain_report_mode_and_github_tunnels_beside_git_rules() {
    let policy = r#"
[policies.trial]
mode = "report"
allow = ["*.github.com", "github.com"]
git = { repos = ["acme/widgets"] }

[[sandboxes]]
id = "s"
token_sha256 = "@HASH@"
policy = "trial"
"#;
    let (_d, cfg) = setup(policy, "");
    let (code, out, _) = text(&bin(&["policy", "lint", "--config", s(&cfg)]));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("policies.trial.mode: report mode does not apply to git rules or API routes"), "{out}");
    assert!(out.contains("policies.trial.allow \"github.com\": allows an opaque tunnel to GitHub"), "{out}");
    let (code, out, _) = text(&bin(&[
        "check",
        "--config",
        s(&cfg),
        "--sandbox",
        "s",
        "--push",
        "refs/heads/main",
        "https://github.com/acme/widgets.git",
    ]));
    assert_eq!(code, 1, "a push with no git.push rules is denied even in report mode: {out}");
    assert!(out.contains("git_write_denied"), "{out}");
    assert!(out.contains("note:    policy is in report mode, but git rules are always enforced"), "{out}");
    assert!(out.contains("also allows an opaque tunnel to GitHub"), "{out}");
}

/// A day of report mode turned into an allowlist: what was denied or would_deny becomes
/// the smallest set of rules, with counts; `--write` makes a policy directory that
/// `policy diff` reads.
#[test]
fn suggest_turns_denials_into_rules() {
    let (dir, cfg) = setup(POLICY, "");
    let line = |sandbox: &str, policy: &str, kind: &str, target: &str, decision: &str, reason: &str, rule: &str| {
        let rule = if rule.is_empty() { String::new() } else { format!(",\"rule\":\"{rule}\"") };
        format!(
            "{{\"log\":\"access\",\"sandbox\":\"{sandbox}\",\"policy\":\"{policy}\",\"kind\":\"{kind}\",\"target\":\"{target}\",\"decision\":\"{decision}\",\"reason\":\"{reason}\"{rule}}}\n"
        )
    };
    let mut log = String::new();
    for _ in 0..3 {
        log.push_str(&line("sbx-py", "python", "connect", "crates.io:443", "would_deny", "host_not_allowed", ""));
    }
    log.push_str(&line("sbx-py", "python", "connect", "api.example.com:9443", "deny", "port_not_allowed", ""));
    log.push_str(&line("sbx-py", "python", "connect", "upload.pypi.org:443", "deny", "host_denied", "upload.pypi.org"));
    log.push_str(&line("sbx-py", "python", "connect", "pypi.org:443", "allow", "", ""));
    log.push_str(&line("sbx-git", "git", "git", "github.com/acme/tools", "deny", "repo_not_connected", ""));
    log.push_str(&line(
        "sbx-git",
        "git",
        "git",
        "github.com/acme/widgets",
        "deny",
        "git_ref_denied",
        "refs/heads/main",
    ));
    log.push_str("{\"level\":\"info\",\"msg\":\"not an access line\"}\nnot json\n");
    let log_path = dir.path().join("access.jsonl");
    std::fs::write(&log_path, log).unwrap();

    let new_dir = dir.path().join("suggested");
    let (code, out, err) =
        text(&bin(&["policy", "suggest", "--log", s(&log_path), "--config", s(&cfg), "--write", s(&new_dir)]));
    assert_eq!(code, 0, "{out}{err}");
    for expect in [
        "# 7 denied requests read; 1 refused by a deny rule (not suggested)",
        "[policies.python]",
        "\"crates.io\",",
        "# 3 requests",
        "\"api.example.com:9443\",",
        "[policies.git]",
        "git.repos = [\n  \"acme/tools\",",
        "git.push = [\n  \"refs/heads/main\",",
    ] {
        assert!(out.contains(expect), "missing {expect:?} in:\n{out}");
    }
    assert!(!out.contains("upload.pypi.org"), "a deny rule's refusal is never suggested: {out}");
    let (code, out, _) =
        text(&bin(&["policy", "diff", "--config", s(&cfg), s(&dir.path().join("policy")), s(&new_dir)]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("+ allow \"crates.io\"") && out.contains("+ allow \"api.example.com:9443\""), "{out}");
    let (code, out, _) =
        text(&bin(&["policy", "suggest", "--log", s(&log_path), "--config", s(&cfg), "--sandbox", "sbx-git"]));
    assert_eq!(code, 0);
    assert!(!out.contains("crates.io") && out.contains("acme/tools"), "{out}");
}

/// `check` explains API-route decisions as it does host and git ones: the rule, its
/// file and line, and why; a policy naming a route the config does not define is a
/// load error naming the file and key.
#[test]
fn check_explains_route_decisions_with_file_and_line() {
    let policy = "[policies.api]\nallow = []\nroutes = [\n  \"llm\",\n]\n\n[[sandboxes]]\nid = \"sbx-api\"\ntoken_sha256 = \"@HASH@\"\npolicy = \"api\"\n";
    let (dir, cfg) = setup(
        policy,
        "[[routes]]\nname = \"llm\"\nupstream = \"https://llm.test\"\nmethods = [\"POST\"]\npaths = [\"/v1/\"]\ninject = { header = \"x-api-key\", secret_file = \"key.txt\" }\n",
    );
    std::fs::write(dir.path().join("key.txt"), "sk-test").unwrap();
    let c = s(&cfg);
    let check = |target: &str, method: &str| {
        let o = bin(&["check", "--config", c, "--sandbox", "sbx-api", target, "--method", method, "--json"]);
        let (code, out, err) = text(&o);
        assert!(code == 0 || code == 1, "{out}{err}");
        (code, serde_json::from_str::<serde_json::Value>(&out).unwrap())
    };
    let (code, v) = check("route:llm/v1/messages", "post");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["decision"], "allow");
    assert_eq!(v["rule_list"], "routes");
    assert_eq!(v["rule_location"], format!("{}:4", dir.path().join("policy/p.toml").display()));

    let (code, v) = check("route:llm/v1/messages", "DELETE");
    assert_eq!(code, 1);
    assert_eq!(v["reason"], "route_not_allowed");
    assert_eq!(v["hint"], "method DELETE is not allowed on route llm");
    let (_, v) = check("route:llm/admin", "POST");
    assert_eq!(v["hint"], "path /admin is not allowed on route llm");
    let (_, v) = check("route:llm/v1/../admin", "POST");
    assert_eq!(v["reason"], "bad_request");
    let (_, v) = check("route:other/v1/x", "POST");
    assert_eq!(v["reason"], "route_not_allowed");
    assert!(v["rule"].is_null());

    std::fs::write(dir.path().join("policy/p.toml"), policy.replace("\"llm\",", "\"llm\", \"typo\",")).unwrap();
    let (code, _, err) = text(&bin(&["check", "--config", c, "--sandbox", "sbx-api", "route:llm/v1/x"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("p.toml") && err.contains("policies.api.routes[1] (line 4)") && err.contains("\"typo\""),
        "{err}"
    );
}
