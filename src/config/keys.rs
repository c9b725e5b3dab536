//! Reads signed-token keys and the revocation list named by `[tokens]`. Runs at
//! start-up and on every reload, so keys rotate and revocations apply without a
//! restart. Errors name the config file and key; secrets are never echoed.

use std::collections::{HashMap, HashSet};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};

use super::error::ConfigError;
use super::validate::{Config, KeyAlg, SecretSource};
use crate::secret::Secret;
use crate::tokens::{Key, Verifier};

/// Shortest HS256 secret accepted (RFC 7518 section 3.2: at least the hash size).
const MIN_SECRET: usize = 32;

pub fn load_verifier(config: &Config) -> Result<Verifier, ConfigError> {
    let t = &config.tokens;
    let err = |key: String, msg: String| ConfigError::invalid(&config.file, key, msg);
    let mut keys = HashMap::new();
    for (i, k) in t.keys.iter().enumerate() {
        let at = |name: &str| format!("tokens.keys[{i}].{name}");
        let key = match k.alg {
            KeyAlg::Hs256 => {
                let (name, secret) = match &k.secret {
                    Some(SecretSource::File(p)) => (
                        at("secret_file"),
                        std::fs::read(p)
                            .map_err(|e| err(at("secret_file"), format!("cannot read {}: {e}", p.display())))?,
                    ),
                    Some(SecretSource::Env(v)) => (
                        at("secret_env"),
                        std::env::var(v)
                            .map_err(|_| err(at("secret_env"), format!("environment variable {v} is not set")))?
                            .into_bytes(),
                    ),
                    None => return Err(err(at("secret_file"), "HS256 keys need a secret".into())),
                };
                let secret = secret.trim_ascii().to_vec();
                if secret.len() < MIN_SECRET {
                    return Err(err(name, format!("expected a secret of at least {MIN_SECRET} bytes")));
                }
                Key {
                    alg: Algorithm::HS256,
                    decoding: DecodingKey::from_secret(&secret).map_err(|e| err(name.clone(), e.to_string()))?,
                    encoding: Some(EncodingKey::from_secret(&secret).map_err(|e| err(name, e.to_string()))?),
                    fingerprint: Key::fingerprint_of(&secret),
                }
            }
            KeyAlg::EdDsa => {
                let public = k.public_key_file.as_ref().ok_or_else(|| err(at("public_key_file"), "missing".into()))?;
                let pem = std::fs::read(public)
                    .map_err(|e| err(at("public_key_file"), format!("cannot read {}: {e}", public.display())))?;
                let decoding = DecodingKey::from_ed_pem(&pem)
                    .map_err(|e| err(at("public_key_file"), format!("expected an Ed25519 public key PEM: {e}")))?;
                let encoding = match &k.private_key_file {
                    Some(p) => {
                        let pem = std::fs::read(p)
                            .map_err(|e| err(at("private_key_file"), format!("cannot read {}: {e}", p.display())))?;
                        Some(EncodingKey::from_ed_pem(&pem).map_err(|e| {
                            err(at("private_key_file"), format!("expected an Ed25519 private key PEM: {e}"))
                        })?)
                    }
                    None => None,
                };
                // The two halves must be one pair, or `token mint` issues tokens that
                // this very key refuses.
                if let Some(encoding) = &encoding {
                    let probe = b"egress-gateway key pair probe";
                    let pair = jsonwebtoken::crypto::sign(probe, encoding, Algorithm::EdDSA)
                        .and_then(|sig| jsonwebtoken::crypto::verify(&sig, probe, &decoding, Algorithm::EdDSA));
                    if !matches!(pair, Ok(true)) {
                        return Err(err(
                            at("private_key_file"),
                            "expected the private half of public_key_file: a token it signs does not verify".into(),
                        ));
                    }
                }
                Key { alg: Algorithm::EdDSA, decoding, encoding, fingerprint: Key::fingerprint_of(&pem) }
            }
        };
        keys.insert(k.kid.clone(), key);
    }
    let mut revoked = HashSet::new();
    if let Some(p) = &t.revocation_file {
        let text = std::fs::read_to_string(p)
            .map_err(|e| err("tokens.revocation_file".into(), format!("cannot read {}: {e}", p.display())))?;
        revoked.extend(
            text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).map(String::from),
        );
    }
    Ok(Verifier::new(keys, t.max_ttl, t.leeway, revoked))
}

/// Reads every API route's injected secret (`routes[].inject`), so secrets rotate
/// with a reload.
/// Reads a secret from its file or environment variable; `key` is where it is
/// configured (`routes[0].inject.secret`, `secrets[1].value`).
fn read_secret(config: &Config, key: &str, source: &SecretSource) -> Result<String, ConfigError> {
    match source {
        SecretSource::File(p) => std::fs::read_to_string(p).map_err(|e| {
            ConfigError::invalid(&config.file, format!("{key}_file"), format!("cannot read {}: {e}", p.display()))
        }),
        SecretSource::Env(v) => std::env::var(v).map_err(|_| {
            ConfigError::invalid(&config.file, format!("{key}_env"), format!("environment variable {v} is not set"))
        }),
    }
}

/// The values of the placeholder secrets (`[[secrets]]`), by name.
pub fn load_placeholder_secrets(config: &Config) -> Result<HashMap<String, Secret>, ConfigError> {
    let mut out = HashMap::new();
    for (i, s) in config.secrets.iter().enumerate() {
        let value = read_secret(config, &format!("secrets[{i}].value"), &s.source)?;
        let value = value.trim();
        // A value holding a placeholder would be substituted again on the next pass.
        if value.is_empty() || value.contains(crate::config::PLACEHOLDER_PREFIX) || value.contains(['\r', '\n']) {
            return Err(ConfigError::invalid(
                &config.file,
                format!("secrets[{i}].value"),
                "expected a non-empty one-line value",
            ));
        }
        out.insert(s.name.clone(), Secret::new(value));
    }
    Ok(out)
}

pub fn load_route_secrets(config: &Config) -> Result<HashMap<String, Secret>, ConfigError> {
    let mut out = HashMap::new();
    for (i, r) in config.routes.iter().enumerate() {
        let value = read_secret(config, &format!("routes[{i}].inject.secret"), &r.secret)?;
        let value = value.trim();
        if value.is_empty() || http::HeaderValue::from_str(&format!("{}{value}", r.prefix)).is_err() {
            return Err(ConfigError::invalid(
                &config.file,
                format!("routes[{i}].inject"),
                "expected a non-empty secret usable in a header",
            ));
        }
        out.insert(r.name.clone(), Secret::new(value));
    }
    Ok(out)
}
