//! The shared store: Redis. Every `limits.sync_interval` (sooner once half a lease is
//! spent) each instance hands over what it spent since the last sync (`INCRBY`, and
//! `SADD` for hosts) and reads back the fleet's totals in the same round trip, with a
//! heartbeat that tells it how many instances share the budgets. A failed sync keeps
//! the counts to hand over next time (the reconciliation when Redis returns); a store
//! that comes back empty (a new `egress:v1:boot` mark) gets each instance's counts of
//! the current windows again. A sync that timed out but ran may be counted twice:
//! the error is on the side of the limit.
//!
//! Keys: `egress:v1:SANDBOX:BUDGET:WINDOW_SECS:WINDOW_INDEX` (counters),
//! `egress:v1:SANDBOX:new_hosts:WINDOW_SECS:WINDOW_INDEX` (host sets),
//! `egress:v1:instances` (a sorted set of heartbeats) and `egress:v1:active:INSTANCE`
//! (what each instance holds open per sandbox, for the fleet-wide
//! `proxy.sandbox_max_concurrent`). Counters and sets expire a minute after their
//! window ends; an instance's entries a few syncs after it stops.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo};
use tokio_util::sync::CancellationToken;

use super::ledger::{What, Window};
use super::{Budgets, STORE_TIMEOUT, STORE_UP, unix_now};
use crate::secret::Secret;

const PREFIX: &str = "egress:v1";
/// Counters not used for this long are no longer refreshed (they are dropped at the
/// end of their window).
const REFRESH_IDLE: Duration = Duration::from_secs(10);
/// The least time between two syncs, however often half a lease is spent.
const MIN_GAP: Duration = Duration::from_millis(20);

fn counter_key(sandbox: &str, what: &What, w: Window) -> String {
    format!("{PREFIX}:{sandbox}:{what}:{}:{}", w.secs, w.index)
}

fn hosts_key(sandbox: &str, w: Window) -> String {
    format!("{PREFIX}:{sandbox}:new_hosts:{}:{}", w.secs, w.index)
}

/// A Redis client with one multiplexed connection, made again after a failure.
pub struct Store {
    client: Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

impl Store {
    /// `url`: `redis://HOST:PORT/DB` or `rediss://` (TLS, verified against `ca` (PEM)
    /// or else the system's roots); `password` for `AUTH`.
    pub fn new(url: &str, password: Option<&Secret>, ca: Option<&[u8]>) -> redis::RedisResult<Store> {
        // TLS to Redis uses the process-wide rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut info = url.into_connection_info()?;
        if let Some(p) = password {
            let settings = info.redis_settings().clone().set_password(p.expose());
            info = info.set_redis_settings(settings);
        }
        let client = match ca {
            Some(pem) => Client::build_with_tls(
                info,
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem.to_vec()) },
            )?,
            None => Client::open(info)?,
        };
        Ok(Store { client, conn: tokio::sync::Mutex::new(None) })
    }

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(STORE_TIMEOUT))
            .set_response_timeout(Some(STORE_TIMEOUT));
        let c = self.client.get_multiplexed_async_connection_with_config(&config).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn forget_connection(&self) {
        *self.conn.lock().await = None;
    }

    async fn query(&self, pipe: &redis::Pipeline) -> redis::RedisResult<Vec<redis::Value>> {
        let mut conn = self.connection().await?;
        let r = tokio::time::timeout(STORE_TIMEOUT, pipe.query_async::<Vec<redis::Value>>(&mut conn)).await;
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.forget_connection().await;
                Err(e)
            }
            Err(_) => {
                self.forget_connection().await;
                Err(redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer")))
            }
        }
    }
}

impl Store {
    /// The fleet's counts of `sandbox`'s budgets in window `w` (`None`: its host set).
    pub async fn read<'a>(
        &self,
        sandbox: &str,
        w: Window,
        whats: impl Iterator<Item = Option<&'a What>>,
    ) -> redis::RedisResult<Vec<u64>> {
        let mut pipe = redis::pipe();
        let mut n = 0;
        for what in whats {
            match what {
                Some(what) => pipe.cmd("GET").arg(counter_key(sandbox, what, w)),
                None => pipe.cmd("SCARD").arg(hosts_key(sandbox, w)),
            };
            n += 1;
        }
        let values = self.query(&pipe).await?;
        if values.len() != n {
            return Err(redis::RedisError::from(std::io::Error::other("unexpected answer")));
        }
        Ok(values.iter().map(|v| redis::from_redis_value_ref::<Option<u64>>(v).ok().flatten().unwrap_or(0)).collect())
    }
}

/// One counter handed to a sync.
struct Flush {
    sandbox: Arc<str>,
    what: Option<What>,
    window: Window,
    amount: u64,
    hosts: Vec<Box<str>>,
}

