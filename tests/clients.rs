//! The client matrix: real clients, configured only the way their users configure a
//! proxy (`HTTPS_PROXY`, `--proxy`, a config option), through the real gateway to a
//! real local HTTPS server (Python's `http.server` with the test CA). For each: an
//! allowed fetch succeeds, and a denied one fails with the reason visible to that
//! client where it shows one (the status line's reason phrase carries it; the README's
//! client table says what each shows).
//!
//! The clients come from `.ci/run` (Debian, PyPI, npm). A missing client fails its test
//! with what to install: a test that passes without its client would prove nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::static_https::StaticServer;
use support::tls::TestCa;
use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, standard_policy};

/// What the origin serves at /hello.txt.
const HELLO: &str = "hello from the origin";

/// A `requests` GET of `argv[2]` trusting the CA file `argv[1]`: prints the answer, or
/// the error (and fails).
const REQUESTS: &str = r#"
import sys, requests
try:
    r = requests.get(sys.argv[2], verify=sys.argv[1], timeout=20)
    print(r.status_code, r.text)
except Exception as e:
    print("ERROR", e)
    sys.exit(1)
"#;

/// The same with `aiohttp`, which reads the proxy from the environment only with
/// `trust_env`.
const AIOHTTP: &str = r#"
import asyncio, ssl, sys, aiohttp
async def main():
    ctx = ssl.create_default_context(cafile=sys.argv[1])
    async with aiohttp.ClientSession(trust_env=True) as s:
        async with s.get(sys.argv[2], ssl=ctx) as r:
            print(r.status, await r.text())
try:
    asyncio.run(main())
except Exception as e:
    print("ERROR", repr(e))
    sys.exit(1)
"#;

struct World {
    gw: TestGateway,
    ca: TestCa,
    server: StaticServer,
    root: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        World::with_sandboxes("")
    }

    /// With more `[[sandboxes]]` beside the standard ones.
    fn with_sandboxes(more: &str) -> World {
        let ca = TestCa::new(&["tls.test", "b-only.test", "blocked.origin.test"]);
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("hello.txt"), format!("{HELLO}\n")).unwrap();
        python_index(root.path());
        let server = StaticServer::https(root.path(), &ca);
        let gw = TestGateway::start(STANDARD_CONFIG, &format!("{}\n{more}", standard_policy()));
        World { gw, ca, server, root }
    }

    fn proxy(&self) -> String {
        self.gw.proxy_url("sbx-a", TOKEN_A)
    }

    /// An allowed URL (tls.test is in policy a) and a denied one (b-only.test is not).
    fn allowed(&self, path: &str) -> String {
        format!("https://tls.test:{}{path}", self.server.port)
    }

    fn denied(&self, path: &str) -> String {
        format!("https://b-only.test:{}{path}", self.server.port)
    }

    fn ca(&self) -> &str {
        self.ca.ca_pem_path.to_str().unwrap()
    }

    /// Runs a Python `script` with the CA file and `url` as its arguments.
    fn python(&self, script: &str, url: &str) -> Output {
        let mut c = self.command("python3");
        c.args(["-c", script, self.ca(), url]);
        run(c, "python3 (with requests: pip install requests)")
    }

    /// Runs a Python client `script` for the allowed URL (it must print the origin's
    /// answer) and for the denied one (it must fail and show the reason); returns what
    /// the denied run printed.
    fn python_allowed_and_denied(&self, script: &str, client: &str) -> String {
        let out = self.python(script, &self.allowed("/hello.txt"));
        assert!(out.status.success() && both(&out).contains(HELLO), "{client}: {}", both(&out));
        let out = self.python(script, &self.denied("/hello.txt"));
        assert!(!out.status.success(), "{client}: {}", both(&out));
        let text = both(&out);
        assert_reason_visible(&text, client);
        text
    }

    /// A command with the proxy in the environment, as a sandbox would set it, and no
    /// other proxy settings.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        // The machine's own trust and package settings (CA bundles, pip's find-links)
        // would override what each test sets.
        for k in [
            "http_proxy",
            "https_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "no_proxy",
            "NO_PROXY",
            "ALL_PROXY",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "PIP_CERT",
            "PIP_FIND_LINKS",
            "PIP_INDEX_URL",
            "PIP_EXTRA_INDEX_URL",
            "GIT_SSL_CAINFO",
            "NODE_EXTRA_CA_CERTS",
        ] {
            c.env_remove(k);
        }
        c.env("PIP_CONFIG_FILE", "/dev/null");
        c.env("HTTPS_PROXY", self.proxy()).env("https_proxy", self.proxy());
        c
    }
}

