//! One access-log record per request or tunnel. Field names are a stable interface:
//! `ts, sandbox, kind, method, target, decision, reason, rule, policy,
//! policy_generation, upstream_addr, status, bytes_up, bytes_down, duration_ms,
//! client_addr, vpce, shadow_decision, budget`. Never a token, never a header value.

pub mod recent;
mod text;

use std::net::SocketAddr;
use std::time::Instant;

use crate::policy::Outcome;

pub use crate::telemetry::{ACCESS_TARGET as TARGET, Kind};
pub use text::Text;

#[derive(Debug, Clone)]
pub struct AccessRecord {
    pub kind: Kind,
    /// A standard method is a static string: no allocation per request.
    pub method: std::borrow::Cow<'static, str>,
    /// Normalised target, or the raw request target (truncated) when it did not parse.
    pub target: Text,
    pub client_addr: SocketAddr,
    pub started: Instant,
    pub sandbox: Option<std::sync::Arc<str>>,
    pub policy: Option<std::sync::Arc<str>>,
    pub policy_generation: u64,
    pub decision: Outcome,
    pub reason: Option<&'static str>,
    pub rule: Option<std::sync::Arc<str>>,
    pub upstream_addr: Option<SocketAddr>,
    pub status: u16,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub vpce: Option<String>,
    /// Set only when the shadow policies decide differently.
    pub shadow_decision: Option<Outcome>,
    /// The budget or limit that refused the request, or ended its tunnel.
    pub budget: Option<String>,
}

/// `method` as a static string when it is a standard one (as it nearly always is).
fn static_method(method: &str) -> std::borrow::Cow<'static, str> {
    const STANDARD: [&str; 10] = ["GET", "POST", "CONNECT", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS", "TRACE", ""];
    match STANDARD.iter().find(|m| **m == method) {
        Some(m) => std::borrow::Cow::Borrowed(m),
        None => std::borrow::Cow::Owned(method.to_string()),
    }
}

/// `None` for an empty string: an unparsed request has no method or target to log.
fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// Longest raw target echoed into logs and error bodies.
const MAX_RAW_TARGET: usize = 256;

/// A printable, bounded rendering of an unparsed request target, safe to log and echo:
/// anything up to the last `@` (userinfo, however malformed: a password may hold `/`
/// or `?`) and the query string (`?key=...`), where clients put credentials, are
/// replaced by `[redacted]`. Over-redacting a refused target costs nothing.
pub fn raw_target(s: &str) -> String {
    let start = s.find("://").map_or(0, |i| i + 3);
    let (prefix, body) = s.split_at(start);
    // The authority: after the scheme, or after an origin-form target's slashes.
    let lead = body.len() - body.trim_start_matches('/').len();
    let (slashes, after) = body.split_at(lead);
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let mut cleaned = String::with_capacity(s.len().min(MAX_RAW_TARGET) + 24);
    cleaned.push_str(prefix);
    cleaned.push_str(slashes);
    let rest = if let Some(at) = after.rfind('@') {
        cleaned.push_str("[redacted]");
        &after[at..]
    } else if looks_like_credentials(&after[..authority_end]) {
        // `user:pass` with the `@` gone (the URI parser drops a fragment, and a `#`
        // in a password starts one): redact the whole authority.
        cleaned.push_str("[redacted]");
        &after[authority_end..]
    } else {
        after
    };
    let (rest, had_query) = match rest.find(['?', '#']) {
        Some(i) => (&rest[..i], true),
        None => (rest, false),
    };
    cleaned.push_str(rest);
    let mut out = bounded(&cleaned);
    if had_query {
        out.push_str("?[redacted]");
    }
    out
}

/// An authority whose text after its last `:` is not a port: `user:secret`.
fn looks_like_credentials(authority: &str) -> bool {
    authority.rsplit_once(':').is_some_and(|(_, tail)| !tail.is_empty() && !tail.bytes().all(|b| b.is_ascii_digit()))
}

fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_RAW_TARGET);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

impl AccessRecord {
    pub fn new(kind: Kind, method: &str, target: impl Into<Text>, client_addr: SocketAddr, generation: u64) -> Self {
        Self::with_vpce(kind, method, target, client_addr, generation, None)
    }

    pub fn with_vpce(
        kind: Kind,
        method: &str,
        target: impl Into<Text>,
        client_addr: SocketAddr,
        generation: u64,
        vpce: Option<String>,
    ) -> Self {
        AccessRecord {
            kind,
            method: static_method(method),
            target: target.into(),
            client_addr,
            started: Instant::now(),
            sandbox: None,
            policy: None,
            policy_generation: generation,
            decision: Outcome::Deny,
            reason: None,
            rule: None,
            upstream_addr: None,
            status: 0,
            bytes_up: 0,
            bytes_down: 0,
            vpce,
            shadow_decision: None,
            budget: None,
        }
    }

    /// Writes the access-log line and records the request's metrics, together so the
    /// two cannot drift.
    pub fn emit(&self) {
        let elapsed = self.started.elapsed();
        crate::metrics::record_request(self.kind, self.decision, self.bytes_up, self.bytes_down, elapsed);
        if let Some(reason) = self.reason
            && self.decision != Outcome::Allow
        {
            metrics::counter!(crate::metrics::PROXY_DENIALS, "reason" => reason).increment(1);
            if let Some(sandbox) = &self.sandbox {
                recent::remember(sandbox, self);
            }
        }
        let duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if !crate::telemetry::write_access_json(|w| self.write_json_fields(w, duration_ms)) {
            self.trace(duration_ms);
        }
    }

