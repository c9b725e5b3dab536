//! `egress-gateway usage --sandbox ID`: asks the running gateway's admin listener for
//! `GET /v1/sandboxes/ID` and prints the sandbox's budgets, what it spent in the
//! current windows, its open connections and its last refusals.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

pub struct Args<'a> {
    pub config: Option<&'a PathBuf>,
    pub sandbox: &'a str,
    /// The admin listener, when not `admin.listen` (which may be port 0).
    pub admin: Option<SocketAddr>,
    pub policy: Option<&'a str>,
    pub json: bool,
}

pub fn run(args: &Args<'_>, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(args.config)?;
    let mut addr = args.admin.unwrap_or(cfg.admin.listen);
    if addr.ip().is_unspecified() {
        let ip: IpAddr = if addr.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() };
        addr = SocketAddr::new(ip, addr.port());
    }
    if !args.sandbox.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        anyhow::bail!("--sandbox: expected a sandbox id (letters, digits, '.', '_', '-')");
    }
    let mut path = format!("/v1/sandboxes/{}", args.sandbox);
    if let Some(p) = args.policy {
        path.push_str(&format!("?policy={p}"));
    }
    let (status, body) =
        get(addr, &path, cfg.admin.token.as_deref()).map_err(|e| anyhow::anyhow!("admin listener {addr}: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|_| anyhow::anyhow!("admin listener {addr}: answered {status}: {body}"))?;
    if status != 200 {
        anyhow::bail!("{}", v["error"].as_str().unwrap_or(&body));
    }
    if args.json {
        writeln!(out, "{v:#}")?;
        return Ok(0);
    }
    print_usage(&v, out)?;
    Ok(0)
}

fn print_usage(v: &serde_json::Value, out: &mut dyn Write) -> std::io::Result<()> {
    let s = |k: &str| v[k].as_str().unwrap_or("-").to_string();
    writeln!(out, "sandbox {} (policy {})", s("sandbox"), s("policy"))?;
    let healthy = v["store_healthy"].as_bool().unwrap_or(true);
    writeln!(out, "counted: {}{}", s("store"), if healthy { "" } else { " (store unreachable: local share)" })?;
    let budgets = v["budgets"].as_array().map(Vec::as_slice).unwrap_or_default();
    if budgets.is_empty() {
        writeln!(out, "budgets: none")?;
    }
    for b in budgets {
        let (used, limit) = (b["used"].as_u64().unwrap_or(0), b["limit"].as_u64().unwrap_or(0));
        let left = b["window_end"].as_u64().unwrap_or(0).saturating_sub(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        );
        writeln!(
            out,
            "  {:<40} {used:>14} of {limit:<14} window ends in {}",
            b["budget"].as_str().unwrap_or("?"),
            humantime::format_duration(Duration::from_secs(left))
        )?;
    }
    writeln!(out, "open connections: {}", v["open_connections"].as_u64().unwrap_or(0))?;
    for o in v["open"].as_array().map(Vec::as_slice).unwrap_or_default().iter().take(20) {
        writeln!(out, "  {}", o.as_str().unwrap_or("?"))?;
    }
    let refusals = v["recent_refusals"].as_array().map(Vec::as_slice).unwrap_or_default();
    writeln!(out, "recent refusals: {}", refusals.len())?;
    for r in refusals {
        let field = |k: &str| r[k].as_str().map(|x| format!(" {k}={x}")).unwrap_or_default();
        writeln!(
            out,
            "  {}{}{}{}{}",
            r["ts"].as_str().unwrap_or("?"),
            field("target"),
            field("reason"),
            field("budget"),
            field("rule")
        )?;
    }
    Ok(())
}

fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    let timeout = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.take(4 << 20).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {head:?}")))?;
    Ok((status, body.to_string()))
}
