//! The load benchmark's clients: CONNECT setups, wrk keep-alive requests, tunnel
//! throughput and idle tunnels. Each phase is bounded in time and count.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::origin::find;
use super::peers::Proxy;

pub struct Rate {
    pub rate: f64,
    /// Operations completed (setups, or requests).
    pub count: u64,
    pub p50: Duration,
    pub p99: Duration,
    /// p90, p99.9 and the maximum, for the progress line (CONNECT setups only).
    pub tail: [Duration; 3],
    pub errors: u64,
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Reads one response head (and a Content-Length body) from `s`; returns the status.
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>, with_body: bool) -> std::io::Result<u16> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    if with_body {
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(status)
}

/// Opens a tunnel to `target` (or a direct connection when there is no proxy); `buf` is left holding any
/// tunnel bytes that arrived with the proxy's answer.
async fn open(p: &Proxy, target: SocketAddr, auth: &str, buf: &mut Vec<u8>) -> std::io::Result<TcpStream> {
    buf.clear();
    let Some(proxy) = p.addr else {
        let s = TcpStream::connect(target).await?;
        s.set_nodelay(true)?;
        return Ok(s);
    };
    if p.transparent {
        // As a redirected program would: straight to the listener, no CONNECT.
        let s = TcpStream::connect(proxy).await?;
        s.set_nodelay(true)?;
        return Ok(s);
    }
    let mut s = TcpStream::connect(proxy).await?;
    s.set_nodelay(true)?;
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let status = read_response(&mut s, buf, false).await?;
    if status != 200 {
        return Err(std::io::Error::other(format!("CONNECT answered {status}")));
    }
    // Keep only what arrived after the answer's head: the tunnel's first bytes.
    if let Some(i) = find(buf, b"\r\n\r\n") {
        buf.drain(..i + 4);
    }
    Ok(s)
}

