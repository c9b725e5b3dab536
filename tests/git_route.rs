//! The git route end to end: the real git client, the gateway, a local HTTPS "GitHub"
//! running `git http-backend` over bare repositories (test CA), and a fake GitHub API
//! that verifies the App's JWT and issues expiring installation tokens.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use support::github_api::FakeGithubApi;
use support::raw::{self, status};
use support::tls::TestCa;
use support::{TOKEN_A, TOKEN_B, TestGateway, TestOrigin, curl, sha256_hex};

fn git(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.test",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .output()
        .expect("run git")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "git failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Bare repositories `acme/widgets.git` and `other/secret.git` under a fresh root.
fn repos() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (owner, name) in [("acme", "widgets"), ("other", "secret")] {
        std::fs::create_dir_all(root.path().join(owner)).unwrap();
        let bare = root.path().join(owner).join(format!("{name}.git"));
        ok(git(root.path(), &["init", "--bare", bare.to_str().unwrap()]));
        ok(git(&bare, &["config", "http.receivepack", "true"]));
        let work = root.path().join(format!("seed-{name}"));
        std::fs::create_dir(&work).unwrap();
        ok(git(&work, &["init"]));
        std::fs::write(work.join("README"), format!("{name}\n")).unwrap();
        ok(git(&work, &["add", "README"]));
        ok(git(&work, &["commit", "-m", "seed"]));
        ok(git(&work, &["push", bare.to_str().unwrap(), "HEAD:refs/heads/main"]));
        ok(git(&work, &["push", bare.to_str().unwrap(), "HEAD:refs/heads/agent/old"]));
        ok(git(&bare, &["symbolic-ref", "HEAD", "refs/heads/main"]));
    }
    root
}

struct World {
    gw: TestGateway,
    github: TestOrigin,
    api: FakeGithubApi,
    _repos: tempfile::TempDir,
    _ca: TestCa,
    _keys: tempfile::TempDir,
}

const POLICY: &str = r#"
[policies.agents]
git = { repos = ["acme/widgets", "acme/tools-*"], push = ["refs/heads/agent/*"] }

[policies.plain]
allow = ["example.org"]

[[sandboxes]]
id = "sbx-a"
token_sha256 = "@A@"
policy = "agents"

[[sandboxes]]
id = "sbx-b"
token_sha256 = "@B@"
policy = "plain"
"#;

fn world(token_ttl_secs: u64, refresh_before: &str) -> World {
    world_with(token_ttl_secs, refresh_before, None)
}

/// With `static_token`, the App is replaced by a static token file for owner acme.
fn world_with(token_ttl_secs: u64, refresh_before: &str, static_token: Option<&str>) -> World {
    world_with_policy(token_ttl_secs, refresh_before, static_token, POLICY)
}

fn world_with_policy(token_ttl_secs: u64, refresh_before: &str, static_token: Option<&str>, policy: &str) -> World {
    world_full(token_ttl_secs, refresh_before, static_token, policy, "", "")
}

