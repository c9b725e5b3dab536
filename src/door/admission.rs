//! Fair shares per client address (`addr::client_key`), before a connection has proved who it is: at most
//! `proxy.max_unauthenticated_per_client` connections from one address may be open
//! without having authenticated (so idle sockets from one address cannot take all of
//! `proxy.max_connections`), and at most `proxy.auth_failures_per_second` failed
//! authentications per address (beyond that the credential is not even checked:
//! `429 limit_exceeded` with `Retry-After`), except for credentials some request proved
//! in the last [`PROVEN_FOR_SECS`] seconds: a sandbox already in is still let in when a
//! neighbour behind the same address (a NAT, one node) keeps failing, and a guess is
//! never such credentials. Once authorized, a connection counts for
//! its sandbox: at most `proxy.sandbox_max_connections` each, so one sandbox's idle
//! keep-alive connections cannot take all of `proxy.max_connections` either.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Most addresses remembered for their failures; past this, addresses with nothing
/// pending and a full bucket are forgotten first.
const MAX_TRACKED: usize = 65_536;

/// How long a proved credential value is still checked past its address's failure
/// budget.
pub const PROVEN_FOR_SECS: u64 = 600;

/// Most proved credentials remembered; past this, expired ones are forgotten, and new
/// ones are not remembered while none has expired.
const MAX_PROVEN: usize = 16_384;

struct Client {
    pending: usize,
    /// Failed authentications that may still happen now (a token bucket of
    /// `failures_per_second`, with a burst of the same size).
    allowance: f64,
    refilled: Instant,
}

pub struct Admission {
    max_pending: usize,
    failures_per_second: f64,
    clients: Mutex<HashMap<IpAddr, Client>>,
    /// Connections one sandbox may hold once authorized (0: no cap).
    max_per_sandbox: usize,
    sandboxes: Mutex<HashMap<Arc<str>, usize>>,
    /// Credentials (a keyed hash of the decoded `id:token`, so that the spellings of
    /// one value are one entry) proved recently, and when (in seconds). Whether one is
    /// here decides only whether it is checked: the check itself still decides.
    proven: Mutex<HashMap<u64, u64, BuildHasherDefault<Prehashed>>>,
    proven_key: std::collections::hash_map::RandomState,
}

/// A connection that has not authenticated yet; counts against its address until it
/// does ([`Pending::authenticated`]) or closes.
pub struct Pending {
    admission: Arc<Admission>,
    ip: IpAddr,
    done: AtomicBool,
    /// The sandbox this connection counts for, once a request on it is authorized.
    sandbox: Mutex<Option<Arc<str>>>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("ip", &self.ip).finish()
    }
}

impl Pending {
    /// The connection authenticated: it no longer counts as pending.
    pub fn authenticated(&self) {
        if !self.done.swap(true, Ordering::Relaxed) {
            self.admission.release(self.ip);
        }
    }
}

impl Pending {
    /// A request for `sandbox` was authorized on this connection: it stops counting as
    /// unauthenticated and starts counting for the sandbox. `false` when the sandbox
    /// already holds `proxy.sandbox_max_connections` connections (the request is then
    /// refused; the connection stays unauthenticated).
    pub fn authorized(&self, sandbox: &Arc<str>) -> bool {
        let mut counted = self.sandbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if counted.is_none() {
            if !self.admission.take_sandbox_slot(sandbox) {
                return false;
            }
            // The identity's own name, shared: no allocation.
            *counted = Some(sandbox.clone());
        }
        drop(counted);
        self.authenticated();
        true
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.authenticated();
        let counted = self.sandbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(sandbox) = counted {
            self.admission.release_sandbox_slot(&sandbox);
        }
    }
}

impl Admission {
    /// `max_pending` 0 disables the per-address cap; `failures_per_second` 0 disables
    /// the failure rate.
    pub fn new(max_pending: usize, failures_per_second: u32) -> Admission {
        Self::with_sandbox_cap(max_pending, failures_per_second, 0)
    }

