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

/// Decoded credentials up to this many bytes (a sandbox id with a static token, or a
/// signed token of a few claims) are kept on the stack: no allocation per request.
const INLINE_CREDENTIALS: usize = 384;

/// A presented `user:secret` pair, kept as one UTF-8 string: inline up to
/// [`INLINE_CREDENTIALS`] bytes, on the heap beyond. Its text is checked to be UTF-8
/// once, when it is made: reading the user or the secret checks nothing again (each
/// check of the whole pair cost a CONNECT setup about 140 instructions, seven times).
pub struct Credentials {
    pair: Pair,
    /// Where the separating `:` is.
    colon: usize,
}

#[allow(clippy::large_enum_variant, reason = "inline is the point: no allocation per CONNECT")]
enum Pair {
    Inline(arrayvec::ArrayString<INLINE_CREDENTIALS>),
    Heap(String),
}

impl Pair {
    fn of(text: &str) -> Pair {
        arrayvec::ArrayString::from(text).map_or_else(|_| Pair::Heap(text.to_owned()), Pair::Inline)
    }
}

impl Credentials {
    pub fn new(user: &str, secret: &str) -> Self {
        let mut joined = String::with_capacity(user.len() + 1 + secret.len());
        joined.push_str(user);
        joined.push(':');
        joined.push_str(secret);
        Credentials { pair: Pair::of(&joined), colon: user.len() }
    }

    /// `user:secret` already joined (a decoded `Basic` value), split at its first `:`;
    /// `None` without a `:`. Bytes that are not UTF-8 are read as ISO-8859-1, the
    /// encoding Python's `requests` and `aiohttp` give Basic credentials (RFC 7617's
    /// default before its `charset` parameter), so a token with `é` works from them too.
    fn joined(bytes: &[u8]) -> Option<Self> {
        let pair = match std::str::from_utf8(bytes) {
            Ok(text) => Pair::of(text),
            Err(_) => Pair::Heap(bytes.iter().map(|&b| char::from(b)).collect()),
        };
        let colon = Self::text_of(&pair).find(':')?;
        Some(Credentials { pair, colon })
    }

    fn text_of(pair: &Pair) -> &str {
        match pair {
            Pair::Inline(s) => s,
            Pair::Heap(s) => s,
        }
    }

    fn text(&self) -> &str {
        Self::text_of(&self.pair)
    }

    /// The decoded `id:token`, as one value.
    pub fn as_bytes(&self) -> &[u8] {
        self.text().as_bytes()
    }

    pub fn user(&self) -> &str {
        self.text().get(..self.colon).unwrap_or_default()
    }

    pub fn secret(&self) -> &str {
        self.text().get(self.colon + 1..).unwrap_or_default()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user()).field("secret", &"<redacted>").finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials")]
    Missing,
    #[error("malformed credentials")]
    Malformed,
    /// Credentials of another scheme than `Basic` (NTLM, Negotiate, Digest, Bearer): its
    /// name when it is a short token, never any of what follows it.
    #[error("proxy credentials of the {0} scheme; the gateway takes Basic only")]
    Scheme(String),
    #[error("unknown sandbox or wrong token")]
    Invalid,
    #[error("signed token refused: {0}")]
    Token(TokenError),
    #[error("credentials are bound to another VPC endpoint")]
    WrongNetwork,
    #[error("the client certificate does not name this sandbox")]
    WrongCertificate,
    #[error("too many failed authentications from this address; retry in a second")]
    TooManyFailures,
    #[error("no sandbox claims this client address (sandboxes[].addresses)")]
    UnknownAddress,
}