/// `api_prefix`: a path under the API host, as GitHub Enterprise Server has (`/api/v3`);
/// `github_extra`: more `[github]` keys.
fn world_full(
    token_ttl_secs: u64,
    refresh_before: &str,
    static_token: Option<&str>,
    policy: &str,
    api_prefix: &str,
    github_extra: &str,
) -> World {
    let ca = TestCa::new(&["github.test", "api.github.test"]);
    let repos = repos();
    let github = TestOrigin::git_https(&ca, repos.path().to_path_buf());
    let api = FakeGithubApi::start(&ca, token_ttl_secs);
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("app.pem");
    std::fs::write(&key_file, &api.private_key_pem).unwrap();
    let credentials = match static_token {
        None => format!("app_id = 1234\nprivate_key_file = \"{}\"\n", key_file.display()),
        Some(t) => {
            let f = keys.path().join("acme.token");
            std::fs::write(&f, format!("{t}\n")).unwrap();
            format!("[github.token_files]\nacme = \"{}\"\n", f.display())
        }
    };
    let config = format!(
        r#"
[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
[resolver.hosts]
"github.test" = ["127.0.0.1"]
"api.github.test" = ["127.0.0.1"]

[egress]
allow = ["127.0.0.1/32"]

[github]
web_url = "https://github.test:{web}"
api_url = "https://api.github.test:{api}{api_prefix}"
ca_file = "{ca}"
refresh_before = "{refresh_before}"
{github_extra}
{credentials}
"#,
        web = github.port(),
        api = api.addr.port(),
        ca = ca.ca_pem_path.display(),
    );
    let policy = policy.replace("@A@", &sha256_hex(TOKEN_A)).replace("@B@", &sha256_hex(TOKEN_B));
    let gw = TestGateway::start(&config, &policy);
    World { gw, github, api, _repos: repos, _ca: ca, _keys: keys }
}

impl World {
    /// git config that sends https://github.test/ through the gateway's origin-form route.
    fn insteadof(&self, user: &str, token: &str) -> [String; 2] {
        ["-c".into(), format!("url.http://{user}:{token}@{}/github.test/.insteadOf=https://github.test/", self.gw.addr)]
    }

    fn git_via(&self, dir: &Path, user: &str, token: &str, args: &[&str]) -> Output {
        let cfg = self.insteadof(user, token);
        let mut all: Vec<&str> = cfg.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        git(dir, &all)
    }

    fn repo_path(&self, owner: &str, name: &str) -> PathBuf {
        self._repos.path().join(owner).join(format!("{name}.git"))
    }
}

#[test]
fn clone_and_fetch_with_an_injected_token() {
    let w = world(3600, "5m");
    let work = tempfile::tempdir().unwrap();
    for v in ["0", "2"] {
        let dest = format!("v{v}");
        ok(w.git_via(
            work.path(),
            "sbx-a",
            TOKEN_A,
            &["-c", &format!("protocol.version={v}"), "clone", "https://github.test/acme/widgets.git", &dest],
        ));
        assert_eq!(std::fs::read_to_string(work.path().join(&dest).join("README")).unwrap(), "widgets\n");
    }
    ok(w.git_via(&work.path().join("v2"), "sbx-a", TOKEN_A, &["fetch", "origin"]));

    let recorded = w.github.recorded();
    assert!(!recorded.is_empty());
    for r in &recorded {
        let auth = r.headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone()).unwrap_or_default();
        assert!(auth.starts_with("Basic "), "the gateway's credential arrives: {r:?}");
        let decoded = base64_decode(auth.trim_start_matches("Basic "));
        assert!(decoded.starts_with("x-access-token:ghs_testtoken"), "{decoded}");
        let all = format!("{:?}", r.headers);
        assert!(!all.contains(TOKEN_A) && !all.contains("sbx-a"), "no sandbox credential upstream: {all}");
        assert!(!r.headers.iter().any(|(k, _)| k == "proxy-authorization" || k == "cookie"));
    }
    assert!(recorded.iter().any(|r| r.headers.iter().any(|(k, v)| k == "git-protocol" && v == "version=2")));
    assert_eq!(w.api.mint_count(), 1, "one read token for all of it");
    let req = &w.api.requests.lock().unwrap()[0];
    assert_eq!(req["repositories"], serde_json::json!(["widgets"]));
    assert_eq!(req["permissions"]["contents"], "read");
    let rec =
        w.gw.wait_for_log(Duration::from_secs(5), |v| v["log"] == "access" && v["kind"] == "git" && v["status"] == 200);
    assert_eq!(rec["target"], "github.test/acme/widgets");
    assert_eq!(rec["sandbox"], "sbx-a");
    let log = w.gw.log_text();
    assert!(!log.contains("ghs_testtoken") && !log.contains(TOKEN_A), "no token in logs");
}

fn base64_decode(s: &str) -> String {
    use base64::Engine;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap_or_default()).unwrap_or_default()
}

