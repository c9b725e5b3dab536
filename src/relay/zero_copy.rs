//! One direction of a TCP-to-TCP tunnel, driven by readiness: nothing is held while the
//! tunnel is idle. On Linux the bytes move by `splice(2)` from the source socket into a
//! pipe and from the pipe into the destination socket, never entering user space;
//! pipes come from a shared pool and are held only while bytes are in flight. A
//! direction whose last chunk filled its pipe (a bulk transfer) takes a larger pipe,
//! which cuts the system calls per byte by up to four; how many large pipes exist is
//! capped, so the kernel's per-user pipe budget stays mostly free. Where a pipe cannot
//! be had (another OS, descriptors exhausted) a chunk is copied through a buffer
//! allocated for that chunk.

use std::io;
use std::net::Shutdown;

use tokio::net::TcpStream;

/// Most bytes moved per step through the user-space fallback.
const CHUNK: usize = 64 * 1024;

/// Relays `from` to `to` until `from` ends (then half-closes `to`) or an error occurs.
/// What a direction reports every chunk to (counts, the idle clock, budgets), which
/// may hold the direction (by not answering yet) or stop it (`false`).
pub trait Gate {
    fn go_on(&self, n: usize) -> impl Future<Output = bool>;
}

/// No counting at all (the load bench's bare relay).
impl Gate for () {
    async fn go_on(&self, _: usize) -> bool {
        true
    }
}

/// Relays `from` to `to` until `from` ends (then half-closes `to`), an error occurs or
/// `gate` stops it.
pub async fn one_way(from: &TcpStream, to: &TcpStream, gate: &impl Gate) -> io::Result<()> {
    let mut bulk = false;
    loop {
        from.readable().await?;
        let moved = match first_step(from, to, bulk) {
            Step::Done(moved) => moved,
            // Readiness was stale; wait again.
            Step::Stale => continue,
            // `to` is full: wait for it. Boxed, because inline this state would sit in
            // every idle tunnel's future (about 480 bytes); a chunk waits for its
            // destination only when that side is slower than this one.
            Step::Blocked(rest) => Box::pin(rest.finish(to)).await?,
            Step::Failed(e) => return Err(e),
        };
        bulk = moved.filled;
        if moved.n == 0 {
            // Propagate the half-close and let the other direction run on.
            let _ = socket2::SockRef::from(to).shutdown(Shutdown::Write);
            return Ok(());
        }
        if !gate.go_on(moved.n).await {
            return Err(spent());
        }
    }
}

/// The error a direction stops with when its budget is spent.
pub fn spent() -> io::Error {
    io::Error::other("byte budget spent")
}

/// One chunk relayed: its length, and whether it took all the room there was.
struct Moved {
    n: usize,
    filled: bool,
}

/// How far one chunk got without waiting.
enum Step {
    /// All of it reached `to` (or `from` ended: `n == 0`).
    Done(Moved),
    /// Nothing was ready after all.
    Stale,
    /// Some of it is still to be written when `to` has room.
    Blocked(Rest),
    Failed(io::Error),
}

/// A chunk read from the source, part of it not yet written.
enum Rest {
    #[cfg(target_os = "linux")]
    Pipe {
        pipe: pipe::Pipe,
        n: usize,
        left: usize,
    },
    Buffer {
        buf: Vec<u8>,
        n: usize,
        sent: usize,
    },
}

impl Rest {
    /// Writes the rest as `to` makes room.
    async fn finish(self, to: &TcpStream) -> io::Result<Moved> {
        match self {
            #[cfg(target_os = "linux")]
            Rest::Pipe { pipe, n, left } => pipe.drain(to, n, left).await,
            Rest::Buffer { buf, n, mut sent } => {
                while sent < n {
                    to.writable().await?;
                    match to.try_write(&buf[sent..n]) {
                        Ok(m) => sent += m,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                }
                Ok(Moved { n, filled: n == CHUNK })
            }
        }
    }
}

/// Moves one chunk that `from` has ready, through a large pipe if `bulk`, as far as it
/// goes without waiting (no allocation on that path: a tunnel's chunks almost always
/// get through in one go).
fn first_step(from: &TcpStream, to: &TcpStream, bulk: bool) -> Step {
    #[cfg(target_os = "linux")]
    if let Some(pipe) = pipe::Pipe::take(bulk) {
        return pipe.carry(from, to);
    }
    let _ = bulk;
    copy_chunk(from, to)
}

/// The user-space fallback: one buffer for one chunk.
fn copy_chunk(from: &TcpStream, to: &TcpStream) -> Step {
    let mut buf = vec![0u8; CHUNK];
    let n = match from.try_read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Stale,
        Err(e) => return Step::Failed(e),
    };
    let mut sent = 0;
    while sent < n {
        match to.try_write(&buf[sent..n]) {
            Ok(m) => sent += m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked(Rest::Buffer { buf, n, sent }),
            Err(e) => return Step::Failed(e),
        }
    }
    Step::Done(Moved { n, filled: n == CHUNK })
}

#[cfg(target_os = "linux")]
mod pipe {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    use super::{Moved, Rest, Step};

    /// A new pipe's capacity (the kernel's default).
    const SMALL: usize = 64 * 1024;
    /// A bulk direction's pipe capacity. 256 KiB moved as much per CPU second in the
    /// load bench as 512 KiB and 1 MiB did, and costs a quarter of the latter's budget.
    const LARGE: usize = 256 * 1024;
    /// Empty default pipes kept for reuse; beyond this many they are closed.
    const SMALL_POOL_MAX: usize = 256;
    /// Most large pipes alive at once, pooled or in use: 64 x 64 pages, a quarter of
    /// the default per-user budget (`fs.pipe-user-pages-soft`, 16,384 pages). Past it
    /// bulk directions use default pipes.
    const LARGE_MAX: usize = 64;