impl AuthError {
    pub fn reason(&self) -> DenyReason {
        match self {
            AuthError::Missing | AuthError::UnknownAddress => DenyReason::AuthRequired,
            AuthError::Token(TokenError::Expired) => DenyReason::TokenExpired,
            AuthError::TooManyFailures => DenyReason::LimitExceeded,
            AuthError::Malformed
            | AuthError::Scheme(_)
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
    let (scheme, payload) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(other_scheme(scheme));
    }
    let payload = payload.trim();
    let mut decoded: smallvec::SmallVec<[u8; INLINE_CREDENTIALS]> =
        smallvec::smallvec![0u8; base64::decoded_len_estimate(payload.len())];
    let len = base64::engine::general_purpose::STANDARD
        .decode_slice(payload, &mut decoded)
        .map_err(|_| AuthError::Malformed)?;
    decoded.truncate(len);
    let creds = Credentials::joined(&decoded).ok_or(AuthError::Malformed)?;
    if creds.user().is_empty() || creds.secret().is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(creds)
}

/// The refusal of credentials in `scheme`: named when it is a scheme clients send
/// (IANA's registry, and NTLM and Kerberos), never otherwise, since a client that sent
/// a bare token where the scheme belongs must not see its token echoed.
fn other_scheme(scheme: &str) -> AuthError {
    const KNOWN: [&str; 16] = [
        "Bearer",
        "Digest",
        "DPoP",
        "GNAP",
        "HOBA",
        "Mutual",
        "Negotiate",
        "NTLM",
        "Kerberos",
        "OAuth",
        "PrivateToken",
        "SCRAM-SHA-1",
        "SCRAM-SHA-256",
        "vapid",
        "AWS4-HMAC-SHA256",
        "Token",
    ];
    let named = KNOWN.iter().find(|k| k.eq_ignore_ascii_case(scheme));
    AuthError::Scheme(named.map_or("an unknown", |k| k).to_string())
}

/// SHA-256 of a token, as listed in policy files (`token_sha256`).
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Who is asking: the sandbox, the policy that governs it, and what its credentials
/// narrow or bind.
#[derive(Debug, Clone)]
pub struct Identity {
    pub sandbox: std::sync::Arc<str>,
    pub policy: Arc<Policy>,
    /// A signed token's `repos` claim: narrows the policy's git repositories.
    pub repos: Option<Vec<String>>,
    /// VPC endpoint ids the sandbox must come through (empty: any).
    pub vpce: Vec<String>,
    /// What authenticated it: a reload or an expiry sweep ends every connection whose
    /// credential the new state refuses.
    pub credential: Credential,
}

/// The credential a connection was authenticated with, as far as a later state must
/// judge it: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A static token: rotated when the sandbox's `token_sha256` changes.
    Static { token_sha256: [u8; 32] },
    /// A signed token: revoked by its `jti` or sandbox id, ended by removing or
    /// replacing its key (`kid`, and the key's fingerprint) and by its expiry.
    Signed { kid: String, key: [u8; 32], jti: Option<String>, expires: u64 },
    /// No token: the source address the sandbox claims (`sandboxes[].addresses`), or,
    /// with `None`, the one sandbox a sidecar instance serves (`transparent.sandbox`).
    /// Ended when the claim (or the sandbox) is gone.
    Network { addr: Option<std::net::IpAddr> },
}