#[test]
fn absolute_form_through_the_proxy() {
    let w = world(3600, "5m");
    let work = tempfile::tempdir().unwrap();
    let proxy = w.gw.proxy_url("sbx-a", TOKEN_A);
    ok(git(work.path(), &["-c", &format!("http.proxy={proxy}"), "clone", "http://github.test/acme/widgets.git", "w"]));
    assert!(work.path().join("w/README").exists());
    let out =
        git(work.path(), &["-c", &format!("http.proxy={proxy}"), "clone", "http://github.test/other/secret.git", "s"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "fatal: remote error: repository other/secret is not connected to this sandbox (repo_not_connected)"
        ),
        "{}",
        stderr(&out)
    );
    // A `ws://` URL with a WebSocket handshake is dispatched as `http://` is: to the git
    // route, never forwarded around it.
    let auth = support::basic("sbx-a", TOKEN_A);
    for scheme in ["ws", "WS"] {
        let resp = raw::request(
            w.gw.addr,
            format!(
                "GET {scheme}://github.test/other/secret.git/info/refs?service=git-upload-pack HTTP/1.1\r\n\
                 Proxy-Authorization: {auth}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ),
        );
        assert!(resp.contains("repo_not_connected"), "{scheme}: {resp}");
    }
}

#[test]
fn unconnected_repositories_and_other_sandboxes_are_refused() {
    let w = world(3600, "5m");
    let work = tempfile::tempdir().unwrap();
    let out = w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/other/secret.git"]);
    assert!(!out.status.success());
    // git prints the reason, and how to change the policy.
    let err = stderr(&out);
    assert!(err.contains("remote error: repository other/secret is not connected to this sandbox"), "{err}");
    assert!(
        err.contains("(repo_not_connected); to connect it, add \"other/secret\" to policies.agents.git.repos"),
        "{err}"
    );
    let rec =
        w.gw.wait_for_log(Duration::from_secs(5), |v| v["log"] == "access" && v["reason"] == "repo_not_connected");
    assert_eq!(rec["target"], "github.test/other/secret");
    let out = w.git_via(work.path(), "sbx-b", TOKEN_B, &["clone", "https://github.test/acme/widgets.git", "b"]);
    assert!(!out.status.success(), "policy plain connects no repository");
    let out = w.git_via(work.path(), "sbx-a", "wrong-token", &["clone", "https://github.test/acme/widgets.git", "c"]);
    assert!(!out.status.success());
    assert!(w.github.recorded().is_empty(), "nothing refused reached GitHub");
    assert_eq!(w.api.mint_count(), 0);
}

#[test]
fn pushes_are_limited_to_allowed_refs() {
    let w = world(3600, "5m");
    let work = tempfile::tempdir().unwrap();
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "w"]));
    let clone = work.path().join("w");
    std::fs::write(clone.join("NEW"), "change\n").unwrap();
    ok(git(&clone, &["add", "NEW"]));
    ok(git(&clone, &["commit", "-m", "change"]));

    ok(w.git_via(&clone, "sbx-a", TOKEN_A, &["push", "origin", "HEAD:refs/heads/agent/fix-1"]));
    let refs = ok(git(&w.repo_path("acme", "widgets"), &["for-each-ref", "--format=%(refname)"]));
    assert!(refs.contains("refs/heads/agent/fix-1"), "{refs}");
    assert!(w.api.requests.lock().unwrap().iter().any(|r| r["permissions"]["contents"] == "write"));

    let out = w.git_via(&clone, "sbx-a", TOKEN_A, &["push", "origin", "HEAD:refs/heads/main"]);
    assert!(!out.status.success(), "main is not an agent ref");
    // As a forge reports a protected branch: per ref, with the reason.
    let err = stderr(&out);
    assert!(
        err.contains("! [remote rejected] HEAD -> main (git_ref_denied: refs/heads/main is not in git.push"),
        "{err}"
    );
    let out2 =
        w.git_via(&clone, "sbx-a", TOKEN_A, &["push", "origin", "HEAD:refs/heads/agent/ok", "HEAD:refs/heads/main"]);
    assert!(!out2.status.success(), "one bad ref refuses the whole push");
    let err = stderr(&out2);
    assert!(err.contains("HEAD -> agent/ok (not pushed: another ref in this push was refused)"), "{err}");
    let out3 = w.git_via(&clone, "sbx-a", TOKEN_A, &["push", "origin", ":refs/heads/agent/old"]);
    assert!(!out3.status.success(), "deletions need allow_delete");
    assert!(
        stderr(&out3).contains("deleting refs/heads/agent/old is not allowed (git.allow_delete)"),
        "{}",
        stderr(&out3)
    );
    let refs = ok(git(&w.repo_path("acme", "widgets"), &["for-each-ref", "--format=%(refname)"]));
    assert!(!refs.contains("refs/heads/agent/ok") && refs.contains("refs/heads/agent/old"), "{refs}");
    let denials: Vec<_> = w.gw.wait_for_access(3, |v| v["reason"] == "git_ref_denied");
    assert!(denials.len() >= 3, "{denials:?}");
}