/// Syncs `budgets` with `store` until `stop` fires.
pub async fn run(budgets: Budgets, store: Arc<Store>, interval: Duration, stop: CancellationToken) {
    let instance = format!("{:016x}", rand::random::<u64>());
    let mut was_healthy = true;
    loop {
        let ok = sync_once(&budgets, &store, &instance, interval).await;
        match (&ok, was_healthy) {
            (Err(e), true) => tracing::warn!(
                error = %e,
                "limit store unreachable: counting locally at this instance's share until it answers"
            ),
            (Ok(()), false) => {
                tracing::info!("limit store answers again: spending counted while it was away handed over")
            }
            _ => {}
        }
        was_healthy = ok.is_ok();
        budgets.0.healthy.store(was_healthy, Ordering::Relaxed);
        ::metrics::gauge!(STORE_UP).set(if was_healthy { 1.0 } else { 0.0 });
        let pause = if was_healthy { interval } else { interval.max(Duration::from_millis(500)) };
        // Early wakes are spaced out: a busy sandbox must not turn the sync into a loop.
        let gap = MIN_GAP.min(pause);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(gap) => {}
        }
        let pause = pause - gap;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
            _ = budgets.0.wake.notified(), if was_healthy => {}
        }
    }
    // What was spent since the last sync (the drain's last bytes) is handed over too.
    if let Err(e) = sync_once(&budgets, &store, &instance, interval).await {
        tracing::warn!(error = %e, "limit store: the last spending before stopping could not be handed over");
    }
}

