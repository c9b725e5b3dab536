//! Load benchmark: egress-gateway against Squid and tinyproxy (each configured for the
//! same job: basic auth, a destination allowlist, no cache, access logging), a bare
//! relay and keep-alive forwarder with none of that (`load/relay.rs`, the floor under
//! any proxy here) and a direct connection, in one run, on loopback. Run it through `bash benches/load.sh`,
//! which installs the peers; `cargo bench --bench load` works once they are present.
//!
//! Measures, per proxy: CONNECT setups per second (connect, CONNECT, one small GET,
//! close) with p50/p99; absolute-form keep-alive requests per second with p50/p99
//! (wrk); tunnel throughput (4 streams of 1 GiB); resident memory per idle tunnel
//! (5,000 idle tunnels); the proxy's CPU per setup, per request and per GiB relayed
//! (each thread's exact run time, `peers::CpuTime`);
//! and CPU per setup again with 10 tunnels open and with the idle tunnels open (a
//! setup's cost must not grow with what is open; `LOAD_IDLE_TUNNELS=9000` for #23);
//! and the allocator calls per setup, counted with `perf` uprobes (`load/allocs.rs`).
//! Every phase is bounded in time.
//!
//! The proxies take turns for LOAD_ROUNDS rounds (default 3); the table gives each
//! figure's median over the rounds, and each ratio's median with its range, every ratio
//! taken within one round, so a slow minute on a shared machine moves one round only.
//!
//! Environment: LOAD_SECONDS (per rate phase, default 5), LOAD_IDLE_TUNNELS (5000),
//! LOAD_STREAM_MIB (1024 per stream), LOAD_ONLY (comma list of gateway, gateway-budget
//! (a budget on the policy, counted locally), gateway-redis (the same counted in a
//! `redis-server` the bench starts), gateway-b (the binary at LOAD_GATEWAY_B, for an A/B
//! of two builds in one run), gateway-signed (an EdDSA signed token instead of the
//! static one), gateway-transparent (setups through the transparent HTTP
//! listener instead of CONNECT), squid, tinyproxy, relay, direct),
//! LOAD_ALLOCS (0: do not count allocator calls), LOAD_GATEWAY_THREADS (the gateway's `proxy.threads`, default 0: one per CPU),
//! LOAD_PROXY_CPUS and LOAD_CLIENT_CPUS (`taskset` CPU lists for the proxies and for
//! this process, the load generator and origins; unset: no pinning).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::print_stdout, reason = "bench output")]

#[path = "load/allocs.rs"]
mod allocs;
#[path = "load/client.rs"]
mod client;
#[path = "load/origin.rs"]
mod origin;
#[path = "load/peers.rs"]
mod peers;
#[path = "load/relay.rs"]
mod relay;

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
    /// The proxy's CPU (user plus system, with its children) per CONNECT setup and per
    /// keep-alive request, in µs.
    cpu_per_setup: Option<f64>,
    cpu_per_request: Option<f64>,
    idle_kib: Option<f64>,
    /// CPU per setup while 10 tunnels, and while the idle tunnels, are open (#23: the
    /// cost of a setup must not grow with what is open).
    cpu_per_setup_10: Option<f64>,
    cpu_per_setup_idle: Option<f64>,
    /// Allocator calls per CONNECT setup (`allocs.rs`): new blocks, and frees.
    allocs_per_setup: Option<f64>,
    frees_per_setup: Option<f64>,
}