fn run(mut c: Command, what: &str) -> Output {
    match c.output() {
        Ok(o) => o,
        Err(e) => panic!("{what} is not installed ({e}); .ci/run installs it"),
    }
}

fn both(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The reason a denied request must show: the code and the explanation.
fn assert_reason_visible(out: &str, client: &str) {
    assert!(out.contains("host_not_allowed"), "{client} does not show the reason:\n{out}");
}

/// An npm registry stand-in: the packument of `is-number` (one version, 7.0.0) and its
/// tarball, built here. `base` is the registry's URL, for the tarball's address.
fn npm_registry(root: &Path, base: &str) {
    let script = r#"
import base64, hashlib, io, json, sys, tarfile
root, base = sys.argv[1], sys.argv[2]
pkg = {"name": "is-number", "version": "7.0.0", "main": "index.js"}
files = {"package/package.json": json.dumps(pkg).encode(), "package/index.js": b"module.exports = n => typeof n === 'number';\n"}
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    for name, data in files.items():
        info = tarfile.TarInfo(name); info.size = len(data); info.mode = 0o644
        t.addfile(info, io.BytesIO(data))
tgz = buf.getvalue()
open(f"{root}/is-number-7.0.0.tgz", "wb").write(tgz)
dist = {"tarball": f"{base}/is-number-7.0.0.tgz", "shasum": hashlib.sha1(tgz).hexdigest(),
        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()}
doc = {"name": "is-number", "dist-tags": {"latest": "7.0.0"}, "versions": {"7.0.0": dict(pkg, dist=dist)}}
open(f"{root}/is-number", "w").write(json.dumps(doc))
"#;
    let out = Command::new("python3").args(["-c", script]).arg(root).arg(base).output().unwrap();
    assert!(out.status.success(), "{}", both(&out));
}

/// A PEP 503 simple index with one tiny wheel, `six` 1.16.0, built here.
fn python_index(root: &Path) {
    std::fs::create_dir_all(root.join("simple/six")).unwrap();
    std::fs::create_dir_all(root.join("files")).unwrap();
    let wheel = "six-1.16.0-py2.py3-none-any.whl";
    let script = r#"
import sys, zipfile, hashlib, base64
path = sys.argv[1]
files = {
    "six.py": b"__version__ = '1.16.0'\n",
    "six-1.16.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: six\nVersion: 1.16.0\n",
    "six-1.16.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py2-none-any\nTag: py3-none-any\n",
}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(data)}\n"
record += "six-1.16.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(path, "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
    z.writestr("six-1.16.0.dist-info/RECORD", record)
print(hashlib.sha256(open(path, "rb").read()).hexdigest())
"#;
    let out = Command::new("python3").args(["-c", script]).arg(root.join("files").join(wheel)).output().unwrap();
    assert!(out.status.success(), "{}", both(&out));
    let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::fs::write(
        root.join("simple/six/index.html"),
        format!("<!DOCTYPE html><html><body><a href=\"../../files/{wheel}#sha256={sha}\">{wheel}</a></body></html>\n"),
    )
    .unwrap();
}

#[test]
fn curl_fetches_and_shows_the_reason_with_verbose() {
    let w = World::new();
    let mut c = w.command("curl");
    c.args(["-sS", "--cacert", w.ca(), &w.allowed("/hello.txt")]);
    let out = run(c, "curl");
    assert!(out.status.success() && both(&out).contains(HELLO), "{}", both(&out));
    let mut c = w.command("curl");
    c.args(["-sS", "-v", "--cacert", w.ca(), &w.denied("/hello.txt")]);
    let out = run(c, "curl");
    assert!(!out.status.success());
    let text = both(&out);
    assert!(text.contains("CONNECT tunnel failed, response 403"), "{text}");
    assert_reason_visible(&text, "curl -v");
}