async fn sync_once(budgets: &Budgets, store: &Store, instance: &str, interval: Duration) -> redis::RedisResult<()> {
    let unix = unix_now();
    let now = Instant::now();
    let mut flushes = Vec::new();
    {
        let mut ledger = budgets.ledger();
        ledger.sweep(unix);
        for ((sandbox, what), c) in ledger.counters.iter_mut() {
            if c.pending == 0 && (now.duration_since(c.last_used) > REFRESH_IDLE || c.window.end() <= unix) {
                continue;
            }
            c.flushing += c.pending;
            flushes.push(Flush {
                sandbox: sandbox.clone(),
                what: Some(what.clone()),
                window: c.window,
                amount: c.pending,
                hosts: Vec::new(),
            });
            c.pending = 0;
        }
        for (sandbox, s) in ledger.hosts.iter_mut() {
            if s.pending.is_empty() && (now.duration_since(s.last_used) > REFRESH_IDLE || s.window.end() <= unix) {
                continue;
            }
            let hosts = std::mem::take(&mut s.pending);
            s.flushing.extend(hosts.iter().cloned());
            flushes.push(Flush { sandbox: sandbox.clone(), what: None, window: s.window, amount: 0, hosts });
        }
    }

    let mut pipe = redis::pipe();
    for f in &flushes {
        let ttl = (f.window.end().saturating_sub(unix) + 60) as i64;
        match &f.what {
            Some(what) => {
                let key = counter_key(&f.sandbox, what, f.window);
                pipe.cmd("INCRBY").arg(&key).arg(f.amount);
                pipe.cmd("EXPIRE").arg(&key).arg(ttl).ignore();
            }
            None => {
                let key = hosts_key(&f.sandbox, f.window);
                if !f.hosts.is_empty() {
                    pipe.cmd("SADD").arg(&key).arg(f.hosts.iter().map(|h| &**h).collect::<Vec<&str>>()).ignore();
                }
                // The members, not just their count: a host another instance counted
                // stays allowed here (the set is bounded by the budget, plus a lease
                // per instance).
                pipe.cmd("SMEMBERS").arg(&key);
                pipe.cmd("EXPIRE").arg(&key).arg(ttl).ignore();
            }
        }
    }
    let now_ms = u64::try_from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis(),
    )
    .unwrap_or(u64::MAX);
    let alive_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX).saturating_mul(4).max(3000);
    let instances = format!("{PREFIX}:instances");
    pipe.cmd("ZADD").arg(&instances).arg(now_ms).arg(instance).ignore();
    pipe.cmd("ZREMRANGEBYSCORE").arg(&instances).arg("-inf").arg(now_ms.saturating_sub(alive_ms)).ignore();
    pipe.cmd("PEXPIRE").arg(&instances).arg(alive_ms * 10).ignore();
    // What this instance holds open per sandbox, replaced whole; and what the other
    // instances alive at the last sync hold.
    let own_active = format!("{PREFIX}:active:{instance}");
    let mine = budgets.0.active_source.get().map(|f| f()).unwrap_or_default();
    pipe.cmd("DEL").arg(&own_active).ignore();
    if !mine.is_empty() {
        let mut hset = redis::cmd("HSET");
        hset.arg(&own_active);
        for (sandbox, n) in &mine {
            hset.arg(sandbox).arg(*n);
        }
        pipe.add_command(hset).ignore();
        pipe.cmd("PEXPIRE").arg(&own_active).arg(alive_ms).ignore();
    }
    let peers = budgets.0.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for peer in &peers {
        pipe.cmd("HGETALL").arg(format!("{PREFIX}:active:{peer}"));
    }
    pipe.cmd("ZRANGE").arg(&instances).arg(0).arg(-1);
    // The store's boot mark: set by the first instance to sync with a store that has
    // none, so a store that restarted empty (no persistence) shows a new one.
    let boot = format!("{PREFIX}:boot");
    pipe.cmd("SET").arg(&boot).arg(format!("{:016x}", rand::random::<u64>())).arg("NX").ignore();
    pipe.cmd("GET").arg(&boot);

    let expected = flushes.len() + peers.len() + 2;
    let answer = store.query(&pipe).await;
    let mut ledger = budgets.ledger();
    let values = match answer {
        Ok(v) if v.len() == expected => v,
        other => {
            // Hand it all over next time.
            for f in flushes {
                match f.what {
                    Some(what) => {
                        if let Some(c) = ledger.counters.get_mut(&(f.sandbox, what)).filter(|c| c.window == f.window) {
                            c.flushing = c.flushing.saturating_sub(f.amount);
                            c.pending += f.amount;
                        }
                    }
                    None => {
                        if let Some(s) = ledger.hosts.get_mut(&f.sandbox).filter(|s| s.window == f.window) {
                            s.flushing.clear();
                            s.pending.extend(f.hosts);
                        }
                    }
                }
            }
            return match other {
                Err(e) => Err(e),
                Ok(v) => Err(redis::RedisError::from(std::io::Error::other(format!(
                    "unexpected answer: {} values for {expected}",
                    v.len()
                )))),
            };
        }
    };
    // A store that lost what it held (a new boot mark): everything this instance
    // handed over in the current windows goes again.
    let mark: Option<String> = values.last().and_then(|v| redis::from_redis_value_ref(v).ok());
    let lost = {
        let mut seen = budgets.0.boot.lock().unwrap_or_else(|e| e.into_inner());
        let lost = seen.is_some() && mark.is_some() && *seen != mark;
        if mark.is_some() {
            *seen = mark;
        }
        lost
    };
    if lost {
        tracing::warn!("limit store restarted without this window's counts: handing over this instance's again");
        for c in ledger.counters.values_mut() {
            c.pending += std::mem::take(&mut c.mine);
        }
        for s in ledger.hosts.values_mut() {
            let again: Vec<Box<str>> = s.seen.iter().filter(|h| !s.pending.contains(h)).cloned().collect();
            s.pending.extend(again);
        }
    }
    for (f, v) in flushes.into_iter().zip(&values) {
        match f.what {
            Some(what) => {
                let total: u64 = redis::from_redis_value_ref(v).unwrap_or(0);
                if let Some(c) = ledger.counters.get_mut(&(f.sandbox, what)).filter(|c| c.window == f.window) {
                    c.flushing = c.flushing.saturating_sub(f.amount);
                    // After a loss, the count this instance knew stands until the
                    // fleet's hand-overs bring the store back past it.
                    c.fleet = if lost { c.fleet.max(total) } else { total };
                    c.mine += f.amount;
                }
            }
            None => {
                let members: Vec<String> = redis::from_redis_value_ref(v).unwrap_or_default();
                if let Some(s) = ledger.hosts.get_mut(&f.sandbox).filter(|s| s.window == f.window) {
                    s.flushing.clear();
                    s.fleet = members.len() as u64;
                    // Known to the fleet: counted there, so not pending here.
                    s.pending.retain(|h| !members.iter().any(|m| m == &**h));
                    s.seen.extend(members.into_iter().map(String::into_boxed_str));
                }
            }
        }
    }
    let tail = &values[values.len() - peers.len() - 2..values.len() - 1];
    let mut others: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for v in &tail[..peers.len()] {
        let held: std::collections::HashMap<String, u64> = redis::from_redis_value_ref(v).unwrap_or_default();
        for (sandbox, n) in held {
            *others.entry(sandbox).or_default() += n;
        }
    }
    *budgets.0.others_active.lock().unwrap_or_else(|e| e.into_inner()) = others;
    let alive: Vec<String> = tail.last().and_then(|v| redis::from_redis_value_ref(v).ok()).unwrap_or_default();
    budgets.0.instances.store((alive.len() as u64).max(1), Ordering::Relaxed);
    *budgets.0.peers.lock().unwrap_or_else(|e| e.into_inner()) = alive.into_iter().filter(|i| i != instance).collect();
    budgets.0.syncs.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