fn main() {
    if let Ok(listen) = std::env::var(relay::LISTEN_VAR) {
        relay::serve(&listen);
        return;
    }
    peers::pin_client();
    let secs = Duration::from_secs(env_u64("LOAD_SECONDS", 5));
    let idle_n = env_u64("LOAD_IDLE_TUNNELS", 5000) as usize;
    let stream_bytes = env_u64("LOAD_STREAM_MIB", 1024) << 20;
    let only = std::env::var("LOAD_ONLY").unwrap_or_else(|_| {
        "gateway,gateway-signed,gateway-budget,gateway-redis,gateway-transparent,squid,tinyproxy,relay,direct".into()
    });

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let origins = rt.block_on(origin::Origins::start(stream_bytes));
    // Logs go to tmpfs where there is one: tinyproxy syncs its log file after every
    // line, which on a disk would measure the disk rather than the proxy.
    let shm = std::path::Path::new("/dev/shm");
    let work = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();

    // Allocator calls per setup need perf uprobes; LOAD_ALLOCS=0 skips them.
    let probes = match env_u64("LOAD_ALLOCS", 1) {
        0 => None,
        _ => allocs::Probes::install(std::process::id())
            .inspect_err(|e| eprintln!("allocations per setup not counted: {e}"))
            .ok(),
    };
    let rounds = env_u64("LOAD_ROUNDS", 3).max(1);
    let names: Vec<&str> = [
        "gateway",
        "gateway-b",
        "gateway-signed",
        "gateway-budget",
        "gateway-redis",
        "gateway-transparent",
        "squid",
        "tinyproxy",
        "relay",
        "direct",
    ]
    .into_iter()
    .filter(|n| only.split(',').any(|o| o == *n))
    .collect();
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); names.len()];
    for round in 1..=rounds {
        for (name, rows) in names.iter().zip(&mut runs) {
            let proxy = match *name {
                "gateway" => Proxy::gateway(work.path(), &origins),
                "gateway-b" => Proxy::gateway_b(work.path(), &origins),
                "gateway-signed" => Proxy::gateway_signed(work.path(), &origins),
                "gateway-transparent" => Proxy::gateway_transparent(work.path(), &origins),
                "gateway-budget" => Proxy::gateway_with(work.path(), &origins, peers::Budgets::Local),
                "gateway-redis" => Proxy::gateway_with(work.path(), &origins, peers::Budgets::Redis),
                "squid" => Proxy::squid(work.path(), &origins),
                "tinyproxy" => Proxy::tinyproxy(work.path(), &origins),
                "relay" => Proxy::relay(work.path(), &origins),
                _ => Proxy::direct(),
            };
            eprintln!("== {name} (round {round} of {rounds})");
            rows.push(rt.block_on(measure(&proxy, &origins, secs, idle_n, stream_bytes, probes.as_ref())));
            drop(proxy);
            // Let TIME_WAIT sockets and the previous proxy's exit settle.
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let runs: Vec<(&str, Vec<Row>)> = names.into_iter().zip(runs).collect();
    print_table(&runs, idle_n, stream_bytes);
}

async fn measure(
    p: &Proxy,
    o: &origin::Origins,
    secs: Duration,
    idle_n: usize,
    stream_bytes: u64,
    probes: Option<&allocs::Probes>,
) -> Row {
    let mut row = Row::default();
    let cpu_before = p.cpu_seconds();
    let setups = client::connect_setups(p, o.http, 32, secs).await;
    (row.setups, row.setup_p50, row.setup_p99) = (setups.rate, setups.p50, setups.p99);
    row.cpu_per_setup = cpu_per_op(p, cpu_before, setups.count);
    eprintln!(
        "  CONNECT setups: {:.0}/s p50 {:?} p99 {:?} (p90 {:?} p99.9 {:?} max {:?}; {} errors), cpu {:?} µs each",
        setups.rate,
        setups.p50,
        setups.p99,
        setups.tail[0],
        setups.tail[1],
        setups.tail[2],
        setups.errors,
        row.cpu_per_setup
    );
    if let Some(probes) = probes.filter(|_| p.is_proxy()) {
        (row.allocs_per_setup, row.frees_per_setup) = count_allocations(p, o, probes, secs).await;
    }

    // The transparent listener in the bench reaches one origin port only: setups.
    if p.transparent {
        return row;
    }
    if p.forwards() {
        let cpu_before = p.cpu_seconds();
        let ka = client::wrk_keepalive(p, o.http, 32, secs);
        (row.rps, row.rps_p50, row.rps_p99) = (ka.rate, ka.p50, ka.p99);
        row.cpu_per_request = cpu_per_op(p, cpu_before, ka.count);
        eprintln!(
            "  keep-alive: {:.0} req/s p50 {:?} p99 {:?} ({} errors), cpu {:?} µs each",
            ka.rate, ka.p50, ka.p99, ka.errors, row.cpu_per_request
        );
    }

    let cpu_before = p.cpu_seconds();
    let tp = client::throughput(p, o.source, 4, stream_bytes, Duration::from_secs(120)).await;
    let cpu = p.cpu_seconds().zip(cpu_before).map(|(a, b)| a.since(&b));
    let gib = tp.bytes as f64 / f64::from(1u32 << 30);
    row.gibps = gib / tp.elapsed.as_secs_f64();
    row.cpu_per_gib = cpu.map(|c| c / gib);
    eprintln!("  throughput: {:.2} GiB/s ({} bytes in {:?}), cpu {:?} s", row.gibps, tp.bytes, tp.elapsed, cpu);

    if p.is_proxy() {
        // Setups with 10 tunnels open, then with every idle tunnel open.
        let (_, ten) = client::idle_tunnels(p, o.hold, 10).await;
        row.cpu_per_setup_10 = setups_cpu(p, o, secs).await;
        drop(ten);
        let (idle, open) = client::idle_tunnels(p, o.hold, idle_n).await;
        row.idle_kib = idle;
        eprintln!("  idle tunnels: {idle:?} KiB each");
        row.cpu_per_setup_idle = setups_cpu(p, o, secs).await;
        eprintln!(
            "  CPU per setup with 10 / {} tunnels open: {:?} / {:?} µs",
            open.len(),
            row.cpu_per_setup_10,
            row.cpu_per_setup_idle
        );
        drop(open);
    }
    row
}

/// Allocator calls per CONNECT setup over a setups phase of its own (at most 2 s: the
/// probes slow every call): new blocks and frees, or `None` with the reason printed.
async fn count_allocations(
    p: &Proxy,
    o: &origin::Origins,
    probes: &allocs::Probes,
    secs: Duration,
) -> (Option<f64>, Option<f64>) {
    let counting = match probes.start(&p.pids()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("  allocations not counted: {e}");
            return (None, None);
        }
    };
    let s = client::connect_setups(p, o.http, 32, secs.min(Duration::from_secs(2))).await;
    match counting.finish() {
        Ok(c) if s.count > 0 => {
            let per = |n: u64| n as f64 / s.count as f64;
            eprintln!(
                "  allocator calls per setup ({} setups): {:.1} new blocks, {:.1} realloc, {:.1} free",
                s.count,
                per(c.allocations),
                per(c.reallocs),
                per(c.frees)
            );
            (Some(per(c.allocations)), Some(per(c.frees)))
        }
        Ok(_) => (None, None),
        Err(e) => {
            eprintln!("  allocations not counted: {e}");
            (None, None)
        }
    }
}

