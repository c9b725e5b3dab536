//! Egress budgets (`[policies.NAME.budget]`) and, with a shared store, the per-sandbox
//! rate and per-route request limits counted across the fleet.
//!
//! The request path never waits on the store: [`Budgets::admit`] and [`Meter::add`]
//! spend from the in-memory [`ledger`], and a background task ([`store`]) hands what
//! was spent to Redis a few times a second (sooner once half a lease is spent) and
//! brings back the fleet's totals. Without a store (`limits.store = "local"`), the
//! ledger is the whole count.

pub mod ledger;
pub mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::policy::budget::{BudgetSpec, HostBudget, Limits};
use ledger::{Ledger, Mode, What, Window};

/// Bytes a tunnel moves before it reports them, at most: one ledger lock per this
/// many bytes. A meter under a smaller budget reports every `limit / BATCH_SHARE`
/// bytes, so what its sandbox's parallel transfers hold unreported stays a small share
/// of the budget (each overshoots it by at most one batch and the chunk in flight).
pub const BATCH: u64 = 64 * 1024;
const BATCH_SHARE: u64 = 1024;

use crate::metrics::{BUDGET_EXHAUSTED, LIMIT_STORE_UP as STORE_UP};

/// A budget or limit that refuses more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    /// Its name: `requests`, `upload_bytes`, `hosts[*.s3.amazonaws.com].upload_bytes`,
    /// `new_hosts`, `proxy.sandbox_max_per_second`, `limits.store`...
    pub budget: String,
    /// Seconds until it has room again (the window's end, or a store's next answer).
    pub retry_after: u64,
    pub hint: String,
}

/// Whether a counter's refusal is the limit's or only the lease's.
fn exhausted(what: &dyn std::fmt::Display, c: &ledger::Counter, unix_now: u64) -> Exhausted {
    if c.used() >= c.limit {
        Exhausted {
            budget: what.to_string(),
            retry_after: c.window.end().saturating_sub(unix_now).max(1),
            hint: format!("budget {what} of {} per {}s is spent until the window ends", c.limit, c.window.secs),
        }
    } else {
        Exhausted {
            budget: what.to_string(),
            retry_after: 1,
            hint: format!("budget {what}: this instance spent its lease and waits for the shared store; retry"),
        }
    }
}

/// This instance's open tunnels and in-flight requests per sandbox (those with any),
/// for the fleet-wide `proxy.sandbox_max_concurrent`.
pub type ActiveSource = Box<dyn Fn() -> Vec<(String, u64)> + Send + Sync>;

/// Shared-store limits that are not a policy's budget.
#[derive(Debug, Default, Clone)]
pub struct FleetLimits {
    /// `proxy.sandbox_max_per_second`, counted in one-second windows (0: none).
    pub per_second: u32,
    /// Per route: `sandbox_requests_per_minute`, counted in one-minute windows.
    pub routes: std::collections::HashMap<String, u32>,
}

/// What one request asks of the budgets.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ask<'a> {
    pub sandbox: &'a str,
    pub spec: Option<&'a Arc<BudgetSpec>>,
    /// The host contacted (`new_hosts`, per-host overrides); `None` for the git and
    /// API routes, whose host is the gateway's.
    pub host: Option<&'a str>,
    pub route: Option<&'a str>,
}

struct Inner {
    ledger: Mutex<Ledger>,
    /// Counted in a shared store.
    shared: bool,
    healthy: AtomicBool,
    /// Instances the store last reported alive (1 until it reports).
    instances: AtomicU64,
    /// Syncs that succeeded.
    syncs: AtomicU64,
    /// What this instance holds open per sandbox (set once by the gateway).
    active_source: OnceLock<ActiveSource>,
    /// What the other live instances held open per sandbox at the last sync.
    others_active: Mutex<std::collections::HashMap<String, u64>>,
    /// The other live instances at the last sync.
    peers: Mutex<Vec<String>>,
    /// The store's boot mark as the last sync read it.
    boot: Mutex<Option<String>>,
    deny_on_store_error: bool,
    fleet: FleetLimits,
    /// Wakes the sync early (half a lease spent).
    wake: Notify,
    store: OnceLock<Arc<store::Store>>,
}

