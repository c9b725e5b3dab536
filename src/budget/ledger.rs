//! The counts behind budgets and fleet-wide limits: one counter per sandbox, thing
//! counted and window, and one set of hosts per sandbox and window. Pure bookkeeping,
//! no I/O: the Redis sync ([`super::store`]) takes what was spent since it last ran
//! and hands back the fleet's totals.
//!
//! A counter holds the fleet's total as the store last reported it (`fleet`), what
//! this instance spent since (`pending`) and what a sync in flight carries
//! (`flushing`). With a shared store an instance may run ahead of the store by at most
//! one lease; while the store cannot be reached, by its share of what is left.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// Most counters and host sets kept; past it idle ones are dropped first.
pub const MAX_ENTRIES: usize = 200_000;

/// What a counter counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum What {
    Requests,
    Upload,
    Download,
    /// A per-host override, by its pattern: requests, upload, download.
    HostRequests(Arc<str>),
    HostUpload(Arc<str>),
    HostDownload(Arc<str>),
    /// `proxy.sandbox_max_per_second`, counted fleet-wide.
    Rate,
    /// A route's `sandbox_requests_per_minute`, counted fleet-wide.
    Route(Arc<str>),
}

impl What {
    /// Bytes are counted after they moved; everything else is asked for first.
    pub fn is_bytes(&self) -> bool {
        matches!(self, What::Upload | What::Download | What::HostUpload(_) | What::HostDownload(_))
    }
}

/// The name a refusal and `usage` give it, and the last part of its store key.
impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::Requests => f.write_str("requests"),
            What::Upload => f.write_str("upload_bytes"),
            What::Download => f.write_str("download_bytes"),
            What::HostRequests(h) => write!(f, "hosts[{h}].requests"),
            What::HostUpload(h) => write!(f, "hosts[{h}].upload_bytes"),
            What::HostDownload(h) => write!(f, "hosts[{h}].download_bytes"),
            What::Rate => f.write_str("proxy.sandbox_max_per_second"),
            What::Route(r) => write!(f, "routes[{r}].sandbox_requests_per_minute"),
        }
    }
}

/// A window: its length and its index since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    pub secs: u64,
    pub index: u64,
}

impl Window {
    pub fn at(secs: u64, unix_now: u64) -> Window {
        let secs = secs.max(1);
        Window { secs, index: unix_now / secs }
    }

    pub fn start(&self) -> u64 {
        self.index * self.secs
    }

    pub fn end(&self) -> u64 {
        self.start() + self.secs
    }
}

/// How far ahead of the store an instance may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Counted here only: up to the limit.
    Local,
    /// Counted in a shared store that answers: up to one lease ahead of it.
    Shared,
    /// The shared store does not answer: up to this instance's share of what was left
    /// when it last answered (`instances` then), or one lease if more. `instances` 0:
    /// it never answered this instance (which knows nothing of what the fleet spent):
    /// one lease.
    Fallback { instances: u64 },
}

/// What an instance may spend ahead of the store: a sixteenth of the limit, at least
/// 8 of a count and 256 KiB of bytes, at most the limit.
pub fn lease(limit: u64, bytes: bool) -> u64 {
    let floor = if bytes { 256 * 1024 } else { 8 };
    (limit / 16).max(floor).min(limit).max(1)
}

#[derive(Debug)]
pub struct Counter {
    pub window: Window,
    pub limit: u64,
    /// The fleet's total as the store last reported it (ours flushed included).
    pub fleet: u64,
    /// Spent here and not yet handed to the store.
    pub pending: u64,
    /// Handed to a sync that has not answered yet.
    pub flushing: u64,
    /// What this instance handed over in this window, in syncs that answered: handed
    /// over again if the store comes back without it (a restart without persistence).
    pub mine: u64,
    pub last_used: Instant,
}

impl Counter {
    fn new(window: Window, limit: u64, now: Instant) -> Counter {
        Counter { window, limit, fleet: 0, pending: 0, flushing: 0, mine: 0, last_used: now }
    }

