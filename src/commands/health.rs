//! `egress-gateway health`: asks the running gateway's admin listener for `/healthz`
//! (or `/readyz`) and exits 0 on `200`, 1 otherwise. The container image's
//! `HEALTHCHECK` uses it: the image has no shell and no curl.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

pub fn run(config_path: Option<&PathBuf>, ready: bool, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(config_path)?;
    let mut addr = cfg.admin.listen;
    // A wildcard listener is reached on loopback.
    if addr.ip().is_unspecified() {
        let ip: IpAddr = if addr.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() };
        addr = SocketAddr::new(ip, addr.port());
    }
    let path = if ready { "/readyz" } else { "/healthz" };
    let status = get(addr, path).map_err(|e| anyhow::anyhow!("admin listener {addr}: {e}"))?;
    writeln!(out, "{path}: {status}")?;
    Ok(if status == 200 { 0 } else { 1 })
}

fn get(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let timeout = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {line:?}")))
}
