//! Load benchmark: egress-gateway against Squid and tinyproxy (each configured for the
//! same job: basic auth, a destination allowlist, no cache, access logging) and a
//! direct connection, in one run, on loopback. Run it through `bash benches/load.sh`,
//! which installs the peers; `cargo bench --bench load` works once they are present.
//!
//! Measures, per proxy: CONNECT setups per second (connect, CONNECT, one small GET,
//! close) with p50/p99; absolute-form keep-alive requests per second with p50/p99
//! (wrk); tunnel throughput (4 streams of 1 GiB); resident memory per idle tunnel
//! (5,000 idle tunnels); CPU seconds per GiB relayed. Every phase is bounded in time.
//!
//! Environment: LOAD_SECONDS (per rate phase, default 5), LOAD_IDLE_TUNNELS (5000),
//! LOAD_STREAM_MIB (1024 per stream), LOAD_ONLY (comma list of gateway,squid,tinyproxy,direct),
//! LOAD_GATEWAY_THREADS (the gateway's `proxy.threads`, default 0: one per CPU).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout, reason = "bench output")]

#[path = "load/client.rs"]
mod client;
#[path = "load/origin.rs"]
mod origin;
#[path = "load/peers.rs"]
mod peers;

use std::time::Duration;

use peers::Proxy;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One proxy's figures; `None` where a figure does not apply (direct has no tunnels).
#[derive(Default, Clone)]
struct Row {
    setups: f64,
    setup_p50: Duration,
    setup_p99: Duration,
    rps: f64,
    rps_p50: Duration,
    rps_p99: Duration,
    gibps: f64,
    cpu_per_gib: Option<f64>,
    idle_kib: Option<f64>,
}

fn main() {
    let secs = Duration::from_secs(env_u64("LOAD_SECONDS", 5));
    let idle_n = env_u64("LOAD_IDLE_TUNNELS", 5000) as usize;
    let stream_bytes = env_u64("LOAD_STREAM_MIB", 1024) << 20;
    let only = std::env::var("LOAD_ONLY").unwrap_or_else(|_| "gateway,squid,tinyproxy,direct".into());

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let origins = rt.block_on(origin::Origins::start(stream_bytes));
    // Logs go to tmpfs where there is one: tinyproxy syncs its log file after every
    // line, which on a disk would measure the disk rather than the proxy.
    let shm = std::path::Path::new("/dev/shm");
    let work = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();

    let mut rows: Vec<(&str, Row)> = Vec::new();
    for name in ["gateway", "squid", "tinyproxy", "direct"] {
        if !only.split(',').any(|o| o == name) {
            continue;
        }
        let proxy = match name {
            "gateway" => Proxy::gateway(work.path(), &origins),
            "squid" => Proxy::squid(work.path(), &origins),
            "tinyproxy" => Proxy::tinyproxy(work.path(), &origins),
            _ => Proxy::direct(),
        };
        eprintln!("== {name}");
        let row = rt.block_on(measure(&proxy, &origins, secs, idle_n, stream_bytes));
        rows.push((name, row));
        drop(proxy);
        // Let TIME_WAIT sockets and the previous proxy's exit settle.
        std::thread::sleep(Duration::from_secs(2));
    }
    print_table(&rows, idle_n, stream_bytes);
}