#[test]
fn path_tricks_and_unsupported_paths() {
    let w = world(3600, "5m");
    let auth = support::basic("sbx-a", TOKEN_A);
    let cases = [
        ("GET /github.test/acme/../other/secret.git/info/refs?service=git-upload-pack HTTP/1.1", 400),
        ("GET /github.test/acme/widgets.git/info/refs?service=git-upload-pack&x=1 HTTP/1.1", 400),
        ("GET /github.test/acme/wid%67ets.git/info/refs?service=git-upload-pack HTTP/1.1", 400),
        ("GET /github.test/acme//widgets.git/info/refs?service=git-upload-pack HTTP/1.1", 400),
        ("GET /github.test/acme/widgets.git/HEAD HTTP/1.1", 403),
        ("POST /github.test/acme/widgets.git/info/lfs/objects/batch HTTP/1.1", 403),
        ("GET /github.test/acme/widgets.git/git-upload-pack HTTP/1.1", 400),
    ];
    for (line, code) in cases {
        let resp = raw::request(
            w.gw.addr,
            format!("{line}\r\nHost: gw\r\nAuthorization: {auth}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
        );
        assert_eq!(status(&resp), code, "{line}: {resp}");
        assert!(resp.contains("x-egress-deny-reason: bad_request"), "{line}: {resp}");
    }
    // No credentials: a 401 challenge git understands.
    let resp = raw::request(
        w.gw.addr,
        b"GET /github.test/acme/widgets.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: gw\r\n\r\n",
    );
    assert_eq!(status(&resp), 401, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("www-authenticate: basic realm=\"egress-gateway\""), "{resp}");
    // A push whose body carries a second Content-Encoding (all are forwarded) is refused.
    for codings in ["Content-Encoding: identity\r\nContent-Encoding: gzip", "Content-Encoding: identity, gzip"] {
        let resp = raw::request(
            w.gw.addr,
            format!(
                "POST /github.test/acme/widgets.git/git-receive-pack HTTP/1.1\r\nHost: gw\r\nAuthorization: {auth}\r\n\
                 Content-Type: application/x-git-receive-pack-request\r\n{codings}\r\nContent-Length: 4\r\n\r\n0000"
            )
            .as_bytes(),
        );
        assert_eq!(status(&resp), 400, "{codings}: {resp}");
        assert!(resp.contains("compressed push bodies are not supported"), "{resp}");
    }
    assert!(w.github.recorded().is_empty());
}

#[test]
fn many_clones_one_mint_and_refresh_after_expiry() {
    // Tokens live 3 s and are refreshed 1 s before expiry.
    let w = world(3, "1s");
    let work = tempfile::tempdir().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let cfg = w.insteadof("sbx-a", TOKEN_A);
            let dir = work.path().to_path_buf();
            std::thread::spawn(move || {
                let mut args: Vec<String> = cfg.to_vec();
                args.extend(["clone".into(), "https://github.test/acme/widgets.git".into(), format!("c{i}")]);
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                git(&dir, &refs).status.success()
            })
        })
        .collect();
    assert!(threads.into_iter().all(|t| t.join().unwrap()), "all clones succeed");
    assert_eq!(w.api.mint_count(), 1, "concurrent clones share one mint");
    std::thread::sleep(Duration::from_millis(2500));
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "later"]));
    assert_eq!(w.api.mint_count(), 2, "a token near expiry is replaced");
}

#[test]
fn large_blobs_stream_without_growing_the_gateway() {
    let w = world(3600, "5m");
    // 50 MB of incompressible data in one blob.
    let seed = w._repos.path().join("seed-widgets");
    let mut data = vec![0u8; 50 * 1024 * 1024];
    let mut x: u64 = 0x9E3779B97F4A7C15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(seed.join("big.bin"), &data).unwrap();
    drop(data);
    ok(git(&seed, &["add", "big.bin"]));
    ok(git(&seed, &["commit", "-m", "big"]));
    ok(git(&seed, &["push", w.repo_path("acme", "widgets").to_str().unwrap(), "HEAD:refs/heads/main"]));

    let hwm = || {
        let s = std::fs::read_to_string(format!("/proc/{}/status", w.gw.pid())).unwrap();
        s.lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap()
    };
    let work = tempfile::tempdir().unwrap();
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "small"]));
    let before = hwm();
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "big"]));
    let after = hwm();
    assert_eq!(std::fs::metadata(work.path().join("big/big.bin")).unwrap().len(), 50 * 1024 * 1024);
    // VmHWM folds in the current RSS as it is read, and the allocator returning pages
    // (madvise) lowers that without updating the recorded peak: a later reading can be
    // lower. Only growth counts.
    let grew = after.saturating_sub(before);
    assert!(grew < 20 * 1024, "gateway peak memory grew by {grew} KiB for a 50 MB clone");
}

