//! The proxy port's threads (`proxy.threads`, one per CPU by default). Each runs its
//! own single-threaded tokio runtime and an accept loop on its own listening socket
//! (`SO_REUSEPORT` on Linux, so the kernel spreads new connections and wakes only one
//! thread for each; elsewhere the threads share one socket);
//! a connection, its tunnel and its upstream requests stay on one thread, so the hot
//! path has no work stealing and no wakeups between threads. A thread that accepts a
//! connection while another has clearly fewer open hands it over (see
//! [`server::Placement`]), so a few long bulk tunnels still spread across CPUs. The cap
//! `proxy.max_connections` is one semaphore shared by all of them. The rest of the
//! gateway (admin, DNS, reload, drain) runs on the main runtime.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Shared, server};

thread_local! {
    /// This thread's index among the proxy threads; unset on every other thread.
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The calling thread's index among the proxy threads, if it is one of them.
pub fn current() -> Option<usize> {
    CURRENT.with(|c| c.get())
}

/// Binds the proxy port's listening socket. With more than one thread on Linux it is
/// the first of a `SO_REUSEPORT` group that [`AcceptThreads::start`] completes. A
/// group would let a second gateway on the same port and user join it and take half
/// the connections, so the address is first bound without the option: a port in use
/// (by another gateway too) still fails with "address in use".
pub fn bind(addr: SocketAddr, threads: usize) -> io::Result<std::net::TcpListener> {
    if !reuse_port(threads) {
        return Ok(listen_socket(addr, false)?.into());
    }
    // The probe never listens, so no connection can queue on it; it also fixes port 0.
    let probe = bound_socket(addr, false)?.local_addr()?.as_socket().unwrap_or(addr);
    Ok(listen_socket(probe, true)?.into())
}

fn bound_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<socket2::Socket> {
    let sock = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    if reuse_port {
        sock.set_reuse_port(true)?;
    }
    sock.bind(&addr.into())?;
    Ok(sock)
}

fn listen_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<socket2::Socket> {
    let sock = bound_socket(addr, reuse_port)?;
    sock.listen(LISTEN_BACKLOG)?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

const LISTEN_BACKLOG: i32 = 1024;

fn reuse_port(threads: usize) -> bool {
    cfg!(target_os = "linux") && threads > 1
}

/// One listening socket per thread: `first` plus sockets joining its `SO_REUSEPORT`
/// group on the same address, or clones of `first` where there is no such group.
fn per_thread_listeners(first: std::net::TcpListener, threads: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let addr = first.local_addr()?;
    let grouped = reuse_port(threads) && socket2::SockRef::from(&first).reuse_port().unwrap_or(false);
    let mut out = Vec::with_capacity(threads);
    for _ in 1..threads {
        out.push(if grouped { listen_socket(addr, true)?.into() } else { first.try_clone()? });
    }
    out.insert(0, first);
    Ok(out)
}

/// The running accept threads.
pub struct AcceptThreads {
    stopped: Vec<oneshot::Receiver<()>>,
}

impl AcceptThreads {
    /// Starts `shared.config.proxy.threads` threads accepting from `listener` until
    /// `stop` fires. Each thread keeps running, for the connections and tunnels it
    /// owns, until `shared.tasks` is closed and empty.
    pub fn start(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) -> io::Result<AcceptThreads> {
        let listener = listener.into_std()?;
        let threads = shared.config.proxy.threads.max(1);
        let listeners = per_thread_listeners(listener, threads)?;
        let limit = Arc::new(Semaphore::new(shared.config.proxy.max_connections));
        let runtimes = (0..threads)
            .map(|_| tokio::runtime::Builder::new_current_thread().enable_all().build())
            .collect::<io::Result<Vec<_>>>()?;
        let handles = runtimes.iter().map(|r| r.handle().clone()).collect();
        let placement = Arc::new(server::Placement::new(handles, shared.tasks.clone()));
        let mut stopped = Vec::new();
        for (i, (runtime, listener)) in runtimes.into_iter().zip(listeners).enumerate() {
            listener.set_nonblocking(true)?;
            let (shared, stop, limit) = (shared.clone(), stop.clone(), limit.clone());
            let place = (placement.clone(), i);
            let (done, rx) = oneshot::channel();
            std::thread::Builder::new().name(format!("proxy-{i}")).spawn(move || {
                CURRENT.with(|c| c.set(Some(i)));
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => server::serve(listener, shared.clone(), stop, limit, Some(place)).await,
                        Err(e) => tracing::error!(error = %e, thread = i, "proxy thread cannot use the listener"),
                    }
                    let _ = done.send(());
                    shared.tasks.wait().await;
                });
            })?;
            stopped.push(rx);
        }
        Ok(AcceptThreads { stopped })
    }

    /// Resolves when every thread has stopped accepting.
    pub async fn stopped(self) {
        for rx in self.stopped {
            let _ = rx.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_gets_a_listener_on_the_one_port() {
        let first = bind("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let addr = first.local_addr().unwrap();
        let listeners = per_thread_listeners(first, 3).unwrap();
        assert_eq!(listeners.len(), 3);
        for l in &listeners {
            assert_eq!(l.local_addr().unwrap(), addr);
            if cfg!(target_os = "linux") {
                assert!(socket2::SockRef::from(l).reuse_port().unwrap(), "one SO_REUSEPORT group");
            }
        }
        // Every connection is accepted by exactly one of them.
        let clients: Vec<_> = (0..24).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut accepted = 0;
        while accepted < clients.len() && std::time::Instant::now() < deadline {
            for l in &listeners {
                if l.accept().is_ok() {
                    accepted += 1;
                }
            }
        }
        assert_eq!(accepted, clients.len());
    }

    #[test]
    fn a_port_in_use_is_refused_even_by_a_group() {
        let first = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = first.local_addr().unwrap();
        for threads in [1, 2] {
            let err = bind(addr, threads).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{threads} threads: {err}");
        }
    }

    #[test]
    fn one_thread_binds_a_plain_socket() {
        let l = bind("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        assert!(!socket2::SockRef::from(&l).reuse_port().unwrap());
        assert_eq!(per_thread_listeners(l, 1).unwrap().len(), 1);
    }
}
