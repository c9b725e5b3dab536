//! The proxies under test, each configured for the same job: basic auth with one
//! credential, only 127.0.0.1 allowed as a destination, no cache, access logging on.
//! Also the process-tree accounting (CPU seconds, resident memory) the bench reads.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;

pub const USER: &str = "bench";
pub const TOKEN: &str = "bench-token-0123456789abcdef";

pub struct Proxy {
    pub name: &'static str,
    /// `None`: direct connections to the origin.
    pub addr: Option<SocketAddr>,
    /// The proxy password the clients send: `TOKEN`, or the gateway's signed token.
    secret: String,
    child: Option<Child>,
    /// A service the proxy needs (the gateway's Redis), not counted as the proxy's.
    service: Option<Child>,
    /// `addr` is a transparent HTTP listener: no CONNECT, the destination is the
    /// `Host` header's name ([`TRANSPARENT_HOST`]) on the bench origin's port.
    pub transparent: bool,
}

/// The name the transparent row's requests carry in `Host` (resolved to 127.0.0.1).
pub const TRANSPARENT_HOST: &str = "origin.bench";

/// Which gateway: as configured for the peers' job, or with an egress budget on its
/// policy counted locally or in Redis (`redis-server` started for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budgets {
    Off,
    Local,
    Redis,
}

