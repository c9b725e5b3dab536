//! `TestGateway`: the real binary, started on an ephemeral port, its log captured.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

pub struct TestGateway {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
}

/// `Basic base64(user:pass)`.
pub fn basic(user: &str, pass: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
}

impl TestGateway {
    /// Starts the gateway with `config` (sections other than `[log]` and `[policy]`) and
    /// one policy file.
    pub fn start(config: &str, policy: &str) -> TestGateway {
        Self::start_with_policy_section(config, policy, "")
    }

    /// Like [`start`], with extra keys for the `[policy]` section (which the harness
    /// writes itself).
    pub fn start_with_policy_section(config: &str, policy: &str, policy_keys: &str) -> TestGateway {
        Self::start_in(None, config, policy, policy_keys)
    }

    /// Like [`start`], inside network namespace `netns` (`ip netns exec`).
    pub fn start_in_netns(netns: &str, config: &str, policy: &str) -> TestGateway {
        Self::start_in(Some(netns), config, policy, "")
    }

    fn start_in(netns: Option<&str>, config: &str, policy: &str, policy_keys: &str) -> TestGateway {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("policy")).expect("policy dir");
        std::fs::write(dir.path().join("policy/test.toml"), policy).expect("write policy");
        let admin = if config.contains("[admin]") { "" } else { "[admin]\nlisten = \"127.0.0.1:0\"\n" };
        // Reloads happen when a test asks for them, unless it tests the file watcher.
        let watch = if policy_keys.contains("watch_interval") { "" } else { "watch_interval = \"0s\"\n" };
        let cfg = format!(
            "[log]\nformat = \"json\"\nlevel = \"info\"\n\n[policy]\ndir = \"policy\"\n{watch}{policy_keys}{admin}{config}"
        );
        std::fs::write(dir.path().join("gateway.toml"), cfg).expect("write config");
        Self::spawn(dir, netns)
    }

    fn spawn(dir: tempfile::TempDir, netns: Option<&str>) -> TestGateway {
        let mut command = match netns {
            None => Command::new(env!("CARGO_BIN_EXE_egress-gateway")),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_egress-gateway")]);
                c
            }
        };
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(dir.path().join("gateway.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gateway");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("log lock").push(line);
            }
        });
        let mut gw = TestGateway { addr: "0.0.0.0:0".parse().expect("addr"), dir, child, logs };
        let line = gw.wait_for_log(Duration::from_secs(20), |v| v["msg"] == "listening");
        gw.addr = line["proxy"].as_str().expect("proxy addr").parse().expect("parse addr");
        gw
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    /// `http://ID:TOKEN@127.0.0.1:PORT` for curl's `-x`.
    pub fn proxy_url(&self, id: &str, token: &str) -> String {
        format!("http://{id}:{token}@{}", self.addr)
    }

    /// Every log line written so far, once the gateway's log has been quiet for longer
    /// than its flush interval (it writes lines in batches, up to 50 ms late).
    pub fn log_text(&self) -> String {
        self.settle();
        self.logs.lock().expect("log lock").join("\n")
    }

    /// Every JSON log line, once the log is quiet (see [`Self::log_text`]).
    pub fn log_json(&self) -> Vec<Value> {
        self.settle();
        self.json_now()
    }

    fn json_now(&self) -> Vec<Value> {
        self.logs.lock().expect("log lock").iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Waits (at most 5 s) until no log line has arrived for 200 ms.
    fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = usize::MAX;
        while Instant::now() < deadline {
            let now = self.logs.lock().expect("log lock").len();
            if now == seen {
                return;
            }
            seen = now;
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits for a JSON log line matching `pred` and returns it; panics with the log on
    /// timeout.
    pub fn wait_for_log(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.json_now().into_iter().find(|v| pred(v)) {
                return v;
            }
            if Instant::now() > deadline {
                panic!("log line not found in time; log so far:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (at most 10 s) until at least `n` access lines match `pred`, then returns
    /// every matching line once the log is quiet; panics with the log on timeout.
    pub fn wait_for_access(&self, n: usize, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let matching =
            |all: Vec<Value>| -> Vec<Value> { all.into_iter().filter(|v| v["log"] == "access" && pred(v)).collect() };
        while matching(self.json_now()).len() < n {
            if Instant::now() > deadline {
                panic!("{n} access lines not found in time; log so far:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        matching(self.log_json())
    }

    /// The access record for `target` (normalised form, e.g. `origin.test:8080`).
    pub fn access_for(&self, target: &str) -> Value {
        self.wait_for_log(Duration::from_secs(10), |v| v["log"] == "access" && v["target"] == target)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status();
    }

    /// Waits for the process to exit (after a signal) and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TestGateway {
    /// The admin listener's address, from the `listening` log line.
    pub fn admin_addr(&self) -> SocketAddr {
        let line = self.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "listening");
        line["admin"].as_str().expect("admin addr").parse().expect("admin addr")
    }

    /// The DNS listener's address, from the `listening` log line.
    pub fn dns_addr(&self) -> SocketAddr {
        let line = self.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "listening");
        line["dns"].as_str().expect("dns configured").parse().expect("dns addr")
    }
}

impl TestGateway {
    /// A transparent listener's address (`"https"` or `"http"`), from the `listening`
    /// log line.
    pub fn transparent_addr(&self, kind: &str) -> SocketAddr {
        let line = self.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "listening");
        line[format!("transparent_{kind}")].as_str().expect("transparent listener").parse().expect("addr")
    }
}