/// CPU per CONNECT setup over a setups phase of `secs`.
async fn setups_cpu(p: &Proxy, o: &origin::Origins, secs: Duration) -> Option<f64> {
    let before = p.cpu_seconds();
    let s = client::connect_setups(p, o.http, 32, secs).await;
    cpu_per_op(p, before, s.count)
}

/// The proxy's CPU since `before`, in µs per operation; `None` for direct (no proxy
/// process) or when nothing completed.
fn cpu_per_op(p: &Proxy, before: Option<peers::CpuTime>, ops: u64) -> Option<f64> {
    let used = p.cpu_seconds().zip(before).map(|(after, before)| after.since(&before))?;
    (ops > 0).then(|| used * 1e6 / ops as f64)
}

/// `get(of) / get(to)` within each round, where both have the figure.
fn round_ratios(get: fn(&Row) -> Option<f64>, of: &[Row], to: &[Row]) -> Vec<f64> {
    of.iter()
        .zip(to)
        .filter_map(|(a, b)| Some((get(a)?, get(b)?)))
        .filter(|(_, b)| *b > 0.0)
        .map(|(a, b)| a / b)
        .collect()
}

/// The median of `values` (the upper one of an even count; 0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Each figure's median over the rounds.
fn median_row(rows: &[Row]) -> Row {
    let f = |get: &dyn Fn(&Row) -> f64| median(rows.iter().map(get).collect());
    let d = |get: &dyn Fn(&Row) -> Duration| Duration::from_secs_f64(f(&|r| get(r).as_secs_f64()));
    let o = |get: &dyn Fn(&Row) -> Option<f64>| {
        let v: Option<Vec<f64>> = rows.iter().map(get).collect();
        v.filter(|v| !v.is_empty()).map(median)
    };
    Row {
        setups: f(&|r| r.setups),
        setup_p50: d(&|r| r.setup_p50),
        setup_p99: d(&|r| r.setup_p99),
        rps: f(&|r| r.rps),
        rps_p50: d(&|r| r.rps_p50),
        rps_p99: d(&|r| r.rps_p99),
        gibps: f(&|r| r.gibps),
        cpu_per_gib: o(&|r| r.cpu_per_gib),
        cpu_per_setup: o(&|r| r.cpu_per_setup),
        cpu_per_request: o(&|r| r.cpu_per_request),
        idle_kib: o(&|r| r.idle_kib),
        cpu_per_setup_10: o(&|r| r.cpu_per_setup_10),
        cpu_per_setup_idle: o(&|r| r.cpu_per_setup_idle),
        allocs_per_setup: o(&|r| r.allocs_per_setup),
        frees_per_setup: o(&|r| r.frees_per_setup),
    }
}

