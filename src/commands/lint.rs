//! `egress-gateway policy lint`: errors for what would fail to load, warnings for
//! likely mistakes: wildcards over a public suffix, allow rules a deny rule fully
//! shadows, duplicates, IP rules inside `egress.deny`, push rules without repos,
//! policies no sandbox uses, sandbox addresses inside `proxy.trusted_proxies`.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use ipnet::IpNet;

use crate::config::{self, Config};
use crate::policy::{HostPattern, Policy, PolicySet, PortSpec, Rule, RuleList, RuleSource, parse_rule};

/// One finding, located at a rule (or a policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub location: String,
    pub subject: String,
    pub message: String,
}

pub fn run(config_path: Option<&PathBuf>, deny_warnings: bool, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(config_path)?;
    let set = match config::load_policies(&cfg) {
        Ok(set) => set,
        Err(e) => {
            writeln!(out, "error: {e}")?;
            writeln!(out, "1 error, 0 warnings")?;
            return Ok(1);
        }
    };
    let warnings = lint(&cfg, &set);
    for w in &warnings {
        // A policy with no rules has no line to point at: its name says where.
        match w.location.as_str() {
            "" => writeln!(out, "warning: {}: {}", w.subject, w.message)?,
            at => writeln!(out, "warning: {at}: {}: {}", w.subject, w.message)?,
        }
    }
    writeln!(out, "0 errors, {} warnings", warnings.len())?;
    Ok(if deny_warnings && !warnings.is_empty() { 1 } else { 0 })
}

/// Every warning for a loaded policy set, sorted by location.
pub fn lint(cfg: &Config, set: &PolicySet) -> Vec<Warning> {
    let mut out = Vec::new();
    let used: HashSet<&str> = set.sandboxes.values().map(|s| s.policy.name()).collect();
    let mut names: Vec<&String> = set.policies.keys().collect();
    names.sort();
    for name in names {
        let Some(policy) = set.policies.get(name) else { continue };
        if !used.contains(name.as_str()) {
            let location = policy.rules().first().map_or_else(String::new, |r| r.location.clone());
            out.push(Warning {
                location,
                subject: format!("policies.{name}"),
                message: "no sandbox uses this policy".into(),
            });
        }
        lint_policy(cfg, policy, &mut out);
    }
    lint_trusted_proxies(cfg, set, &mut out);
    out.sort_by(|a, b| a.location.cmp(&b.location).then(a.subject.cmp(&b.subject)));
    out
}

/// A sandbox whose `addresses` overlap `proxy.trusted_proxies` may send a PROXY header
/// of its own, naming any source address, and so pose as any other sandbox.
fn lint_trusted_proxies(cfg: &Config, set: &PolicySet, out: &mut Vec<Warning>) {
    if cfg.proxy.proxy_protocol == config::ProxyProtocol::Off {
        return;
    }
    let mut ids: Vec<&String> = set.sandboxes.keys().collect();
    ids.sort();
    for id in ids {
        let Some(sandbox) = set.sandboxes.get(id) else { continue };
        let overlap = sandbox.addresses.iter().find_map(|a| {
            cfg.proxy.trusted_proxies.iter().find(|t| t.contains(&a.network()) || a.contains(&t.network()))
        });
        if let Some(trusted) = overlap {
            out.push(Warning {
                location: String::new(),
                subject: format!("sandboxes.{id}.addresses"),
                message: format!(
                    "overlaps proxy.trusted_proxies ({trusted}): the sandbox may send a PROXY header naming another \
                     sandbox's address and pass as it"
                ),
            });
        }
    }
}