    /// With `max_per_sandbox` connections at most per authorized sandbox (0: no cap).
    pub fn with_sandbox_cap(max_pending: usize, failures_per_second: u32, max_per_sandbox: usize) -> Admission {
        Admission {
            max_pending,
            failures_per_second: f64::from(failures_per_second),
            clients: Mutex::default(),
            max_per_sandbox,
            sandboxes: Mutex::default(),
            proven: Mutex::default(),
            proven_key: std::collections::hash_map::RandomState::new(),
        }
    }

    fn take_sandbox_slot(&self, sandbox: &Arc<str>) -> bool {
        if self.max_per_sandbox == 0 {
            return true;
        }
        let mut s = self.sandboxes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A sandbox already counted needs no new key.
        let n = s.entry(sandbox.clone()).or_insert(0);
        if *n >= self.max_per_sandbox {
            return false;
        }
        *n += 1;
        true
    }

    fn release_sandbox_slot(&self, sandbox: &str) {
        if self.max_per_sandbox == 0 {
            return;
        }
        let mut s = self.sandboxes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = s.get_mut(sandbox) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.remove(sandbox);
            }
        }
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Client>> {
        self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fresh(&self) -> Client {
        Client { pending: 0, allowance: self.failures_per_second, refilled: Instant::now() }
    }

    /// Admits one more unauthenticated connection from `ip`, or `None` when the
    /// address already holds its share.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Pending> {
        let ip = crate::addr::client_key(ip);
        if self.max_pending > 0 {
            let mut clients = self.clients();
            if clients.len() >= MAX_TRACKED {
                self.forget_idle(&mut clients);
            }
            let fresh = self.fresh();
            let c = clients.entry(ip).or_insert(fresh);
            if c.pending >= self.max_pending {
                return None;
            }
            c.pending += 1;
        }
        Some(Pending {
            admission: self.clone(),
            ip,
            done: AtomicBool::new(self.max_pending == 0),
            sandbox: Mutex::new(None),
        })
    }

    fn release(&self, ip: IpAddr) {
        let mut clients = self.clients();
        if let Some(c) = clients.get_mut(&ip) {
            c.pending = c.pending.saturating_sub(1);
            if c.pending == 0 && c.allowance >= self.failures_per_second {
                clients.remove(&ip);
            }
        }
    }

    /// True when `ip` may still have a credential checked (its failure budget is not
    /// spent).
    pub fn may_try(&self, ip: IpAddr) -> bool {
        if self.failures_per_second == 0.0 {
            return true;
        }
        let ip = crate::addr::client_key(ip);
        let mut clients = self.clients();
        match clients.get_mut(&ip) {
            Some(c) => {
                self.refill(c);
                c.allowance >= 1.0
            }
            None => true,
        }
    }

    /// True when `ip` may have `credentials` (the decoded `id:token`) checked: its
    /// failure budget is not spent, or a request proved them in the last
    /// [`PROVEN_FOR_SECS`] seconds (`now`, in seconds).
    pub fn may_try_credentials(&self, ip: IpAddr, credentials: Option<&[u8]>, now: u64) -> bool {
        self.may_try(ip) || credentials.is_some_and(|c| self.proven_lately(c, now))
    }

    fn proven_lately(&self, credentials: &[u8], now: u64) -> bool {
        let key = self.proven_key.hash_one(credentials);
        let proven = self.proven.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        proven.get(&key).is_some_and(|at| now.saturating_sub(*at) < PROVEN_FOR_SECS)
    }

    /// Notes that a request proved `credentials` at `now` (seconds). Allocates nothing.
    pub fn proved(&self, credentials: &[u8], now: u64) {
        if self.failures_per_second == 0.0 {
            return;
        }
        let key = self.proven_key.hash_one(credentials);
        let mut proven = self.proven.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = proven.get_mut(&key) {
            *at = now;
            return;
        }
        if proven.len() >= MAX_PROVEN {
            proven.retain(|_, at| now.saturating_sub(*at) < PROVEN_FOR_SECS);
            // Full of credentials proved lately: those already in keep their place.
            if proven.len() >= MAX_PROVEN {
                return;
            }
        }
        proven.insert(key, now);
    }

    /// Spends one failed authentication from `ip`'s budget.
    pub fn failed(&self, ip: IpAddr) {
        if self.failures_per_second == 0.0 {
            return;
        }
        let ip = crate::addr::client_key(ip);
        let mut clients = self.clients();
        if clients.len() >= MAX_TRACKED && !clients.contains_key(&ip) {
            self.forget_idle(&mut clients);
        }
        let fresh = self.fresh();
        let c = clients.entry(ip).or_insert(fresh);
        self.refill(c);
        c.allowance = (c.allowance - 1.0).max(0.0);
    }

    fn refill(&self, c: &mut Client) {
        let now = Instant::now();
        let elapsed = now.duration_since(c.refilled).as_secs_f64();
        c.allowance = (c.allowance + elapsed * self.failures_per_second).min(self.failures_per_second);
        c.refilled = now;
    }

    fn forget_idle(&self, clients: &mut HashMap<IpAddr, Client>) {
        let full = self.failures_per_second;
        clients.retain(|_, c| {
            let elapsed = c.refilled.elapsed().as_secs_f64();
            c.pending > 0 || c.allowance + elapsed * full < full
        });
        if clients.len() >= MAX_TRACKED {
            clients.retain(|_, c| c.pending > 0);
        }
    }
}