async fn measure(p: &Proxy, o: &origin::Origins, secs: Duration, idle_n: usize, stream_bytes: u64) -> Row {
    let mut row = Row::default();
    let setups = client::connect_setups(p, o.http, 32, secs).await;
    (row.setups, row.setup_p50, row.setup_p99) = (setups.rate, setups.p50, setups.p99);
    eprintln!(
        "  CONNECT setups: {:.0}/s p50 {:?} p99 {:?} (p90 {:?} p99.9 {:?} max {:?}; {} errors)",
        setups.rate, setups.p50, setups.p99, setups.tail[0], setups.tail[1], setups.tail[2], setups.errors
    );

    let ka = client::wrk_keepalive(p, o.http, 32, secs);
    (row.rps, row.rps_p50, row.rps_p99) = (ka.rate, ka.p50, ka.p99);
    eprintln!("  keep-alive: {:.0} req/s p50 {:?} p99 {:?} ({} errors)", ka.rate, ka.p50, ka.p99, ka.errors);

    let cpu_before = p.cpu_seconds();
    let tp = client::throughput(p, o.source, 4, stream_bytes, Duration::from_secs(120)).await;
    let cpu = p.cpu_seconds().zip(cpu_before).map(|(a, b)| a - b);
    let gib = tp.bytes as f64 / f64::from(1u32 << 30);
    row.gibps = gib / tp.elapsed.as_secs_f64();
    row.cpu_per_gib = cpu.map(|c| c / gib);
    eprintln!("  throughput: {:.2} GiB/s ({} bytes in {:?}), cpu {:?} s", row.gibps, tp.bytes, tp.elapsed, cpu);

    if p.is_proxy() {
        let idle = client::idle_tunnels(p, o.hold, idle_n).await;
        row.idle_kib = idle;
        eprintln!("  idle tunnels: {idle:?} KiB each");
    }
    row
}

fn print_table(rows: &[(&str, Row)], idle_n: usize, stream_bytes: u64) {
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0);
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    let header: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    println!();
    println!("| metric | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(rows.len()));
    type Cell = Box<dyn Fn(&Row) -> String>;
    let lines: Vec<(&str, Cell)> = vec![
        ("CONNECT setups/s", Box::new(|r: &Row| format!("{:.0}", r.setups))),
        ("CONNECT p50 ms", Box::new(move |r: &Row| ms(r.setup_p50))),
        ("CONNECT p99 ms", Box::new(move |r: &Row| ms(r.setup_p99))),
        ("keep-alive req/s", Box::new(|r: &Row| format!("{:.0}", r.rps))),
        ("keep-alive p50 ms", Box::new(move |r: &Row| ms(r.rps_p50))),
        ("keep-alive p99 ms", Box::new(move |r: &Row| ms(r.rps_p99))),
        ("tunnel GiB/s (4 streams)", Box::new(|r: &Row| format!("{:.2}", r.gibps))),
        ("proxy CPU s per GiB", Box::new(move |r: &Row| opt(r.cpu_per_gib, 2))),
        ("KiB per idle tunnel", Box::new(move |r: &Row| opt(r.idle_kib, 1))),
    ];
    for (name, cell) in &lines {
        let cells: Vec<String> = rows.iter().map(|(_, r)| cell(r)).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    let Some((_, gw)) = rows.iter().find(|(n, _)| *n == "gateway") else { return };
    println!();
    println!("gateway ratios (higher is better for rates, lower for latency, memory and CPU):");
    for (name, r) in rows.iter().filter(|(n, _)| *n != "gateway") {
        let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}x", a / b) } else { "-".into() };
        let mut parts = vec![
            format!("setups {}", ratio(gw.setups, r.setups)),
            format!("setup p99 {}", ratio(gw.setup_p99.as_secs_f64(), r.setup_p99.as_secs_f64())),
            format!("keep-alive {}", ratio(gw.rps, r.rps)),
            format!("throughput {}", ratio(gw.gibps, r.gibps)),
        ];
        if let (Some(a), Some(b)) = (gw.idle_kib, r.idle_kib) {
            parts.push(format!("idle memory {}", ratio(a, b)));
        }
        if let (Some(a), Some(b)) = (gw.cpu_per_gib, r.cpu_per_gib) {
            parts.push(format!("CPU/GiB {}", ratio(a, b)));
        }
        println!("  vs {name}: {}", parts.join(", "));
    }
    println!();
    println!(
        "{} idle tunnels; {} streams of {} MiB; machine: {} cores, {}",
        idle_n,
        4,
        stream_bytes >> 20,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                .split(':')
                .nth(1)
                .unwrap_or("")
                .trim()
                .to_string()))
            .unwrap_or_default()
    );
}
