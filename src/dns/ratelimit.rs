//! Per-source token buckets for the DNS firewall, and a sampler that bounds how many
//! blocked-name log lines are written per second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Most sources tracked at once; beyond it idle buckets are evicted, and if none are
/// idle the least recently seen half (a spoofed-source flood can neither grow memory
/// nor lock out a source it has not seen).
const MAX_SOURCES: usize = 65_536;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl RateLimiter {
    /// `rate` queries per second per source, bursts up to `burst`. `rate == 0` means no
    /// limit.
    pub fn new(rate: u32, burst: u32) -> Self {
        RateLimiter { rate: f64::from(rate), burst: f64::from(burst), buckets: Mutex::new(HashMap::new()) }
    }

    pub fn enabled(&self) -> bool {
        self.rate > 0.0
    }

    /// Takes one token for `src`; false when the source is over its rate.
    pub fn allow(&self, src: IpAddr, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        // An IPv4-mapped source counts as its IPv4.
        let src = crate::addr::client_key(src);
        let Ok(mut buckets) = self.buckets.lock() else {
            return true;
        };
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&src) {
            let full_after = self.burst / self.rate;
            buckets.retain(|_, b| now.saturating_duration_since(b.last).as_secs_f64() < full_after);
            if buckets.len() >= MAX_SOURCES {
                // Once per MAX_SOURCES / 2 new sources at most: linear, so constant
                // per query.
                let mut seen: Vec<Instant> = buckets.values().map(|b| b.last).collect();
                let (_, cutoff, _) = seen.select_nth_unstable(MAX_SOURCES / 2);
                let cutoff = *cutoff;
                buckets.retain(|_, b| b.last > cutoff);
            }
        }
        let b = buckets.entry(src).or_insert(Bucket { tokens: self.burst, last: now });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Lets at most `per_second` events through in each wall-clock second and counts the
/// rest, so a flood of blocked names cannot flood the log.
pub struct Sampler {
    per_second: u32,
    start: Instant,
    second: AtomicU64,
    count: AtomicU32,
    suppressed: AtomicU64,
}

impl Sampler {
    pub fn new(per_second: u32) -> Self {
        Sampler {
            per_second,
            start: Instant::now(),
            second: AtomicU64::new(0),
            count: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(suppressed_since_last)` when this event may be logged.
    pub fn sample(&self) -> Option<u64> {
        let now = self.start.elapsed().as_secs();
        // Read before writing: the shared counters are only written when the second
        // changes or the budget is not spent yet, so busy threads do not fight over
        // the cache line on every blocked query.
        if self.second.load(Ordering::Relaxed) != now && self.second.swap(now, Ordering::Relaxed) != now {
            self.count.store(0, Ordering::Relaxed);
        }
        if self.count.load(Ordering::Relaxed) >= self.per_second {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.count.fetch_add(1, Ordering::Relaxed) < self.per_second {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_limits_and_refills_per_source() {
        let rl = RateLimiter::new(10, 5);
        let t0 = Instant::now();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!((0..20).filter(|_| rl.allow(a, t0)).count(), 5);
        assert!(rl.allow(b, t0), "another source is unaffected");
        assert!(rl.allow(a, t0 + Duration::from_millis(150)), "refills at 10/s");
        assert!(RateLimiter::new(0, 0).allow(a, t0));
        // A mapped source is its IPv4.
        let (v4, mapped): (IpAddr, IpAddr) = ("127.0.0.9".parse().unwrap(), "::ffff:127.0.0.9".parse().unwrap());
        assert_eq!((0..20).filter(|i| rl.allow(if i % 2 == 0 { v4 } else { mapped }, t0)).count(), 5);
    }

    #[test]
    fn a_full_table_still_admits_a_new_source() {
        let rl = RateLimiter::new(1, 2);
        let t0 = Instant::now();
        // A flood from as many addresses as the table holds, none of them idle yet.
        for i in 0..MAX_SOURCES as u32 {
            let src = IpAddr::from(std::net::Ipv6Addr::from(u128::from(i) + 1));
            assert!(rl.allow(src, t0 + Duration::from_micros(u64::from(i))));
        }
        let late = t0 + Duration::from_millis(100);
        let newcomer: IpAddr = "127.200.0.2".parse().unwrap();
        assert!(rl.allow(newcomer, late), "a source the flood did not use is answered");
        let len = rl.buckets.lock().unwrap().len();
        assert!(len <= MAX_SOURCES / 2 + 1, "the least recently seen half went: {len}");
        // The newcomer keeps its own bucket: limited as before.
        assert!(rl.allow(newcomer, late));
        assert!(!rl.allow(newcomer, late));
    }

    #[test]
    fn sampler_bounds_events_per_second() {
        let s = Sampler::new(3);
        let passed = (0..100).filter(|_| s.sample().is_some()).count();
        assert!((3..=6).contains(&passed), "{passed}");
    }
}