#[test]
fn a_submodule_on_an_unconnected_repository_is_not_fetched() {
    let w = world(3600, "5m");
    // Point a submodule of acme/widgets at other/secret, by hand (no network).
    let seed = w._repos.path().join("seed-widgets");
    let secret_head = ok(git(&w.repo_path("other", "secret"), &["rev-parse", "HEAD"])).trim().to_string();
    std::fs::write(
        seed.join(".gitmodules"),
        "[submodule \"vendor/secret\"]\n\tpath = vendor/secret\n\turl = https://github.test/other/secret.git\n",
    )
    .unwrap();
    ok(git(&seed, &["add", ".gitmodules"]));
    ok(git(&seed, &["update-index", "--add", "--cacheinfo", &format!("160000,{secret_head},vendor/secret")]));
    ok(git(&seed, &["commit", "-m", "submodule"]));
    ok(git(&seed, &["push", w.repo_path("acme", "widgets").to_str().unwrap(), "HEAD:refs/heads/main"]));

    let work = tempfile::tempdir().unwrap();
    let out = w.git_via(
        work.path(),
        "sbx-a",
        TOKEN_A,
        &["clone", "--recurse-submodules", "https://github.test/acme/widgets.git", "w"],
    );
    assert!(work.path().join("w/README").exists(), "the connected repository cloned");
    assert!(!work.path().join("w/vendor/secret/README").exists(), "the unconnected submodule did not");
    assert!(!out.status.success() || stderr(&out).contains("403"), "{}", stderr(&out));
    w.gw.wait_for_log(Duration::from_secs(5), |v| {
        v["reason"] == "repo_not_connected" && v["target"] == "github.test/other/secret"
    });
}

#[test]
fn a_static_token_file_per_owner() {
    let w = world_with(3600, "5m", Some("ghp_staticowner0123"));
    let work = tempfile::tempdir().unwrap();
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "w"]));
    let auth =
        w.github.recorded()[0].headers.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.clone()).unwrap();
    assert_eq!(base64_decode(auth.trim_start_matches("Basic ")), "x-access-token:ghp_staticowner0123");
    assert_eq!(w.api.mint_count(), 0);
    assert!(!w.gw.log_text().contains("ghp_staticowner0123"));
}

/// Report mode lets host decisions through to try out an allowlist; it must never make
/// the gateway lend its own GitHub credential for what the git rules refuse.
#[test]
fn report_mode_never_lends_the_gateways_credential() {
    let policy = POLICY.replace(
        "[policies.agents]\ngit = { repos = [\"acme/widgets\", \"acme/tools-*\"], push = [\"refs/heads/agent/*\"] }",
        "[policies.agents]\nmode = \"report\"\ngit = { repos = [\"acme/widgets\"] }",
    );
    assert!(policy.contains("mode = \"report\""), "{policy}");
    let w = world_with_policy(3600, "5m", Some("ghp_staticowner0123"), &policy);
    let work = tempfile::tempdir().unwrap();
    // A repository the policy does not connect.
    let out = w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/other/secret.git", "s"]);
    assert!(!out.status.success(), "report mode cloned an unconnected repository");
    // The connected one clones; pushing to it, with no git.push rules, does not.
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "w"]));
    let clone = work.path().join("w");
    std::fs::write(clone.join("NEW"), "change\n").unwrap();
    ok(git(&clone, &["add", "NEW"]));
    ok(git(&clone, &["commit", "-m", "change"]));
    let before = ok(git(&w.repo_path("acme", "widgets"), &["for-each-ref", "--format=%(refname) %(objectname)"]));
    let out = w.git_via(&clone, "sbx-a", TOKEN_A, &["push", "origin", "HEAD:refs/heads/main"]);
    assert!(!out.status.success(), "report mode pushed without git.push rules");
    let out = w.git_via(&clone, "sbx-a", TOKEN_A, &["push", "origin", ":refs/heads/main"]);
    assert!(!out.status.success(), "report mode deleted main");
    let after = ok(git(&w.repo_path("acme", "widgets"), &["for-each-ref", "--format=%(refname) %(objectname)"]));
    assert_eq!(before, after, "no ref changed upstream");
    assert!(
        w.github.recorded().iter().all(|r| r.uri.contains("acme/widgets") && !r.uri.contains("git-receive-pack")),
        "only the connected repository's reads reached GitHub"
    );
    let refused = w.gw.wait_for_access(3, |v| v["kind"] == "git" && v["reason"].is_string());
    assert!(refused.iter().all(|v| v["decision"] == "deny"), "logged as deny, not would_deny: {refused:?}");
}