/// The budgets of every sandbox on this instance. Cheap to clone.
#[derive(Clone)]
pub struct Budgets(Arc<Inner>);

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Budgets {
    /// Counted here only.
    pub fn local() -> Budgets {
        Budgets::new(false, false, FleetLimits::default())
    }

    /// Counted in a shared store that [`store::run`] syncs with; `fleet` are the
    /// per-instance limits now counted fleet-wide.
    pub fn shared(deny_on_store_error: bool, fleet: FleetLimits) -> Budgets {
        Budgets::new(true, deny_on_store_error, fleet)
    }

    fn new(shared: bool, deny_on_store_error: bool, fleet: FleetLimits) -> Budgets {
        ::metrics::gauge!(STORE_UP).set(1.0);
        Budgets(Arc::new(Inner {
            ledger: Mutex::new(Ledger::default()),
            shared,
            healthy: AtomicBool::new(true),
            instances: AtomicU64::new(1),
            syncs: AtomicU64::new(0),
            active_source: OnceLock::new(),
            others_active: Mutex::new(std::collections::HashMap::new()),
            peers: Mutex::new(Vec::new()),
            boot: Mutex::new(None),
            deny_on_store_error,
            fleet,
            wake: Notify::new(),
            store: OnceLock::new(),
        }))
    }

    pub fn is_shared(&self) -> bool {
        self.0.shared
    }

    /// Where the sync reads what this instance holds open (the gateway's limits).
    pub fn set_active_source(&self, source: ActiveSource) {
        let _ = self.0.active_source.set(source);
    }

    /// What the other instances held open for `sandbox` at the last sync (0 without a
    /// shared store).
    pub fn others_active(&self, sandbox: &str) -> u64 {
        if !self.0.shared {
            return 0;
        }
        let others = self.0.others_active.lock().unwrap_or_else(|e| e.into_inner());
        others.get(sandbox).copied().unwrap_or(0)
    }

    /// Syncs with the shared store that succeeded so far.
    pub fn syncs(&self) -> u64 {
        self.0.syncs.load(Ordering::Relaxed)
    }

    /// False while the shared store does not answer.
    pub fn store_healthy(&self) -> bool {
        self.0.healthy.load(Ordering::Relaxed)
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.0.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mode(&self) -> Mode {
        self.0.mode()
    }

    /// Admits one request or tunnel: spends one of every request budget and limit that
    /// applies and counts its host, or refuses without spending anything. The meter
    /// returned counts its bytes against its byte budgets.
    pub fn admit(&self, ask: Ask<'_>) -> Result<Option<Arc<Meter>>, Exhausted> {
        let route_limit = ask.route.and_then(|r| self.0.fleet.routes.get(r)).copied().filter(|&n| n > 0);
        let fleet_limited = self.0.shared && (self.0.fleet.per_second > 0 || route_limit.is_some());
        if ask.spec.is_none() && !fleet_limited {
            return Ok(None);
        }
        if self.0.shared && self.0.deny_on_store_error && !self.store_healthy() {
            return Err(Exhausted {
                budget: "limits.store".into(),
                retry_after: 1,
                hint: "the shared limit store cannot be reached and limits.on_store_error is \"deny\"".into(),
            });
        }
        let (now, unix) = (Instant::now(), unix_now());
        let mode = self.mode();
        let sandbox: Arc<str> = Arc::from(ask.sandbox);

        // Counts asked for before they are spent: (what, window, limit).
        let mut counts: Vec<(What, Window, u64)> = Vec::new();
        if self.0.shared && self.0.fleet.per_second > 0 {
            counts.push((What::Rate, Window::at(1, unix), u64::from(self.0.fleet.per_second)));
        }
        if self.0.shared
            && let (Some(route), Some(n)) = (ask.route, route_limit)
        {
            counts.push((What::Route(Arc::from(route)), Window::at(60, unix), u64::from(n)));
        }
        let mut bytes: Vec<(What, u64)> = Vec::new();
        let mut window = Window::at(3600, unix);
        if let Some(spec) = ask.spec {
            window = Window::at(spec.window.as_secs(), unix);
            let overrides = ask.host.into_iter().flat_map(|host| spec.hosts_for(host));
            for (what, limit) in limits_of(&spec.limits, overrides) {
                if what.is_bytes() {
                    bytes.push((what, limit));
                } else {
                    counts.push((what, window, limit));
                }
            }
        }

        let mut ledger = self.ledger();
        for (what, w, limit) in &counts {
            let c = ledger.counter(&sandbox, what, *w, *limit, now);
            if c.room(mode, false) < 1 {
                return Err(refused(what, c, unix));
            }
        }
        for (what, limit) in &bytes {
            let c = ledger.counter(&sandbox, what, window, *limit, now);
            // A lease spent by the sandbox's other tunnels holds them, not a new one.
            let open = if mode == Mode::Shared { c.used() < c.limit } else { c.room(mode, true) >= 1 };
            if !open {
                return Err(refused(what, c, unix));
            }
        }
        let new_host = match (ask.spec.and_then(|s| s.new_hosts), ask.host) {
            (Some(limit), Some(host)) => {
                let host = host.trim_end_matches('.').to_ascii_lowercase();
                let set = ledger.host_set(&sandbox, window, limit, now);
                if !set.admits(&host, mode) {
                    ::metrics::counter!(BUDGET_EXHAUSTED, "budget" => "new_hosts").increment(1);
                    let spent = set.used() >= limit;
                    return Err(Exhausted {
                        budget: "new_hosts".into(),
                        retry_after: if spent { window.end().saturating_sub(unix).max(1) } else { 1 },
                        hint: if spent {
                            format!("budget new_hosts of {limit} distinct hosts per {}s is spent", window.secs)
                        } else {
                            "budget new_hosts: this instance waits for the shared store; retry".into()
                        },
                    });
                }
                Some(host)
            }
            _ => None,
        };

        let mut wake = false;
        for (what, w, limit) in &counts {
            let c = ledger.counter(&sandbox, what, *w, *limit, now);
            c.pending += 1;
            wake |= c.pending * 2 >= ledger::lease(c.limit, false);
        }
        if let Some(host) = new_host {
            let set = ledger.host_set(&sandbox, window, ask.spec.and_then(|s| s.new_hosts).unwrap_or(0), now);
            set.add(&host);
            wake |= set.pending.len() as u64 * 2 >= ledger::lease(set.limit, false);
        }
        drop(ledger);
        if wake && self.0.shared {
            self.0.wake.notify_one();
        }
        if bytes.is_empty() {
            return Ok(None);
        }
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for (what, limit) in bytes {
            match what {
                What::Upload | What::HostUpload(_) => up.push((what, limit)),
                _ => down.push((what, limit)),
            }
        }
        let batch = |list: &[(What, u64)]| {
            list.iter().map(|(_, limit)| limit / BATCH_SHARE).min().unwrap_or(BATCH).clamp(1, BATCH)
        };
        Ok(Some(Arc::new(Meter {
            budgets: self.clone(),
            sandbox,
            window_secs: window.secs,
            batch: [batch(&up), batch(&down)],
            lists: [up, down],
            unreported: [AtomicU64::new(0), AtomicU64::new(0)],
            exhausted: CancellationToken::new(),
            why: OnceLock::new(),
        })))
    }

    /// Drops counters of windows that ended (the shared store's sync does this on
    /// every round; a local store calls it now and then).
    pub fn sweep(&self) {
        self.ledger().sweep(unix_now());
    }

    /// Where the fleet's counts are read from for [`Budgets::spent`].
    pub fn set_store(&self, store: Arc<store::Store>) {
        let _ = self.0.store.set(store);
    }

    /// What `sandbox` spent in the current windows: with a shared store, the fleet's
    /// totals read from it plus what this instance has not handed over yet; otherwise
    /// (or when the store does not answer) this instance's view.
    pub async fn spent(&self, sandbox: &str, spec: Option<&BudgetSpec>) -> Vec<Spent> {
        let Some(spec) = spec else { return Vec::new() };
        let w = Window::at(spec.window.as_secs(), unix_now());
        let mut rows: Vec<(Option<What>, u64)> =
            limits_of(&spec.limits, spec.hosts.iter()).into_iter().map(|(what, limit)| (Some(what), limit)).collect();
        if let Some(limit) = spec.new_hosts {
            rows.push((None, limit));
        }
        let fleet = match self.0.store.get() {
            Some(store) => store.read(sandbox, w, rows.iter().map(|(what, _)| what.as_ref())).await.ok(),
            None => None,
        };
        let ledger = self.ledger();
        rows.iter()
            .enumerate()
            .map(|(i, (what, limit))| {
                let (local, unsent) = match what {
                    Some(what) => ledger.peek(sandbox, what, w).map_or((0, 0), |c| (c.used(), c.pending + c.flushing)),
                    None => ledger
                        .hosts
                        .get(sandbox)
                        .filter(|s| s.window == w)
                        .map_or((0, 0), |s| (s.used(), (s.pending.len() + s.flushing.len()) as u64)),
                };
                let used = match &fleet {
                    Some(f) => f[i] + unsent,
                    None => local,
                };
                Spent {
                    budget: what.as_ref().map_or_else(|| "new_hosts".to_string(), ToString::to_string),
                    used,
                    limit: *limit,
                    window_start: w.start(),
                    window_end: w.end(),
                }
            })
            .collect()
    }
}

/// Every request and byte limit of a budget, then of each host override given, with
/// what counts it.
fn limits_of<'a>(own: &Limits, overrides: impl Iterator<Item = &'a HostBudget>) -> Vec<(What, u64)> {
    let mut out = Vec::new();
    let mut add = |limits: &Limits, req: What, up: What, down: What| {
        for (what, limit) in [(req, limits.requests), (up, limits.upload_bytes), (down, limits.download_bytes)] {
            if let Some(limit) = limit {
                out.push((what, limit));
            }
        }
    };
    add(own, What::Requests, What::Upload, What::Download);
    for h in overrides {
        let p: Arc<str> = Arc::from(h.host.as_str());
        add(&h.limits, What::HostRequests(p.clone()), What::HostUpload(p.clone()), What::HostDownload(p));
    }
    out
}

