//! `egress-gateway policy replay --log ACCESS.jsonl [--config NEW]`: re-decides every
//! logged request under the config's policies and summarises what changes.
//!
//! Both sides are policy verdicts as if every policy enforced (a `would_deny` in the
//! log counts as denied), so trialling a policy in report mode shows what enforcement
//! would block. Records denied for reasons outside the policy (authentication,
//! address vetting, upstream errors) count as allowed by policy. Records without a
//! sandbox are skipped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

use crate::config;
use crate::policy::{self, Outcome, Subject};
use crate::policy::{DenyReason, PolicySet};

const POLICY_REASONS: [DenyReason; 7] = [
    DenyReason::RequestNotAllowed,
    DenyReason::HostNotAllowed,
    DenyReason::HostDenied,
    DenyReason::PortNotAllowed,
    DenyReason::RepoNotConnected,
    DenyReason::GitWriteDenied,
    DenyReason::GitRefDenied,
];

#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    pub records: u64,
    pub skipped: u64,
    pub unchanged: u64,
    /// (sandbox, target) -> change
    pub allow_to_deny: Vec<Change>,
    pub deny_to_allow: Vec<Change>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Change {
    pub sandbox: String,
    pub target: String,
    pub requests: u64,
    /// The reason and rule under the new policy.
    pub reason: Option<&'static str>,
    pub rule: Option<String>,
}

pub fn run(log: &PathBuf, config_path: Option<&PathBuf>, json: bool, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(config_path)?;
    let set = config::load_policies(&cfg)?;
    let file = std::fs::File::open(log).map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", log.display()))?;
    let summary = replay(BufReader::new(file), &set)?;
    if json {
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        print(out, &summary)?;
    }
    Ok(if summary.allow_to_deny.is_empty() { 0 } else { 1 })
}

/// Replays access-log lines against `set`.
pub fn replay(lines: impl BufRead, set: &PolicySet) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let mut a2d: BTreeMap<(String, String), Change> = BTreeMap::new();
    let mut d2a: BTreeMap<(String, String), Change> = BTreeMap::new();
    for line in lines.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            summary.skipped += 1;
            continue;
        };
        // Diagnostics share the log stream: only access records count.
        let is_access = match v.get("log") {
            Some(l) => l == "access",
            None => v.get("kind").is_some(),
        };
        if !is_access {
            continue;
        }
        summary.records += 1;
        let (Some(sandbox), Some(target), Some(kind)) =
            (v["sandbox"].as_str(), v["target"].as_str(), v["kind"].as_str())
        else {
            summary.skipped += 1;
            continue;
        };
        let subject = match kind {
            // `https://host/path?[redacted]`: the query is not logged, so it is not judged.
            "inspect" => {
                let url = target.split('?').next().unwrap_or(target);
                match policy::parse_subject(url, None, v["method"].as_str()) {
                    Ok(s) => s,
                    Err(_) => {
                        summary.skipped += 1;
                        continue;
                    }
                }
            }
            "connect" | "forward" => match crate::addr::parse_authority(target, None) {
                Ok(t) => Subject::Host(t),
                Err(_) => {
                    summary.skipped += 1;
                    continue;
                }
            },
            _ => {
                summary.skipped += 1;
                continue;
            }
        };
        let old_allowed = match v["decision"].as_str() {
            Some("allow") => true,
            Some("would_deny") => false,
            _ => !v["reason"].as_str().is_some_and(|r| POLICY_REASONS.iter().any(|p| p.code() == r)),
        };
        let answer = policy::evaluate(set, sandbox, &subject);
        let new_allowed = answer.decision == Outcome::Allow;
        let bucket = match (old_allowed, new_allowed) {
            (true, false) => &mut a2d,
            (false, true) => &mut d2a,
            _ => {
                summary.unchanged += 1;
                continue;
            }
        };
        bucket
            .entry((sandbox.to_string(), answer.target.clone()))
            .or_insert_with(|| Change {
                sandbox: sandbox.to_string(),
                target: answer.target.clone(),
                requests: 0,
                reason: answer.reason,
                rule: answer.rule.clone(),
            })
            .requests += 1;
    }
    summary.allow_to_deny = a2d.into_values().collect();
    summary.deny_to_allow = d2a.into_values().collect();
    Ok(summary)
}

fn print(out: &mut dyn Write, s: &Summary) -> std::io::Result<()> {
    writeln!(out, "replayed {} records ({} skipped, {} unchanged)", s.records, s.skipped, s.unchanged)?;
    for (title, changes) in [("allow -> deny", &s.allow_to_deny), ("deny -> allow", &s.deny_to_allow)] {
        let requests: u64 = changes.iter().map(|c| c.requests).sum();
        writeln!(out, "{title}: {} targets, {requests} requests", changes.len())?;
        for c in changes {
            let why = match (&c.reason, &c.rule) {
                (Some(r), Some(rule)) => format!("  ({r}, rule {rule:?})"),
                (Some(r), None) => format!("  ({r})"),
                (None, Some(rule)) => format!("  (rule {rule:?})"),
                (None, None) => String::new(),
            };
            writeln!(out, "  {:<24} {:<40} {:>6} requests{why}", c.sandbox, c.target, c.requests)?;
        }
    }
    Ok(())
}
