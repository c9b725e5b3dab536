//! GitHub credentials for the git route: installation tokens minted by a GitHub App
//! (RS256 app JWT, installation looked up per owner, token scoped to the one
//! repository and the permission needed), cached until shortly before expiry with one
//! mint in flight per key; or a static token file per owner. Fails closed. Tokens are
//! never logged: [`Secret`] redacts itself.
//!
//! A sandbox names the repository, so it chooses what is minted: each sandbox may
//! cause at most `github.sandbox_mints_per_minute` mints (a burst of as many, refilled
//! over the minute), and a failed mint is remembered for [`FAILED_FOR`], so that a
//! sandbox asking for repositories that do not exist, or for many that a glob allows,
//! cannot spend the App's API rate limit, which every sandbox shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

use crate::config::GithubConfig;
use crate::https_client::HttpsConnector;

pub use crate::secret::Secret;

#[derive(Debug, thiserror::Error)]
pub enum CredError {
    #[error("no GitHub credential is configured for owner {0:?}")]
    NotConfigured(String),
    #[error("cannot read the token file for owner {0:?}")]
    TokenFile(String),
    #[error("GitHub App: {0}")]
    App(String),
    #[error("this sandbox asked for new GitHub credentials too often; retry in {0} s")]
    TooManyMints(u64),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Permission {
    Read,
    Write,
}

/// A mint's outcome: a token, or why there is none and which sandbox asked
/// (remembered for [`FAILED_FOR`], for that sandbox: another asking for a repository
/// that has come to exist since is not held to one's early failure).
struct Cached {
    token: Result<Secret, (String, String)>,
    refresh_at: SystemTime,
}

/// How long a failed mint is answered from the cache.
const FAILED_FOR: Duration = Duration::from_secs(10);

/// Past this many cached keys, expired ones are dropped as a new one is added.
const CACHE_PRUNE_AT: usize = 4096;

/// A sandbox's mint allowance: a token bucket of `github.sandbox_mints_per_minute`.
struct Bucket {
    tokens: f64,
    at: std::time::Instant,
}

type Slot = Arc<tokio::sync::Mutex<Option<Cached>>>;

pub struct Credentials {
    app: Option<(u64, EncodingKey)>,
    token_files: HashMap<String, std::path::PathBuf>,
    api: http::Uri,
    refresh_before: Duration,
    client: Client<HttpsConnector, Full<Bytes>>,
    tokens: Mutex<HashMap<(String, Permission), Slot>>,
    installations: Mutex<HashMap<String, u64>>,
    /// Mints a sandbox may cause per minute (0: any number).
    mints_per_minute: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Largest API response read.
const MAX_API_BODY: usize = 64 * 1024;

impl Credentials {
    pub fn new(cfg: &GithubConfig, connector: HttpsConnector) -> Result<Self, String> {
        let app = match &cfg.app {
            Some((id, key_file)) => {
                let pem = std::fs::read(key_file)
                    .map_err(|e| format!("github.private_key_file: cannot read {}: {e}", key_file.display()))?;
                let key = EncodingKey::from_rsa_pem(&pem)
                    .map_err(|e| format!("github.private_key_file: expected an RSA private key PEM: {e}"))?;
                Some((*id, key))
            }
            None => None,
        };
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Credentials {
            app,
            token_files: cfg.token_files.clone(),
            api: cfg.api_url.clone(),
            refresh_before: cfg.refresh_before,
            client,
            tokens: Mutex::new(HashMap::new()),
            installations: Mutex::new(HashMap::new()),
            mints_per_minute: cfg.sandbox_mints_per_minute,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// A token for `owner/repo` with `perm`, asked for by `sandbox`. A static token
    /// file for the owner wins; otherwise the App mints (or the cache returns) an
    /// installation token.
    pub async fn token(&self, sandbox: &str, owner: &str, repo: &str, perm: Permission) -> Result<Secret, CredError> {
        let owner_lc = owner.to_ascii_lowercase();
        if let Some(file) = self.token_files.get(&owner_lc) {
            let text = tokio::fs::read_to_string(file).await.map_err(|_| CredError::TokenFile(owner.to_string()))?;
            let token = text.trim();
            if token.is_empty() {
                return Err(CredError::TokenFile(owner.to_string()));
            }
            return Ok(Secret::new(token));
        }
        if self.app.is_none() {
            return Err(CredError::NotConfigured(owner.to_string()));
        }
        let key = (format!("{owner_lc}/{}", repo.to_ascii_lowercase()), perm);
        let slot = {
            let mut tokens = self.tokens.lock().map_err(|_| CredError::App("lock".into()))?;
            if tokens.len() >= CACHE_PRUNE_AT && !tokens.contains_key(&key) {
                let now = SystemTime::now();
                // A slot in use (locked) stays; an empty or expired one goes.
                tokens
                    .retain(|_, slot| slot.try_lock().map_or(true, |c| c.as_ref().is_some_and(|c| now < c.refresh_at)));
            }
            tokens.entry(key).or_default().clone()
        };
        // One mint in flight per (repository, permission): others wait on the slot.
        let mut cached = slot.lock().await;
        if let Some(c) = cached.as_ref()
            && SystemTime::now() < c.refresh_at
        {
            match &c.token {
                Ok(token) => return Ok(token.clone()),
                Err((asked_by, why)) if asked_by == sandbox => return Err(CredError::App(why.clone())),
                Err(_) => {}
            }
        }
        self.take_mint(sandbox)?;
        let (token, refresh_at) = match self.mint(owner, repo, perm).await {
            Ok((token, expires_at)) => {
                (Ok(token), expires_at.checked_sub(self.refresh_before).unwrap_or(SystemTime::UNIX_EPOCH))
            }
            Err(CredError::App(why)) => (Err((sandbox.to_string(), why)), SystemTime::now() + FAILED_FOR),
            Err(e) => return Err(e),
        };
        *cached = Some(Cached { token: token.clone(), refresh_at });
        token.map_err(|(_, why)| CredError::App(why))
    }

    /// Takes one of `sandbox`'s mints, or says when the next is due.
    fn take_mint(&self, sandbox: &str) -> Result<(), CredError> {
        if self.mints_per_minute == 0 {
            return Ok(());
        }
        let burst = f64::from(self.mints_per_minute);
        let per_sec = burst / 60.0;
        let now = std::time::Instant::now();
        let mut buckets = self.buckets.lock().map_err(|_| CredError::App("lock".into()))?;
        let b = buckets.entry(sandbox.to_string()).or_insert(Bucket { tokens: burst, at: now });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec).min(burst);
        b.at = now;
        if b.tokens < 1.0 {
            let wait = ((1.0 - b.tokens) / per_sec).ceil() as u64;
            return Err(CredError::TooManyMints(wait.max(1)));
        }
        b.tokens -= 1.0;
        Ok(())
    }

    fn app_jwt(&self) -> Result<String, CredError> {
        let (id, key) = self.app.as_ref().ok_or_else(|| CredError::App("not configured".into()))?;
        let now = crate::tokens::now();
        // Back-dated a minute for clock skew; GitHub allows at most 10 minutes.
        let claims = serde_json::json!({ "iat": now.saturating_sub(60), "exp": now + 540, "iss": id.to_string() });
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, key).map_err(|e| CredError::App(e.to_string()))
    }