    /// The record as a tracing event: text logs, or no batch writer installed.
    fn trace(&self, duration_ms: u64) {
        tracing::info!(
            target: TARGET,
            sandbox = self.sandbox.as_deref(),
            kind = self.kind.as_str(),
            method = non_empty(&self.method),
            target = non_empty(&self.target),
            decision = self.decision.as_str(),
            reason = self.reason,
            rule = self.rule.as_deref(),
            policy = self.policy.as_deref(),
            policy_generation = self.policy_generation,
            upstream_addr = self.upstream_addr.map(tracing::field::display),
            status = self.status,
            bytes_up = self.bytes_up,
            bytes_down = self.bytes_down,
            duration_ms,
            client_addr = %self.client_addr,
            vpce = self.vpce.as_deref(),
            shadow_decision = self.shadow_decision.map(Outcome::as_str),
            budget = self.budget.as_deref(),
        );
    }

    /// The JSON fields after `ts` and `log`, the same as [`Self::trace`] gives through
    /// the JSON formatter, written without tracing's per-field dispatch (the access log
    /// is one line per request).
    fn write_json_fields(&self, w: &mut String, duration_ms: u64) -> std::fmt::Result {
        use crate::telemetry::json::{Key, field_socket_addr, field_str, field_u64, json_key as key};
        let opt = |w: &mut String, k: Key, v: Option<&str>| v.map_or(Ok(()), |v| field_str(w, k, v));
        opt(w, key!("sandbox"), self.sandbox.as_deref())?;
        field_str(w, key!("kind"), self.kind.as_str())?;
        opt(w, key!("method"), non_empty(&self.method))?;
        opt(w, key!("target"), non_empty(&self.target))?;
        field_str(w, key!("decision"), self.decision.as_str())?;
        opt(w, key!("reason"), self.reason)?;
        opt(w, key!("rule"), self.rule.as_deref())?;
        opt(w, key!("policy"), self.policy.as_deref())?;
        field_u64(w, key!("policy_generation"), self.policy_generation)?;
        if let Some(a) = self.upstream_addr {
            field_socket_addr(w, key!("upstream_addr"), a)?;
        }
        field_u64(w, key!("status"), u64::from(self.status))?;
        field_u64(w, key!("bytes_up"), self.bytes_up)?;
        field_u64(w, key!("bytes_down"), self.bytes_down)?;
        field_u64(w, key!("duration_ms"), duration_ms)?;
        field_socket_addr(w, key!("client_addr"), self.client_addr)?;
        opt(w, key!("vpce"), self.vpce.as_deref())?;
        opt(w, key!("shadow_decision"), self.shadow_decision.map(Outcome::as_str))?;
        opt(w, key!("budget"), self.budget.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direct_json_line_has_the_fields_the_traced_one_has() {
        let mut rec = AccessRecord::with_vpce(
            Kind::Forward,
            "GET",
            "example.com:80",
            "127.0.0.1:5000".parse().unwrap_or_else(|e| panic!("{e}")),
            7,
            Some("vpce-1".into()),
        );
        rec.sandbox = Some("sbx \"quoted\"".into());
        rec.rule = Some("*.example.com".into());
        rec.upstream_addr = Some("[::1]:80".parse().unwrap_or_else(|e| panic!("{e}")));
        rec.status = 200;
        rec.bytes_down = 12;
        rec.decision = Outcome::Allow;

        let mut direct = String::from("{\"ts\":\"x\",\"log\":\"access\"");
        rec.write_json_fields(&mut direct, 3).unwrap_or_else(|e| panic!("{e}"));
        direct.push('}');
        let direct: serde_json::Value = serde_json::from_str(&direct).unwrap_or_else(|e| panic!("{e}: {direct}"));

        let traced = crate::telemetry::json::capture(|| rec.trace(3)).remove(0);
        let strip = |mut v: serde_json::Value| {
            v.as_object_mut().map(|o| o.remove("ts"));
            v
        };
        assert_eq!(strip(direct.clone()), strip(traced));
        assert!(direct.get("reason").is_none(), "absent options stay absent");
        assert_eq!(direct["upstream_addr"], "[::1]:80");
    }

    #[test]
    fn raw_targets_never_carry_userinfo_or_queries() {
        assert_eq!(raw_target("http://sbx-a:TOKEN@host/x?y"), "http://[redacted]@host/x?[redacted]");
        assert_eq!(raw_target("sbx-a:TOKEN@host:443"), "[redacted]@host:443");
        assert_eq!(raw_target("/path?key=sbx-a:TOKEN"), "/path?[redacted]");
        assert_eq!(raw_target("http://sbx-a:Ab3+/x9Q=@origin.test/"), "http://[redacted]@origin.test/");
        assert_eq!(raw_target("http://sbx-a:Ab3?x@origin.test/"), "http://[redacted]@origin.test/");
        assert_eq!(raw_target("//sbx-a:TOK@origin.test/"), "//[redacted]@origin.test/");
        assert_eq!(raw_target("/github.test/sbx-a:TOK@acme/w.git"), "/[redacted]@acme/w.git");
        assert_eq!(raw_target("http://host/plain"), "http://host/plain");
        // What the URI parser leaves of `http://sbx-a:tok#X@origin.test/`.
        assert_eq!(raw_target("http://sbx-a:tokA/"), "http://[redacted]/");
        assert_eq!(raw_target("//sbx-a:SEC"), "//[redacted]");
        assert_eq!(raw_target("*sbx-a:SECRET14"), "[redacted]");
        assert_eq!(raw_target("origin.test:443"), "origin.test:443");
        assert_eq!(raw_target("http://host/#frag"), "http://host/?[redacted]");
        assert_eq!(raw_target("bad\u{7}host:1"), "bad?host:1");
        assert_eq!(raw_target(&"a".repeat(1000)).len(), MAX_RAW_TARGET);
    }
}
