//! Git rules: which repositories a policy's sandboxes may clone, fetch and push, and
//! which refs they may push to.
//!
//! Repository patterns are `OWNER/REPO` globs (`acme/widgets`, `acme/tools-*`), ref
//! patterns are ref-name globs (`refs/heads/agent/*`). `*` stays within one path
//! component, `**` crosses them. Matching is case-insensitive for repositories (GitHub
//! names are) and exact for refs.

use globset::{GlobBuilder, GlobMatcher};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitRuleError {
    #[error("expected OWNER/REPO (a glob in either part), got {0:?}")]
    RepoPattern(String),
    #[error("expected a ref pattern starting with refs/, got {0:?}")]
    RefPattern(String),
    #[error("invalid glob {0:?}: {1}")]
    Glob(String, String),
}

#[derive(Debug)]
pub struct GitPattern {
    matcher: GlobMatcher,
    /// Index of the rule in the policy's rule list.
    pub rule: usize,
}

#[derive(Debug, Default)]
pub struct GitRules {
    repos: Vec<GitPattern>,
    push: Vec<GitPattern>,
    pub allow_delete: bool,
}

fn glob(pattern: &str, case_insensitive: bool) -> Result<GlobMatcher, GitRuleError> {
    GlobBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| GitRuleError::Glob(pattern.to_string(), e.kind().to_string()))
}

/// `OWNER/REPO` with exactly one `/`, no empty part, no `..`.
pub fn check_repo_pattern(p: &str) -> Result<(), GitRuleError> {
    let parts: Vec<&str> = p.split('/').collect();
    let ok = parts.len() == 2
        && parts.iter().all(|x| !x.is_empty() && *x != "." && *x != "..")
        && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.*?/[]{},!".contains(&b));
    if ok { Ok(()) } else { Err(GitRuleError::RepoPattern(p.to_string())) }
}

impl GitRules {
    pub fn add_repo(&mut self, pattern: &str, rule: usize) -> Result<(), GitRuleError> {
        let p = pattern.strip_suffix(".git").unwrap_or(pattern);
        check_repo_pattern(p)?;
        self.repos.push(GitPattern { matcher: glob(p, true)?, rule });
        Ok(())
    }

    pub fn add_push(&mut self, pattern: &str, rule: usize) -> Result<(), GitRuleError> {
        if !pattern.starts_with("refs/") || pattern.contains("..") {
            return Err(GitRuleError::RefPattern(pattern.to_string()));
        }
        self.push.push(GitPattern { matcher: glob(pattern, false)?, rule });
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.repos.is_empty()
    }

    /// The rule that connects `repo` (`owner/name`, without `.git`), if any.
    pub fn repo_rule(&self, repo: &str) -> Option<usize> {
        self.repos.iter().find(|p| p.matcher.is_match(repo)).map(|p| p.rule)
    }

    /// True when any push pattern exists (pushing is possible at all).
    pub fn push_enabled(&self) -> bool {
        !self.push.is_empty()
    }

    /// The rule that allows pushing to `refname`, if any.
    pub fn push_rule(&self, refname: &str) -> Option<usize> {
        self.push.iter().find(|p| p.matcher.is_match(refname)).map(|p| p.rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_and_ref_patterns() {
        let mut g = GitRules::default();
        g.add_repo("acme/widgets", 0).unwrap();
        g.add_repo("acme/tools-*.git", 1).unwrap();
        g.add_push("refs/heads/agent/*", 2).unwrap();
        assert_eq!(g.repo_rule("acme/widgets"), Some(0));
        assert_eq!(g.repo_rule("ACME/Widgets"), Some(0));
        assert_eq!(g.repo_rule("acme/tools-cli"), Some(1));
        assert_eq!(g.repo_rule("acme/widgets2"), None);
        assert_eq!(g.repo_rule("evil/widgets"), None);
        assert_eq!(g.push_rule("refs/heads/agent/x"), Some(2));
        assert_eq!(g.push_rule("refs/heads/agent/x/y"), None, "* stays within a component");
        assert_eq!(g.push_rule("refs/heads/main"), None);
        for bad in ["widgets", "acme/", "/x", "a/b/c", "acme/../x", "a b/c"] {
            assert!(g.add_repo(bad, 9).is_err(), "{bad}");
        }
        assert!(g.add_push("heads/main", 9).is_err());
    }
}