fn print_table(runs: &[(&str, Vec<Row>)], idle_n: usize, stream_bytes: u64) {
    let rows: Vec<(&str, Row)> = runs.iter().map(|(n, r)| (*n, median_row(r))).collect();
    let rounds = runs.first().map_or(0, |(_, r)| r.len());
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0);
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    // A zero rate: the phase did not run (the transparent row forwards no requests).
    let keep_alive = |r: &Row, cell: String| if r.rps > 0.0 { cell } else { "-".to_string() };
    let header: Vec<&str> = rows.iter().map(|(n, _)| *n).collect();
    println!();
    println!("medians of {rounds} round(s):");
    println!("| metric | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(rows.len()));
    type Cell = Box<dyn Fn(&Row) -> String>;
    let lines: Vec<(&str, Cell)> = vec![
        ("CONNECT setups/s", Box::new(|r: &Row| format!("{:.0}", r.setups))),
        ("CONNECT p50 ms", Box::new(move |r: &Row| ms(r.setup_p50))),
        ("CONNECT p99 ms", Box::new(move |r: &Row| ms(r.setup_p99))),
        ("proxy CPU µs per setup", Box::new(move |r: &Row| opt(r.cpu_per_setup, 0))),
        ("allocations per setup", Box::new(move |r: &Row| opt(r.allocs_per_setup, 1))),
        ("frees per setup", Box::new(move |r: &Row| opt(r.frees_per_setup, 1))),
        ("keep-alive req/s", Box::new(move |r: &Row| keep_alive(r, format!("{:.0}", r.rps)))),
        ("keep-alive p50 ms", Box::new(move |r: &Row| keep_alive(r, ms(r.rps_p50)))),
        ("keep-alive p99 ms", Box::new(move |r: &Row| keep_alive(r, ms(r.rps_p99)))),
        ("proxy CPU µs per request", Box::new(move |r: &Row| opt(r.cpu_per_request, 1))),
        ("tunnel GiB/s (4 streams)", Box::new(|r: &Row| format!("{:.2}", r.gibps))),
        ("proxy CPU s per GiB", Box::new(move |r: &Row| opt(r.cpu_per_gib, 2))),
        ("KiB per idle tunnel", Box::new(move |r: &Row| opt(r.idle_kib, 1))),
        ("proxy CPU µs per setup, 10 tunnels open", Box::new(move |r: &Row| opt(r.cpu_per_setup_10, 0))),
        ("proxy CPU µs per setup, idle tunnels open", Box::new(move |r: &Row| opt(r.cpu_per_setup_idle, 0))),
    ];
    for (name, cell) in &lines {
        let cells: Vec<String> = rows.iter().map(|(_, r)| cell(r)).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cores = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).and_then(|l| l.split(':').nth(1));
    let pinning = match (peers::env_var("LOAD_PROXY_CPUS"), peers::env_var("LOAD_CLIENT_CPUS")) {
        (None, None) => String::new(),
        (p, c) => format!(
            "; proxies on CPUs {}, load generator on CPUs {}",
            p.as_deref().unwrap_or("any"),
            c.as_deref().unwrap_or("any")
        ),
    };
    println!();
    println!(
        "{idle_n} idle tunnels; 4 streams of {} MiB; machine: {cores} cores, {}{pinning}",
        stream_bytes >> 20,
        model.unwrap_or("").trim()
    );
    let Some((_, gw)) = runs.iter().find(|(n, _)| *n == "gateway") else { return };
    println!();
    println!("gateway ratios, each within one round: median (range); higher is better for rates,");
    println!("lower for latency, memory and CPU:");
    type Metric = fn(&Row) -> Option<f64>;
    let metrics: [(&str, Metric); 8] = [
        ("setups", |r| Some(r.setups)),
        ("setup p99", |r| Some(r.setup_p99.as_secs_f64())),
        ("CPU/setup", |r| r.cpu_per_setup),
        ("keep-alive", |r| Some(r.rps)),
        ("CPU/request", |r| r.cpu_per_request),
        ("throughput", |r| Some(r.gibps)),
        ("idle memory", |r| r.idle_kib),
        ("CPU/GiB", |r| r.cpu_per_gib),
    ];
    for (name, peer) in runs.iter().filter(|(n, _)| !n.starts_with("gateway")) {
        let mut parts = Vec::new();
        for (label, get) in &metrics {
            let ratios = round_ratios(*get, gw, peer);
            if ratios.is_empty() {
                continue;
            }
            let (lo, hi) = ratios.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
            let range = if ratios.len() > 1 { format!(" ({lo:.2}-{hi:.2})") } else { String::new() };
            parts.push(format!("{label} {:.2}x{range}", median(ratios)));
        }
        println!("  vs {name}: {}", parts.join(", "));
    }
    // #23's targets, each a ratio within one round (median over the rounds).
    let ratio = |get: Metric, of: &[Row], to: &[Row]| -> Option<f64> {
        let r = round_ratios(get, of, to);
        (!r.is_empty()).then(|| median(r))
    };
    let peer = |name: &str| runs.iter().find(|(n, _)| *n == name).map(|(_, r)| r.as_slice());
    let targets: [(&str, Metric, &str, f64); 6] = [
        ("CPU per CONNECT setup", |r| r.cpu_per_setup, "relay", 1.05),
        ("CPU per CONNECT setup", |r| r.cpu_per_setup, "squid", 0.5),
        ("CPU per keep-alive request", |r| r.cpu_per_request, "squid", 0.3),
        ("CPU per GiB relayed", |r| r.cpu_per_gib, "relay", 1.05),
        ("KiB per idle tunnel", |r| r.idle_kib, " KiB", 4.0),
        ("allocations per CONNECT setup", |r| r.allocs_per_setup, "", 8.0),
    ];
    println!();
    println!("targets (#23):");
    for (what, get, against, target) in targets {
        // An `against` that is a unit (leading space or empty) is an absolute figure.
        let absolute = against.is_empty() || against.starts_with(' ');
        let got = if absolute {
            get(&median_row(gw)).map(|v| (v, format!("{v:.1}{against}")))
        } else {
            peer(against).and_then(|p| ratio(get, gw, p)).map(|r| (r, format!("{r:.2}x {against}")))
        };
        let unit = if absolute { against.to_string() } else { format!("x {against}") };
        match got {
            Some((v, shown)) => {
                let verdict = if v <= target { "met" } else { "missed" };
                println!("  {what}: {shown} (target at most {target}{unit}): {verdict}");
            }
            None => println!("  {what}: not measured in this run (target at most {target}{unit})"),
        }
    }
    // The keep-alive target's floor: what the bare forwarder itself spends against
    // Squid, and the gateway against it, in the same rounds.
    if let (Some(relay), Some(squid)) = (peer("relay"), peer("squid"))
        && let (Some(floor), Some(over)) =
            (ratio(|r| r.cpu_per_request, relay, squid), ratio(|r| r.cpu_per_request, gw, relay))
    {
        println!(
            "  CPU per keep-alive request, the floor: the bare forwarder {floor:.2}x squid; the gateway {over:.2}x the bare forwarder"
        );
    }
    // A setup's cost as tunnels stay open: within each round, against the first phase.
    for (label, get) in [
        ("10 tunnels open", (|r: &Row| r.cpu_per_setup_10) as Metric),
        ("the idle tunnels open", |r: &Row| r.cpu_per_setup_idle),
    ] {
        let growth = |rows: &[Row]| {
            let grown: Vec<f64> =
                rows.iter().filter_map(|r| Some(get(r)? / r.cpu_per_setup?)).filter(|v| v.is_finite()).collect();
            (!grown.is_empty()).then(|| median(grown))
        };
        // The bare relay holds nothing per tunnel but its sockets: how much the
        // kernel's own cost grows with what is open, in the same run.
        let floor = peer("relay").and_then(growth).map(|g| format!("; the bare relay {g:.2}x")).unwrap_or_default();
        match growth(gw) {
            None => println!("  CPU per setup with {label}: not measured in this run (target at most 1.1x)"),
            Some(m) => {
                let verdict = if m <= 1.1 { "met" } else { "missed" };
                println!("  CPU per setup with {label}: {m:.2}x with none (target at most 1.1x{floor}): {verdict}");
            }
        }
    }
    // What each variant (budgets, signed tokens, transparent) costs against the plain
    // gateway, within each round.
    let costs: [(&str, Metric); 4] = [
        ("CPU/setup", |r| r.cpu_per_setup),
        ("CPU/request", |r| r.cpu_per_request),
        ("CPU/GiB", |r| r.cpu_per_gib),
        ("idle memory", |r| r.idle_kib),
    ];
    for (name, with) in runs.iter().filter(|(n, _)| n.starts_with("gateway-")) {
        let parts: Vec<String> =
            costs.iter().filter_map(|(label, get)| ratio(*get, with, gw).map(|r| format!("{label} {r:.2}x"))).collect();
        println!("  {name} against gateway: {}", parts.join(", "));
    }
}
