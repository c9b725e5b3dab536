//! Credentials -> sandbox identity.
//!
//! Sandboxes send `Basic base64(SANDBOX_ID:TOKEN)`. A static token is checked by
//! comparing its SHA-256 with the one listed for that sandbox, in constant time.
//! (Signed tokens slot in as a second branch of [`authenticate`].) The token itself is never
//! stored, logged or echoed: [`Credentials`] redacts it in `Debug`.

use std::fmt;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use std::sync::Arc;

use crate::policy::{DenyReason, Policy, PolicySet};
use crate::tokens::{self, TokenError, Verifier};

/// Longest `Authorization` value accepted; real ones are far shorter.
const MAX_HEADER_LEN: usize = 4096;

pub struct Credentials {
    pub user: String,
    secret: String,
}

impl Credentials {
    pub fn new(user: &str, secret: &str) -> Self {
        Credentials { user: user.to_string(), secret: secret.to_string() }
    }

    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).field("secret", &"<redacted>").finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials")]
    Missing,
    #[error("malformed credentials")]
    Malformed,
    #[error("unknown sandbox or wrong token")]
    Invalid,
    #[error("signed token refused: {0}")]
    Token(TokenError),
    #[error("credentials are bound to another VPC endpoint")]
    WrongNetwork,
    #[error("the client certificate does not name this sandbox")]
    WrongCertificate,
}

impl AuthError {
    pub fn reason(&self) -> DenyReason {
        match self {
            AuthError::Missing => DenyReason::AuthRequired,
            AuthError::Token(TokenError::Expired) => DenyReason::TokenExpired,
            AuthError::Malformed
            | AuthError::Invalid
            | AuthError::Token(_)
            | AuthError::WrongNetwork
            | AuthError::WrongCertificate => DenyReason::AuthInvalid,
        }
    }
}

/// Parses a `Basic` credentials header value.
pub fn parse_basic(value: &[u8]) -> Result<Credentials, AuthError> {
    if value.len() > MAX_HEADER_LEN {
        return Err(AuthError::Malformed);
    }
    let value = std::str::from_utf8(value).map_err(|_| AuthError::Malformed)?.trim();
    let (scheme, payload) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AuthError::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(payload.trim()).map_err(|_| AuthError::Malformed)?;
    let decoded = String::from_utf8(decoded).map_err(|_| AuthError::Malformed)?;
    let (user, secret) = decoded.split_once(':').ok_or(AuthError::Malformed)?;
    if user.is_empty() || secret.is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(Credentials::new(user, secret))
}

/// SHA-256 of a token, as listed in policy files (`token_sha256`).
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Who is asking: the sandbox, the policy that governs it, and what its credentials
/// narrow or bind.
#[derive(Debug, Clone)]
pub struct Identity {
    pub sandbox: String,
    pub policy: Arc<Policy>,
    /// A signed token's `repos` claim: narrows the policy's git repositories.
    pub repos: Option<Vec<String>>,
    /// VPC endpoint ids the sandbox must come through (empty: any).
    pub vpce: Vec<String>,
    pub signed: bool,
}

/// Checks credentials: a signed token (when keys are configured and the password is a
/// JWT) or a static token listed by SHA-256. `now` is unix time in seconds.
pub fn authenticate(
    set: &PolicySet,
    verifier: &Verifier,
    creds: &Credentials,
    now: u64,
) -> Result<Identity, AuthError> {
    if verifier.has_keys() && tokens::looks_signed(creds.secret()) {
        let claims = verifier.verify(creds.secret(), &creds.user, now).map_err(AuthError::Token)?;
        let policy = set
            .policies
            .get(&claims.pol)
            .cloned()
            .ok_or(AuthError::Token(TokenError::Claims("pol names no policy".into())))?;
        let vpce = policy.vpce().to_vec();
        return Ok(Identity { sandbox: claims.sub, policy, repos: claims.repos, vpce, signed: true });
    }
    let presented = token_sha256(creds.secret());
    match set.sandbox(&creds.user) {
        Some(sbx) if bool::from(presented.ct_eq(&sbx.token_sha256)) => {
            if verifier.is_revoked(&sbx.id) {
                return Err(AuthError::Token(TokenError::Revoked));
            }
            let vpce = if sbx.vpce.is_empty() { sbx.policy.vpce().to_vec() } else { sbx.vpce.clone() };
            Ok(Identity { sandbox: sbx.id.clone(), policy: sbx.policy.clone(), repos: None, vpce, signed: false })
        }
        Some(_) => Err(AuthError::Invalid),
        None => {
            // Same work as a known sandbox, so timing does not reveal which ids exist.
            let _ = presented.ct_eq(&[0u8; 32]);
            Err(AuthError::Invalid)
        }
    }
}

/// Checks an optional header value: missing, malformed or wrong all map to a reason.
pub fn authenticate_header(
    set: &PolicySet,
    verifier: &Verifier,
    value: Option<&[u8]>,
    now: u64,
) -> Result<Identity, AuthError> {
    let creds = parse_basic(value.ok_or(AuthError::Missing)?)?;
    authenticate(set, verifier, &creds, now)
}

/// A fresh random token (URL-safe, 256 bits) for the demo and `token` CLI.
pub fn generate_token() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s))
    }

    #[test]
    fn parses_basic() {
        let c = parse_basic(b64("sbx-1:tok:with:colons").as_bytes()).unwrap();
        assert_eq!(c.user, "sbx-1");
        assert_eq!(c.secret(), "tok:with:colons");
        assert!(!format!("{c:?}").contains("tok"));
        for bad in ["Bearer abc", "Basic !!!", "Basic", &b64("nocolon"), &b64(":x"), &b64("x:")] {
            assert!(parse_basic(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_basic(&vec![b'a'; 5000]).is_err());
    }

    #[test]
    fn hash_matches_the_documented_example() {
        assert_eq!(
            hex::encode(token_sha256("test")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