/// The hasher of a map whose keys are already keyed hashes (`Admission::proven`): the
/// key is its own hash. It cannot be steered into collisions by anyone who does not
/// know the key of the hash that made it, and a second SipHash of it cost each
/// authentication about 100 instructions.
#[derive(Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; any other input is folded in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_its_share_until_it_authenticates() {
        let a = Arc::new(Admission::new(2, 0));
        let ip: IpAddr = [10, 0, 0, 1].into();
        let other: IpAddr = [10, 0, 0, 2].into();
        let first = a.admit(ip).unwrap_or_else(|| unreachable!());
        let second = a.admit(ip).unwrap_or_else(|| unreachable!());
        assert!(a.admit(ip).is_none(), "a third pending connection from one address");
        assert!(a.admit(other).is_some(), "another address is not affected");
        first.authenticated();
        let third = a.admit(ip);
        assert!(third.is_some(), "an authenticated connection frees its place");
        drop(second);
        drop(third);
        drop(first);
        assert!(a.clients().is_empty(), "nothing is remembered once all closed");
    }

    #[test]
    fn a_mapped_address_holds_its_ipv4_share() {
        let a = Arc::new(Admission::new(1, 0));
        let ip = |s: &str| -> IpAddr { s.parse().unwrap_or_else(|_| unreachable!()) };
        let first = a.admit(ip("192.0.2.1"));
        assert!(first.is_some());
        assert!(a.admit(ip("::ffff:192.0.2.1")).is_none(), "the same client over a dual-stack socket");
        assert!(a.admit(ip("2001:db8::2")).is_some());
    }

    #[test]
    fn one_sandbox_holds_at_most_its_connections() {
        let a = Arc::new(Admission::with_sandbox_cap(0, 0, 2));
        let ip: IpAddr = [10, 0, 0, 1].into();
        let (s, other): (Arc<str>, Arc<str>) = ("s".into(), "other".into());
        let (c1, c2, c3) = (a.admit(ip).unwrap(), a.admit(ip).unwrap(), a.admit(ip).unwrap());
        assert!(c1.authorized(&s) && c1.authorized(&s), "a connection counts once");
        assert!(c2.authorized(&s));
        assert!(!c3.authorized(&s), "a third connection for the sandbox");
        assert!(c3.authorized(&other), "another sandbox is not affected");
        drop(c1);
        let c4 = a.admit(ip).unwrap();
        assert!(c4.authorized(&s), "a closed connection frees its place");
        drop((c2, c3, c4));
        assert!(a.sandboxes.lock().unwrap().is_empty(), "nothing is remembered once all closed");
    }

    #[test]
    fn failures_are_rated_per_address() {
        let a = Admission::new(0, 3);
        let ip: IpAddr = [10, 0, 0, 1].into();
        for _ in 0..3 {
            assert!(a.may_try(ip));
            a.failed(ip);
        }
        assert!(!a.may_try(ip), "the fourth failure within a second is not checked");
        assert!(a.may_try([10, 0, 0, 2].into()));
    }
}
