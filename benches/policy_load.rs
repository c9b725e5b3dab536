//! Policy loading at scale: the time to load (as `config validate` and start-up do) and
//! to reload (as SIGHUP and `POST /v1/reload` do) policy directories of 1k to 50k
//! sandboxes and 10k to 100k rules, with the time per sandbox and per rule, so that a
//! step that is not linear shows as a growing per-item cost.
//!
//!     cargo bench --bench policy_load
//!
//! While a slow reload runs, decisions keep being served from the old snapshot: the
//! bench also counts how many snapshots a second thread took during each reload.
//!
//! #23's cases: 100k rules with 10 and with 10,000 sandboxes, with the resident memory
//! the loaded state adds (`/proc/self/statm` around the load) and bytes per rule,
//! against the target of a reload under 1 s. Each runs in a fresh process of this
//! bench, so that no earlier case's freed memory is reused and hides the cost.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    reason = "a bench fails loudly and prints its table"
)]

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use egress_gateway::config;
use egress_gateway::reload::{self, Store};

const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// One policy file: `policies` policies of `rules` allow rules each, and `sandboxes`
/// sandboxes spread over them.
fn write_policy(dir: &Path, policies: usize, rules: usize, sandboxes: usize) {
    let mut text = String::with_capacity(64 * (policies * rules + sandboxes * 2));
    for p in 0..policies {
        let _ = write!(text, "[policies.p{p}]\nallow = [\n");
        for r in 0..rules {
            let _ = writeln!(text, "  \"host{r}.svc{p}.example.com\",");
        }
        text.push_str("]\ndeny = [\"upload.example.com\"]\n\n");
    }
    for s in 0..sandboxes {
        let _ = write!(
            text,
            "[[sandboxes]]\nid = \"sbx-{s:06}\"\ntoken_sha256 = \"{HASH}\"\npolicy = \"p{}\"\n\n",
            s % policies
        );
    }
    std::fs::write(dir.join("policy.toml"), text).expect("write policy");
}

struct Row {
    label: String,
    items: usize,
    load: Duration,
    reload: Duration,
    served_during_reload: u64,
    resident_bytes: Option<i64>,
}

/// Resident bytes of this process.
fn resident() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn measure(label: &str, policies: usize, rules: usize, sandboxes: usize, items: usize) -> Row {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("policy")).expect("mkdir");
    write_policy(&dir.path().join("policy"), policies, rules, sandboxes);
    let cfg_path = dir.path().join("gateway.toml");
    std::fs::write(&cfg_path, "[policy]\ndir = \"policy\"\n").expect("write config");

    let before = resident();
    let start = Instant::now();
    let cfg = config::load(&cfg_path).expect("config");
    let loaded = reload::load(&cfg).expect("policies load");
    let load = start.elapsed();
    let resident_bytes = resident().zip(before).map(|(a, b)| a - b);

    let store = Arc::new(Store::new(loaded));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let reader = {
        let (store, stop, served) = (store.clone(), stop.clone(), served.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = store.snapshot();
                std::hint::black_box(s.policies.sandbox("sbx-000001"));
                served.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let start = Instant::now();
    store.reload(&cfg).expect("reload");
    let reload = start.elapsed();
    let served_during_reload = served.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    Row { label: label.to_string(), items, load, reload, served_during_reload, resident_bytes }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing and wants a
    // quick smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    let only = std::env::var("POLICY_LOAD_ONLY").ok();
    let cases: &[(&str, usize, usize, usize, usize)] = if full {
        &[
            ("100k rules, 10 sandboxes", 1_000, 100, 10, 100_000),
            ("100k rules, 10k sandboxes", 1_000, 100, 10_000, 100_000),
            ("1k sandboxes", 10, 10, 1_000, 1_000),
            ("10k sandboxes", 10, 10, 10_000, 10_000),
            ("20k sandboxes", 10, 10, 20_000, 20_000),
            ("50k sandboxes", 10, 10, 50_000, 50_000),
            ("10k rules", 100, 100, 1_000, 10_000),
        ]
    } else {
        &[("1k sandboxes", 10, 10, 1_000, 1_000)]
    };
    if only.is_none() {
        println!("| case | load | reload | per item (load) | snapshots served during reload | resident | per rule |");
        println!("|---|---|---|---|---|---|---|");
    }
    for &(label, policies, rules, sandboxes, items) in cases {
        let memory_case = label.starts_with("100k rules");
        if only.as_deref().is_some_and(|o| o != label) {
            continue;
        }
        if memory_case && only.is_none() {
            let exe = std::env::current_exe().expect("current exe");
            let out = std::process::Command::new(exe)
                .arg("--bench")
                .env("POLICY_LOAD_ONLY", label)
                .output()
                .expect("run the case in a fresh process");
            print!("{}", String::from_utf8_lossy(&out.stdout));
            continue;
        }
        let r = measure(label, policies, rules, sandboxes, items);
        let per_item = r.load.as_secs_f64() * 1e6 / r.items as f64;
        let rules = policies * rules;
        let (resident, per_rule) = match r.resident_bytes {
            Some(b) if memory_case => (format!("{:.1} MiB", b as f64 / 1048576.0), format!("{} B", b / rules as i64)),
            _ => ("".into(), "".into()),
        };
        println!(
            "| {} | {:.0} ms | {:.0} ms | {:.1} µs | {} | {resident} | {per_rule} |",
            r.label,
            r.load.as_secs_f64() * 1e3,
            r.reload.as_secs_f64() * 1e3,
            per_item,
            r.served_during_reload
        );
        if label.starts_with("100k rules") {
            let met = if r.reload < Duration::from_secs(1) { "met" } else { "missed" };
            println!("|   target (#23): reload under 1 s | | {met} | | | | |");
        }
    }
}
