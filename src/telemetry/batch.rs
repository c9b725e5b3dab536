//! Log output off the request path. Formatted lines are appended to a shared buffer;
//! a writer thread writes what has gathered every `log.flush_interval` in one system
//! call, or sooner once [`SOON`] bytes wait. Warnings and errors, and every line when
//! the interval is zero, are written at once. When output stalls, the buffer is
//! bounded: past [`MAX_PENDING`] the logging thread writes itself and so waits, as it
//! would writing directly.
//!
//! Lines keep their order: whoever writes takes the output lock first, then swaps the
//! buffer out under the buffer lock.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Pending bytes that wake the writer thread before the interval ends.
pub const SOON: usize = 64 * 1024;
/// Pending bytes past which the logging thread writes the buffer itself.
pub const MAX_PENDING: usize = 4 * 1024 * 1024;

struct Inner {
    pending: Mutex<Vec<u8>>,
    /// Signalled when the buffer goes from empty to not, and when it passes [`SOON`].
    ready: Condvar,
    out: Mutex<Box<dyn Write + Send>>,
    interval: Duration,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves only bytes behind; keep logging.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A [`MakeWriter`] whose writers append to the batch.
#[derive(Clone)]
pub struct Batch {
    inner: Arc<Inner>,
}

impl Batch {
    /// A batch writing to `out`; with a non-zero `interval`, starts the writer thread.
    pub fn new(out: Box<dyn Write + Send>, interval: Duration) -> io::Result<Batch> {
        let inner = Arc::new(Inner {
            pending: Mutex::new(Vec::with_capacity(SOON)),
            ready: Condvar::new(),
            out: Mutex::new(out),
            interval,
        });
        if !interval.is_zero() {
            let bg = inner.clone();
            std::thread::Builder::new().name("log-writer".into()).spawn(move || bg.run())?;
        }
        Ok(Batch { inner })
    }

    /// Writes everything pending now.
    pub fn flush(&self) {
        self.inner.write_pending();
    }

    /// Appends a whole line written outside tracing (the access log).
    pub fn append_line(&self, line: &[u8]) {
        // The only error is the direct write with a zero interval; like a failed
        // batch write, there is nowhere to report it.
        let _ = self.append(line, false);
    }

    fn append(&self, line: &[u8], urgent: bool) -> io::Result<()> {
        let inner = &*self.inner;
        if inner.interval.is_zero() {
            let mut out = lock(&inner.out);
            out.write_all(line)?;
            return out.flush();
        }
        let mut pending = lock(&inner.pending);
        let before = pending.len();
        pending.extend_from_slice(line);
        let after = pending.len();
        drop(pending);
        if urgent || after > MAX_PENDING {
            inner.write_pending();
        } else if before == 0 || (before < SOON && after >= SOON) {
            inner.ready.notify_one();
        }
        Ok(())
    }
}

impl Inner {
    /// The writer thread: sleeps while nothing is pending; once a line arrives, lets
    /// more gather for the interval (or until [`SOON`] bytes), then writes them all.
    fn run(&self) {
        let mut spare = Vec::with_capacity(SOON);
        loop {
            let mut pending = lock(&self.pending);
            while pending.is_empty() {
                pending = self.ready.wait(pending).unwrap_or_else(PoisonError::into_inner);
            }
            if pending.len() < SOON {
                pending = self.ready.wait_timeout(pending, self.interval).unwrap_or_else(PoisonError::into_inner).0;
            }
            drop(pending);
            self.write_swapped(&mut spare);
        }
    }

    fn write_pending(&self) {
        let mut spare = Vec::new();
        self.write_swapped(&mut spare);
    }

    /// Swaps the pending bytes into `spare` and writes them, holding the output lock
    /// across both so batches cannot overtake each other. `spare` comes back empty.
    fn write_swapped(&self, spare: &mut Vec<u8>) {
        let mut out = lock(&self.out);
        std::mem::swap(&mut *lock(&self.pending), spare);
        if !spare.is_empty() {
            // Nowhere to report a failure to write the log; the next batch tries again.
            let _ = out.write_all(spare);
            let _ = out.flush();
        }
        spare.clear();
    }
}

/// One event's writer: tracing-subscriber formats the whole line, then writes it once.
pub struct LineWriter {
    batch: Batch,
    urgent: bool,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.batch.append(buf, self.urgent)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.batch.append(buf, self.urgent)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Batch {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter { batch: self.clone(), urgent: false }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter {
        LineWriter { batch: self.clone(), urgent: *meta.level() <= Level::WARN }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that records each write call.
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            lock(&self.0).push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Calls {
        fn joined(&self) -> String {
            String::from_utf8(lock(&self.0).concat()).unwrap_or_default()
        }
        fn count(&self) -> usize {
            lock(&self.0).len()
        }
    }

    fn wait_for(pred: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if pred() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn lines_gathered_in_an_interval_are_written_in_one_call_in_order() {
        let calls = Calls::default();
        let batch = Batch::new(Box::new(calls.clone()), Duration::from_millis(200)).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..100 {
            batch.make_writer().write_all(format!("line {i}\n").as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(wait_for(|| calls.joined().lines().count() == 100), "lines not written: {:?}", calls.joined());
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(calls.joined(), expected);
        assert!(calls.count() <= 2, "100 lines took {} write calls", calls.count());
    }

    #[test]
    fn warnings_are_written_at_once_behind_earlier_lines() {
        let calls = Calls::default();
        let batch = Batch::new(Box::new(calls.clone()), Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
        batch.make_writer().write_all(b"info\n").unwrap_or_else(|e| panic!("{e}"));
        let mut urgent = LineWriter { batch: batch.clone(), urgent: true };
        urgent.write_all(b"warn\n").unwrap_or_else(|e| panic!("{e}"));
        // Written before write_all returned: no waiting for the writer thread.
        assert_eq!(calls.joined(), "info\nwarn\n");
    }

    #[test]
    fn flush_writes_what_is_pending() {
        let calls = Calls::default();
        let batch = Batch::new(Box::new(calls.clone()), Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
        batch.make_writer().write_all(b"last words\n").unwrap_or_else(|e| panic!("{e}"));
        batch.flush();
        assert_eq!(calls.joined(), "last words\n");
    }

    #[test]
    fn zero_interval_writes_every_line_itself() {
        let calls = Calls::default();
        let batch = Batch::new(Box::new(calls.clone()), Duration::ZERO).unwrap_or_else(|e| panic!("{e}"));
        batch.make_writer().write_all(b"a\n").unwrap_or_else(|e| panic!("{e}"));
        batch.make_writer().write_all(b"b\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(calls.count(), 2);
    }

    #[test]
    fn a_full_buffer_is_written_by_the_logging_thread() {
        let calls = Calls::default();
        let batch = Batch::new(Box::new(calls.clone()), Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
        let line = vec![b'x'; MAX_PENDING + 1];
        batch.make_writer().write_all(&line).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(calls.joined().len(), MAX_PENDING + 1);
    }
}
