//! Signed sandbox tokens (JWT), verified locally so any instance of a fleet can
//! authenticate any sandbox without shared state.
//!
//! Keys are looked up by the header's `kid`; each key fixes its algorithm (HS256 or
//! EdDSA), so a token cannot choose a weaker one and `alg: none` never verifies. Claims:
//! `sub` (sandbox id, must equal the Basic user), `pol` (policy name), `exp`
//! (required), `iat` or `nbf` (one required), `jti`, and optional `repos` that narrow
//! the policy's git repositories. `exp - iat` (else `exp - nbf`) may not exceed
//! `tokens.max_ttl`. A revocation list of
//! sandbox ids and `jti`s is reloaded with the policies.
//!
//! A token whose signature verified is remembered, by the SHA-256 of the token, for
//! the rest of its generation: later requests with it only repeat the claim checks
//! (time, subject, revocation), not the signature (an EdDSA check costs about 40 µs,
//! half of a whole CONNECT setup's CPU). Refused tokens are never remembered, and a
//! reload builds a new verifier with an empty memory.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub sub: String,
    pub pol: String,
    pub exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repos: Option<Vec<String>>,
}

/// Why a signed token was refused. `Expired` maps to `token_expired`, the rest to
/// `auth_invalid`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a well-formed signed token")]
    Malformed,
    #[error("unknown key id")]
    UnknownKey,
    #[error("algorithm does not match the key")]
    WrongAlgorithm,
    #[error("signature does not verify")]
    BadSignature,
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet")]
    NotYetValid,
    #[error("token lifetime exceeds tokens.max_ttl")]
    TtlTooLong,
    #[error("token subject does not match the sandbox id")]
    WrongSubject,
    #[error("token has been revoked")]
    Revoked,
    #[error("invalid claims: {0}")]
    Claims(String),
}

impl TokenError {
    /// True for refusals that depend only on the token and this generation's keys, not
    /// on the time, the presenting user or the revocation list.
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            TokenError::Malformed
                | TokenError::UnknownKey
                | TokenError::WrongAlgorithm
                | TokenError::BadSignature
                | TokenError::Claims(_)
        )
    }
}

/// A verification key (and, where the instance holds it, a signing key).
pub struct Key {
    pub alg: Algorithm,
    pub decoding: DecodingKey,
    pub encoding: Option<EncodingKey>,
    /// SHA-256 of the verification key material: a key replaced under the same `kid`
    /// ends the connections its predecessor authenticated.
    pub fingerprint: [u8; 32],
}

impl Key {
    /// The fingerprint of verification key material (a secret, or a public key PEM).
    pub fn fingerprint_of(material: &[u8]) -> [u8; 32] {
        Sha256::digest(material).into()
    }
}

/// Most tokens remembered at once; when full, expired ones are dropped first, then all.
const VERIFIED_MAX: usize = 10_000;

/// Everything needed to verify signed tokens at one policy generation.
#[derive(Default)]
pub struct Verifier {
    keys: HashMap<String, Key>,
    max_ttl: Duration,
    leeway: Duration,
    revoked: HashSet<String>,
    /// Claims (and the key id) of tokens whose signature verified, by SHA-256 of the
    /// token.
    verified: Mutex<HashMap<[u8; 32], (String, Claims)>>,
    /// Tokens refused for what cannot change (their signature, key, form or claims), by
    /// SHA-256 of the token: a replayed forgery does not buy a signature check each
    /// time. Bounded; cleared when full.
    refused: Mutex<HashMap<[u8; 32], TokenError>>,
}

