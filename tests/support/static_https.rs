//! A real static HTTPS server (Python's `http.server` behind `ssl`, with the test CA's
//! certificate) on a loopback port, serving a directory: the package index, registry
//! and repository stand-ins of the client matrix.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::tls::TestCa;

const SERVER: &str = r#"
import http.server, ssl, sys, functools
root, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
handler = functools.partial(Quiet, directory=root)
port = int(sys.argv[4]) if len(sys.argv) > 4 else 0
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
if cert:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

pub struct StaticServer {
    pub port: u16,
    child: Child,
}

impl StaticServer {
    /// HTTPS with the CA's server certificate.
    pub fn https(root: &Path, ca: &TestCa) -> StaticServer {
        Self::start(root, Some(ca))
    }

    /// Plain HTTP.
    pub fn http(root: &Path) -> StaticServer {
        Self::start(root, None)
    }

    /// HTTPS on 127.0.0.1:`port` inside network namespace `netns`.
    pub fn https_in_netns(root: &Path, ca: &TestCa, netns: &str, port: u16) -> StaticServer {
        Self::start_in(root, Some(ca), Some((netns, port)))
    }

    fn start(root: &Path, ca: Option<&TestCa>) -> StaticServer {
        Self::start_in(root, ca, None)
    }

    fn start_in(root: &Path, ca: Option<&TestCa>, netns: Option<(&str, u16)>) -> StaticServer {
        let (cert, key) = match ca {
            Some(ca) => (ca.cert_pem_path.display().to_string(), ca.key_pem_path.display().to_string()),
            None => (String::new(), String::new()),
        };
        let mut command = match netns {
            None => Command::new("python3"),
            Some((ns, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "python3"]);
                c
            }
        };
        let port = netns.map_or(0, |(_, p)| p);
        let mut child = command
            .args(["-c", SERVER])
            .arg(root)
            .args([cert, key, port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start python3 http.server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("port line");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("static server did not start: {line:?}"));
        StaticServer { port, child }
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