/// A `redis-server` on a free loopback port, answering PING.
#[allow(clippy::zombie_processes, reason = "returned to the Proxy, which kills and waits for it on drop")]
fn redis_server(d: &Path) -> (Child, u16) {
    let port = free_port();
    let mut child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (benches/load.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        use std::io::{Read, Write};
        let pong = TcpStream::connect(("127.0.0.1", port)).ok().and_then(|mut s| {
            s.write_all(b"PING\r\n").ok()?;
            let mut b = [0u8; 7];
            s.read_exact(&mut b).ok()?;
            Some(b == *b"+PONG\r\n")
        });
        if pong == Some(true) {
            return (child, port);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_listening(addr: SocketAddr, child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("proxy exited with {status}: {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(Instant::now() < deadline, "proxy did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An environment variable's value, `None` when unset or empty.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The command that starts a proxy: under `taskset` when `LOAD_PROXY_CPUS` pins the
/// proxies to some CPUs (inherited by every process and thread they start).
fn proxy_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    match env_var("LOAD_PROXY_CPUS") {
        Some(cpus) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(cpus).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// With `LOAD_CLIENT_CPUS`, pins this process (the load generator and the origins; call
/// it before any thread starts, so that every later thread and `wrk` inherit it).
pub fn pin_client() {
    if let Some(cpus) = env_var("LOAD_CLIENT_CPUS") {
        let ok = Command::new("taskset")
            .args(["-p", "-c", &cpus, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "taskset -p -c {cpus} failed");
    }
}

fn spawn(name: &'static str, cmd: &mut Command, port: u16, log: &Path) -> Proxy {
    let err = std::fs::File::create(log).unwrap();
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(err).spawn().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_listening(addr, &mut child, log);
    Proxy { name, addr: Some(addr), secret: TOKEN.into(), child: Some(child), service: None, transparent: false }
}

/// Writes the gateway's policy (one sandbox, `allow`, then `policy_extra`) and config
/// (as for the peers' job, then `config_extra`) into `d`; returns its proxy port.
fn gateway_files(d: &Path, allow: &str, policy_extra: &str, config_extra: &str) -> u16 {
    std::fs::create_dir_all(d.join("policy")).unwrap();
    let port = free_port();
    let hash = hex::encode(egress_gateway::auth::token_sha256(TOKEN));
    let threads = std::env::var("LOAD_GATEWAY_THREADS").unwrap_or_else(|_| "0".into());
    std::fs::write(
        d.join("policy/bench.toml"),
        format!(
            "[policies.bench]\nallow = [\"{allow}\"]\n{policy_extra}\n[[sandboxes]]\nid = \"{USER}\"\ntoken_sha256 = \"{hash}\"\npolicy = \"bench\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("gateway.toml"),
        format!(
            r#"[proxy]
listen = "127.0.0.1:{port}"
max_connections = 30000
# Every bench tunnel is one sandbox's: no per-sandbox cap (it would stop the idle
# phase at 30000 / 16).
sandbox_max_connections = 0
threads = {threads}
sandbox_max_concurrent = 0
sandbox_max_per_second = 0
[log]
format = "json"
level = "info"
[policy]
dir = "policy"
watch_interval = "0s"
[admin]
listen = "127.0.0.1:0"
[resolver]
nameservers = ["127.0.0.1:9"]
hosts_file = false
[egress]
allow = ["127.0.0.1/32"]
{config_extra}"#
        ),
    )
    .unwrap();
    port
}

/// With `LOAD_GATEWAY_TOKEN=hs256|eddsa`: a `[tokens]` section with one key of that
/// kind (its files written to `d`), for a signed token minted once the config exists.
fn signed_token_section(d: &Path, alg: &str) -> String {
    match alg {
        "hs256" => {
            std::fs::write(d.join("hs.secret"), "bench-hs256-secret-0123456789abcdef-0123456789").unwrap();
            format!(
                "[tokens]\n[[tokens.keys]]\nkid = \"k\"\nalg = \"HS256\"\nsecret_file = \"{}\"\n",
                d.join("hs.secret").display()
            )
        }
        "eddsa" => {
            let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
            std::fs::write(d.join("ed.key"), kp.serialize_pem()).unwrap();
            std::fs::write(d.join("ed.pub"), kp.public_key_pem()).unwrap();
            format!(
                "[tokens]\n[[tokens.keys]]\nkid = \"k\"\nalg = \"EdDSA\"\npublic_key_file = \"{}\"\nprivate_key_file = \"{}\"\n",
                d.join("ed.pub").display(),
                d.join("ed.key").display()
            )
        }
        other => panic!("LOAD_GATEWAY_TOKEN={other}: expected hs256 or eddsa"),
    }
}

fn dir(work: &Path, name: &str) -> std::path::PathBuf {
    let d = work.join(name);
    std::fs::create_dir_all(&d).unwrap();
    // Squid and tinyproxy drop privileges when started as root.
    let _ = Command::new("chmod").arg("-R").arg("a+rwx").arg(work).status();
    d
}

impl Proxy {
    pub fn gateway(work: &Path, o: &super::origin::Origins) -> Proxy {
        Proxy::gateway_with(work, o, Budgets::Off)
    }

    /// The gateway as configured for the peers' job, run from another build
    /// (`LOAD_GATEWAY_B`, a path to an `egress-gateway` binary): an A/B of a change
    /// within one run.
    pub fn gateway_b(work: &Path, o: &super::origin::Origins) -> Proxy {
        let mut p = Proxy::gateway_built(work, o, Budgets::Off, env_var("LOAD_GATEWAY_B").as_deref());
        p.name = "gateway-b";
        p
    }

    pub fn gateway_with(work: &Path, o: &super::origin::Origins, budgets: Budgets) -> Proxy {
        Proxy::gateway_built(work, o, budgets, None)
    }

    /// The gateway with an EdDSA signed token as the sandbox's credential instead of
    /// the static one (#23: report signed tokens too).
    pub fn gateway_signed(work: &Path, o: &super::origin::Origins) -> Proxy {
        let mut p = Proxy::gateway_token(work, o, Budgets::Off, None, Some("eddsa"));
        p.name = "gateway-signed";
        p
    }

    /// The gateway's transparent HTTP listener (`transparent.sandbox` the bench
    /// sandbox, `http_port` the origin's): what a program that ignores `HTTP_PROXY`
    /// costs, against CONNECT.
    pub fn gateway_transparent(work: &Path, o: &super::origin::Origins) -> Proxy {
        let d = dir(work, "gateway");
        let listen = free_port();
        let extra = format!(
            "[resolver.hosts]\n\"{TRANSPARENT_HOST}\" = [\"127.0.0.1\"]\n[transparent]\nhttp_listen = \"127.0.0.1:{listen}\"\n\
             sandbox = \"{USER}\"\nhttp_port = {}\n",
            o.http.port()
        );
        gateway_files(&d, &format!("{TRANSPARENT_HOST}:*"), "", &extra);
        let mut cmd = proxy_command(env!("CARGO_BIN_EXE_egress-gateway"));
        cmd.args(["serve", "--config"]).arg(d.join("gateway.toml"));
        let mut proxy = spawn("gateway-transparent", &mut cmd, listen, &d.join("gateway.log"));
        proxy.transparent = true;
        proxy
    }

    fn gateway_built(work: &Path, o: &super::origin::Origins, budgets: Budgets, bin: Option<&str>) -> Proxy {
        Proxy::gateway_token(work, o, budgets, bin, env_var("LOAD_GATEWAY_TOKEN").as_deref())
    }

    fn gateway_token(
        work: &Path,
        _o: &super::origin::Origins,
        budgets: Budgets,
        bin: Option<&str>,
        signed: Option<&str>,
    ) -> Proxy {
        let d = dir(work, "gateway");
        // Budgets large enough never to refuse: what is measured is their counting.
        let budget = match budgets {
            Budgets::Off => "",
            Budgets::Local | Budgets::Redis => {
                "[policies.bench.budget]\nwindow = \"1h\"\nupload_bytes = \"1TiB\"\ndownload_bytes = \"1TiB\"\nrequests = 1000000000\nnew_hosts = 1000\n"
            }
        };
        let (service, limits) = match budgets {
            Budgets::Redis => {
                let (child, port) = redis_server(&d);
                (Some(child), format!("[limits]\nstore = \"redis://127.0.0.1:{port}/0\"\n"))
            }
            _ => (None, String::new()),
        };
        let tokens = signed.map(|alg| signed_token_section(&d, alg)).unwrap_or_default();
        let port = gateway_files(&d, "127.0.0.1:*", budget, &format!("{limits}{tokens}"));
        let mut cmd = proxy_command(bin.unwrap_or(env!("CARGO_BIN_EXE_egress-gateway")));
        cmd.args(["serve", "--config"]).arg(d.join("gateway.toml"));
        let mut proxy = spawn("gateway", &mut cmd, port, &d.join("gateway.log"));
        proxy.service = service;
        if signed.is_some() {
            let out = Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
                .args(["token", "mint", "--config"])
                .arg(d.join("gateway.toml"))
                .args(["--kid", "k", "--sandbox", USER, "--policy", "bench", "--ttl", "1h"])
                .output()
                .unwrap();
            assert!(out.status.success(), "token mint: {}", String::from_utf8_lossy(&out.stderr));
            proxy.secret = String::from_utf8(out.stdout).unwrap().trim().to_string();
        }
        proxy
    }

    pub fn squid(work: &Path, _o: &super::origin::Origins) -> Proxy {
        let d = dir(work, "squid");
        let port = free_port();
        let out = Command::new("openssl").args(["passwd", "-apr1", TOKEN]).output().unwrap();
        let hash = String::from_utf8(out.stdout).unwrap();
        std::fs::write(d.join("passwd"), format!("{USER}:{}", hash.trim())).unwrap();
        let p = d.display();
        std::fs::write(
            d.join("squid.conf"),
            format!(
                r#"http_port 127.0.0.1:{port}
pid_filename {p}/squid.pid
cache_log {p}/cache.log
access_log stdio:{p}/access.log
coredump_dir {p}
netdb_filename none
cache deny all
max_filedescriptors 20000
shutdown_lifetime 0 seconds
dns_nameservers 127.0.0.1
auth_param basic program /usr/lib/squid/basic_ncsa_auth {p}/passwd
auth_param basic children 5 startup=5 idle=1
acl authed proxy_auth REQUIRED
acl allowed_dst dst 127.0.0.1/32
http_access deny !authed
http_access allow allowed_dst
http_access deny all
"#
            ),
        )
        .unwrap();
        let _ = Command::new("chmod").arg("-R").arg("a+rwx").arg(&d).status();
        let mut cmd = proxy_command("squid");
        cmd.arg("-N").arg("-f").arg(d.join("squid.conf"));
        spawn("squid", &mut cmd, port, &d.join("stderr.log"))
    }

    pub fn tinyproxy(work: &Path, _o: &super::origin::Origins) -> Proxy {
        let d = dir(work, "tinyproxy");
        let port = free_port();
        let p = d.display();
        std::fs::write(d.join("filter"), "127.0.0.1\n").unwrap();
        std::fs::write(
            d.join("tinyproxy.conf"),
            format!(
                r#"User nobody
Group nogroup
Port {port}
Listen 127.0.0.1
Timeout 600
LogFile "{p}/tinyproxy.log"
LogLevel Info
PidFile "{p}/tinyproxy.pid"
MaxClients 20000
BasicAuth {USER} {TOKEN}
Filter "{p}/filter"
FilterType fnmatch
FilterDefaultDeny Yes
DisableViaHeader Yes
"#
            ),
        )
        .unwrap();
        let _ = Command::new("chmod").arg("-R").arg("a+rwx").arg(&d).status();
        let mut cmd = proxy_command("tinyproxy");
        cmd.arg("-d").arg("-c").arg(d.join("tinyproxy.conf"));
        spawn("tinyproxy", &mut cmd, port, &d.join("stderr.log"))
    }

    /// The bare relay of `relay.rs`, run as a child process of this bench binary.
    pub fn relay(work: &Path, _o: &super::origin::Origins) -> Proxy {
        let d = dir(work, "relay");
        let port = free_port();
        let mut cmd = proxy_command(std::env::current_exe().unwrap());
        cmd.env(super::relay::LISTEN_VAR, format!("127.0.0.1:{port}"));
        spawn("relay", &mut cmd, port, &d.join("stderr.log"))
    }

    pub fn direct() -> Proxy {
        Proxy { name: "direct", addr: None, secret: TOKEN.into(), child: None, service: None, transparent: false }
    }

    /// The same proxy's address without ownership of its process, for client tasks.
    pub fn handle(&self) -> Proxy {
        Proxy {
            name: self.name,
            addr: self.addr,
            secret: self.secret.clone(),
            child: None,
            service: None,
            transparent: self.transparent,
        }
    }

    pub fn is_proxy(&self) -> bool {
        self.addr.is_some()
    }

    /// Whether it forwards absolute-form requests (the transparent row has no proxy
    /// port in the bench).
    pub fn forwards(&self) -> bool {
        !self.transparent
    }

    /// `Proxy-Authorization` value for the bench credential.
    pub fn auth(&self) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{}", self.secret)))
    }

    /// The proxy's process and its descendants (none for direct).
    pub fn pids(&self) -> Vec<u32> {
        let Some(child) = &self.child else { return Vec::new() };
        process_tree(child.id())
    }

    /// The CPU time of the proxy and its children (helpers, workers) so far; `None`
    /// for direct (no process).
    pub fn cpu_seconds(&self) -> Option<CpuTime> {
        let pids = self.pids();
        if pids.is_empty() {
            return None;
        }
        let ticks: u64 = pids.iter().filter_map(|p| stat_fields(*p)).map(|f| f.utime + f.stime).sum();
        let threads = pids.iter().flat_map(|&pid| thread_run_times(pid)).collect();
        Some(CpuTime { ticks: ticks as f64 / 100.0, processes: pids.len(), threads })
    }

    /// Resident memory of the proxy and its children, in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.pids()
            .iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
            .filter_map(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
            })
            .sum()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            for p in process_tree(child.id()).into_iter().rev() {
                let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
            }
            let _ = child.wait();
        }
        if let Some(service) = &mut self.service {
            let _ = service.kill();
            let _ = service.wait();
        }
    }
}

/// A proxy's CPU time at one moment, two ways: the kernel's per-process totals
/// (`/proc/PID/stat`, user plus system, which count exited threads too but are cut to
/// 10 ms ticks), and each live thread's exact run time (`/proc/PID/task/TID/schedstat`,
/// in ns). A phase of 60 ms (a 256 MiB stream) is 6 ticks, so the ticks alone moved a
/// per-GiB figure by up to a third.
#[derive(Clone, Debug)]
pub struct CpuTime {
    ticks: f64,
    processes: usize,
    threads: std::collections::HashMap<(u32, u32), u64>,
}

impl CpuTime {
    /// CPU seconds from `before` to `self`: the threads' exact run time, unless it
    /// falls outside the ticks' rounding (a thread that exited in between took its
    /// time with it), then the ticks.
    pub fn since(&self, before: &CpuTime) -> f64 {
        let ticks = self.ticks - before.ticks;
        let ns: u64 = self
            .threads
            .iter()
            .map(|(id, &now)| now.saturating_sub(before.threads.get(id).copied().unwrap_or(0)))
            .sum();
        let exact = ns as f64 / 1e9;
        // utime and stime are each cut to a tick, per process, at both ends.
        let slack = 0.02 * (self.processes.max(before.processes) as f64) + 0.01;
        if (exact - ticks).abs() <= slack { exact } else { ticks }
    }
}

/// Each live thread of `pid` and the nanoseconds it has run.
fn thread_run_times(pid: u32) -> Vec<((u32, u32), u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.filter_map(|e| {
        let tid = e.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
        Some(((pid, tid), s.split_whitespace().next()?.parse().ok()?))
    })
    .collect()
}

struct Stat {
    ppid: u32,
    utime: u64,
    stime: u64,
}

fn stat_fields(pid: u32) -> Option<Stat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat { ppid: f.get(1)?.parse().ok()?, utime: f.get(11)?.parse().ok()?, stime: f.get(12)?.parse().ok()? })
}

/// `root` and every descendant.
fn process_tree(root: u32) -> Vec<u32> {
    let all: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|pid| Some((pid, stat_fields(pid)?.ppid)))
                .collect()
        })
        .unwrap_or_default();
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(all.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    out
}