impl Verifier {
    pub fn new(keys: HashMap<String, Key>, max_ttl: Duration, leeway: Duration, revoked: HashSet<String>) -> Self {
        Verifier { keys, max_ttl, leeway, revoked, verified: Mutex::default(), refused: Mutex::default() }
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (String, Claims)>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn has_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// True when a sandbox id or token id is on the revocation list.
    pub fn is_revoked(&self, id: &str) -> bool {
        self.revoked.contains(id)
    }

    /// The fingerprint of the key with id `kid`, if one is configured: a removed or
    /// replaced key ends what its predecessor authenticated.
    pub fn key_fingerprint(&self, kid: &str) -> Option<[u8; 32]> {
        self.keys.get(kid).map(|k| k.fingerprint)
    }

    /// Verifies `token` presented by Basic user `user` at unix time `now`.
    pub fn verify(&self, token: &str, user: &str, now: u64) -> Result<Claims, TokenError> {
        self.verify_keyed(token, user, now).map(|(_, c)| c)
    }

    /// [`Verifier::verify`], also returning the id of the key that signed the token.
    pub fn verify_keyed(&self, token: &str, user: &str, now: u64) -> Result<(String, Claims), TokenError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let known = self.verified().get(&digest).cloned();
        if let Some((kid, c)) = known {
            self.check_claims(&c, user, now)?;
            return Ok((kid, c));
        }
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner()).get(&digest).cloned();
        if let Some(e) = refused {
            return Err(e);
        }
        let (kid, c) = match self.verify_signed(token, user, now) {
            Ok(ok) => ok,
            Err(e) => {
                if e.is_permanent() {
                    let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                    if refused.len() >= VERIFIED_MAX {
                        refused.clear();
                    }
                    refused.insert(digest, e.clone());
                }
                return Err(e);
            }
        };
        let mut verified = self.verified();
        if verified.len() >= VERIFIED_MAX {
            verified.retain(|_, (_, c)| !self.expired(c, now));
            if verified.len() >= VERIFIED_MAX {
                verified.clear();
            }
        }
        verified.insert(digest, (kid.clone(), c.clone()));
        Ok((kid, c))
    }

    /// Past `exp`, allowing for `tokens.leeway`.
    fn expired(&self, c: &Claims, now: u64) -> bool {
        c.exp.saturating_add(self.leeway.as_secs()) < now
    }

    /// The full check: header, key, signature, then the claims.
    fn verify_signed(&self, token: &str, user: &str, now: u64) -> Result<(String, Claims), TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let kid = header.kid.as_deref().ok_or(TokenError::UnknownKey)?;
        let key = self.keys.get(kid).ok_or(TokenError::UnknownKey)?;
        if header.alg != key.alg {
            return Err(TokenError::WrongAlgorithm);
        }
        let mut validation = Validation::new(key.alg);
        validation.leeway = self.leeway.as_secs();
        validation.validate_nbf = true;
        validation.validate_exp = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        let data = jsonwebtoken::decode::<Claims>(token, &key.decoding, &validation).map_err(|e| match e.kind() {
            ErrorKind::ExpiredSignature => TokenError::Expired,
            ErrorKind::ImmatureSignature => TokenError::NotYetValid,
            ErrorKind::InvalidSignature => TokenError::BadSignature,
            ErrorKind::InvalidAlgorithm => TokenError::WrongAlgorithm,
            ErrorKind::MissingRequiredClaim(c) | ErrorKind::InvalidClaimFormat(c) => TokenError::Claims(c.clone()),
            ErrorKind::Json(e) => TokenError::Claims(e.to_string()),
            _ => TokenError::Malformed,
        })?;
        let c = data.claims;
        self.check_claims(&c, user, now)?;
        Ok((kid.to_string(), c))
    }

    /// The checks that depend on time, the presenting user and the revocation list:
    /// repeated on every use of a token, remembered or not.
    fn check_claims(&self, c: &Claims, user: &str, now: u64) -> Result<(), TokenError> {
        // The library checks exp and nbf against its own clock; check against ours too
        // so that callers (and tests) control time.
        let leeway = self.leeway.as_secs();
        if self.expired(c, now) {
            return Err(TokenError::Expired);
        }
        if c.nbf.is_some_and(|nbf| nbf > now.saturating_add(leeway)) {
            return Err(TokenError::NotYetValid);
        }
        // The lifetime is counted from `iat` (or `nbf`): a token with neither could be
        // signed for years and pass in its last `max_ttl`.
        let issued = c.iat.or(c.nbf).ok_or_else(|| {
            TokenError::Claims("iat (or nbf) is required: a token's lifetime is held to tokens.max_ttl".into())
        })?;
        if issued > now.saturating_add(leeway) {
            return Err(TokenError::NotYetValid);
        }
        if c.exp.saturating_sub(issued) > self.max_ttl.as_secs().saturating_add(leeway) {
            return Err(TokenError::TtlTooLong);
        }
        if c.sub != user {
            return Err(TokenError::WrongSubject);
        }
        // The same characters as a listed sandbox id: a subject must never read as a
        // label (`team-a/db`) that peer rules match.
        let id_like = !c.sub.is_empty()
            && c.sub.len() <= 128
            && c.sub.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !id_like {
            return Err(TokenError::Claims("sub must be a sandbox id: letters, digits, '.', '_', '-'".into()));
        }
        if self.revoked.contains(&c.sub) || c.jti.as_ref().is_some_and(|j| self.revoked.contains(j)) {
            return Err(TokenError::Revoked);
        }
        Ok(())
    }

    /// Signs `claims` with key `kid` (which must hold a signing key).
    pub fn mint(&self, kid: &str, claims: &Claims) -> Result<String, String> {
        let key = self.keys.get(kid).ok_or_else(|| format!("no key with kid {kid:?} in [tokens]"))?;
        let encoding = key
            .encoding
            .as_ref()
            .ok_or_else(|| format!("key {kid:?} has no signing key here (EdDSA needs private_key_file)"))?;
        let mut header = Header::new(key.alg);
        header.kid = Some(kid.to_string());
        jsonwebtoken::encode(&header, claims, encoding).map_err(|e| e.to_string())
    }
}