#[test]
fn wget_fetches_and_shows_the_reason() {
    let w = World::new();
    let dir = tempfile::tempdir().unwrap();
    let mut c = w.command("wget");
    c.current_dir(dir.path()).args(["-q", "-O", "-", "--ca-certificate", w.ca(), &w.allowed("/hello.txt")]);
    let out = run(c, "wget");
    assert!(out.status.success() && both(&out).contains(HELLO), "{}", both(&out));
    let mut c = w.command("wget");
    c.current_dir(dir.path()).args(["-O", "-", "--ca-certificate", w.ca(), &w.denied("/hello.txt")]);
    let out = run(c, "wget");
    assert!(!out.status.success());
    assert_reason_visible(&both(&out), "wget");
}

/// pip, requests and urllib all go through http.client, which sends
/// `CONNECT host:443 HTTP/1.0` without a Host header.
#[test]
fn python_urllib_fetches_and_shows_the_reason() {
    let w = World::new();
    let script = r#"
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[1])
try:
    print(urllib.request.urlopen(sys.argv[2], context=ctx, timeout=20).read().decode())
except Exception as e:
    print("ERROR", e)
    sys.exit(1)
"#;
    let text = w.python_allowed_and_denied(script, "urllib");
    assert!(text.contains("Tunnel connection failed: 403"), "{text}");
}

#[test]
fn python_requests_fetches_and_shows_the_reason() {
    let w = World::new();
    w.python_allowed_and_denied(REQUESTS, "requests");
}

/// A token with characters beyond ASCII: `requests` and `aiohttp` send Basic
/// credentials in ISO-8859-1, curl in UTF-8; each gets through.
#[test]
fn a_token_beyond_ascii_works_from_requests_aiohttp_and_curl() {
    let token = "tok\u{e9}n-\u{fc}-0123456789abcdef";
    let w = World::with_sandboxes(&format!(
        "[[sandboxes]]\nid = \"sbx-u\"\ntoken_sha256 = \"{}\"\npolicy = \"a\"\n",
        support::sha256_hex(token)
    ));
    let encoded: String = token.bytes().map(|b| format!("%{b:02X}")).collect();
    let proxy = format!("http://sbx-u:{encoded}@{}", w.gw.addr);
    let url = w.allowed("/hello.txt");
    for (client, script) in [("requests", REQUESTS), ("aiohttp", AIOHTTP)] {
        let mut c = w.command("python3");
        c.env("HTTPS_PROXY", &proxy).env("https_proxy", &proxy).args(["-c", script, w.ca(), &url]);
        let out = run(c, "python3 with requests and aiohttp");
        assert!(out.status.success() && both(&out).contains(HELLO), "{client}: {}", both(&out));
    }
    let mut c = w.command("curl");
    c.args(["-sS", "--cacert", w.ca(), "-x", &proxy, &url]);
    let out = run(c, "curl");
    assert!(out.status.success() && both(&out).contains(HELLO), "curl: {}", both(&out));
}

#[test]
fn python_httpx_fetches_and_shows_the_reason() {
    let w = World::new();
    let script = r#"
import sys, httpx
try:
    r = httpx.get(sys.argv[2], verify=sys.argv[1], timeout=20)
    print(r.status_code, r.text)
except Exception as e:
    print("ERROR", repr(e))
    sys.exit(1)
"#;
    w.python_allowed_and_denied(script, "httpx");
}

#[test]
fn python_aiohttp_fetches_and_shows_the_reason() {
    let w = World::new();
    w.python_allowed_and_denied(AIOHTTP, "aiohttp");
}

#[test]
fn uv_downloads_from_an_index_and_reports_the_refusal() {
    let w = World::new();
    let uv = |index: String, target: &Path| {
        let mut c = w.command("uv");
        c.args(["pip", "install", "--no-cache", "--no-deps", "--target"])
            .arg(target)
            .args(["--index-url", &index, "six==1.16.0"])
            .env("SSL_CERT_FILE", w.ca())
            .env("UV_HTTP_TIMEOUT", "20")
            .env("UV_HTTP_RETRIES", "0")
            .env("UV_NO_CONFIG", "1");
        run(c, "uv (pip install uv)")
    };
    let (ok, refused) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = uv(w.allowed("/simple/"), ok.path());
    assert!(out.status.success(), "{}", both(&out));
    assert!(ok.path().join("six.py").exists(), "{}", both(&out));
    let out = uv(w.denied("/simple/"), refused.path());
    assert!(!out.status.success());
    // uv (reqwest) says only that the tunnel failed, not how.
    assert!(both(&out).contains("tunnel error"), "{}", both(&out));
}