impl Identity {
    pub fn signed(&self) -> bool {
        matches!(self.credential, Credential::Signed { .. })
    }
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
        let (kid, claims) = verifier.verify_keyed(creds.secret(), creds.user(), now).map_err(AuthError::Token)?;
        let policy = set
            .policies
            .get(&claims.pol)
            .cloned()
            .ok_or(AuthError::Token(TokenError::Claims("pol names no policy".into())))?;
        let vpce = set.vpce_binding(&claims.sub, &policy).to_vec();
        let key = verifier.key_fingerprint(&kid).unwrap_or_default();
        let credential = Credential::Signed { kid, key, jti: claims.jti, expires: claims.exp };
        return Ok(Identity { sandbox: claims.sub.into(), policy, repos: claims.repos, vpce, credential });
    }
    let presented = token_sha256(creds.secret());
    match set.sandbox(creds.user()) {
        Some(sbx) if bool::from(presented.ct_eq(&sbx.token_sha256)) => {
            if verifier.is_revoked(&sbx.id) {
                return Err(AuthError::Token(TokenError::Revoked));
            }
            let vpce = sbx.vpce_under(&sbx.policy).to_vec();
            let credential = Credential::Static { token_sha256: sbx.token_sha256 };
            Ok(Identity { sandbox: sbx.id.clone(), policy: sbx.policy.clone(), repos: None, vpce, credential })
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
        assert_eq!(c.user(), "sbx-1");
        assert_eq!(c.secret(), "tok:with:colons");
        assert!(!format!("{c:?}").contains("tok"));
        for bad in ["Bearer abc", "Basic !!!", "Basic", &b64("nocolon"), &b64(":x"), &b64("x:")] {
            assert!(parse_basic(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_basic(&vec![b'a'; 5000]).is_err());
    }

    /// `requests` and `aiohttp` encode Basic credentials as ISO-8859-1; curl, Go and
    /// urllib as UTF-8. Both name the same token.
    #[test]
    fn basic_credentials_in_iso_8859_1_are_read_as_such() {
        let engine = base64::engine::general_purpose::STANDARD;
        let utf8 = parse_basic(b64("sbx-u:tokén-ü").as_bytes()).unwrap();
        let latin1: Vec<u8> = "sbx-u:tokén-ü".chars().map(|c| u8::try_from(u32::from(c)).unwrap()).collect();
        let latin1 = parse_basic(format!("Basic {}", engine.encode(&latin1)).as_bytes()).unwrap();
        assert_eq!((latin1.user(), latin1.secret()), ("sbx-u", "tokén-ü"));
        assert_eq!((utf8.user(), utf8.secret()), (latin1.user(), latin1.secret()));
    }

    /// Another scheme is named in the refusal, as long as it looks like a scheme; a bare
    /// token where the scheme belongs is never echoed.
    #[test]
    fn another_scheme_is_named_never_a_token() {
        for (value, named) in [
            ("NTLM TlRMTVNTUAABAAAAB4IIogAAAAAAAAAAAAAAAAAAAAAKAGFKAAAADw==", "NTLM"),
            ("Negotiate YIIF", "Negotiate"),
            ("Bearer sbx-1:secret-token-value", "Bearer"),
            ("Digest username=\"x\"", "Digest"),
            ("secret-token-value-that-is-long", "an unknown"),
            ("tokenA-secret-01", "an unknown"),
            ("0123456789abcdef rest", "an unknown"),
            ("ntlm TlRM", "NTLM"),
        ] {
            let e = parse_basic(value.as_bytes()).map(|_| ()).unwrap_err();
            assert_eq!(e, AuthError::Scheme(named.to_string()), "{value}");
            assert!(!e.to_string().contains("secret"), "{e}");
            assert_eq!(e.reason(), DenyReason::AuthInvalid);
        }
    }

    #[test]
    fn signed_tokens_keep_a_listed_sandboxs_vpce_binding() {
        use crate::policy::{Mode, Sandbox};
        let secret = b"0123456789abcdef0123456789abcdef";
        let mut keys = std::collections::HashMap::new();
        keys.insert(
            "k1".to_string(),
            tokens::Key {
                alg: jsonwebtoken::Algorithm::HS256,
                decoding: jsonwebtoken::DecodingKey::from_secret(secret).unwrap(),
                encoding: Some(jsonwebtoken::EncodingKey::from_secret(secret).unwrap()),
                fingerprint: tokens::Key::fingerprint_of(secret),
            },
        );
        let verifier = Verifier::new(
            keys,
            std::time::Duration::from_secs(3600),
            std::time::Duration::from_secs(5),
            Default::default(),
        );
        let policy = Arc::new(Policy::builder("p", Mode::Enforce, &[443]).build());
        let mut set = PolicySet::default();
        set.policies.insert("p".into(), policy.clone());
        set.sandboxes.insert(
            "sbx-1".into(),
            Sandbox {
                id: "sbx-1".into(),
                token_sha256: [0; 32],
                policy,
                vpce: vec!["vpce-1".into()],
                addresses: Vec::new(),
                labels: Vec::new(),
            },
        );
        let now = tokens::now();
        let claims = tokens::Claims {
            sub: "sbx-1".into(),
            pol: "p".into(),
            exp: now + 60,
            iat: Some(now),
            nbf: None,
            jti: Some("j1".into()),
            repos: None,
        };
        let token = verifier.mint("k1", &claims).unwrap();
        let id = authenticate(&set, &verifier, &Credentials::new("sbx-1", &token), now).unwrap();
        assert_eq!(id.vpce, vec!["vpce-1".to_string()], "the sandbox's own binding holds for its signed tokens");
        assert!(matches!(id.credential, Credential::Signed { ref kid, .. } if kid == "k1"));
    }

    #[test]
    fn hash_matches_the_documented_example() {
        assert_eq!(
            hex::encode(token_sha256("test")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
