//! Transparent mode with the shipped nftables node recipe
//! (`config/deploy/transparent-node.nft`), in two network namespaces this test
//! creates and removes: `egw*` holds the gateway and the origin (on its own
//! loopback), `esb*` the sandbox, whose programs have no proxy settings and resolve
//! through the gateway's DNS firewall in answer mode. Every address is inside those
//! namespaces. Needs root, `ip` (iproute2) and `nft` (nftables); `.ci/run` installs
//! them and runs the suite as root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::gateway::TestGateway;
use support::static_https::StaticServer;
use support::tls::TestCa;
use support::{STANDARD_CONFIG, standard_policy};

const GW_IP: &str = "10.77.0.1";
const SBX_IP: &str = "10.77.0.2";

fn run(args: &[&str]) -> Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn ok(args: &[&str]) {
    let out = run(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The two namespaces and the veth pair between them; removed on drop.
struct Namespaces {
    gw: String,
    sbx: String,
}

impl Namespaces {
    fn create() -> Namespaces {
        let id = std::process::id();
        let ns = Namespaces { gw: format!("egw{id}"), sbx: format!("esb{id}") };
        ns.remove();
        let (gw, sbx) = (ns.gw.as_str(), ns.sbx.as_str());
        let (gw_if, sbx_if) = (format!("g{id}"), format!("s{id}"));
        ok(&["ip", "netns", "add", gw]);
        ok(&["ip", "netns", "add", sbx]);
        ok(&["ip", "link", "add", &gw_if, "netns", gw, "type", "veth", "peer", "name", &sbx_if, "netns", sbx]);
        for (n, dev, ip) in [(gw, gw_if.as_str(), GW_IP), (sbx, sbx_if.as_str(), SBX_IP)] {
            ok(&["ip", "-n", n, "addr", "add", &format!("{ip}/24"), "dev", dev]);
            ok(&["ip", "-n", n, "link", "set", dev, "up"]);
            ok(&["ip", "-n", n, "link", "set", "lo", "up"]);
        }
        ok(&["ip", "-n", sbx, "route", "add", "default", "via", GW_IP]);
        // `ip netns exec` bind-mounts /etc/netns/NAME/resolv.conf over /etc/resolv.conf:
        // the sandbox resolves through the gateway's DNS firewall.
        let etc = format!("/etc/netns/{sbx}");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(format!("{etc}/resolv.conf"), format!("nameserver {GW_IP}\noptions timeout:2 attempts:1\n"))
            .unwrap();
        // The shipped recipe, with only its defines set.
        let recipe =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/deploy/transparent-node.nft"))
                .unwrap()
                .replace("define SANDBOX_IF = \"sbx0\"", &format!("define SANDBOX_IF = \"{gw_if}\""));
        let rules = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(rules.path(), recipe).unwrap();
        ok(&["ip", "netns", "exec", gw, "nft", "-f", rules.path().to_str().unwrap()]);
        // The sidecar recipe is not exercised here; it must at least load.
        let sidecar = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/deploy/transparent-sidecar.nft");
        ok(&["ip", "netns", "exec", gw, "nft", "-c", "-f", sidecar.to_str().unwrap()]);
        ns
    }

    /// Runs a program in the sandbox namespace, with no proxy settings.
    fn in_sandbox(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.sbx])
            .args(args)
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("ALL_PROXY")
            .output()
            .unwrap()
    }

    fn remove(&self) {
        for n in [&self.gw, &self.sbx] {
            let _ = run(&["ip", "netns", "del", n]);
        }
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.sbx));
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A listener in the gateway namespace that prints what reaches it.
struct Witness(Option<std::process::Child>);