fn refused(what: &What, c: &ledger::Counter, unix: u64) -> Exhausted {
    let kind = match what {
        What::HostRequests(_) | What::HostUpload(_) | What::HostDownload(_) => "hosts",
        What::Requests => "requests",
        What::Upload => "upload_bytes",
        What::Download => "download_bytes",
        What::Rate => "per_second",
        What::Route(_) => "route",
    };
    ::metrics::counter!(BUDGET_EXHAUSTED, "budget" => kind).increment(1);
    exhausted(what, c, unix)
}

impl Inner {
    fn mode(&self) -> Mode {
        if !self.shared {
            Mode::Local
        } else if self.healthy.load(Ordering::Relaxed) {
            Mode::Shared
        } else if self.syncs.load(Ordering::Relaxed) == 0 {
            // Never heard from the store: it knows nothing of what the fleet spent.
            Mode::Fallback { instances: 0 }
        } else {
            Mode::Fallback { instances: self.instances.load(Ordering::Relaxed) }
        }
    }
}

/// One budget's use in its current window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Spent {
    pub budget: String,
    pub used: u64,
    pub limit: u64,
    pub window_start: u64,
    pub window_end: u64,
}

/// A direction of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to upstream.
    Up = 0,
    Down = 1,
}

/// Counts one request's or tunnel's bytes against its byte budgets, in batches.
pub struct Meter {
    budgets: Budgets,
    sandbox: Arc<str>,
    window_secs: u64,
    /// Per direction: the counters and their limits.
    lists: [Vec<(What, u64)>; 2],
    /// Per direction: bytes moved before they are reported.
    batch: [u64; 2],
    unreported: [AtomicU64; 2],
    exhausted: CancellationToken,
    why: OnceLock<Exhausted>,
}