/// `workers` loops of: connect, CONNECT, one GET through the tunnel, close.
pub async fn connect_setups(p: &Proxy, http: SocketAddr, workers: usize, dur: Duration) -> Rate {
    let start = Instant::now();
    let auth = p.auth();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let auth = auth.clone();
        let proxy = p.handle();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), 0u64);
            let mut buf = Vec::with_capacity(4096);
            let get = if proxy.transparent {
                format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", super::peers::TRANSPARENT_HOST)
            } else {
                format!("GET / HTTP/1.1\r\nHost: {http}\r\n\r\n")
            };
            while start.elapsed() < dur {
                let t = Instant::now();
                let ok = async {
                    let mut s = open(&proxy, http, &auth, &mut buf).await?;
                    s.write_all(get.as_bytes()).await?;
                    let status = read_response(&mut s, &mut buf, true).await?;
                    std::io::Result::Ok(status == 200)
                };
                match tokio::time::timeout(Duration::from_secs(5), ok).await {
                    Ok(Ok(true)) => lat.push(t.elapsed()),
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let (mut lat, mut errors) = (Vec::new(), 0);
    for t in tasks {
        let (l, e) = t.await.unwrap();
        lat.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed();
    lat.sort();
    Rate {
        rate: lat.len() as f64 / elapsed.as_secs_f64(),
        count: lat.len() as u64,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        tail: [percentile(&lat, 0.9), percentile(&lat, 0.999), lat.last().copied().unwrap_or_default()],
        errors,
    }
}

/// Absolute-form GETs on keep-alive connections through the proxy (origin-form straight
/// to the origin for direct), driven by wrk with 2 threads and `conns` connections.
pub fn wrk_keepalive(p: &Proxy, http: SocketAddr, conns: usize, dur: Duration) -> Rate {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("proxy.lua");
    let (url, lua) = match p.addr {
        Some(proxy) => (
            format!("http://{proxy}"),
            format!(
                "wrk.path = \"http://{http}/\"\nwrk.headers[\"Host\"] = \"{http}\"\nwrk.headers[\"Proxy-Authorization\"] = \"{}\"\n",
                p.auth()
            ),
        ),
        None => (format!("http://{http}"), String::new()),
    };
    std::fs::write(&script, lua).unwrap();
    let out = Command::new("wrk")
        .args(["-t2", &format!("-c{conns}"), &format!("-d{}s", dur.as_secs()), "--latency", "-s"])
        .arg(&script)
        .arg(&url)
        .output()
        .expect("wrk (apt install wrk)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |prefix: &str| text.lines().find_map(|l| l.trim().strip_prefix(prefix).map(|r| r.trim().to_string()));
    let rate = field("Requests/sec:").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let errors = text
        .lines()
        .filter(|l| l.contains("Non-2xx") || l.contains("Socket errors"))
        .flat_map(|l| l.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u64>().ok()).collect::<Vec<_>>())
        .sum();
    // "  123456 requests in 5.00s, 12.34MB read"
    let count = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    Rate {
        rate,
        count,
        p50: wrk_duration(field("50%")),
        p99: wrk_duration(field("99%")),
        tail: Default::default(),
        errors,
    }
}

/// wrk prints latencies as `1.23ms`, `456.00us` or `1.02s`.
fn wrk_duration(v: Option<String>) -> Duration {
    let Some(v) = v else { return Duration::ZERO };
    let (num, mult) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        (v.as_str(), 1.0)
    };
    num.parse::<f64>().map(|n| Duration::from_secs_f64(n * mult)).unwrap_or_default()
}

pub struct Throughput {
    pub bytes: u64,
    pub elapsed: Duration,
}

/// `streams` tunnels to the source origin at once, each read to the end.
pub async fn throughput(p: &Proxy, source: SocketAddr, streams: usize, each: u64, limit: Duration) -> Throughput {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let proxy = p.handle();
        let auth = p.auth();
        tasks.push(tokio::spawn(async move {
            let mut head = Vec::new();
            let Ok(mut s) = open(&proxy, source, &auth, &mut head).await else { return 0 };
            let mut buf = vec![0u8; 256 * 1024];
            let mut got = head.len() as u64;
            let deadline = start + limit;
            while got < each {
                match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => got += n as u64,
                    _ => break,
                }
            }
            got
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await.unwrap();
    }
    Throughput { bytes, elapsed: start.elapsed() }
}

/// Opens `n` tunnels to the hold origin, 64 at a time, and leaves them idle; returns
/// the proxy's resident memory growth per tunnel in KiB.
/// Opens `n` idle tunnels to `hold`, measures the proxy's resident memory per tunnel,
/// and hands the still-open tunnels back (for a phase that runs while they are open).
pub async fn idle_tunnels(p: &Proxy, hold: SocketAddr, n: usize) -> (Option<f64>, Vec<TcpStream>) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = p.rss_kib();
    let auth = p.auth();
    let mut open_streams = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut failures = 0;
    while open_streams.len() < n && Instant::now() < deadline && failures < 100 {
        let batch = (n - open_streams.len()).min(64);
        let mut tasks = Vec::new();
        for _ in 0..batch {
            let proxy = p.handle();
            let auth = auth.clone();
            tasks.push(tokio::spawn(async move {
                let mut head = Vec::new();
                tokio::time::timeout(Duration::from_secs(5), open(&proxy, hold, &auth, &mut head)).await.ok()?.ok()
            }));
        }
        for t in tasks {
            match t.await.unwrap() {
                Some(s) => open_streams.push(s),
                None => failures += 1,
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = p.rss_kib();
    if std::env::var("LOAD_HOLD").is_ok() {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let opened = open_streams.len();
    eprintln!("  idle tunnels: {opened} open, RSS {before} KiB -> {after} KiB, {failures} failures");
    ((opened > 0).then(|| after.saturating_sub(before) as f64 / opened as f64), open_streams)
}