    static SMALL_POOL: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());
    static LARGE_POOL: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());
    /// Large pipes alive (pooled or in use); each one's `Drop` gives its place back.
    static LARGE_ALIVE: AtomicUsize = AtomicUsize::new(0);

    pub struct Pipe {
        read: OwnedFd,
        write: OwnedFd,
        /// Bytes the pipe holds at most.
        cap: usize,
    }

    impl Drop for Pipe {
        fn drop(&mut self) {
            if self.cap > SMALL {
                LARGE_ALIVE.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn pool_of(large: bool) -> std::sync::MutexGuard<'static, Vec<Pipe>> {
        let pool = if large { &LARGE_POOL } else { &SMALL_POOL };
        pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    impl Pipe {
        /// An empty pipe from a pool or a new one, large if `bulk` and one may still be
        /// had; `None` when no pipe can be made.
        pub fn take(bulk: bool) -> Option<Pipe> {
            if bulk {
                if let Some(p) = pool_of(true).pop() {
                    return Some(p);
                }
                if let Some(p) = Pipe::new_large() {
                    return Some(p);
                }
            }
            if let Some(p) = pool_of(false).pop() {
                return Some(p);
            }
            Pipe::new(SMALL)
        }

        fn new(cap: usize) -> Option<Pipe> {
            match nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC) {
                Ok((read, write)) => Some(Pipe { read, write, cap }),
                Err(e) => {
                    tracing::debug!(error = %e, "no pipe for splice; copying through user space");
                    None
                }
            }
        }

        /// A new large pipe, unless `LARGE_MAX` are alive or the kernel refuses to
        /// grow one (its per-user budget is spent, or `fs.pipe-max-size` is lower).
        fn new_large() -> Option<Pipe> {
            if LARGE_ALIVE.fetch_add(1, Ordering::Relaxed) >= LARGE_MAX {
                LARGE_ALIVE.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
            let Some(mut p) = Pipe::new(SMALL) else {
                LARGE_ALIVE.fetch_sub(1, Ordering::Relaxed);
                return None;
            };
            // From here on the pipe's Drop gives the place back.
            p.cap = LARGE;
            match fcntl(&p.write, FcntlArg::F_SETPIPE_SZ(LARGE as i32)) {
                Ok(got) if usize::try_from(got).is_ok_and(|g| g >= LARGE) => Some(p),
                _ => None,
            }
        }

        /// Back to its pool; only ever called on an empty pipe.
        fn give_back(self) {
            let large = self.cap > SMALL;
            let max = if large { LARGE_MAX } else { SMALL_POOL_MAX };
            let mut pool = pool_of(large);
            if pool.len() < max {
                pool.push(self);
            }
        }

        /// Splices what `from` has ready into the pipe and on into `to` as far as it
        /// goes without waiting. On an error the pipe may hold bytes, so it is closed
        /// rather than pooled.
        pub fn carry(self, from: &TcpStream, to: &TcpStream) -> Step {
            let cap = self.cap;
            let filled = from
                .try_io(Interest::READABLE, || Ok(splice(from.as_fd(), None, self.write.as_fd(), None, cap, FLAGS)?));
            let n = match filled {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.give_back();
                    return Step::Stale;
                }
                Err(e) => {
                    self.give_back();
                    return Step::Failed(e);
                }
            };
            let mut left = n;
            while left > 0 {
                match self.splice_out(to, left) {
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Step::Blocked(Rest::Pipe { pipe: self, n, left });
                    }
                    Err(e) => return Step::Failed(e),
                }
            }
            self.give_back();
            Step::Done(Moved { n, filled: n == cap })
        }

        /// Writes the `left` bytes still in the pipe (of `n` read) as `to` makes room.
        pub async fn drain(self, to: &TcpStream, n: usize, mut left: usize) -> io::Result<Moved> {
            while left > 0 {
                to.writable().await?;
                match self.splice_out(to, left) {
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            let filled = n == self.cap;
            self.give_back();
            Ok(Moved { n, filled })
        }

        /// One `splice(2)` from the pipe into `to`, if `to` is (believed) writable.
        fn splice_out(&self, to: &TcpStream, left: usize) -> io::Result<usize> {
            to.try_io(Interest::WRITABLE, || Ok(splice(self.read.as_fd(), None, to.as_fd(), None, left, FLAGS)?))
        }
    }

    /// Never block in the kernel; move pages rather than copy them where it can.
    const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn bulk_directions_get_large_pipes_up_to_the_cap() {
            let small = Pipe::take(false).unwrap();
            assert_eq!(small.cap, SMALL);
            // Other tests may hold large pipes too, so count only what this one got.
            let taken: Vec<Pipe> = (0..=LARGE_MAX).map(|_| Pipe::take(true).unwrap()).collect();
            let large = taken.iter().filter(|p| p.cap == LARGE).count();
            assert!((1..=LARGE_MAX).contains(&large), "{large} large pipes");
            assert_eq!(taken.last().unwrap().cap, SMALL, "the cap was not applied");
            let first_large = taken.iter().find(|p| p.cap == LARGE).unwrap();
            let size = fcntl(&first_large.write, FcntlArg::F_GETPIPE_SZ).unwrap();
            assert!(usize::try_from(size).unwrap() >= LARGE, "the kernel holds {size} bytes");
            let alive = LARGE_ALIVE.load(Ordering::Relaxed);
            drop(taken);
            assert!(LARGE_ALIVE.load(Ordering::Relaxed) < alive, "closing large pipes freed no places");
            assert_eq!(Pipe::take(true).unwrap().cap, LARGE);
        }
    }
}
