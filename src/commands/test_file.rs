//! `egress-gateway policy test FILE...`: table-driven expectations.
//!
//! ```toml
//! [[case]]
//! sandbox = "sbx-example"
//! target = "https://pypi.org/simple/"   # host:port, URL, git URL or route:NAME/PATH
//! expect = "allow"                       # or "deny"
//! reason = "host_denied"                 # optional, with deny
//! push = "refs/heads/agent/x"            # optional, git URLs only
//! method = "POST"                        # optional (GET): route: targets, and URLs of inspected hosts
//! ```

use std::io::Write;
use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use crate::config;
use crate::policy;
use crate::policy::PolicySet;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    #[serde(rename = "case", default)]
    cases: Vec<Spanned<Case>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    sandbox: String,
    target: String,
    expect: Expect,
    reason: Option<String>,
    push: Option<String>,
    method: Option<String>,
    /// Optional label shown in failures.
    name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Expect {
    Allow,
    Deny,
}

pub fn run(config_path: Option<&PathBuf>, files: &[PathBuf], out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(config_path)?;
    let set = config::load_policies(&cfg)?;
    let (mut passed, mut failed) = (0usize, 0usize);
    for file in files {
        let text =
            std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", file.display()))?;
        let parsed: TestFile =
            toml::from_str(&text).map_err(|e| crate::config::ConfigError::toml(&file.into(), &text, &e))?;
        anyhow::ensure!(!parsed.cases.is_empty(), "{}: no [[case]] tables", file.display());
        for case in &parsed.cases {
            let line = text.get(..case.span().start).map_or(0, |s| s.matches('\n').count()) + 1;
            match check_case(&set, case.get_ref()) {
                Ok(()) => passed += 1,
                Err(why) => {
                    failed += 1;
                    let c = case.get_ref();
                    let label = c.name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
                    writeln!(out, "FAIL {}:{line}{label}: sandbox {} -> {}", file.display(), c.sandbox, c.target)?;
                    writeln!(out, "     {why}")?;
                }
            }
        }
    }
    writeln!(out, "{passed} passed, {failed} failed")?;
    Ok(if failed == 0 { 0 } else { 1 })
}

fn check_case(set: &PolicySet, c: &Case) -> Result<(), String> {
    let subject = policy::parse_subject(&c.target, c.push.as_deref(), c.method.as_deref())?;
    if set.sandbox(&c.sandbox).is_none() {
        return Err(format!("unknown sandbox {:?}", c.sandbox));
    }
    let a = policy::evaluate(set, &c.sandbox, &subject);
    // Report mode lets traffic through: a test expects what enforcement would do.
    let got = if a.decision == policy::Outcome::Allow { Expect::Allow } else { Expect::Deny };
    let describe = || match (a.reason, &a.rule) {
        (Some(r), Some(rule)) => format!("deny ({r}, rule {rule:?})"),
        (Some(r), None) => format!("deny ({r})"),
        (None, Some(rule)) => format!("allow (rule {rule:?} at {})", a.rule_location.as_deref().unwrap_or("?")),
        (None, None) => "allow".to_string(),
    };
    if got != c.expect {
        let want = if c.expect == Expect::Allow { "allow" } else { "deny" };
        return Err(format!("expected {want}, got {}", describe()));
    }
    if let Some(want) = &c.reason
        && a.reason != Some(want.as_str())
    {
        return Err(format!("expected reason {want}, got {}", describe()));
    }
    Ok(())
}
