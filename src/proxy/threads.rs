//! The proxy port's threads (`proxy.threads`, one per CPU by default). Each runs its
//! own single-threaded tokio runtime and an accept loop on the same listening socket;
//! a connection, its tunnel and its upstream requests stay on one thread, so the hot
//! path has no work stealing and no wakeups between threads. A thread that accepts a
//! connection while another has clearly fewer open hands it over (see
//! [`server::Placement`]), so a few long bulk tunnels still spread across CPUs. The cap
//! `proxy.max_connections` is one semaphore shared by all of them. The rest of the
//! gateway (admin, DNS, reload, drain) runs on the main runtime.

use std::io;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Shared, server};

/// How often each proxy thread's runtime wakes for [`keep_a_timer_due`]; shorter than
/// the timers every connection sets (`proxy.connect_timeout`, 5 s by default, and
/// `proxy.header_read_timeout`, 10 s).
const TIMER_FLOOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps a timer due within [`TIMER_FLOOR`] on this thread's runtime, so that the
/// timers a connection sets are never earlier than every timer already waiting.
/// tokio wakes its own driver (an eventfd `write`, and one more `epoll_wait` return)
/// whenever a new timer is earlier than the one it last parked for, or when none was
/// waiting: in a storm of short tunnels, half a `write` per CONNECT setup. The cost
/// is one wakeup a second per proxy thread.
async fn keep_a_timer_due() {
    loop {
        tokio::time::sleep(TIMER_FLOOR).await;
    }
}

/// The running accept threads.
pub struct AcceptThreads {
    stopped: Vec<oneshot::Receiver<()>>,
    /// `proxy.max_connections` places, shared with the transparent listeners.
    limit: Arc<Semaphore>,
}

impl AcceptThreads {
    /// Starts `shared.config.proxy.threads` threads accepting from `listener` until
    /// `stop` fires. Each thread keeps running, for the connections and tunnels it
    /// owns, until `shared.tasks` is closed and empty.
    pub fn start(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) -> io::Result<AcceptThreads> {
        let listener = listener.into_std()?;
        let limit = Arc::new(Semaphore::new(shared.config.proxy.max_connections));
        let runtimes = (0..shared.config.proxy.threads.max(1))
            .map(|_| tokio::runtime::Builder::new_current_thread().enable_all().build())
            .collect::<io::Result<Vec<_>>>()?;
        let handles = runtimes.iter().map(|r| r.handle().clone()).collect();
        let placement = Arc::new(server::Placement::new(handles, shared.tasks.clone()));
        let mut stopped = Vec::new();
        for (i, runtime) in runtimes.into_iter().enumerate() {
            let listener = listener.try_clone()?;
            listener.set_nonblocking(true)?;
            let (shared, stop, limit) = (shared.clone(), stop.clone(), limit.clone());
            let limit: Arc<Semaphore> = limit;
            let place = (placement.clone(), i);
            let (done, rx) = oneshot::channel();
            std::thread::Builder::new().name(format!("proxy-{i}")).spawn(move || {
                runtime.block_on(async move {
                    tokio::spawn(keep_a_timer_due());
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
        Ok(AcceptThreads { stopped, limit })
    }

    /// The places under `proxy.max_connections` every client connection takes.
    pub fn limit(&self) -> Arc<Semaphore> {
        self.limit.clone()
    }

    /// Resolves when every thread has stopped accepting.
    pub async fn stopped(self) {
        for rx in self.stopped {
            let _ = rx.await;
        }
    }
}