    pub fn used(&self) -> u64 {
        self.fleet + self.pending + self.flushing
    }

    /// How much more may be spent now.
    pub fn room(&self, mode: Mode, bytes: bool) -> u64 {
        let left = self.limit.saturating_sub(self.used());
        let ahead = self.pending + self.flushing;
        let cap = match mode {
            Mode::Local => return left,
            Mode::Shared => lease(self.limit, bytes),
            Mode::Fallback { instances: 0 } => lease(self.limit, bytes),
            Mode::Fallback { instances } => {
                lease(self.limit, bytes).max(self.limit.saturating_sub(self.fleet) / instances)
            }
        };
        left.min(cap.saturating_sub(ahead))
    }
}

/// Distinct hosts contacted in a window.
#[derive(Debug)]
pub struct HostSet {
    pub window: Window,
    pub limit: u64,
    /// Hosts admitted here this window (all of them, flushed or not).
    pub seen: HashSet<Box<str>>,
    /// Admitted here and not yet handed to the store.
    pub pending: Vec<Box<str>>,
    pub flushing: Vec<Box<str>>,
    /// The fleet's distinct hosts as the store last counted them.
    pub fleet: u64,
    pub last_used: Instant,
}

impl HostSet {
    fn new(window: Window, limit: u64, now: Instant) -> HostSet {
        HostSet {
            window,
            limit,
            seen: HashSet::new(),
            pending: Vec::new(),
            flushing: Vec::new(),
            fleet: 0,
            last_used: now,
        }
    }

    pub fn used(&self) -> u64 {
        self.fleet + (self.pending.len() + self.flushing.len()) as u64
    }

    /// Whether `host` may be contacted: already counted, or room for one more.
    pub fn admits(&self, host: &str, mode: Mode) -> bool {
        if self.seen.contains(host) {
            return true;
        }
        let as_counter = Counter {
            window: self.window,
            limit: self.limit,
            fleet: self.fleet,
            pending: self.pending.len() as u64,
            flushing: self.flushing.len() as u64,
            mine: 0,
            last_used: self.last_used,
        };
        as_counter.room(mode, false) >= 1
    }

    pub fn add(&mut self, host: &str) {
        if self.seen.insert(host.into()) {
            self.pending.push(host.into());
        }
    }
}

/// Every counter and host set, by sandbox.
#[derive(Debug, Default)]
pub struct Ledger {
    pub counters: HashMap<(Arc<str>, What), Counter>,
    pub hosts: HashMap<Arc<str>, HostSet>,
    /// When the table was last pruned for room (at most once a second).
    pruned: Option<Instant>,
}

impl Ledger {
    /// The counter for `what` in `window`, created (or reset, for a new window) as needed.
    pub fn counter(
        &mut self,
        sandbox: &Arc<str>,
        what: &What,
        window: Window,
        limit: u64,
        now: Instant,
    ) -> &mut Counter {
        self.make_room(now);
        let c =
            self.counters.entry((sandbox.clone(), what.clone())).or_insert_with(|| Counter::new(window, limit, now));
        if c.window != window {
            *c = Counter::new(window, limit, now);
        }
        c.limit = limit;
        c.last_used = now;
        c
    }

    pub fn host_set(&mut self, sandbox: &Arc<str>, window: Window, limit: u64, now: Instant) -> &mut HostSet {
        self.make_room(now);
        let s = self.hosts.entry(sandbox.clone()).or_insert_with(|| HostSet::new(window, limit, now));
        if s.window != window {
            *s = HostSet::new(window, limit, now);
        }
        s.limit = limit;
        s.last_used = now;
        s
    }

    /// Looks a counter up without creating it.
    pub fn peek(&self, sandbox: &str, what: &What, window: Window) -> Option<&Counter> {
        let key: (Arc<str>, What) = (Arc::from(sandbox), what.clone());
        self.counters.get(&key).filter(|c| c.window == window)
    }

