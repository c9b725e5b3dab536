//! The real git client through the gateway's absolute-form proxy path to a local
//! `git http-backend` (smart HTTP over plain HTTP). The git route with credential
//! injection is a separate feature; this proves ordinary proxying carries git.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::path::Path;
use std::process::Command;

use support::{STANDARD_CONFIG, TOKEN_A, TOKEN_B, TestGateway, TestOrigin, standard_policy};

fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.test", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .output()
        .expect("run git")
}

fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "git failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bare repository `widgets.git` with one commit, under a fresh root.
fn repo_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    ok(git(root.path(), &["init", "--bare", "widgets.git"]));
    let work = root.path().join("seed");
    std::fs::create_dir(&work).unwrap();
    ok(git(&work, &["init"]));
    std::fs::write(work.join("README"), "widgets\n").unwrap();
    ok(git(&work, &["add", "README"]));
    ok(git(&work, &["commit", "-m", "seed"]));
    ok(git(&work, &["push", root.path().join("widgets.git").to_str().unwrap(), "HEAD:refs/heads/main"]));
    ok(git(&root.path().join("widgets.git"), &["symbolic-ref", "HEAD", "refs/heads/main"]));
    root
}

#[test]
fn clone_fetch_and_push_through_the_proxy() {
    let root = repo_root();
    let origin = TestOrigin::git(root.path().to_path_buf());
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let proxy = gw.proxy_url("sbx-a", TOKEN_A);
    let url = format!("http://origin.test:{}/git/widgets.git", origin.port());
    let work = tempfile::tempdir().unwrap();

    for version in ["0", "2"] {
        let dest = format!("clone-v{version}");
        ok(git(
            work.path(),
            &["-c", &format!("http.proxy={proxy}"), "-c", &format!("protocol.version={version}"), "clone", &url, &dest],
        ));
        assert_eq!(std::fs::read_to_string(work.path().join(&dest).join("README")).unwrap(), "widgets\n");
    }
    let clone = work.path().join("clone-v2");
    ok(git(&clone, &["config", "http.proxy", &proxy]));
    std::fs::write(clone.join("NEW"), "change\n").unwrap();
    ok(git(&clone, &["add", "NEW"]));
    ok(git(&clone, &["commit", "-m", "change"]));
    ok(git(&clone, &["push", "origin", "HEAD:refs/heads/agent/x"]));
    ok(git(&clone, &["fetch", "origin"]));
    let refs = ok(git(&root.path().join("widgets.git"), &["for-each-ref", "--format=%(refname)"]));
    assert!(refs.contains("refs/heads/agent/x"), "{refs}");

    // Git protocol v2 travels as the Git-Protocol header.
    assert!(
        origin.recorded().iter().any(|r| r.headers.iter().any(|(k, v)| k == "git-protocol" && v == "version=2")),
        "Git-Protocol header forwarded"
    );
    assert!(origin.recorded().iter().all(|r| !format!("{:?}", r.headers).contains(TOKEN_A)));
    let logs = gw.wait_for_access(1, |l| l["method"] == "POST" && l["status"] == 200);
    assert!(logs.iter().any(|l| l["method"] == "POST" && l["status"] == 200), "{logs:?}");
    assert!(!gw.log_text().contains(TOKEN_A));
}

#[test]
fn clone_by_a_sandbox_without_the_host_fails_visibly() {
    let root = repo_root();
    let origin = TestOrigin::git(root.path().to_path_buf());
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let work = tempfile::tempdir().unwrap();
    let out = git(
        work.path(),
        &[
            "-c",
            &format!("http.proxy={}", gw.proxy_url("sbx-b", TOKEN_B)),
            "clone",
            &format!("http://origin.test:{}/git/widgets.git", origin.port()),
            "x",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("403"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(origin.recorded().is_empty());
}
