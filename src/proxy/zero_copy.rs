//! One direction of a TCP-to-TCP tunnel, driven by readiness: nothing is held while the
//! tunnel is idle. On Linux the bytes move by `splice(2)` from the source socket into a
//! pipe and from the pipe into the destination socket, never entering user space;
//! pipes come from a shared pool and are held only while bytes are in flight. Where a
//! pipe cannot be had (another OS, descriptors exhausted) a chunk is copied through a
//! buffer allocated for that chunk.

use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::TcpStream;

/// Most bytes moved per step: a pipe's default capacity.
const CHUNK: usize = 64 * 1024;

/// Relays `from` to `to` until `from` ends (then half-closes `to`) or an error occurs.
/// `on_bytes` is called after every chunk with its length.
pub async fn one_way(from: &TcpStream, to: &TcpStream, count: &AtomicU64, on_bytes: impl Fn()) -> io::Result<()> {
    loop {
        from.readable().await?;
        let n = match move_chunk(from, to).await {
            Ok(Some(n)) => n,
            // Readiness was stale; wait again.
            Ok(None) => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // Propagate the half-close and let the other direction run on.
            let _ = socket2::SockRef::from(to).shutdown(Shutdown::Write);
            return Ok(());
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        on_bytes();
    }
}

/// Moves one chunk that `from` has ready. `Ok(None)`: nothing was ready after all;
/// `Ok(Some(0))`: end of stream.
async fn move_chunk(from: &TcpStream, to: &TcpStream) -> io::Result<Option<usize>> {
    #[cfg(target_os = "linux")]
    if let Some(pipe) = pipe::Pipe::take() {
        return pipe.carry(from, to).await;
    }
    copy_chunk(from, to).await
}

/// The user-space fallback: one buffer for one chunk.
async fn copy_chunk(from: &TcpStream, to: &TcpStream) -> io::Result<Option<usize>> {
    let mut buf = vec![0u8; CHUNK];
    let n = match from.try_read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut sent = 0;
    while sent < n {
        to.writable().await?;
        match to.try_write(&buf[sent..n]) {
            Ok(m) => sent += m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(n))
}

#[cfg(target_os = "linux")]
mod pipe {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::Mutex;

    use nix::fcntl::{OFlag, SpliceFFlags, splice};
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    use super::CHUNK;

    /// Empty pipes kept for reuse; beyond this many they are closed.
    const POOL_MAX: usize = 256;
    static POOL: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());

    pub struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
    }

    impl Pipe {
        /// An empty pipe from the pool or a new one; `None` when none can be made.
        pub fn take() -> Option<Pipe> {
            if let Some(p) = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                return Some(p);
            }
            match nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC) {
                Ok((read, write)) => Some(Pipe { read, write }),
                Err(e) => {
                    tracing::debug!(error = %e, "no pipe for splice; copying through user space");
                    None
                }
            }
        }

        /// Back to the pool; only ever called on an empty pipe.
        fn give_back(self) {
            let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_MAX {
                pool.push(self);
            }
        }

        /// Splices what `from` has ready into the pipe and all of it on into `to`. On
        /// an error the pipe may hold bytes, so it is closed rather than pooled.
        pub async fn carry(self, from: &TcpStream, to: &TcpStream) -> io::Result<Option<usize>> {
            let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
            let filled = from
                .try_io(Interest::READABLE, || Ok(splice(from.as_fd(), None, self.write.as_fd(), None, CHUNK, flags)?));
            let n = match filled {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.give_back();
                    return Ok(None);
                }
                Err(e) => {
                    self.give_back();
                    return Err(e);
                }
            };
            let mut left = n;
            while left > 0 {
                to.writable().await?;
                let drained = to
                    .try_io(Interest::WRITABLE, || Ok(splice(self.read.as_fd(), None, to.as_fd(), None, left, flags)?));
                match drained {
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            self.give_back();
            Ok(Some(n))
        }
    }
}
