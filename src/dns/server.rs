//! Binding and serving the DNS firewall. The request and response types and the
//! handler are hickory-server's; the socket loops are our own:
//! - UDP: one socket per core (`SO_REUSEPORT`), each served by its own OS thread that
//!   receives, answers and sends inline (the handler never waits on I/O, so its future
//!   completes on first poll). hickory's own UDP server spawns a task and goes through
//!   a channel per query; this measured faster (benches/dns_bench.sh). On Linux the
//!   loop batches with recvmmsg/sendmmsg (`udp_batch`).
//! - TCP: concurrent connections are capped and idle ones closed, which hickory's TCP
//!   server does not offer.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_net::xfer::Protocol;
use socket2::{Domain, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::MayReach;
use super::firewall::{Firewall, Handler};
use super::wire::answer_bytes;
#[cfg(not(target_os = "linux"))]
use super::wire::{MAX_DATAGRAM, UDP_POLL};
use crate::config::DnsConfig;
use crate::metrics;

pub struct DnsServer {
    udp: Vec<std::net::UdpSocket>,
    tcp: TcpListener,
    handler: Handler,
    max_tcp: usize,
    max_tcp_per_client: usize,
    tcp_idle: Duration,
}

impl DnsServer {
    /// Binds UDP and TCP on `cfg.listen` (the same port for both, also when the port
    /// is 0).
    /// `may_reach` is consulted in answer mode (`dns.answer = "gateway"`).
    pub async fn bind(cfg: &DnsConfig, may_reach: MayReach) -> io::Result<DnsServer> {
        let mut firewall = Firewall::new(cfg).map_err(io::Error::other)?;
        if cfg.answer == crate::config::DnsAnswer::Gateway {
            firewall.answer_for(may_reach, cfg.answer_ttl);
        }
        let sockets = match cfg.udp_sockets {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let mut firewall = Some(firewall);
        let mut last_err = None;
        // With port 0, the UDP port picked may be taken for TCP: retry a few times.
        for _ in 0..8 {
            match bind_all(cfg.listen, sockets) {
                Ok((udp, tcp)) => {
                    let Some(firewall) = firewall.take() else { break };
                    return Ok(DnsServer {
                        udp,
                        tcp,
                        handler: Handler::new(firewall),
                        max_tcp: cfg.tcp_max_connections,
                        max_tcp_per_client: cfg.tcp_max_per_client,
                        tcp_idle: cfg.tcp_idle_timeout,
                    });
                }
                Err(e) if cfg.listen.port() == 0 => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("cannot bind DNS listener")))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Serves until `shutdown` fires, then stops both transports.
    pub async fn run(self, shutdown: CancellationToken) {
        let DnsServer { udp, tcp, handler, max_tcp, max_tcp_per_client, tcp_idle } = self;
        let tasks = TaskTracker::new();
        let mut threads = Vec::new();
        for (i, socket) in udp.into_iter().enumerate() {
            let (handler, shutdown) = (handler.clone(), shutdown.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("dns-udp-{i}"))
                .spawn(move || serve_udp(socket, &handler, &shutdown));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => tracing::error!(error = %e, "cannot start DNS UDP thread"),
            }
        }
        let limits = TcpLimits { max: max_tcp, per_client: max_tcp_per_client, idle: tcp_idle };
        serve_tcp(tcp, handler, limits, shutdown.clone(), tasks.clone()).await;
        tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
        let _ = tokio::task::spawn_blocking(move || threads.into_iter().for_each(|t| drop(t.join()))).await;
    }
}

fn bind_all(addr: SocketAddr, sockets: usize) -> io::Result<(Vec<std::net::UdpSocket>, TcpListener)> {
    let first = udp_socket(addr)?;
    let bound = first.local_addr()?;
    let mut udp = vec![first];
    for _ in 1..sockets {
        udp.push(udp_socket(bound)?);
    }
    let tcp = std::net::TcpListener::bind(bound)?;
    tcp.set_nonblocking(true)?;
    Ok((udp, TcpListener::from_std(tcp)?))
}

fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, None)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

#[cfg(target_os = "linux")]
fn serve_udp(socket: std::net::UdpSocket, handler: &Handler, shutdown: &CancellationToken) {
    super::udp_batch::serve(socket, handler, shutdown)
}

/// One datagram per system call, where batching calls are not available.
#[cfg(not(target_os = "linux"))]
fn serve_udp(socket: std::net::UdpSocket, handler: &Handler, shutdown: &CancellationToken) {
    if let Err(e) = socket.set_read_timeout(Some(UDP_POLL)) {
        tracing::error!(error = %e, "dns udp socket unusable");
        return;
    }
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut served: u32 = 0;
    loop {
        // Looking at the token takes a lock: do it when idle and every 1024 queries.
        served = served.wrapping_add(1);
        if served.is_multiple_of(1024) && shutdown.is_cancelled() {
            return;
        }
        let (n, src) = match socket.recv_from(&mut buf) {
            Ok(ok) => ok,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if shutdown.is_cancelled() {
                    return;
                }
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "dns udp receive failed");
                continue;
            }
        };
        // Port 0 cannot be answered.
        if src.port() == 0 {
            continue;
        }
        if let Some(reply) = futures_executor::block_on(answer_bytes(&buf[..n], src, Protocol::Udp, handler)) {
            let _ = socket.send_to(&reply, src);
        }
    }
}