/// What a tunnel direction does after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    /// This instance is a lease ahead of the shared store: wait for its next answer
    /// ([`Meter::room`]) before moving more.
    Wait,
    /// A budget is spent: end the tunnel.
    Stop,
}

impl Meter {
    /// Counts `n` bytes moved.
    pub fn add(&self, dir: Dir, n: u64) -> Flow {
        if self.lists[dir as usize].is_empty() {
            return Flow::Go;
        }
        let slot = &self.unreported[dir as usize];
        if slot.fetch_add(n, Ordering::Relaxed) + n < self.batch[dir as usize] {
            return if self.exhausted.is_cancelled() { Flow::Stop } else { Flow::Go };
        }
        let n = slot.swap(0, Ordering::Relaxed);
        self.report(dir, n)
    }

    /// Waits (polling the ledger) until `dir` may move bytes again: true, or false once
    /// a budget is spent. Bounded: a store that does not answer within its timeout
    /// counts as down, and then this instance's share decides.
    pub async fn room(&self, dir: Dir) -> bool {
        loop {
            match self.check(dir, 0) {
                Flow::Go => return true,
                Flow::Stop => return false,
                Flow::Wait => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    /// Reports what is left unreported (at the end of a tunnel or body).
    pub fn finish(&self) {
        for dir in [Dir::Up, Dir::Down] {
            let n = self.unreported[dir as usize].swap(0, Ordering::Relaxed);
            if n > 0 && !self.lists[dir as usize].is_empty() {
                self.report(dir, n);
            }
        }
    }

    /// Fires when a byte budget is spent.
    pub fn exhausted(&self) -> &CancellationToken {
        &self.exhausted
    }

    /// The budget that was spent.
    pub fn why(&self) -> Option<&Exhausted> {
        self.why.get()
    }

    fn report(&self, dir: Dir, n: u64) -> Flow {
        let flow = self.check(dir, n);
        if flow == Flow::Stop {
            self.exhausted.cancel();
        }
        flow
    }

    /// Adds `n` to `dir`'s counters and says whether more may move.
    fn check(&self, dir: Dir, n: u64) -> Flow {
        if self.exhausted.is_cancelled() {
            return Flow::Stop;
        }
        let (now, unix) = (Instant::now(), unix_now());
        let window = Window::at(self.window_secs, unix);
        let mode = self.budgets.mode();
        let mut flow = Flow::Go;
        let mut wake = false;
        {
            let mut ledger = self.budgets.ledger();
            for (what, limit) in &self.lists[dir as usize] {
                let c = ledger.counter(&self.sandbox, what, window, *limit, now);
                c.pending += n;
                let lease = ledger::lease(c.limit, true);
                wake |= n > 0 && c.pending * 2 >= lease;
                if c.room(mode, true) > 0 {
                    continue;
                }
                if c.used() < c.limit && mode == Mode::Shared {
                    // Only the lease is spent: the store has the last word.
                    flow = Flow::Wait;
                    wake = true;
                    continue;
                }
                let _ = self.why.set(refused(what, c, unix));
                flow = Flow::Stop;
                break;
            }
        }
        if wake && self.budgets.0.shared {
            self.budgets.0.wake.notify_one();
        }
        flow
    }
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter").field("sandbox", &self.sandbox).field("why", &self.why.get()).finish_non_exhaustive()
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// How long the sync waits for the store before it counts the store as down.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(limits: Limits, new_hosts: Option<u64>, hosts: Vec<HostBudget>) -> Arc<BudgetSpec> {
        Arc::new(BudgetSpec { window: Duration::from_secs(3600), limits, new_hosts, hosts })
    }

    fn ask<'a>(spec: &'a Arc<BudgetSpec>, host: &'a str) -> Ask<'a> {
        Ask { sandbox: "sb", spec: Some(spec), host: Some(host), route: None }
    }

    #[test]
    fn a_refusal_spends_nothing() {
        let b = Budgets::local();
        let s = spec(Limits { requests: Some(3), ..Limits::default() }, Some(1), Vec::new());
        assert!(b.admit(ask(&s, "a.example")).is_ok());
        let e = b.admit(ask(&s, "b.example")).unwrap_err();
        assert_eq!(e.budget, "new_hosts");
        // Refused by new_hosts: the request was not counted, so two more fit.
        assert!(b.admit(ask(&s, "a.example")).is_ok());
        assert!(b.admit(ask(&s, "A.example.")).is_ok(), "the same host, spelled otherwise");
        let e = b.admit(ask(&s, "a.example")).unwrap_err();
        assert_eq!(e.budget, "requests");
        assert!(e.retry_after >= 1 && e.retry_after <= 3600);
    }

    #[test]
    fn meters_stop_at_the_limit_and_count_host_overrides_apart() {
        let b = Budgets::local();
        let host = HostBudget {
            host: "*.s3.example".into(),
            limits: Limits { upload_bytes: Some(BATCH * 2), ..Limits::default() },
        };
        let s = spec(Limits { upload_bytes: Some(BATCH * 8), ..Limits::default() }, None, vec![host]);
        let m = b.admit(ask(&s, "bucket.s3.example")).unwrap().unwrap();
        assert_eq!(m.add(Dir::Up, BATCH), Flow::Go);
        assert_eq!(m.add(Dir::Down, BATCH * 100), Flow::Go, "no download budget");
        assert_eq!(m.add(Dir::Up, BATCH), Flow::Stop);
        assert_eq!(m.why().unwrap().budget, "hosts[*.s3.example].upload_bytes");
        assert!(m.exhausted().is_cancelled());
        // Other hosts still have the policy's budget (2 of 8 batches spent).
        assert!(b.admit(ask(&s, "bucket.s3.example")).is_err());
        let m = b.admit(ask(&s, "other.example")).unwrap().unwrap();
        for _ in 0..5 {
            assert_eq!(m.add(Dir::Up, BATCH), Flow::Go);
        }
        assert_eq!(m.add(Dir::Up, BATCH), Flow::Stop);
        assert_eq!(m.why().unwrap().budget, "upload_bytes");
    }

    #[test]
    fn small_amounts_are_reported_when_the_meter_finishes() {
        let b = Budgets::local();
        let s = spec(Limits { upload_bytes: Some(1 << 30), ..Limits::default() }, None, Vec::new());
        let m = b.admit(ask(&s, "x.example")).unwrap().unwrap();
        assert_eq!(m.add(Dir::Up, 99), Flow::Go, "below one batch: not reported yet");
        drop(m);
        let used = b.ledger().peek("sb", &What::Upload, Window::at(3600, unix_now())).unwrap().used();
        assert_eq!(used, 99);
    }

    #[test]
    fn parallel_meters_overshoot_a_small_budget_by_a_small_share() {
        // 30 transfers in parallel under 256 KiB, each moving 8 KiB chunks until told
        // to stop: what they move together stays near the budget (it was 30 batches
        // of 64 KiB, nearly 2 MiB, before a meter's batch scaled with its budget).
        let b = Budgets::local();
        let limit = 256 * 1024;
        let s = spec(Limits { download_bytes: Some(limit), ..Limits::default() }, None, Vec::new());
        let meters: Vec<_> = (0..30).map(|_| b.admit(ask(&s, "x.example")).unwrap().unwrap()).collect();
        let mut moved = 0;
        for _ in 0..64 {
            for m in &meters {
                if m.add(Dir::Down, 8 * 1024) != Flow::Stop {
                    moved += 8 * 1024;
                }
            }
        }
        assert!(moved <= limit + 30 * (limit / BATCH_SHARE), "{moved} of {limit}");
        assert!(moved >= limit - 8 * 1024, "the budget itself is usable: {moved}");
    }

    #[test]
    fn a_shared_store_bounds_how_far_an_instance_runs_ahead() {
        let b = Budgets::shared(false, FleetLimits::default());
        let s = spec(Limits { requests: Some(1000), ..Limits::default() }, None, Vec::new());
        // A lease of 62 requests ahead of the store, then "wait for it".
        let admitted = (0..100).filter(|_| b.admit(ask(&s, "x.example")).is_ok()).count();
        assert_eq!(admitted, 62);
        let e = b.admit(ask(&s, "x.example")).unwrap_err();
        assert_eq!(e.retry_after, 1);
        assert!(e.hint.contains("shared store"), "{}", e.hint);
        // The store is down before this instance ever heard from it: it knows nothing
        // of what the fleet spent, and stays at its one lease.
        b.0.healthy.store(false, Ordering::Relaxed);
        b.0.instances.store(4, Ordering::Relaxed);
        assert_eq!((0..1000).filter(|_| b.admit(ask(&s, "x.example")).is_ok()).count(), 0);
        // Once it has synced, and 4 instances were alive then: a quarter of the budget each.
        b.0.syncs.store(1, Ordering::Relaxed);
        let more = (0..1000).filter(|_| b.admit(ask(&s, "x.example")).is_ok()).count();
        assert_eq!(admitted + more, 250);
        // With on_store_error = "deny", nothing it covers is admitted.
        let strict = Budgets::shared(true, FleetLimits { per_second: 10, ..FleetLimits::default() });
        strict.0.healthy.store(false, Ordering::Relaxed);
        let plain = Ask { sandbox: "sb", spec: None, host: Some("x.example"), route: None };
        assert_eq!(strict.admit(plain).unwrap_err().budget, "limits.store");
    }
}
