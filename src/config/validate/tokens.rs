//! The `[tokens]` section: signing keys for sandbox tokens, revocations, expiry grace.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

/// Where signed-token keys come from; read at start-up and on every reload.
#[derive(Debug, Clone)]
pub struct TokensConfig {
    pub max_ttl: Duration,
    pub leeway: Duration,
    pub revocation_file: Option<PathBuf>,
    pub keys: Vec<KeySource>,
    /// Connections authenticated by a signed token end this long after its `exp`;
    /// `None` ("off"): they end only when they close or a reload refuses them.
    pub expiry_grace: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlg {
    Hs256,
    EdDsa,
}

#[derive(Debug, Clone)]
pub struct KeySource {
    pub kid: String,
    pub alg: KeyAlg,
    /// HS256: the shared secret.
    pub secret: Option<SecretSource>,
    /// EdDSA: the public key (PEM) that verifies.
    pub public_key_file: Option<PathBuf>,
    /// EdDSA: the private key (PEM), only where tokens are minted.
    pub private_key_file: Option<PathBuf>,
}

pub(super) fn validate_tokens(
    t: crate::config::raw::RawTokens,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<TokensConfig, ConfigError> {
    positive(file, "tokens.max_ttl", t.max_ttl)?;
    // More skew than this would make `exp` meaningless.
    within(file, "tokens.leeway", t.leeway, Duration::ZERO, Duration::from_secs(3600))?;
    let expiry_grace = match t.expiry_grace.trim() {
        "off" => None,
        v => Some(humantime::parse_duration(v).map_err(|e| {
            ConfigError::invalid(
                file,
                "tokens.expiry_grace",
                format!("expected a duration such as \"60s\" or \"off\", got {v:?}: {e}"),
            )
        })?),
    };
    if let Some(g) = expiry_grace {
        within(file, "tokens.expiry_grace", g, Duration::ZERO, MAX_DURATION)?;
    }
    let path = |p: &PathBuf| clean_path(&base_dir.join(p));
    let mut keys = Vec::with_capacity(t.keys.len());
    let mut seen = std::collections::HashSet::new();
    for (i, k) in t.keys.into_iter().enumerate() {
        let key = |name: &str| format!("tokens.keys[{i}].{name}");
        if k.kid.is_empty() {
            return Err(ConfigError::invalid(file, key("kid"), "expected a non-empty key id"));
        }
        if !seen.insert(k.kid.clone()) {
            return Err(ConfigError::invalid(file, key("kid"), format!("key id {:?} is defined twice", k.kid)));
        }
        let alg = match k.alg.as_str() {
            "HS256" => KeyAlg::Hs256,
            "EdDSA" => KeyAlg::EdDsa,
            other => {
                return Err(ConfigError::invalid(
                    file,
                    key("alg"),
                    format!("expected \"HS256\" or \"EdDSA\", got {other:?}"),
                ));
            }
        };
        let secret = match (&k.secret_file, &k.secret_env) {
            (None, None) => None,
            (Some(f), None) => Some(SecretSource::File(path(f))),
            (None, Some(env)) => Some(SecretSource::Env(env.clone())),
            (Some(_), Some(_)) => {
                return Err(ConfigError::invalid(
                    file,
                    key("secret_file"),
                    "expected secret_file or secret_env, not both",
                ));
            }
        };
        match alg {
            KeyAlg::Hs256 if secret.is_none() => {
                return Err(ConfigError::invalid(
                    file,
                    key("secret_file"),
                    "HS256 keys need secret_file or secret_env",
                ));
            }
            KeyAlg::EdDsa if k.public_key_file.is_none() => {
                return Err(ConfigError::invalid(file, key("public_key_file"), "EdDSA keys need a public key (PEM)"));
            }
            _ => {}
        }
        keys.push(KeySource {
            kid: k.kid,
            alg,
            secret,
            public_key_file: k.public_key_file.as_ref().map(path),
            private_key_file: k.private_key_file.as_ref().map(path),
        });
    }
    Ok(TokensConfig {
        max_ttl: t.max_ttl,
        leeway: t.leeway,
        revocation_file: t.revocation_file.as_ref().map(path),
        keys,
        expiry_grace,
    })
}