/// GitHub Enterprise Server's API lives under a path (`https://ghe.example.com/api/v3`):
/// accepted by config validation and kept on every API call.
#[test]
fn github_enterprise_api_url_with_a_path_prefix() {
    let w = world_full(3600, "5m", None, POLICY, "/api/v3", "");
    let work = tempfile::tempdir().unwrap();
    ok(w.git_via(work.path(), "sbx-a", TOKEN_A, &["clone", "https://github.test/acme/widgets.git", "w"]));
    assert_eq!(w.api.mint_count(), 1);
    assert!(
        w.api.prefixed.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "installation lookup and mint under /api/v3"
    );
}

/// A push is registered before its command list is read: a reload that revokes the
/// sandbox's credential while the list trickles in ends it, and nothing reaches GitHub
/// with the gateway's write credential.
#[test]
fn a_push_whose_credential_is_revoked_mid_command_list_never_reaches_github() {
    use std::io::Write;
    let w = world(3600, "5m");
    let chunk = |b: &[u8]| {
        let mut c = format!("{:x}\r\n", b.len()).into_bytes();
        c.extend_from_slice(b);
        c.extend_from_slice(b"\r\n");
        c
    };
    let a = "a".repeat(40);
    let zero = "0".repeat(40);
    let payload = format!("{zero} {a} refs/heads/agent/late\0report-status\n");
    let commands = format!("{:04x}{payload}0000PACK", payload.len() + 4);
    let mut s = raw::connect(w.gw.addr);
    write!(
        s,
        "POST /github.test/acme/widgets.git/git-receive-pack HTTP/1.1\r\nHost: gw\r\nAuthorization: {}\r\n\
         Content-Type: application/x-git-receive-pack-request\r\nTransfer-Encoding: chunked\r\n\r\n",
        support::basic("sbx-a", TOKEN_A)
    )
    .unwrap();
    s.write_all(&chunk(&commands.as_bytes()[..10])).unwrap();
    s.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Rotate sbx-a's token and reload while the command list is still arriving.
    let policy = POLICY.replace("@A@", &sha256_hex("a-new-token")).replace("@B@", &sha256_hex(TOKEN_B));
    std::fs::write(w.gw.dir.path().join("policy/test.toml"), policy).unwrap();
    w.gw.signal("HUP");
    w.gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "closing a connection");
    let _ = s.write_all(&chunk(&commands.as_bytes()[10..]));
    let _ = s.write_all(b"0\r\n\r\n");
    let resp = raw::read_response(&mut s);
    assert_ne!(status(&resp), 200, "{resp}");
    assert!(resp.contains("no longer allows it"), "{resp}");
    assert!(w.github.recorded().iter().all(|r| !r.uri.contains("git-receive-pack")), "nothing reached GitHub");
    assert_eq!(w.api.mint_count(), 0, "no write credential was minted");
}

#[test]
fn a_refused_large_push_shows_the_refusal() {
    // A client that writes a whole push before it reads (as urllib does) must read the
    // 401 for a wrong token, not a reset connection: the gateway reads the body first.
    let w = world(3600, "5m");
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("pack");
    std::fs::write(&upload, vec![b'0'; 32 << 20]).unwrap();
    let script = r#"
import base64, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], data=open(sys.argv[2], "rb").read(), method="POST", headers={
    "Authorization": "Basic " + base64.b64encode(b"sbx-a:not-the-token").decode(),
    "Content-Type": "application/x-git-receive-pack-request"})
try:
    urllib.request.urlopen(req, timeout=20)
    print("no refusal")
except urllib.error.HTTPError as e:
    print("status", e.code, e.headers.get("x-egress-deny-reason"))
except Exception as e:
    print("error", e)
"#;
    let url = format!("http://{}/github.test/acme/widgets.git/git-receive-pack", w.gw.addr);
    let out = Command::new("python3").args(["-c", script, &url]).arg(&upload).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("status 401 auth_invalid"), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(w.github.recorded().is_empty());
}