fn lint_policy(cfg: &Config, policy: &Policy, out: &mut Vec<Warning>) {
    let name = policy.name();
    let rules: Vec<(&RuleSource, Option<Rule>)> = policy
        .rules()
        .iter()
        .map(|r| (r, matches!(r.list, RuleList::Allow | RuleList::Deny).then(|| parse_rule(&r.text).ok()).flatten()))
        .collect();
    let warn = |out: &mut Vec<Warning>, r: &RuleSource, message: String| {
        out.push(Warning {
            location: r.location.clone(),
            subject: format!("policies.{name}.{} {:?}", r.list.key(), r.text),
            message,
        });
    };
    let mut seen: Vec<(RuleList, &Rule, &RuleSource)> = Vec::new();
    for (src, rule) in &rules {
        let Some(rule) = rule else { continue };
        if let HostPattern::Suffix(s) = &rule.pattern
            && is_icann_suffix(s)
        {
            warn(out, src, format!("wildcard covers the public suffix {s:?}: every site under it"));
        }
        if let Some((_, _, first)) = seen.iter().find(|(l, r, _)| *l == src.list && *r == rule) {
            warn(out, src, format!("duplicate of the rule at {}", first.location));
        }
        seen.push((src.list, rule, src));
        if src.list == RuleList::Allow {
            if let HostPattern::Net(net) = &rule.pattern
                && never_dialled(cfg, net)
            {
                warn(out, src, "every address it matches is in egress.deny: it can never be reached".into());
            }
            let shadow = rules.iter().find_map(|(d_src, d)| {
                let d = d.as_ref()?;
                (d_src.list == RuleList::Deny && covers(d, rule, policy.default_ports())).then_some(d_src)
            });
            if let Some(d) = shadow {
                warn(
                    out,
                    src,
                    format!("fully shadowed by deny {:?} at {}: it never allows anything", d.text, d.location),
                );
            }
        }
    }
    let has_repos = policy.rules().iter().any(|r| r.list == RuleList::GitRepos);
    lint_inspection(cfg, policy, has_repos, &warn, out);
    lint_secret_tunnels(cfg, policy, &rules, &warn, out);
    if !has_repos && let Some(push) = policy.rules().iter().find(|r| r.list == RuleList::GitPush) {
        warn(out, push, "git.push without git.repos: no repository can be pushed to".into());
    }
    let policy_location = || policy.rules().first().map_or_else(String::new, |r| r.location.clone());
    if policy.mode() == crate::policy::Mode::Enforce
        && let Some(all) = policy.rules().iter().find(|r| r.list == RuleList::AllowAll)
        && !policy.rules().iter().any(|r| r.list == RuleList::Deny)
    {
        warn(
            out,
            all,
            "allow_all in enforce mode with no deny rules: every public destination is reachable; add deny \
             rules for what must stay out, or run it in report mode"
                .into(),
        );
    }
    if policy.mode() == crate::policy::Mode::Report && (has_repos || policy.routes().next().is_some()) {
        out.push(Warning {
            location: policy_location(),
            subject: format!("policies.{name}.mode"),
            message: "report mode does not apply to git rules or API routes: the gateway adds its own \
                      credential there, so they are always enforced"
                .into(),
        });
    }
    if has_repos {
        for rule in github_tunnel_rules(cfg, policy) {
            warn(
                out,
                rule,
                "allows an opaque tunnel to GitHub beside git.repos: sandboxes can push anywhere there with \
                 credentials of their own, around every per-repository and per-ref rule"
                    .into(),
            );
        }
    }
}

/// Inspected hosts no request rule allows anything on, request rules for hosts the
/// policy does not inspect, and inspect rules `intercept.never` overrides.
fn lint_inspection(
    cfg: &Config,
    policy: &Policy,
    has_repos: bool,
    warn: &dyn Fn(&mut Vec<Warning>, &RuleSource, String),
    out: &mut Vec<Warning>,
) {
    let requests = policy.request_rules();
    for src in policy.rules().iter().filter(|r| r.list == RuleList::Inspect) {
        let Ok(rule) = parse_rule(&src.text) else { continue };
        let name = example_name(&rule.pattern);
        if let (Some(i), Some(host)) = (&cfg.intercept, &name)
            && i.never_inspects(host)
        {
            warn(out, src, "intercept.never lists this host: it is tunnelled, never inspected".into());
            continue;
        }
        let git_host = name.as_ref().and_then(|h| h.as_name()).is_some_and(|n| n == cfg.github.web_host) && has_repos;
        let allows = requests.iter().any(|r| {
            r.action == crate::policy::requests::Action::Allow
                && (name.as_ref().is_some_and(|h| r.host.matches(h))
                    || example_name(&r.host).is_some_and(|h| rule.pattern.matches(&h)))
        });
        if !allows && !git_host {
            warn(out, src, "inspected, but no request rule allows anything on it: every request is refused".into());
        }
    }
    for (r, src) in requests.iter().filter_map(|r| policy.rules().get(r.rule).map(|s| (r, s))) {
        let Some(host) = example_name(&r.host) else { continue };
        // On any port an inspect rule names (one written for a single port counts).
        let inspected = policy
            .rules()
            .iter()
            .filter(|s| s.list == RuleList::Inspect)
            .filter_map(|s| parse_rule(&s.text).ok())
            .any(|rule| rule.pattern.matches(&host));
        if !inspected {
            warn(out, src, format!("{host} is not in policies.{}.inspect: this rule is never applied", policy.name()));
        }
    }
}

/// Allow rules (and `allow_all`) that tunnel, uninspected, to a host with secret values
/// bound to it: a value one sandbox stored there through an inspected request comes
/// back unredacted through the tunnel.
fn lint_secret_tunnels(
    cfg: &Config,
    policy: &Policy,
    rules: &[(&RuleSource, Option<Rule>)],
    warn: &dyn Fn(&mut Vec<Warning>, &RuleSource, String),
    out: &mut Vec<Warning>,
) {
    let inspects = |host: &crate::addr::Host| {
        cfg.intercept.as_ref().is_some_and(|i| !i.never_inspects(host))
            && policy
                .rules()
                .iter()
                .filter(|s| s.list == RuleList::Inspect)
                .filter_map(|s| parse_rule(&s.text).ok())
                .any(|rule| rule.pattern.matches(host))
    };
    for secret in &cfg.secrets {
        for host in secret.hosts.iter().filter_map(|(p, _)| example_name(p)) {
            if inspects(&host) {
                continue;
            }
            let allowed = rules.iter().find(|(src, rule)| {
                src.list == RuleList::Allow
                    && rule.as_ref().is_some_and(|r| {
                        r.pattern.matches(&host) || example_name(&r.pattern).is_some_and(|h| secret.on_host_name(&h))
                    })
            });
            let all = || policy.rules().iter().find(|r| r.list == RuleList::AllowAll);
            if let Some(src) = allowed.map(|(src, _)| *src).or_else(all) {
                warn(
                    out,
                    src,
                    format!(
                        "tunnels to {host} uninspected, where secrets name={:?} is bound: a value stored there \
                         comes back unredacted through the tunnel; inspect {host} in this policy",
                        secret.name
                    ),
                );
            }
        }
    }
}

