//! Clone throughput of a large repository through the gateway's git route against the
//! same clone straight from the local backend (`git http-backend` over TLS), in one
//! run, alternating, 3 rounds each.
//!
//!     cargo bench --bench git_clone
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout, reason = "bench output")]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use support::tls::TestCa;
use support::{TOKEN_A, TestGateway, TestOrigin, sha256_hex};

const SIZE_MB: usize = 100;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@example.test", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        // The environment's CA bundle would override http.sslCAInfo.
        .env_remove("GIT_SSL_CAINFO")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn main() {
    let root = tempfile::tempdir().unwrap();
    let bare = root.path().join("acme/big.git");
    std::fs::create_dir_all(root.path().join("acme")).unwrap();
    git(root.path(), &["init", "--bare", bare.to_str().unwrap()]);
    let seed = root.path().join("seed");
    std::fs::create_dir(&seed).unwrap();
    git(&seed, &["init"]);
    let mut data = vec![0u8; SIZE_MB * 1024 * 1024];
    let mut x: u64 = 0x2545F4914F6CDD1D;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(seed.join("blob.bin"), &data).unwrap();
    drop(data);
    git(&seed, &["add", "."]);
    git(&seed, &["commit", "-qm", "big"]);
    git(&seed, &["push", "-q", bare.to_str().unwrap(), "HEAD:refs/heads/main"]);
    git(&bare, &["symbolic-ref", "HEAD", "refs/heads/main"]);

    let ca = TestCa::new(&["github.test", "127.0.0.1"]);
    let origin = TestOrigin::git_https(&ca, root.path().to_path_buf());
    let token_file = root.path().join("acme.token");
    std::fs::write(&token_file, "ghp_benchtoken\n").unwrap();
    let config = format!(
        "[resolver]\nnameservers = [\"127.0.0.1:9\"]\nhosts_file = false\n[resolver.hosts]\n\"github.test\" = [\"127.0.0.1\"]\n[egress]\nallow = [\"127.0.0.1/32\"]\n[log]\nlevel = \"warn\"\n[github]\nweb_url = \"https://github.test:{}\"\nca_file = \"{}\"\n[github.token_files]\nacme = \"{}\"\n",
        origin.port(),
        ca.ca_pem_path.display(),
        token_file.display()
    );
    let policy = format!(
        "[policies.p]\ngit = {{ repos = [\"acme/*\"] }}\n[[sandboxes]]\nid = \"sbx\"\ntoken_sha256 = \"{}\"\npolicy = \"p\"\n",
        sha256_hex(TOKEN_A)
    );
    let gw = TestGateway::start(&config.replace("[log]\nlevel = \"warn\"\n", ""), &policy);

    let work = tempfile::tempdir().unwrap();
    let direct_url = format!("https://127.0.0.1:{}/acme/big.git", origin.port());
    let ca_opt = format!("http.sslCAInfo={}", ca.ca_pem_path.display());
    let via = format!("url.http://sbx:{TOKEN_A}@{}/github.test/.insteadOf=https://github.test/", gw.addr);
    let (mut direct, mut gateway) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let d = work.path().join(format!("d{round}"));
        let t = Instant::now();
        git(work.path(), &["-c", &ca_opt, "clone", "-q", &direct_url, d.to_str().unwrap()]);
        direct.push(t.elapsed().as_secs_f64());
        let g = work.path().join(format!("g{round}"));
        let t = Instant::now();
        git(work.path(), &["-c", &via, "clone", "-q", "https://github.test/acme/big.git", g.to_str().unwrap()]);
        gateway.push(t.elapsed().as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (d, g) = (median(&mut direct), median(&mut gateway));
    let mb = SIZE_MB as f64;
    println!("clone of a {SIZE_MB} MB repository (median of 3), git http-backend over TLS on loopback");
    println!("  direct:  {d:.2} s  {:.1} MB/s", mb / d);
    println!("  gateway: {g:.2} s  {:.1} MB/s", mb / g);
    println!("  gateway/direct throughput: {:.2}", d / g);
}
