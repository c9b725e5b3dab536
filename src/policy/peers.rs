//! Sandbox-to-sandbox rules: `peers` (whom a policy's sandboxes may reach) and
//! `accept_from` (whom they accept), globs over sandbox ids and labels. Both sides
//! must agree; no match is a deny.

use globset::{Glob, GlobMatcher};

/// One `peers` or `accept_from` pattern.
#[derive(Debug, Clone)]
pub struct PeerPattern {
    matcher: GlobMatcher,
    /// Index of the rule in the policy's rule list.
    pub rule: usize,
}

impl PeerPattern {
    pub fn new(pattern: &str, rule: usize) -> Result<PeerPattern, String> {
        let valid = !pattern.is_empty()
            && pattern.len() <= 128
            && pattern.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/=*?".contains(&b));
        if !valid {
            return Err(format!(
                "expected a sandbox id or label glob (letters, digits, '.', '_', '-', '/', '=', '*', '?'), got {pattern:?}"
            ));
        }
        let matcher = Glob::new(pattern).map_err(|e| format!("invalid glob {pattern:?}: {e}"))?.compile_matcher();
        Ok(PeerPattern { matcher, rule })
    }

    /// Matches the sandbox id or any of its labels.
    pub fn matches(&self, id: &str, labels: &[String]) -> bool {
        self.matcher.is_match(id) || labels.iter().any(|l| self.matcher.is_match(l))
    }
}

/// The first pattern of `list` that matches.
pub fn first_match<'a>(list: &'a [PeerPattern], id: &str, labels: &[String]) -> Option<&'a PeerPattern> {
    list.iter().find(|p| p.matches(id, labels))
}