#[test]
fn pip_downloads_from_an_index_and_shows_the_reason() {
    let w = World::new();
    let dest = tempfile::tempdir().unwrap();
    let pip_with = |index: String, retries: &str| {
        let mut c = w.command("python3");
        c.args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--retries",
            retries,
        ])
        .args(["--timeout", "20", "--cert", w.ca(), "--index-url", &index, "-d"])
        .arg(dest.path())
        .arg("six==1.16.0");
        run(c, "pip")
    };
    let pip = |index: String| pip_with(index, "0");
    let pip_retrying = |index: String| pip_with(index, "1");
    let out = pip(w.allowed("/simple/"));
    assert!(out.status.success(), "{}", both(&out));
    assert!(dest.path().join("six-1.16.0-py2.py3-none-any.whl").exists());
    // pip shows why a fetch failed in its retry warning.
    let out = pip_retrying(w.denied("/simple/"));
    assert!(!out.status.success());
    assert_reason_visible(&both(&out), "pip");
}

#[test]
fn git_clones_over_https_and_reports_the_refusal() {
    let w = World::new();
    // A bare repository served by the static server ("dumb" HTTP is enough to clone).
    let repo = w.root.path().join("repo.git");
    let work = tempfile::tempdir().unwrap();
    let git = |dir: &Path, args: &[&str]| {
        let mut c = w.command("git");
        c.current_dir(dir).args(["-c", "init.defaultBranch=main", "-c", "user.name=t", "-c", "user.email=t@t"]);
        c.args(args).env("GIT_TERMINAL_PROMPT", "0").env("GIT_SSL_CAINFO", w.ca());
        run(c, "git")
    };
    let seed = work.path().join("seed");
    std::fs::create_dir(&seed).unwrap();
    assert!(git(&seed, &["init", "-q"]).status.success());
    std::fs::write(seed.join("README"), "x\n").unwrap();
    assert!(git(&seed, &["add", "README"]).status.success());
    assert!(git(&seed, &["commit", "-qm", "seed"]).status.success());
    assert!(
        git(work.path(), &["clone", "-q", "--bare", seed.to_str().unwrap(), repo.to_str().unwrap()]).status.success()
    );
    assert!(git(&repo, &["update-server-info"]).status.success());
    let out = git(work.path(), &["clone", "-q", &w.allowed("/repo.git"), "ok"]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(work.path().join("ok/README").exists());
    let out = git(work.path(), &["clone", "-q", &w.denied("/repo.git"), "no"]);
    assert!(!out.status.success());
    // git (libcurl) shows the status of a refused CONNECT, not its reason phrase.
    assert!(both(&out).contains("403"), "{}", both(&out));
}

#[test]
fn java_httpclient_fetches_and_shows_the_status() {
    let w = World::new();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("Fetch.java");
    std::fs::write(&src, JAVA_FETCH).unwrap();
    let port = w.gw.addr.port().to_string();
    let java = |url: String| {
        let mut c = w.command("java");
        c.arg("-Djdk.http.auth.tunneling.disabledSchemes=").arg(&src).args([
            "127.0.0.1",
            &port,
            "sbx-a",
            TOKEN_A,
            w.ca(),
            &url,
        ]);
        run(c, "java (JDK 11 or later)")
    };
    let out = java(w.allowed("/hello.txt"));
    assert!(out.status.success() && both(&out).contains(HELLO), "{}", both(&out));
    let out = java(w.denied("/hello.txt"));
    assert!(!out.status.success());
    assert!(both(&out).contains("403"), "{}", both(&out));
}

/// Java's HttpClient through an authenticating proxy, trusting a PEM CA: what a Java
/// user writes (Basic for tunnels must be re-enabled with a system property).
const JAVA_FETCH: &str = r#"
import java.net.*;
import java.net.http.*;
import java.io.*;
import java.security.KeyStore;
import java.security.cert.*;
import javax.net.ssl.*;

public class Fetch {
    public static void main(String[] a) throws Exception {
        KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
        ks.load(null, null);
        try (InputStream in = new FileInputStream(a[4])) {
            ks.setCertificateEntry("ca", CertificateFactory.getInstance("X.509").generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks);
        SSLContext ssl = SSLContext.getInstance("TLS");
        ssl.init(null, tmf.getTrustManagers(), null);
        HttpClient client = HttpClient.newBuilder()
            .proxy(ProxySelector.of(new InetSocketAddress(a[0], Integer.parseInt(a[1]))))
            .authenticator(new Authenticator() {
                protected PasswordAuthentication getPasswordAuthentication() {
                    return new PasswordAuthentication(a[2], a[3].toCharArray());
                }
            })
            .sslContext(ssl)
            .build();
        try {
            HttpResponse<String> r = client.send(HttpRequest.newBuilder(URI.create(a[5])).build(),
                HttpResponse.BodyHandlers.ofString());
            System.out.println(r.statusCode() + " " + r.body());
        } catch (IOException e) {
            System.out.println("ERROR " + e);
            System.exit(1);
        }
    }
}
"#;

#[test]
fn node_undici_proxy_agent_fetches_and_shows_the_status() {
    let w = World::new();
    let modules = node_modules();
    let script = r#"
const { ProxyAgent, fetch } = require('undici');
const ca = require('fs').readFileSync(process.env.CA_FILE);
const agent = new ProxyAgent({ uri: process.env.PROXY_URI, requestTls: { ca } });
fetch(process.env.TARGET_URL, { dispatcher: agent })
  .then(async r => { console.log(r.status, await r.text()); process.exit(r.ok ? 0 : 1); })
  .catch(e => { console.log('ERROR', e.message, e.cause); process.exit(1); });
"#;
    let node = |url: String| {
        let mut c = w.command("node");
        c.env("NODE_PATH", &modules)
            .env("PROXY_URI", w.proxy())
            .env("CA_FILE", w.ca())
            .env("TARGET_URL", &url)
            .args(["-e", script]);
        run(c, "node")
    };
    let out = node(w.allowed("/hello.txt"));
    assert!(out.status.success() && both(&out).contains(HELLO), "{}\n{}", both(&out), w.gw.log_text());
    let out = node(w.denied("/hello.txt"));
    assert!(!out.status.success());
    assert!(both(&out).contains("403"), "{}", both(&out));
}

#[test]
fn npm_installs_from_a_registry_and_reports_the_refusal() {
    let w = World::new();
    npm_registry(w.root.path(), &w.allowed(""));
    let npm = |registry: String| {
        let dir = tempfile::tempdir().unwrap();
        let mut c = w.command("npm");
        c.current_dir(dir.path())
            .args(["install", "--no-audit", "--no-fund", "--no-save", "--fetch-retries", "0", "--registry", &registry])
            .args(["--cafile", w.ca(), "--https-proxy", &w.proxy(), "is-number@7.0.0"])
            .env("npm_config_cache", dir.path().join("cache"))
            .env("npm_config_userconfig", dir.path().join("npmrc"));
        let out = run(c, "npm");
        (out, dir)
    };
    let (out, dir) = npm(w.allowed("/"));
    assert!(out.status.success(), "{}", both(&out));
    assert!(dir.path().join("node_modules/is-number/index.js").exists(), "{}", both(&out));
    let (out, _dir) = npm(w.denied("/"));
    assert!(!out.status.success());
    assert!(both(&out).contains("403"), "{}", both(&out));
}

/// apt with `Acquire::http::Proxy`, an `http://` repository (so the forwarding path,
/// not a tunnel): a flat repository with an empty package list.
#[test]
fn apt_get_updates_from_an_http_repository_and_shows_the_reason() {
    let w = World::new();
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("Packages"), "").unwrap();
    let script = r#"
import hashlib, sys
d = open(sys.argv[1] + "/Packages", "rb").read()
r = "Origin: test\nLabel: test\nSuite: stable\nCodename: stable\nArchitectures: amd64 all\nDate: Tue, 01 Dec 2026 00:00:00 UTC\n"
r += "MD5Sum:\n %s %d Packages\nSHA256:\n %s %d Packages\n" % (hashlib.md5(d).hexdigest(), len(d), hashlib.sha256(d).hexdigest(), len(d))
open(sys.argv[1] + "/Release", "w").write(r)
"#;
    assert!(Command::new("python3").args(["-c", script]).arg(repo.path()).status().unwrap().success());
    let server = StaticServer::http(repo.path());
    let apt = |host: &str| {
        let state = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(state.path().join("lists/partial")).unwrap();
        std::fs::create_dir_all(state.path().join("cache/archives/partial")).unwrap();
        let sources = state.path().join("sources.list");
        std::fs::write(&sources, format!("deb [trusted=yes] http://{host}:{}/ ./\n", server.port)).unwrap();
        let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
        let mut c = w.command("apt-get");
        c.arg("update")
            .args(["-o", &opt("Dir::Etc::sourcelist", &sources), "-o", "Dir::Etc::sourceparts=-"])
            .args(["-o", &opt("Dir::State::Lists", &state.path().join("lists"))])
            .args(["-o", &opt("Dir::Cache", &state.path().join("cache"))])
            .args(["-o", "APT::Get::List-Cleanup=0", "-o", "Debug::NoLocking=1", "-o", "Acquire::Retries=0"])
            .args(["-o", &format!("Acquire::http::Proxy={}", w.proxy())]);
        run(c, "apt-get")
    };
    let out = apt("tls.test");
    let text = both(&out);
    assert!(out.status.success() && !text.contains("E: "), "{text}");
    let out = apt("b-only.test");
    let text = both(&out);
    assert!(text.contains("403"), "{text}");
    assert_reason_visible(&text, "apt-get");
}

/// cargo with `CARGO_HTTP_PROXY`, fetching from a sparse registry stand-in: the index
/// file and the `.crate` of `egress-demo` 1.0.0, built here.
#[test]
fn cargo_fetches_from_a_sparse_registry_and_reports_the_refusal() {
    let w = World::new();
    let script = r#"
import hashlib, io, json, os, sys, tarfile
root, dl = sys.argv[1], sys.argv[2]
files = {"egress-demo-1.0.0/Cargo.toml": b'[package]\nname = "egress-demo"\nversion = "1.0.0"\nedition = "2021"\n',
         "egress-demo-1.0.0/src/lib.rs": b"pub fn hi() {}\n"}
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    for name, data in files.items():
        info = tarfile.TarInfo(name); info.size = len(data); info.mode = 0o644
        t.addfile(info, io.BytesIO(data))
crate = buf.getvalue()
os.makedirs(f"{root}/index/eg/re", exist_ok=True)
os.makedirs(f"{root}/crates", exist_ok=True)
open(f"{root}/crates/egress-demo-1.0.0.crate", "wb").write(crate)
line = {"name": "egress-demo", "vers": "1.0.0", "deps": [], "cksum": hashlib.sha256(crate).hexdigest(), "features": {}, "yanked": False}
open(f"{root}/index/eg/re/egress-demo", "w").write(json.dumps(line) + "\n")
open(f"{root}/index/config.json", "w").write(json.dumps({"dl": dl + "/crates/{crate}-{version}.crate"}))
"#;
    let built = Command::new("python3").args(["-c", script]).arg(w.root.path()).arg(w.allowed("")).output().unwrap();
    assert!(built.status.success(), "{}", both(&built));
    let cargo = |registry: String| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/lib.rs"), "").unwrap();
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\negress-demo = { version = \"1\", registry = \"local\" }\n",
        )
        .unwrap();
        let mut c = w.command("cargo");
        c.current_dir(dir.path())
            .args(["fetch"])
            .env("CARGO_HOME", dir.path().join("cargo-home"))
            .env("CARGO_REGISTRIES_LOCAL_INDEX", format!("sparse+{registry}/index/"))
            .env("CARGO_HTTP_PROXY", w.proxy())
            .env("CARGO_HTTP_CAINFO", w.ca())
            .env("CARGO_NET_RETRY", "0")
            .env_remove("CARGO_TARGET_DIR");
        let out = run(c, "cargo");
        (out, dir)
    };
    let (out, dir) = cargo(w.allowed(""));
    assert!(out.status.success(), "{}", both(&out));
    assert!(dir.path().join("Cargo.lock").exists());
    let (out, _dir) = cargo(w.denied(""));
    assert!(!out.status.success());
    assert!(both(&out).contains("403"), "{}", both(&out));
}

