//! Hostname rules: an exact-name map and a suffix map.
//!
//! A lookup costs one hash probe for the name and one per parent domain, whatever the
//! number of rules: `a.b.example.com` probes `exact["a.b.example.com"]`, then
//! `suffix["b.example.com"]`, `suffix["example.com"]`, `suffix["com"]`. No allocation.

use std::collections::HashMap;

use super::rule::PortSpec;

/// One rule's port constraint and its index in the policy's rule list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostEntry {
    pub ports: PortSpec,
    pub rule: usize,
}

#[derive(Debug, Default)]
pub struct HostRules {
    exact: HashMap<Box<str>, Vec<HostEntry>>,
    suffix: HashMap<Box<str>, Vec<HostEntry>>,
}

impl HostRules {
    pub fn add_exact(&mut self, name: &str, entry: HostEntry) {
        self.exact.entry(name.into()).or_default().push(entry);
    }

    /// `suffix` is the part after `*.`: the rule matches names strictly below it.
    pub fn add_suffix(&mut self, suffix: &str, entry: HostEntry) {
        self.suffix.entry(suffix.into()).or_default().push(entry);
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffix.is_empty()
    }

    /// Every entry whose pattern matches `name`, most specific first: the exact entries,
    /// then suffix entries from the nearest parent outwards.
    pub fn matching<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a HostEntry> + 'a {
        let exact = self.exact.get(name).into_iter().flatten();
        let parents = name.match_indices('.').filter_map(move |(i, _)| self.suffix.get(&name[i + 1..])).flatten();
        exact.chain(parents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rule: usize) -> HostEntry {
        HostEntry { ports: PortSpec::Any, rule }
    }

    #[test]
    fn suffix_matches_any_depth_but_not_apex() {
        let mut h = HostRules::default();
        h.add_suffix("example.com", entry(0));
        h.add_exact("pypi.org", entry(1));
        let hits = |n: &str| h.matching(n).map(|e| e.rule).collect::<Vec<_>>();
        assert_eq!(hits("a.example.com"), vec![0]);
        assert_eq!(hits("a.b.c.d.example.com"), vec![0]);
        assert!(hits("example.com").is_empty());
        assert!(hits("badexample.com").is_empty());
        assert_eq!(hits("pypi.org"), vec![1]);
        assert!(hits("x.pypi.org").is_empty());
    }
}