#[test]
fn a_github_that_echoes_the_token_never_hands_it_to_the_sandbox() {
    let w = world_with(3600, "5m", Some("ghp_STATICtoken0123456789"));
    let auth = support::basic("sbx-a", TOKEN_A);
    let resp = raw::request(
        w.gw.addr,
        format!(
            "GET /github.test/acme/tools-echo.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: gw\r\n\
             Authorization: {auth}\r\n\r\n"
        ),
    );
    assert_eq!(status(&resp), 302, "{resp}");
    assert_eq!(w.github.recorded().len(), 1, "the request reached the echoing upstream");
    let b64 = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s);
    let basic = b64("x-access-token:ghp_STATICtoken0123456789");
    let bare = b64("ghp_STATICtoken0123456789");
    // Raw, as the Basic value (URL-encoded in the redirect, unpadded), base64 alone.
    for leaked in ["ghp_STATICtoken0123456789", basic.trim_end_matches('='), bare.trim_end_matches('=')] {
        assert!(!resp.contains(leaked), "{leaked} in {resp}");
    }
    assert!(resp.contains("[REDACTED]"), "{resp}");
}

/// A sandbox names the repository, so it chooses what the App mints: it may cause at
/// most `github.sandbox_mints_per_minute` mints, and a failed mint is answered from the
/// cache for a while, so no sandbox spends the App's API rate limit for the others.
#[test]
fn a_sandbox_cannot_spend_the_apps_token_mints() {
    let w = world_full(3600, "5m", None, POLICY, "", "sandbox_mints_per_minute = 5");
    let refs = |repo: &str| {
        curl(&[&format!(
            "http://sbx-a:{TOKEN_A}@{}/github.test/acme/{repo}.git/info/refs?service=git-upload-pack",
            w.gw.addr
        )])
    };
    let statuses: Vec<u16> = (0..8).map(|i| refs(&format!("tools-nx{i}")).status).collect();
    assert!(statuses[..5].iter().all(|s| *s != 429) && statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    assert_eq!(w.api.mint_count(), 5);
    let out = refs("tools-nx7");
    assert!(out.body.contains("limit_exceeded") && out.body.contains("sandbox_mints_per_minute"), "{out:?}");
    // A repository already minted for is served from the cache, over the limit too.
    assert_ne!(refs("tools-nx0").status, 429);
    assert_eq!(w.api.mint_count(), 5);
    drop(w);

    // A second sandbox on the same policy.
    const TOKEN_C: &str = "token-c-7e6d5c4b3a29180716f5e4d3";
    let policy = format!(
        "{POLICY}\n[[sandboxes]]\nid = \"sbx-c\"\ntoken_sha256 = \"{}\"\npolicy = \"agents\"\n",
        sha256_hex(TOKEN_C)
    );
    let w = world_with_policy(3600, "5m", None, &policy);
    let missing = |user: &str, token: &str| {
        curl(&[&format!(
            "http://{user}:{token}@{}/github.test/acme/tools-missing.git/info/refs?service=git-upload-pack",
            w.gw.addr
        )])
    };
    for _ in 0..3 {
        let out = missing("sbx-a", TOKEN_A);
        assert_eq!(out.status, 502, "{out:?}");
    }
    assert_eq!(w.api.mint_count(), 1, "a failed mint is remembered, not asked again");
    // For the sandbox that asked: another is not held to its failure (the repository
    // may exist by now).
    assert_eq!(missing("sbx-c", TOKEN_C).status, 502);
    assert_eq!(w.api.mint_count(), 2);
}

/// A GET with a body is never sent on with the gateway's credential: a server that
/// ignores a GET's body would read it as a second request no rule judged.
#[test]
fn a_ref_advertisement_with_a_body_is_refused() {
    let w = world(3600, "5m");
    let body = "POST /acme/private.git/git-receive-pack HTTP/1.1\r\nHost: github.test\r\nX-Swallow: ";
    let resp = raw::request(
        w.gw.addr,
        format!(
            "GET /github.test/acme/widgets.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: gw\r\n\
             Authorization: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            support::basic("sbx-a", TOKEN_A),
            body.len()
        ),
    );
    assert_eq!(status(&resp), 400, "{resp}");
    assert!(resp.contains("GET or HEAD request with a body"), "{resp}");
    assert!(w.github.recorded().is_empty(), "nothing reached GitHub");
}
