//! Binding and serving the DNS firewall: UDP through hickory's server (one socket per
//! core with `SO_REUSEPORT`), TCP through a small loop of our own so that concurrent
//! connections are capped and idle ones closed.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_net::NetError;
use hickory_net::runtime::TokioTime;
use hickory_net::xfer::Protocol;
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::BinEncoder;
use hickory_server::Server;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use socket2::{Domain, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::firewall::{Firewall, Handler};
use crate::config::DnsConfig;
use crate::metrics;

pub struct DnsServer {
    udp: Vec<UdpSocket>,
    tcp: TcpListener,
    handler: Handler,
    max_tcp: usize,
    tcp_idle: Duration,
}

impl DnsServer {
    /// Binds UDP and TCP on `cfg.listen` (the same port for both, also when the port
    /// is 0).
    pub async fn bind(cfg: &DnsConfig) -> io::Result<DnsServer> {
        let firewall = Firewall::new(cfg).map_err(io::Error::other)?;
        let sockets = match cfg.udp_sockets {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let mut last_err = None;
        // With port 0, the UDP port picked may be taken for TCP: retry a few times.
        for _ in 0..8 {
            match bind_all(cfg.listen, sockets) {
                Ok((udp, tcp)) => {
                    return Ok(DnsServer {
                        udp,
                        tcp,
                        handler: Handler(Arc::new(firewall)),
                        max_tcp: cfg.tcp_max_connections,
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
        let DnsServer {
            udp,
            tcp,
            handler,
            max_tcp,
            tcp_idle,
        } = self;
        let mut server = Server::new(handler.clone());
        for socket in udp {
            server.register_socket(socket);
        }
        let tasks = TaskTracker::new();
        let tcp_loop = serve_tcp(
            tcp,
            handler,
            max_tcp,
            tcp_idle,
            shutdown.clone(),
            tasks.clone(),
        );
        tokio::select! {
            _ = tcp_loop => {}
            r = server.block_until_done() => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "dns udp server stopped");
                }
            }
        }
        let _ = server.shutdown_gracefully().await;
        tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), tasks.wait()).await;
    }
}

fn bind_all(addr: SocketAddr, sockets: usize) -> io::Result<(Vec<UdpSocket>, TcpListener)> {
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

fn udp_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, None)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

async fn serve_tcp(
    listener: TcpListener,
    handler: Handler,
    max: usize,
    idle: Duration,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let limit = Arc::new(Semaphore::new(max));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            ::metrics::counter!(metrics::DNS_TCP_REFUSED).increment(1);
            continue; // dropped: closed at once
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = tcp_connection(stream, peer, &handler, idle) => {}
                _ = shutdown.cancelled() => {}
            }
            drop(permit);
        });
    }
}

/// Serves length-prefixed messages on one connection until it closes, errs, or idles.
async fn tcp_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    handler: &Handler,
    idle: Duration,
) {
    let mut buf = Vec::with_capacity(512);
    loop {
        let len = match tokio::time::timeout(idle, stream.read_u16()).await {
            Ok(Ok(len)) => usize::from(len),
            _ => return,
        };
        buf.resize(len, 0);
        match tokio::time::timeout(idle, stream.read_exact(&mut buf)).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
        let Some(reply) = answer_bytes(&buf, peer, handler).await else {
            return;
        };
        let Ok(reply_len) = u16::try_from(reply.len()) else {
            return;
        };
        let mut out = Vec::with_capacity(reply.len() + 2);
        out.extend_from_slice(&reply_len.to_be_bytes());
        out.extend_from_slice(&reply);
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// The wire answer to one raw TCP message; `None` closes the connection (too short to
/// carry a header, or a response message).
async fn answer_bytes(raw: &[u8], peer: SocketAddr, handler: &Handler) -> Option<Vec<u8>> {
    if raw.len() < 12 || raw[2] & 0x80 != 0 {
        return None;
    }
    match Request::from_bytes(raw.to_vec(), peer, Protocol::Tcp) {
        Ok(request) => {
            let slot = TcpResponder::default();
            handler
                .handle_request::<_, TokioTime>(&request, slot.clone())
                .await;
            slot.take()
        }
        Err(_) => {
            ::metrics::counter!(metrics::DNS_QUERIES, "result" => "formerr", "transport" => "tcp")
                .increment(1);
            Some(formerr(raw))
        }
    }
}

/// A bare FORMERR header echoing the query's id and opcode.
pub fn formerr(raw: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[0] = raw[0];
    h[1] = raw[1];
    h[2] = 0x80 | (raw[2] & 0x78); // QR, original opcode
    h[3] = 0x01; // FORMERR
    h
}

/// Collects the encoded response for the TCP loop to write.
#[derive(Clone, Default)]
struct TcpResponder(Arc<Mutex<Option<Vec<u8>>>>);

impl TcpResponder {
    fn take(&self) -> Option<Vec<u8>> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }
}

#[async_trait::async_trait]
impl ResponseHandler for TcpResponder {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(u16::MAX);
        let info = response
            .destructive_emit(&mut encoder)
            .map_err(|e| NetError::from(e.to_string()))?;
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(bytes);
        }
        Ok(info)
    }
}