/// True when a Basic password looks like a JWT rather than a static token.
pub fn looks_signed(secret: &str) -> bool {
    secret.starts_with("eyJ") && secret.matches('.').count() == 2
}

/// Current unix time in seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> Verifier {
        let secret = b"0123456789abcdef0123456789abcdef";
        let mut keys = HashMap::new();
        keys.insert(
            "k1".to_string(),
            Key {
                alg: Algorithm::HS256,
                decoding: DecodingKey::from_secret(secret).unwrap(),
                encoding: Some(EncodingKey::from_secret(secret).unwrap()),
                fingerprint: Key::fingerprint_of(secret),
            },
        );
        let revoked = ["sbx-revoked".to_string(), "jti-revoked".to_string()].into_iter().collect();
        Verifier::new(keys, Duration::from_secs(3600), Duration::from_secs(30), revoked)
    }

    fn claims(sub: &str, iat: u64, exp: u64) -> Claims {
        Claims { sub: sub.into(), pol: "p".into(), exp, iat: Some(iat), nbf: None, jti: None, repos: None }
    }

    #[test]
    fn verifies_and_rejects() {
        let v = verifier();
        let t0 = now();
        let ok = v.mint("k1", &claims("sbx-1", t0, t0 + 600)).unwrap();
        assert!(looks_signed(&ok));
        assert_eq!(v.verify(&ok, "sbx-1", t0).unwrap().pol, "p");
        assert_eq!(v.verify(&ok, "sbx-2", t0), Err(TokenError::WrongSubject));
        assert_eq!(v.verify(&ok, "sbx-1", t0 + 700), Err(TokenError::Expired));
        let long = v.mint("k1", &claims("sbx-1", t0, t0 + 7200)).unwrap();
        assert_eq!(v.verify(&long, "sbx-1", t0), Err(TokenError::TtlTooLong));
        let revoked = v.mint("k1", &claims("sbx-revoked", t0, t0 + 60)).unwrap();
        assert_eq!(v.verify(&revoked, "sbx-revoked", t0), Err(TokenError::Revoked));
        let mut c = claims("sbx-1", t0, t0 + 60);
        c.jti = Some("jti-revoked".into());
        assert_eq!(v.verify(&v.mint("k1", &c).unwrap(), "sbx-1", t0), Err(TokenError::Revoked));
        let future = v.mint("k1", &claims("sbx-1", t0 + 600, t0 + 900)).unwrap();
        assert_eq!(v.verify(&future, "sbx-1", t0), Err(TokenError::NotYetValid));
        // Without iat or nbf a lifetime cannot be held to max_ttl: refused, even in
        // what would be its last hour.
        let mut ageless = claims("sbx-1", t0, t0 + 600);
        ageless.iat = None;
        let ageless = v.mint("k1", &ageless).unwrap();
        assert!(matches!(v.verify(&ageless, "sbx-1", t0), Err(TokenError::Claims(_))));
        let mut from_nbf = claims("sbx-1", t0, t0 + 600);
        (from_nbf.iat, from_nbf.nbf) = (None, Some(t0));
        assert!(v.verify(&v.mint("k1", &from_nbf).unwrap(), "sbx-1", t0).is_ok());
        // A subject that reads as a label (peer rules match ids and labels) is refused.
        let label_like = v.mint("k1", &claims("team-a/runner", t0, t0 + 60)).unwrap();
        assert!(matches!(v.verify(&label_like, "team-a/runner", t0), Err(TokenError::Claims(_))));
    }

    #[test]
    fn verified_tokens_are_remembered_within_bounds_and_still_checked() {
        let v = verifier();
        let t0 = now();
        let ok = v.mint("k1", &claims("sbx-1", t0, t0 + 600)).unwrap();
        assert!(v.verify(&ok, "sbx-1", t0).is_ok());
        assert_eq!(v.verified().len(), 1);
        // Refusals are not remembered; a remembered token is still checked each time.
        let revoked = v.mint("k1", &claims("sbx-revoked", t0, t0 + 60)).unwrap();
        assert_eq!(v.verify(&revoked, "sbx-revoked", t0), Err(TokenError::Revoked));
        assert_eq!(v.verify("eyJnot.a.token", "sbx-1", t0), Err(TokenError::Malformed));
        assert_eq!(v.verified().len(), 1);
        assert_eq!(v.verify(&ok, "sbx-2", t0), Err(TokenError::WrongSubject));
        assert_eq!(v.verify(&ok, "sbx-1", t0 + 700), Err(TokenError::Expired));

        // Full: expired tokens make room first.
        for i in 1..VERIFIED_MAX {
            let mut c = claims("sbx-1", t0, if i % 2 == 0 { t0 + 60 } else { t0 + 600 });
            c.jti = Some(format!("j{i}"));
            assert!(v.verify(&v.mint("k1", &c).unwrap(), "sbx-1", t0).is_ok());
        }
        assert_eq!(v.verified().len(), VERIFIED_MAX);
        let later = t0 + 120;
        let fresh = v.mint("k1", &claims("sbx-1", later, later + 600)).unwrap();
        assert!(v.verify(&fresh, "sbx-1", later).is_ok());
        // Left: the first token, the half of the others still valid, and the new one.
        assert_eq!(v.verified().len(), 1 + VERIFIED_MAX / 2 + 1, "the expired half was dropped");
    }

    #[test]
    fn forged_tokens_are_remembered_as_refused() {
        let v = verifier();
        let t0 = now();
        let ok = v.mint("k1", &claims("sbx-1", t0, t0 + 600)).unwrap();
        let parts: Vec<&str> = ok.split('.').collect();
        use base64::Engine;
        let other = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!(r#"{{"sub":"sbx-1","pol":"admin","exp":{}}}"#, t0 + 600));
        let forged = format!("{}.{other}.{}", parts[0], parts[2]);
        assert_eq!(v.verify(&forged, "sbx-1", t0), Err(TokenError::BadSignature));
        assert_eq!(v.refused.lock().unwrap().len(), 1, "a bad signature is remembered");
        assert_eq!(v.verify(&forged, "sbx-1", t0), Err(TokenError::BadSignature));
        // Refusals that depend on time or the presenting user are not remembered.
        assert_eq!(v.verify(&ok, "sbx-1", t0 + 700), Err(TokenError::Expired));
        assert_eq!(v.refused.lock().unwrap().len(), 1);
        assert!(v.verify(&ok, "sbx-1", t0).is_ok());
    }

    #[test]
    fn alg_none_and_tampering_are_rejected() {
        let v = verifier();
        let t0 = now();
        let ok = v.mint("k1", &claims("sbx-1", t0, t0 + 600)).unwrap();
        let parts: Vec<&str> = ok.split('.').collect();
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let none_header = b64.encode(r#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
        assert!(v.verify(&format!("{none_header}.{}.", parts[1]), "sbx-1", t0).is_err());
        let other = b64.encode(format!(r#"{{"sub":"sbx-1","pol":"admin","exp":{}}}"#, t0 + 600));
        assert_eq!(v.verify(&format!("{}.{other}.{}", parts[0], parts[2]), "sbx-1", t0), Err(TokenError::BadSignature));
        let unknown = b64.encode(r#"{"alg":"HS256","typ":"JWT","kid":"k9"}"#);
        assert_eq!(v.verify(&format!("{unknown}.{}.{}", parts[1], parts[2]), "sbx-1", t0), Err(TokenError::UnknownKey));
        let hs384 = b64.encode(r#"{"alg":"HS384","typ":"JWT","kid":"k1"}"#);
        assert_eq!(
            v.verify(&format!("{hs384}.{}.{}", parts[1], parts[2]), "sbx-1", t0),
            Err(TokenError::WrongAlgorithm)
        );
        assert_eq!(v.verify("eyJnot.a.token", "sbx-1", t0), Err(TokenError::Malformed));
    }
}