/// Caps on DNS over TCP: connections in all, per source address (the idle timer
/// restarts with every message, so one client could otherwise hold every slot), and
/// the idle timeout.
struct TcpLimits {
    max: usize,
    per_client: usize,
    idle: Duration,
}

/// Open connections per source address; an entry leaves with its last connection.
#[derive(Default)]
struct PerClient(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

struct ClientSlot {
    table: Arc<PerClient>,
    ip: std::net::IpAddr,
}

impl PerClient {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<ClientSlot> {
        let mut t = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = t.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot { table: self.clone(), ip })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

async fn serve_tcp(
    listener: TcpListener,
    handler: Handler,
    limits: TcpLimits,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let limit = Arc::new(Semaphore::new(limits.max));
    let per_client = Arc::new(PerClient::default());
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // An IPv4-mapped client counts as its IPv4, as the rate limit does.
        let Some(client_slot) = per_client.take(crate::addr::client_key(peer.ip()), limits.per_client) else {
            ::metrics::counter!(metrics::DNS_TCP_REFUSED).increment(1);
            continue; // dropped: closed at once
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            ::metrics::counter!(metrics::DNS_TCP_REFUSED).increment(1);
            continue;
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        let idle = limits.idle;
        tasks.spawn(async move {
            tokio::select! {
                _ = tcp_connection(stream, peer, &handler, idle) => {}
                _ = shutdown.cancelled() => {}
            }
            drop((permit, client_slot));
        });
    }
}

/// Serves length-prefixed messages on one connection until it closes, errs, or idles
/// (reading a message, or writing answers the client does not read).
/// Reads are buffered and answers to pipelined queries are written together, once no
/// further whole query is already buffered: one read and one write per burst, not per
/// query, and never an answer held back behind part of the next query.
/// Whether `buf` starts with a whole length-prefixed message.
fn holds_a_message(buf: &[u8]) -> bool {
    match buf {
        [hi, lo, rest @ ..] => rest.len() >= usize::from(u16::from_be_bytes([*hi, *lo])),
        _ => false,
    }
}

async fn tcp_connection(stream: TcpStream, peer: SocketAddr, handler: &Handler, idle: Duration) {
    let (r, mut w) = stream.into_split();
    let mut r = tokio::io::BufReader::with_capacity(16 * 1024, r);
    let mut msg = Vec::with_capacity(512);
    let mut out = Vec::with_capacity(16 * 1024);
    loop {
        let len = match tokio::time::timeout(idle, r.read_u16()).await {
            Ok(Ok(len)) => usize::from(len),
            _ => break,
        };
        msg.resize(len, 0);
        match tokio::time::timeout(idle, r.read_exact(&mut msg)).await {
            Ok(Ok(_)) => {}
            _ => break,
        }
        let Some(reply) = answer_bytes(&msg, peer, Protocol::Tcp, handler).await else { break };
        let Ok(reply_len) = u16::try_from(reply.len()) else { break };
        out.extend_from_slice(&reply_len.to_be_bytes());
        out.extend_from_slice(&reply);
        if !holds_a_message(r.buffer()) || out.len() >= 16 * 1024 {
            // A client that sends but never reads must not hold its slot: a write
            // that cannot finish within the idle timeout ends the connection.
            if !matches!(tokio::time::timeout(idle, w.write_all(&out)).await, Ok(Ok(()))) {
                return;
            }
            out.clear();
        }
    }
    let _ = tokio::time::timeout(idle, w.write_all(&out)).await;
}