    async fn api(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, CredError> {
        let jwt = self.app_jwt()?;
        let uri = format!("{}{path}", self.api.to_string().trim_end_matches('/'));
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(&uri)
            .header("authorization", format!("Bearer {jwt}"))
            .header("accept", "application/vnd.github+json")
            .header("user-agent", "egress-gateway")
            .header("x-github-api-version", "2022-11-28")
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| CredError::App(e.to_string()))?;
        let resp = tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .map_err(|_| CredError::App("GitHub API timed out".into()))?
            .map_err(|e| CredError::App(format!("GitHub API unreachable: {e}")))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_API_BODY)
            .collect()
            .await
            .map_err(|_| CredError::App("GitHub API response too large or broken".into()))?
            .to_bytes();
        if !status.is_success() {
            return Err(CredError::App(format!("GitHub API answered {status} for {path}")));
        }
        serde_json::from_slice(&bytes).map_err(|_| CredError::App(format!("GitHub API sent invalid JSON for {path}")))
    }

    async fn installation(&self, owner: &str, repo: &str) -> Result<u64, CredError> {
        let owner_lc = owner.to_ascii_lowercase();
        if let Some(id) = self.installations.lock().ok().and_then(|m| m.get(&owner_lc).copied()) {
            return Ok(id);
        }
        let v = self.api(Method::GET, &format!("/repos/{owner}/{repo}/installation"), None).await?;
        let id = v["id"].as_u64().ok_or_else(|| CredError::App("installation without id".into()))?;
        if let Ok(mut m) = self.installations.lock() {
            m.insert(owner_lc, id);
        }
        Ok(id)
    }

    async fn mint(&self, owner: &str, repo: &str, perm: Permission) -> Result<(Secret, SystemTime), CredError> {
        let id = self.installation(owner, repo).await?;
        let permission = match perm {
            Permission::Read => "read",
            Permission::Write => "write",
        };
        let body = serde_json::json!({ "repositories": [repo], "permissions": { "contents": permission } });
        let v = self.api(Method::POST, &format!("/app/installations/{id}/access_tokens"), Some(body)).await?;
        let token = v["token"].as_str().filter(|t| !t.is_empty()).ok_or_else(|| CredError::App("no token".into()))?;
        let expires_at = v["expires_at"]
            .as_str()
            .and_then(|s| humantime::parse_rfc3339_weak(s).ok())
            .ok_or_else(|| CredError::App("no expires_at".into()))?;
        tracing::info!(owner, repo, permission, "minted a GitHub installation token");
        Ok((Secret::new(token), expires_at))
    }
}

/// Replaces anything that looks like a GitHub token in `s` (for error text that might
/// echo one).
pub fn redact(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split_inclusive(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        let core = word.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        if ["ghs_", "ghp_", "gho_", "ghu_", "ghr_", "github_pat_"].iter().any(|p| core.starts_with(p)) {
            out.push_str("<redacted>");
            out.push_str(&word[core.len()..]);
        } else {
            out.push_str(word);
        }
    }
    out
}

/// Status of an upstream answer that means the gateway's own credential was refused.
pub fn is_credential_refusal(status: StatusCode) -> bool {
    status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction() {
        assert_eq!(redact("token ghs_abc123 and github_pat_11AB_cd, ok"), "token <redacted> and <redacted>, ok");
        assert_eq!(format!("{:?}", Secret::new("ghs_x")), "Secret(<redacted>)");
    }
}