/// A name a host pattern matches (for a suffix, one label below it).
fn example_name(p: &HostPattern) -> Option<crate::addr::Host> {
    match p {
        HostPattern::Exact(n) => Some(crate::addr::Host::Name(n.clone())),
        HostPattern::Suffix(s) => Some(crate::addr::Host::Name(format!("x.{s}"))),
        HostPattern::Net(n) => Some(crate::addr::Host::Ip(n.network())),
    }
}

/// The allow rules that let `policy` tunnel to GitHub's web host (github.com, or the
/// configured GitHub Enterprise host) on port 443, beside the git route.
pub fn github_tunnel_rules<'p>(cfg: &Config, policy: &'p Policy) -> Vec<&'p RuleSource> {
    let mut hosts = vec!["github.com".to_string()];
    if !hosts.contains(&cfg.github.web_host) {
        hosts.push(cfg.github.web_host.clone());
    }
    let mut rules: Vec<&RuleSource> = Vec::new();
    for host in hosts {
        let Ok(target) = crate::addr::parse_authority(&format!("{host}:443"), None) else { continue };
        // Inspected: its git paths take the git route, the rest request rules.
        let never = cfg.intercept.as_ref().is_some_and(|i| i.never_inspects(&target.host));
        if cfg.intercept.is_some() && !never && policy.inspects(&target).is_some() {
            continue;
        }
        let decision = policy.decide(&target);
        if let crate::policy::Verdict::Allow { rule } = decision.verdict
            && !rules.contains(&rule)
        {
            rules.push(rule);
        }
    }
    rules
}

fn is_icann_suffix(name: &str) -> bool {
    psl::suffix(name.as_bytes())
        .is_some_and(|s| s.as_bytes() == name.as_bytes() && s.is_known() && s.typ() == Some(psl::Type::Icann))
}

fn never_dialled(cfg: &Config, net: &IpNet) -> bool {
    let (first, last) = (net.network(), net.broadcast());
    cfg.egress.filter.vet(first).is_err() && cfg.egress.filter.vet(last).is_err() && net.prefix_len() >= 8
}

/// True when deny rule `d` matches every target that allow rule `a` matches.
fn covers(d: &Rule, a: &Rule, default_ports: &[u16]) -> bool {
    let hosts = match (&d.pattern, &a.pattern) {
        (HostPattern::Exact(x), HostPattern::Exact(y)) => x == y,
        (HostPattern::Suffix(s), HostPattern::Exact(y)) => y.strip_suffix(s.as_str()).is_some_and(|p| p.ends_with('.')),
        (HostPattern::Suffix(s), HostPattern::Suffix(t)) => {
            t == s || t.strip_suffix(s.as_str()).is_some_and(|p| p.ends_with('.'))
        }
        (HostPattern::Net(x), HostPattern::Net(y)) => x.contains(y),
        _ => false,
    };
    let ports = match (d.ports, a.ports) {
        // A deny rule without a port covers every port.
        (PortSpec::Default | PortSpec::Any, _) => true,
        (PortSpec::One(p), PortSpec::One(q)) => p == q,
        (PortSpec::One(p), PortSpec::Default) => default_ports == [p],
        (PortSpec::One(_), PortSpec::Any) => false,
    };
    hosts && ports
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        parse_rule(s).unwrap()
    }

    #[test]
    fn coverage() {
        assert!(covers(&rule("*.example.com"), &rule("a.example.com:443"), &[80, 443]));
        assert!(covers(&rule("*.example.com"), &rule("*.b.example.com"), &[80, 443]));
        assert!(!covers(&rule("*.example.com"), &rule("example.com"), &[80, 443]));
        assert!(!covers(&rule("a.example.com:443"), &rule("a.example.com"), &[80, 443]));
        assert!(covers(&rule("a.example.com:443"), &rule("a.example.com"), &[443]));
        assert!(covers(&rule("10.0.0.0/8"), &rule("10.1.0.0/16:*"), &[443]));
        assert!(!covers(&rule("*.xample.com"), &rule("a.example.com"), &[443]));
    }

    #[test]
    fn public_suffixes() {
        assert!(is_icann_suffix("com"));
        assert!(is_icann_suffix("co.uk"));
        assert!(!is_icann_suffix("example.com"));
        assert!(!is_icann_suffix("sandbox.internal"));
    }
}
