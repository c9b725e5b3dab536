//! The live policy state: loaded and validated off the request path, swapped
//! atomically. A request takes one snapshot and uses it to the end; a failed load keeps
//! the old state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::config::{self, Config, ConfigError};
use crate::policy::PolicySet;

#[derive(Debug)]
pub struct State {
    /// Starts at 1 and grows by one on every successful reload.
    pub generation: u64,
    pub policies: PolicySet,
}

pub struct Store {
    current: ArcSwap<State>,
    next_generation: AtomicU64,
}

impl Store {
    pub fn new(policies: PolicySet) -> Self {
        Store { current: ArcSwap::from_pointee(State { generation: 1, policies }), next_generation: AtomicU64::new(2) }
    }

    pub fn snapshot(&self) -> Arc<State> {
        self.current.load_full()
    }

    /// Loads the policies named by `config` and swaps them in; on error the current
    /// state stays.
    pub fn reload(&self, config: &Config) -> Result<u64, ConfigError> {
        let policies = config::load_policies(config)?;
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        self.current.store(Arc::new(State { generation, policies }));
        Ok(generation)
    }
}