impl Drop for Witness {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Witness {
    fn start(ns: &str, proto: &str, port: u16) -> Witness {
        let script = format!(
            r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if "{proto}" == "udp" else socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port}))
if "{proto}" == "tcp":
    s.listen(5)
print("ready", flush=True)
while True:
    if "{proto}" == "udp":
        data, peer = s.recvfrom(2048)
    else:
        c, peer = s.accept()
    print("reached", peer[0], flush=True)
"#
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Witness(Some(child))
    }

    /// Everything it printed after `ready`.
    fn reached(mut self) -> String {
        let mut child = self.0.take().unwrap();
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn the_node_recipe_serves_proxy_unaware_programs_and_drops_everything_else() {
    assert_eq!(
        run(&["id", "-u"]).stdout,
        b"0\n",
        "this test creates network namespaces and needs root (.ci/run runs the suite as root)"
    );
    for tool in [["ip", "-V"], ["nft", "--version"]] {
        assert!(run(&tool).status.success(), "{} is needed (apt-get install iproute2 nftables)", tool[0]);
    }
    let ns = Namespaces::create();

    // The origin listens on the gateway namespace's loopback, port 443; the names
    // resolve there (resolver.hosts) and 127.0.0.1 is the test's egress exception.
    let ca = TestCa::new(&["tls.test", "blocked.origin.test"]);
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("hello"), "hello from the origin\n").unwrap();
    let repo = site.path().join("acme/widgets.git");
    std::fs::create_dir_all(&repo).unwrap();
    let seed = tempfile::tempdir().unwrap();
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .current_dir(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(site.path(), &["init", "--bare", repo.to_str().unwrap()]);
    git(seed.path(), &["init"]);
    std::fs::write(seed.path().join("README"), "through the namespace\n").unwrap();
    git(seed.path(), &["add", "README"]);
    git(seed.path(), &["commit", "-m", "seed"]);
    git(seed.path(), &["push", repo.to_str().unwrap(), "HEAD:refs/heads/main"]);
    // A static server serves git's "dumb" protocol once the info files exist.
    git(&repo, &["update-server-info"]);
    let _origin = StaticServer::https_in_netns(site.path(), &ca, &ns.gw, 443);

    let config = format!(
        "{STANDARD_CONFIG}\n[transparent]\nhttps_listen = \"0.0.0.0:8443\"\nhttp_listen = \"0.0.0.0:8080\"\n\n\
         [dns]\nlisten = \"{GW_IP}:53\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [\"{GW_IP}\"]\n\
         answer = \"gateway\"\n"
    );
    let policy =
        standard_policy().replace("policy = \"a\"\n", &format!("policy = \"a\"\naddresses = [\"{SBX_IP}\"]\n"));
    let gw = TestGateway::start_in_netns(&ns.gw, &config, &policy);

    let cacert = ca.ca_pem_path.to_str().unwrap();
    let curl = |args: &[&str]| {
        let mut full = vec!["curl", "-sS", "--max-time", "8", "--cacert", cacert];
        full.extend_from_slice(args);
        ns.in_sandbox(&full)
    };

    // An allowed name: resolved by the DNS firewall to the gateway, redirected from
    // 443 to the SNI listener, decided, dialled by the gateway.
    let out = curl(&["https://tls.test/hello"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from the origin\n");
    let rec = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["decision"] == "allow").remove(0);
    assert_eq!((rec["sandbox"].as_str(), rec["target"].as_str()), (Some("sbx-a"), Some("tls.test:443")), "{rec}");
    assert!(rec["client_addr"].as_str().unwrap().starts_with(SBX_IP), "{rec}");

    // git, unchanged, with no proxy settings.
    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("w");
    let out = ns.in_sandbox(&[
        "env",
        &format!("GIT_SSL_CAINFO={cacert}"),
        "git",
        "clone",
        "https://tls.test/acme/widgets.git",
        dest.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(dest.join("README")).unwrap(), "through the namespace\n");

    // A denied name does not even resolve; asked for by address, the gateway refuses
    // it and says why in the log.
    let out = curl(&["https://blocked.origin.test/hello"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("resolve"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = curl(&["--resolve", &format!("blocked.origin.test:443:{GW_IP}"), "https://blocked.origin.test/hello"]);
    assert!(!out.status.success());
    let rec = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["decision"] == "deny").remove(0);
    assert_eq!(
        (rec["reason"].as_str(), rec["target"].as_str()),
        (Some("host_denied"), Some("blocked.origin.test:443"))
    );

    // Something that is not TLS on a redirected port: refused before any name is
    // known, and logged under the address the client dialled.
    let not_tls = format!(
        "import socket; s = socket.create_connection(('{GW_IP}', 443), 5); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print(s.recv(64).hex())"
    );
    let out = ns.in_sandbox(&["python3", "-c", &not_tls]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("1503"), "a TLS alert: {out:?}");
    let rec = gw.wait_for_access(1, |v| v["kind"] == "transparent" && v["reason"] == "bad_request").remove(0);
    assert_eq!(rec["target"].as_str(), Some(format!("{GW_IP}:443").as_str()), "{rec}");

    // UDP 443 (QUIC) and a TCP port that is not redirected get nowhere, though
    // something listens on both; a direct connection to the listener is dropped too.
    let udp = Witness::start(&ns.gw, "udp", 443);
    let tcp = Witness::start(&ns.gw, "tcp", 9999);
    let send_udp = format!(
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b'q', ('{GW_IP}', 443)) for _ in range(3)]"
    );
    assert!(ns.in_sandbox(&["python3", "-c", &send_udp]).status.success());
    let direct = curl(&["--connect-timeout", "2", &format!("http://{GW_IP}:9999/")]);
    assert!(!direct.status.success());
    let listener =
        curl(&["--connect-timeout", "2", "--resolve", &format!("tls.test:8443:{GW_IP}"), "https://tls.test:8443/"]);
    assert!(!listener.status.success());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(udp.reached(), "", "UDP 443 reached the gateway namespace");
    assert_eq!(tcp.reached(), "", "a non-redirected port was reachable");
}