    /// Drops counters and sets of past windows with nothing left to hand over.
    pub fn sweep(&mut self, unix_now: u64) {
        self.counters.retain(|_, c| c.window.end() > unix_now || c.pending + c.flushing > 0);
        self.hosts.retain(|_, s| s.window.end() > unix_now || !s.pending.is_empty() || !s.flushing.is_empty());
    }

    fn make_room(&mut self, now: Instant) {
        if self.counters.len() + self.hosts.len() < MAX_ENTRIES
            || self.pruned.is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1))
        {
            return;
        }
        self.pruned = Some(now);
        // Idle longest first: drop what was not used in the last minute, then anything
        // with nothing pending.
        let minute = std::time::Duration::from_secs(60);
        self.counters.retain(|_, c| now.duration_since(c.last_used) < minute);
        self.hosts.retain(|_, s| now.duration_since(s.last_used) < minute);
        if self.counters.len() + self.hosts.len() >= MAX_ENTRIES {
            self.counters.retain(|_, c| c.pending + c.flushing > 0);
            self.hosts.retain(|_, s| !s.pending.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(limit: u64, fleet: u64, pending: u64) -> Counter {
        let mut c = Counter::new(Window::at(60, 0), limit, Instant::now());
        c.fleet = fleet;
        c.pending = pending;
        c
    }

    #[test]
    fn local_counters_spend_up_to_the_limit() {
        assert_eq!(counter(10, 0, 3).room(Mode::Local, false), 7);
        assert_eq!(counter(10, 0, 10).room(Mode::Local, false), 0);
    }

    #[test]
    fn shared_counters_run_ahead_by_one_lease() {
        // 1,000 requests: a lease of 62; 60 spent since the last sync leaves 2.
        assert_eq!(lease(1000, false), 62);
        assert_eq!(counter(1000, 500, 60).room(Mode::Shared, false), 2);
        // Small limits: a lease of 8, never past the limit.
        assert_eq!(counter(10, 5, 0).room(Mode::Shared, false), 5);
        // Bytes too: 1 GiB has a lease of 64 MiB.
        assert_eq!(counter(1 << 30, 0, 60 << 20).room(Mode::Shared, true), 4 << 20);
    }

    #[test]
    fn without_the_store_an_instance_spends_its_share() {
        // 1,000 left across 4 instances: 250 each.
        let c = counter(1000, 0, 200);
        assert_eq!(c.room(Mode::Fallback { instances: 4 }, false), 50);
        assert_eq!(counter(1000, 0, 250).room(Mode::Fallback { instances: 4 }, false), 0);
        assert_eq!(counter(1000, 600, 0).room(Mode::Fallback { instances: 4 }, false), 100);
    }

    #[test]
    fn host_sets_count_distinct_hosts() {
        let now = Instant::now();
        let mut l = Ledger::default();
        let sb: Arc<str> = Arc::from("sb");
        let w = Window::at(3600, 0);
        let s = l.host_set(&sb, w, 2, now);
        for h in ["a.example", "b.example", "a.example"] {
            assert!(s.admits(h, Mode::Local));
            s.add(h);
        }
        assert!(!s.admits("c.example", Mode::Local));
        assert!(s.admits("b.example", Mode::Local), "a counted host stays allowed");
        // A new window starts over.
        let s = l.host_set(&sb, Window::at(3600, 3600), 2, now);
        assert!(s.admits("c.example", Mode::Local));
    }

    #[test]
    fn windows_align_to_the_epoch() {
        let w = Window::at(3600, 7300);
        assert_eq!((w.start(), w.end()), (7200, 10800));
        let mut l = Ledger::default();
        let sb: Arc<str> = Arc::from("sb");
        l.counter(&sb, &What::Requests, w, 5, Instant::now()).pending = 5;
        l.sweep(10_800);
        assert_eq!(l.counters.len(), 1, "pending counts are kept until handed over");
        l.counters.values_mut().for_each(|c| c.pending = 0);
        l.sweep(10_800);
        assert!(l.counters.is_empty());
    }
}
