//! The `[limits]` section: where per-sandbox limits and budgets are counted.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub store: LimitStore,
    /// With a Redis store that cannot be reached: keep counting locally (at this
    /// instance's share), or refuse what a budget or limit covers.
    pub deny_on_store_error: bool,
    pub sync_interval: Duration,
}

#[derive(Clone)]
pub enum LimitStore {
    /// Counted by each instance on its own.
    Local,
    /// Counted in Redis, shared by every instance. `url` never holds a password;
    /// `ca` is the PEM CA a `rediss://` server must chain to (None: system roots).
    Redis { url: String, password: Option<crate::secret::Secret>, ca: Option<Vec<u8>> },
}

impl std::fmt::Debug for LimitStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitStore::Local => f.write_str("Local"),
            LimitStore::Redis { url, .. } => f.debug_struct("Redis").field("url", url).finish_non_exhaustive(),
        }
    }
}

pub(super) fn validate_limits(
    l: crate::config::raw::RawLimits,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<LimitsConfig, ConfigError> {
    let deny_on_store_error = match l.on_store_error.as_str() {
        "local" => false,
        "deny" => true,
        other => {
            return Err(ConfigError::invalid(
                file,
                "limits.on_store_error",
                format!("expected \"local\" or \"deny\", got {other:?}"),
            ));
        }
    };
    within(file, "limits.sync_interval", l.sync_interval, Duration::from_millis(10), Duration::from_secs(10))?;
    let store = if l.store == "local" {
        // A Redis password or CA beside a local store means the store line was lost.
        for (key, set) in [
            ("limits.redis_password_file", l.redis_password_file.is_some()),
            ("limits.redis_ca_file", l.redis_ca_file.is_some()),
        ] {
            if set {
                return Err(ConfigError::invalid(file, key, "only with a Redis store: set limits.store to its URL"));
            }
        }
        LimitStore::Local
    } else if l.store.starts_with("redis://") || l.store.starts_with("rediss://") {
        let url = http::Uri::try_from(l.store.as_str()).ok();
        let Some(authority) = url.as_ref().and_then(|u| u.authority()) else {
            return Err(ConfigError::invalid(
                file,
                "limits.store",
                "expected redis://HOST:PORT/DB or rediss://HOST:PORT/DB",
            ));
        };
        // A password in the URL would be in every place the URL is shown.
        if authority.as_str().split_once('@').is_some_and(|(user, _)| user.contains(':')) {
            return Err(ConfigError::invalid(
                file,
                "limits.store",
                "the URL holds a password: put it in limits.redis_password_file instead",
            ));
        }
        // What the Redis client itself refuses (a database that is not a number, an
        // unknown query option) is named here, with the file and key, not at start-up.
        if let Err(e) = redis::IntoConnectionInfo::into_connection_info(l.store.as_str()) {
            return Err(ConfigError::invalid(file, "limits.store", format!("expected redis://HOST:PORT/DB: {e}")));
        }
        let password = match &l.redis_password_file {
            Some(p) => {
                let path = base_dir.join(p);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ConfigError::invalid(
                        file,
                        "limits.redis_password_file",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                if text.trim().is_empty() {
                    return Err(ConfigError::invalid(
                        file,
                        "limits.redis_password_file",
                        format!("{} is empty: expected the password", path.display()),
                    ));
                }
                Some(crate::secret::Secret::new(text.trim()))
            }
            None => None,
        };
        let ca = match &l.redis_ca_file {
            Some(p) if l.store.starts_with("rediss://") => {
                let path = base_dir.join(p);
                let pem = std::fs::read(&path).map_err(|e| {
                    ConfigError::invalid(file, "limits.redis_ca_file", format!("cannot read {}: {e}", path.display()))
                })?;
                if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                    return Err(ConfigError::invalid(file, "limits.redis_ca_file", "expected PEM certificates"));
                }
                Some(pem)
            }
            Some(_) => {
                return Err(ConfigError::invalid(
                    file,
                    "limits.redis_ca_file",
                    "only for a TLS store: write the URL as rediss://",
                ));
            }
            None => None,
        };
        LimitStore::Redis { url: l.store, password, ca }
    } else {
        return Err(ConfigError::invalid(
            file,
            "limits.store",
            // Up to the last `@` may be a password: never echoed (the message reaches
            // logs and `/v1/status`).
            format!(
                "expected \"local\" or a redis:// or rediss:// URL, got {:?}",
                l.store.rsplit_once('@').map_or(l.store.clone(), |(_, host)| format!("[redacted]@{host}"))
            ),
        ));
    };
    Ok(LimitsConfig { store, deny_on_store_error, sync_interval: l.sync_interval })
}