/// Go's net/http with its default transport (`HTTPS_PROXY` from the environment).
#[test]
fn go_net_http_fetches_and_shows_the_reason() {
    let w = World::new();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fetch.go");
    std::fs::write(&src, GO_FETCH).unwrap();
    let go = |url: String| {
        let mut c = w.command("go");
        c.current_dir(dir.path())
            .arg("run")
            .arg(&src)
            .args([w.ca(), &url])
            .env("GOCACHE", dir.path().join("gocache"))
            .env("GOPATH", dir.path().join("gopath"))
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOTOOLCHAIN", "local");
        run(c, "go (Debian golang-go)")
    };
    let out = go(w.allowed("/hello.txt"));
    assert!(out.status.success() && both(&out).contains(HELLO), "{}", both(&out));
    let out = go(w.denied("/hello.txt"));
    assert!(!out.status.success());
    assert_reason_visible(&both(&out), "Go net/http");
}

const GO_FETCH: &str = r#"
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	pem, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	resp, err := (&http.Client{Transport: tr}).Get(os.Args[2])
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
}
"#;

/// Where `.ci/run` installs the npm packages the matrix uses (`undici`).
fn node_modules() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/node_modules");
    assert!(
        dir.join("undici").is_dir(),
        "undici is not installed: run `npm install --prefix tests/clients` (.ci/run does)"
    );
    dir
}

