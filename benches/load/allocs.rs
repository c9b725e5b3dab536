//! Allocator calls per CONNECT setup, counted the way the README's note describes:
//! `perf` uprobes on the C library's allocation functions, attached to the proxy's
//! process tree for a setups phase of its own (every probed call traps into the
//! kernel, so that phase's CPU and rate are not used for anything else).
//!
//! Needs root and `perf` with uprobe support (`benches/load.sh` installs `linux-perf`);
//! without them the bench says why and reports the figure as not measured.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The functions probed: the first four make a new block, `realloc` may, `free` ends one.
const NEW_BLOCK: [&str; 4] = ["malloc", "calloc", "posix_memalign", "aligned_alloc"];
const OTHERS: [&str; 2] = ["realloc", "free"];
/// The group `perf probe` puts the bench's probes in.
const GROUP: &str = "gwbench";

/// Probes added to one C library for the bench's life; removed on drop.
pub struct Probes {
    events: Vec<String>,
}

/// Calls counted over one phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Calls that make a new block (malloc, calloc, posix_memalign, aligned_alloc).
    pub allocations: u64,
    pub reallocs: u64,
    pub frees: u64,
}

/// A running `perf stat`.
pub struct Counting {
    child: Child,
    events: usize,
}

fn perf(args: &[&str]) -> Result<std::process::Output, String> {
    Command::new("perf").args(args).stdin(Stdio::null()).output().map_err(|e| format!("perf: {e}"))
}

/// The C library `pid` has mapped.
fn libc_of(pid: u32) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).map(PathBuf::from)
}

impl Probes {
    /// Adds the probes to the C library `pid` uses (the same file every proxy here
    /// maps), or says why it cannot.
    pub fn install(pid: u32) -> Result<Probes, String> {
        let lib = libc_of(pid).ok_or_else(|| format!("no libc.so mapped by pid {pid}"))?;
        let lib = lib.to_str().ok_or("libc path is not UTF-8")?.to_string();
        // Probes left by an interrupted run would make `--add` fail.
        let _ = perf(&["probe", "-q", "-d", &format!("{GROUP}:*")]);
        let mut events = Vec::new();
        for f in NEW_BLOCK.iter().chain(&OTHERS) {
            let spec = format!("{GROUP}:{f}={f}");
            let out = perf(&["probe", "-q", "-x", &lib, "--add", &spec])?;
            if !out.status.success() {
                let _ = perf(&["probe", "-q", "-d", &format!("{GROUP}:*")]);
                return Err(format!("perf probe {spec}: {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
            events.push(format!("{GROUP}:{f}"));
        }
        Ok(Probes { events })
    }

    /// Starts counting the probed calls in `pids`.
    pub fn start(&self, pids: &[u32]) -> Result<Counting, String> {
        if pids.is_empty() {
            return Err("no process to count".into());
        }
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", &self.events.join(","), "-p", &list.join(",")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("perf stat: {e}"))?;
        // perf attaches after it starts; give it a moment before the phase begins.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(Counting { child, events: self.events.len() })
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        let _ = perf(&["probe", "-q", "-d", &format!("{GROUP}:*")]);
    }
}

impl Counting {
    /// Stops `perf stat` and reads its counts.
    pub fn finish(self) -> Result<Counts, String> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        let out = self.child.wait_with_output().map_err(|e| format!("perf stat: {e}"))?;
        let text = String::from_utf8_lossy(&out.stderr);
        let mut counts = Counts::default();
        let mut seen = 0;
        // CSV lines: count,unit,event,...
        for line in text.lines() {
            let f: Vec<&str> = line.split(',').collect();
            let (Some(n), Some(event)) = (f.first().and_then(|n| n.parse::<u64>().ok()), f.get(2)) else {
                continue;
            };
            let name = event.rsplit(':').next().unwrap_or("");
            seen += 1;
            match name {
                "realloc" => counts.reallocs += n,
                "free" => counts.frees += n,
                _ if NEW_BLOCK.contains(&name) => counts.allocations += n,
                _ => seen -= 1,
            }
        }
        if seen < self.events {
            return Err(format!("perf stat gave {seen} of {} counts: {}", self.events, text.trim()));
        }
        Ok(counts)
    }
}
