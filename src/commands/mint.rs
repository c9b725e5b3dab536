//! `egress-gateway token mint`: a signed sandbox token for runtimes and tests.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::tokens::{self, Claims};

pub struct MintArgs<'a> {
    pub config: Option<&'a PathBuf>,
    pub kid: &'a str,
    pub sandbox: &'a str,
    pub policy: &'a str,
    pub repos: &'a [String],
    pub ttl: Duration,
    pub jti: Option<&'a str>,
}

pub fn run(a: &MintArgs<'_>, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(a.config)?;
    let loaded = crate::reload::load(&cfg)?;
    anyhow::ensure!(
        loaded.policies.policies.contains_key(a.policy),
        "no policy named {:?} in {}",
        a.policy,
        cfg.policy.source.describe()
    );
    anyhow::ensure!(
        a.ttl <= cfg.tokens.max_ttl && !a.ttl.is_zero(),
        "--ttl must be above zero and at most tokens.max_ttl ({}s)",
        cfg.tokens.max_ttl.as_secs()
    );
    for r in a.repos {
        crate::policy::git::check_repo_pattern(r).map_err(|e| anyhow::anyhow!("--repo: {e}"))?;
    }
    let now = tokens::now();
    let claims = Claims {
        sub: a.sandbox.to_string(),
        pol: a.policy.to_string(),
        exp: now + a.ttl.as_secs(),
        iat: Some(now),
        nbf: None,
        jti: Some(a.jti.map_or_else(|| hex::encode(rand::random::<[u8; 12]>()), str::to_string)),
        repos: (!a.repos.is_empty()).then(|| a.repos.to_vec()),
    };
    let token = loaded.tokens.mint(a.kid, &claims).map_err(anyhow::Error::msg)?;
    writeln!(out, "{token}")?;
    Ok(0)
}
