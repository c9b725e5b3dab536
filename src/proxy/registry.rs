//! Open tunnels, so that a reload can close those the new policies no longer allow:
//! a revocation takes effect at once, not when the tunnel ends by itself.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use crate::dryrun::{self, Subject};
use crate::reload::State;

struct Entry {
    sandbox: String,
    /// The policy a signed token named; None for sandboxes listed in policy files.
    signed_policy: Option<String>,
    subject: Subject,
    cancel: CancellationToken,
}

#[derive(Default)]
pub struct Registry {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Entry>>,
}

/// Removes its tunnel from the registry when dropped.
pub struct Registration<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Ok(mut open) = self.registry.open.lock() {
            open.remove(&self.id);
        }
    }
}

impl Registry {
    /// Records an open tunnel; `cancel` closes it.
    pub fn register(
        &self,
        sandbox: &str,
        signed_policy: Option<&str>,
        subject: Subject,
        cancel: CancellationToken,
    ) -> Registration<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry =
            Entry { sandbox: sandbox.to_string(), signed_policy: signed_policy.map(str::to_string), subject, cancel };
        if let Ok(mut open) = self.open.lock() {
            open.insert(id, entry);
        }
        Registration { registry: self, id }
    }

    pub fn len(&self) -> usize {
        self.open.lock().map_or(0, |o| o.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every tunnel whose sandbox is gone or revoked, or whose target its policy
    /// no longer allows under `state`. Returns how many were closed.
    pub fn close_disallowed(&self, state: &State) -> usize {
        let Ok(open) = self.open.lock() else { return 0 };
        let mut closed = 0;
        for e in open.values() {
            let policy = match &e.signed_policy {
                Some(name) if !state.tokens.is_revoked(&e.sandbox) => state.policies.policies.get(name),
                Some(_) => None,
                None if state.tokens.is_revoked(&e.sandbox) => None,
                None => state.policies.sandbox(&e.sandbox).map(|s| &s.policy),
            };
            let allowed = policy.is_some_and(|p| dryrun::decide(p, &e.subject).permits());
            if !allowed {
                tracing::info!(sandbox = %e.sandbox, target = %e.subject, "closing tunnel the new policies no longer allow");
                e.cancel.cancel();
                closed += 1;
            }
        }
        closed
    }
}
