//! The container image, built and run for real: `Dockerfile.scratch` (the runtime
//! layout of `Dockerfile`: the binary, the shared libraries it links, a CA bundle, the
//! non-root user) from the binary cargo built, run read-only with every capability
//! dropped, on the host network (so it serves loopback only). Checks `/healthz`, the
//! image's own HEALTHCHECK, an allowed and a denied request through it, and that the
//! process runs as uid 65532.
//!
//! Needs a Docker engine: `.ci/run` installs Debian's docker.io and starts dockerd.
//! Without one the test fails and says so; it never passes silently.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::{TOKEN_A, TestOrigin, curl, sha256_hex};

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("docker is not installed ({e}): .ci/run installs docker.io"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Copies `from` to the same absolute path under `root`.
fn copy_into(root: &Path, from: &Path) {
    let to = root.join(from.strip_prefix("/").unwrap());
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

/// The image's root: the binary, every library `ldd` names (the loader included), the
/// CA bundle, and passwd/group entries for uid 65532.
fn rootfs(root: &Path, binary: &Path) {
    let bin = root.join("usr/local/bin/egress-gateway");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(binary, &bin).unwrap();
    let ldd = Command::new("ldd").arg(binary).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line.split("=>").last().unwrap_or("").split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            copy_into(root, Path::new(path));
            // The loader is also reached through its canonical path.
            if let Ok(real) = std::fs::canonicalize(path)
                && real != Path::new(path)
            {
                copy_into(root, &real);
            }
        }
    }
    if Path::new("/etc/ssl/certs/ca-certificates.crt").exists() {
        copy_into(root, Path::new("/etc/ssl/certs/ca-certificates.crt"));
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
    std::fs::create_dir_all(root.join("etc/egress-gateway")).unwrap();
}

struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

#[test]
fn the_image_runs_read_only_as_non_root_and_serves() {
    let info = docker(&["info", "--format", "{{.ServerVersion}}"]);
    assert!(
        info.status.success(),
        "no Docker engine answers on this machine, so the image cannot be tested (start dockerd; .ci/run does): {}",
        text(&info)
    );
    let ctx = tempfile::tempdir().unwrap();
    rootfs(&ctx.path().join("rootfs"), Path::new(env!("CARGO_BIN_EXE_egress-gateway")));
    let dockerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile.scratch");
    let tag = format!("egress-gateway-test:{}", std::process::id());
    let built = docker(&["build", "-q", "-t", &tag, "-f", dockerfile.to_str().unwrap(), ctx.path().to_str().unwrap()]);
    assert!(built.status.success(), "docker build: {}", text(&built));

    // Config and policy, mounted read-only where the image expects them.
    let origin = TestOrigin::http();
    let conf = tempfile::tempdir().unwrap();
    std::fs::create_dir(conf.path().join("policy")).unwrap();
    let port = |l: std::net::TcpListener| l.local_addr().unwrap().port();
    let (proxy_port, admin_port) = (
        port(std::net::TcpListener::bind("127.0.0.1:0").unwrap()),
        port(std::net::TcpListener::bind("127.0.0.1:0").unwrap()),
    );
    std::fs::write(
        conf.path().join("gateway.toml"),
        format!(
            "[proxy]\nlisten = \"127.0.0.1:{proxy_port}\"\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n[log]\nformat = \"json\"\n\
             [policy]\ndir = \"policy\"\nwatch_interval = \"0s\"\n[resolver]\nnameservers = [\"127.0.0.1:9\"]\nhosts_file = false\n\
             [resolver.hosts]\n\"origin.test\" = [\"127.0.0.1\"]\n\"other.test\" = [\"127.0.0.1\"]\n[egress]\nallow = [\"127.0.0.1/32\"]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        conf.path().join("policy/p.toml"),
        format!(
            "[policies.a]\nallow = [\"origin.test:*\"]\n[[sandboxes]]\nid = \"sbx-a\"\ntoken_sha256 = \"{}\"\npolicy = \"a\"\n",
            sha256_hex(TOKEN_A)
        ),
    )
    .unwrap();
    // Readable by the container's user.
    let _ = Command::new("chmod").args(["-R", "a+rX"]).arg(conf.path()).status();
    let mount = format!("{}:/etc/egress-gateway:ro", conf.path().display());
    let run = docker(&[
        "run",
        "-d",
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &mount,
        &tag,
    ]);
    assert!(run.status.success(), "docker run: {}", text(&run));
    let container = Container(String::from_utf8_lossy(&run.stdout).trim().to_string());

    // /healthz answers once it is up.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = curl(&["-s", &format!("http://127.0.0.1:{admin_port}/healthz")]);
        if out.status == 200 {
            break;
        }
        let logs = docker(&["logs", &container.0]);
        assert!(Instant::now() < deadline, "no /healthz: {out:?}\n{}", text(&logs));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The image's own HEALTHCHECK (egress-gateway health) reports healthy.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = docker(&["inspect", "-f", "{{.State.Health.Status}}", &container.0]);
        if text(&h).trim() == "healthy" {
            break;
        }
        assert!(Instant::now() < deadline, "HEALTHCHECK never healthy: {}", text(&h));
        std::thread::sleep(Duration::from_millis(500));
    }
    let proxy = format!("http://sbx-a:{TOKEN_A}@127.0.0.1:{proxy_port}");
    let allowed = curl(&["-x", &proxy, &format!("http://origin.test:{}/echo", origin.port())]);
    assert_eq!(allowed.status, 200, "{allowed:?}");
    let denied = curl(&["-x", &proxy, &format!("http://other.test:{}/echo", origin.port())]);
    assert_eq!(denied.status, 403, "{denied:?}");
    assert!(denied.body.contains("host_not_allowed"), "{denied:?}");

    // The process inside runs as the non-root user.
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &container.0]);
    let pid = text(&pid).trim().to_string();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default().to_string();
    assert!(uid.split_whitespace().skip(1).all(|u| u == "65532"), "{uid}");
    let caps = status.lines().find(|l| l.starts_with("CapEff:")).unwrap_or_default().to_string();
    assert!(caps.ends_with("0000000000000000"), "no effective capabilities: {caps}");
    drop(container);
    let _ = docker(&["rmi", "-f", &tag]);
}
