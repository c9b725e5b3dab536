//! Per-sandbox limits: concurrent tunnels plus in-flight requests, and new tunnels or
//! requests per second (a token bucket, bursts up to twice the rate). Over either: 429
//! `limit_exceeded`, and other sandboxes are unaffected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Entries kept before idle ones are evicted (signed tokens make sandbox ids unbounded).
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("sandbox has too many open tunnels and requests (proxy.sandbox_max_concurrent)")]
    Concurrent,
    #[error("sandbox opens tunnels and requests too fast (proxy.sandbox_max_per_second)")]
    Rate,
}

struct Slot {
    active: usize,
    tokens: f64,
    last: Instant,
}

struct Inner {
    max_concurrent: usize,
    rate: f64,
    burst: f64,
    slots: Mutex<HashMap<String, Slot>>,
}

#[derive(Clone)]
pub struct SandboxLimits(Arc<Inner>);

/// Holds one concurrency slot until dropped.
pub struct Permit {
    limits: Option<Arc<Inner>>,
    sandbox: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(inner) = &self.limits
            && let Ok(mut slots) = inner.slots.lock()
            && let Some(slot) = slots.get_mut(&self.sandbox)
        {
            slot.active = slot.active.saturating_sub(1);
        }
    }
}

impl SandboxLimits {
    /// `max_concurrent == 0` and `per_second == 0` disable the respective limit.
    pub fn new(max_concurrent: usize, per_second: u32) -> Self {
        let rate = f64::from(per_second);
        SandboxLimits(Arc::new(Inner { max_concurrent, rate, burst: rate * 2.0, slots: Mutex::new(HashMap::new()) }))
    }

    /// A budget of `n` requests per minute per key (bursts of `n`), no concurrency cap.
    pub fn per_minute(n: u32) -> Self {
        let rate = f64::from(n) / 60.0;
        SandboxLimits(Arc::new(Inner {
            max_concurrent: 0,
            rate,
            burst: f64::from(n),
            slots: Mutex::new(HashMap::new()),
        }))
    }

    /// Open tunnels and in-flight requests per sandbox, for those with any.
    pub fn active_counts(&self) -> Vec<(String, u64)> {
        let Ok(slots) = self.0.slots.lock() else { return Vec::new() };
        slots.iter().filter(|(_, s)| s.active > 0).map(|(k, s)| (k.clone(), s.active as u64)).collect()
    }

    /// [`Self::acquire`], with `elsewhere` more held by other instances of the fleet
    /// counted against `proxy.sandbox_max_concurrent`.
    pub fn acquire_in_fleet(&self, sandbox: &str, elsewhere: u64) -> Result<Permit, LimitError> {
        let permit = self.acquire(sandbox)?;
        let inner = &self.0;
        if inner.max_concurrent > 0 && elsewhere > 0 {
            let here = inner.slots.lock().ok().and_then(|s| s.get(sandbox).map(|s| s.active)).unwrap_or(0);
            if here as u64 + elsewhere > inner.max_concurrent as u64 {
                return Err(LimitError::Concurrent);
            }
        }
        Ok(permit)
    }

    pub fn acquire(&self, sandbox: &str) -> Result<Permit, LimitError> {
        self.acquire_at(sandbox, Instant::now())
    }

    pub fn acquire_at(&self, sandbox: &str, now: Instant) -> Result<Permit, LimitError> {
        let inner = &self.0;
        if inner.max_concurrent == 0 && inner.rate <= 0.0 {
            return Ok(Permit { limits: None, sandbox: String::new() });
        }
        let Ok(mut slots) = inner.slots.lock() else {
            return Ok(Permit { limits: None, sandbox: String::new() });
        };
        if slots.len() >= MAX_TRACKED && !slots.contains_key(sandbox) {
            slots.retain(|_, s| s.active > 0);
        }
        let slot = slots.entry(sandbox.to_string()).or_insert(Slot { active: 0, tokens: inner.burst, last: now });
        if inner.max_concurrent > 0 && slot.active >= inner.max_concurrent {
            return Err(LimitError::Concurrent);
        }
        if inner.rate > 0.0 {
            let elapsed = now.saturating_duration_since(slot.last).as_secs_f64();
            slot.tokens = (slot.tokens + elapsed * inner.rate).min(inner.burst);
            slot.last = now;
            if slot.tokens < 1.0 {
                return Err(LimitError::Rate);
            }
            slot.tokens -= 1.0;
        }
        slot.active += 1;
        Ok(Permit { limits: Some(inner.clone()), sandbox: sandbox.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn concurrency_and_rate_per_sandbox() {
        let l = SandboxLimits::new(2, 0);
        let a = l.acquire("a").unwrap();
        let _b = l.acquire("a").unwrap();
        assert_eq!(l.acquire("a").err(), Some(LimitError::Concurrent));
        assert!(l.acquire("other").is_ok());
        drop(a);
        assert!(l.acquire("a").is_ok());

        let l = SandboxLimits::new(0, 5);
        let t0 = Instant::now();
        let ok = (0..20).filter(|_| l.acquire_at("a", t0).is_ok()).count();
        assert_eq!(ok, 10, "burst of twice the rate");
        assert!(l.acquire_at("a", t0 + Duration::from_millis(250)).is_ok(), "refills");
        assert!(SandboxLimits::new(0, 0).acquire("x").is_ok());
    }
}