/// A plain-HTTP request refused with a large body still unsent: clients that write the
/// whole body before they read (urllib, Node's `http`, wget) must read the refusal,
/// not a reset connection. The gateway reads and discards the body first.
#[test]
fn a_refused_large_upload_over_plain_http_shows_the_refusal() {
    let w = World::new();
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("up.bin");
    std::fs::write(&upload, vec![b'x'; 3 << 20]).unwrap();
    // b-only.test is not in sandbox a's policy; nothing is listening there either.
    let url = "http://b-only.test:9/upload";
    let plain = |program: &str| {
        let mut c = w.command(program);
        c.env("HTTP_PROXY", w.proxy()).env("http_proxy", w.proxy());
        c
    };

    let script = r#"
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[2], data=open(sys.argv[3], "rb").read(), method="POST")
try:
    urllib.request.urlopen(req, timeout=20)
    print("no refusal")
except urllib.error.HTTPError as e:
    print("status", e.code, e.headers.get("x-egress-deny-reason"))
"#;
    let mut c = plain("python3");
    c.args(["-c", script, w.ca(), url]).arg(&upload);
    let out = run(c, "python3");
    assert!(both(&out).contains("status 403 host_not_allowed"), "urllib: {}", both(&out));

    let script = r#"
const http = require("http");
const proxy = new URL(process.env.HTTP_PROXY);
const target = new URL(process.argv[1]);
const auth = Buffer.from(decodeURIComponent(proxy.username) + ":" + decodeURIComponent(proxy.password)).toString("base64");
const body = require("fs").readFileSync(process.argv[2]);
const req = http.request({ host: proxy.hostname, port: proxy.port, method: "POST", path: target.href,
  headers: { Host: target.host, "Proxy-Authorization": "Basic " + auth, "Content-Length": body.length } },
  (res) => { console.log("status", res.statusCode, res.headers["x-egress-deny-reason"]); res.resume(); });
req.on("error", (e) => console.log("ERROR", e.message));
req.end(body);
"#;
    let mut c = plain("node");
    c.args(["-e", script, url]).arg(&upload);
    let out = run(c, "node");
    assert!(both(&out).contains("status 403 host_not_allowed"), "node http: {}", both(&out));

    let mut c = plain("wget");
    c.current_dir(dir.path()).args(["--tries=1", "-O", "-", "--post-file"]).arg(&upload).arg(url);
    let out = run(c, "wget");
    let text = both(&out);
    assert!(text.contains("403") && text.contains("host_not_allowed"), "wget: {text}");
}
