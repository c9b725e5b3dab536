//! The live policy state: loaded and validated off the request path, swapped
//! atomically. A request takes one snapshot and uses it to the end; a failed load keeps
//! the old state and says why (log, metric, `/v1/status`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;

use crate::config::{self, Config, ConfigError};
use crate::metrics;
use crate::policy::PolicySet;
use crate::tokens::Verifier;

/// Everything that reloads together: policies, shadow policies, token keys and the
/// revocation list.
pub struct Loaded {
    pub policies: PolicySet,
    pub shadow: Option<PolicySet>,
    pub tokens: Verifier,
    pub route_secrets: std::collections::HashMap<String, crate::secret::Secret>,
    pub secrets: std::collections::HashMap<String, crate::secret::Secret>,
    /// The files' [`fingerprint`] taken before they were read: a file written while
    /// (or just after) they were read differs from it, and the watcher reloads it.
    pub files: u64,
}

/// Reads and validates everything reloadable named by `config`.
pub fn load(config: &Config) -> Result<Loaded, ConfigError> {
    let files = fingerprint(config);
    Ok(Loaded {
        files,
        policies: config::load_policies(config)?,
        shadow: config::load_shadow(config)?,
        tokens: config::load_verifier(config)?,
        route_secrets: config::load_route_secrets(config)?,
        secrets: config::load_placeholder_secrets(config)?,
    })
}

pub struct State {
    /// Starts at 1 and grows by one on every successful reload.
    pub generation: u64,
    pub policies: PolicySet,
    /// Decided alongside for comparison (`policy.shadow_dir`); never enforced.
    pub shadow: Option<PolicySet>,
    pub tokens: Verifier,
    /// API route name -> the secret injected upstream.
    pub route_secrets: std::collections::HashMap<String, crate::secret::Secret>,
    /// Placeholder secret name -> its value (`[[secrets]]`).
    pub secrets: std::collections::HashMap<String, crate::secret::Secret>,
    pub loaded_at: SystemTime,
}

pub struct Store {
    current: ArcSwap<State>,
    /// The first load's [`Loaded::files`].
    files_at_start: u64,
    next_generation: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Held for a whole reload, so two reloads (signal, file watch, admin) never race
    /// and generations are swapped in the order they were numbered.
    reloading: Mutex<()>,
}

impl Store {
    pub fn new(loaded: Loaded) -> Self {
        ::metrics::gauge!(metrics::POLICY_GENERATION).set(1.0);
        let Loaded { policies, shadow, tokens, route_secrets, secrets, files } = loaded;
        Store {
            files_at_start: files,
            current: ArcSwap::from_pointee(State {
                generation: 1,
                policies,
                shadow,
                tokens,
                route_secrets,
                secrets,
                loaded_at: SystemTime::now(),
            }),
            next_generation: AtomicU64::new(2),
            last_error: Mutex::new(None),
            reloading: Mutex::new(()),
        }
    }

    pub fn snapshot(&self) -> Arc<State> {
        self.current.load_full()
    }

    /// The files' fingerprint taken before the first load read them: where the file
    /// watcher starts, so that a write racing the start-up load is still seen.
    pub fn files_at_start(&self) -> u64 {
        self.files_at_start
    }

    /// The error of the last reload attempt, if it failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    /// Loads the policies named by `config` and swaps them in; on error the current
    /// state stays. Logs and counts either way.
    pub fn reload(&self, config: &Config) -> Result<u64, ConfigError> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = load(config).map(|Loaded { policies, shadow, tokens, route_secrets, secrets, files: _ }| {
            let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
            let loaded_at = SystemTime::now();
            self.current.store(Arc::new(State {
                generation,
                policies,
                shadow,
                tokens,
                route_secrets,
                secrets,
                loaded_at,
            }));
            generation
        });
        let message = match &result {
            Ok(generation) => {
                tracing::info!(generation, "policies reloaded");
                ::metrics::counter!(metrics::POLICY_RELOADS, "result" => "ok").increment(1);
                ::metrics::gauge!(metrics::POLICY_GENERATION).set(*generation as f64);
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "policy reload failed; keeping the previous policies");
                ::metrics::counter!(metrics::POLICY_RELOADS, "result" => "error").increment(1);
                Some(e.to_string())
            }
        };
        if let Ok(mut last) = self.last_error.lock() {
            *last = message;
        }
        result
    }
}

/// A fingerprint of every file a reload reads (policy and shadow directories, token
/// keys, the revocation file, TLS certificate and key): names, sizes and modification
/// times. A change means a reload is due.
pub fn fingerprint(config: &Config) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    if let config::PolicySource::Dir(d) = &config.policy.source {
        files.extend(config::policy_files::policy_files(d).unwrap_or_default());
    }
    if let Some(d) = &config.policy.shadow {
        files.extend(config::policy_files::policy_files(d).unwrap_or_default());
    }
    // The main file too: an edit to it is reported (it applies on restart).
    files.extend(config.baseline.as_ref().map(|b| b.path().to_path_buf()));
    files.extend(config.tokens.revocation_file.iter().cloned());
    for k in &config.tokens.keys {
        if let Some(config::SecretSource::File(p)) = &k.secret {
            files.push(p.clone());
        }
        files.extend(k.public_key_file.iter().cloned());
        files.extend(k.private_key_file.iter().cloned());
    }
    if let Some((cert, key)) = &config.proxy.tls {
        files.push(cert.clone());
        files.push(key.clone());
    }
    for source in config.routes.iter().map(|r| &r.secret).chain(config.secrets.iter().map(|s| &s.source)) {
        if let config::SecretSource::File(p) = source {
            files.push(p.clone());
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.hash(&mut h);
        if let Ok(m) = std::fs::metadata(&f) {
            m.len().hash(&mut h);
            m.modified().ok().hash(&mut h);
        }
    }
    h.finish()
}
