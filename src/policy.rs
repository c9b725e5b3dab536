//! Compiled sandbox policies and the decision function.
//!
//! Pure: no I/O, no tokio, no hyper. Live traffic, the dry-run CLI, shadow policies,
//! the revocation sweep, the fuzzers and the benches all decide with [`decide`] (host
//! decisions, the hot path, with [`Policy::decide`]).

pub mod budget;
pub mod claims;
pub mod decision;
pub mod explain;
pub mod git;
pub mod hosts;
pub mod net;
pub mod peers;
pub mod requests;
pub mod route;
pub mod rule;
pub mod subject;

use std::collections::HashMap;
use std::sync::Arc;

pub use decision::{Decision, DenyReason, Outcome, RuleList, RuleSource, Verdict};
pub use explain::{Answer, evaluate, explain, hint};
use git::{GitRuleError, GitRules};
use hosts::{HostEntry, HostRules};
use net::{NetEntry, NetRules};
use route::RouteRule;
pub use rule::{HostPattern, PortSpec, Rule, RuleError, parse_rule};
pub use subject::{GitAccess, Subject, parse_subject};

use crate::addr::{Host, Target};

/// `enforce` denies; `report` lets denied traffic through and logs `would_deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Enforce,
    Report,
}

#[derive(Debug, Default)]
struct RuleSet {
    hosts: HostRules,
    nets: NetRules,
}

/// One compiled policy.
#[derive(Debug)]
pub struct Policy {
    name: std::sync::Arc<str>,
    mode: Mode,
    default_ports: Vec<u16>,
    rules: Vec<RuleSource>,
    allow: RuleSet,
    deny: RuleSet,
    git: GitRules,
    vpce: Vec<String>,
    routes: Vec<RouteRule>,
    /// `allow_all = true`: the index of its rule source.
    allow_all: Option<usize>,
    peers: Vec<peers::PeerPattern>,
    accept_from: Vec<peers::PeerPattern>,
    budget: Option<Arc<budget::BudgetSpec>>,
    /// Hosts whose TLS is terminated so that their requests are decided one by one.
    inspect: RuleSet,
    requests: Vec<requests::RequestRule>,
}

/// Decides `subject` under `policy`: the one decision every path takes. `narrow` is a
/// signed token's `repos` claim (git repositories only; it never widens the policy).
/// Git and route decisions are always enforced, whatever the policy's mode: the
/// gateway adds its own credential there.
pub fn decide<'p>(policy: &'p Policy, subject: &Subject, narrow: Option<&[String]>) -> Decision<'p> {
    match subject {
        Subject::Host(t) => {
            let d = policy.decide(t);
            // An inspected host is reached: its requests are decided one by one.
            match d.verdict {
                Verdict::Deny { reason: DenyReason::HostNotAllowed | DenyReason::PortNotAllowed, .. } => {
                    match policy.inspects(t) {
                        Some(rule) => Decision { verdict: Verdict::Allow { rule }, report_only: d.report_only },
                        None => d,
                    }
                }
                _ => d,
            }
        }
        Subject::Request { target, method, path, headers } => match policy.inspects(target) {
            Some(_) => policy.decide_request(&target.host, method, path, headers),
            None => policy.decide(target),
        },
        Subject::Git { repo, access } => {
            let write = !matches!(access, GitAccess::Read);
            let repo_decision = policy.decide_git(repo, write, narrow);
            match access {
                GitAccess::Ref { name, delete } if repo_decision.reason().is_none() => policy.decide_ref(name, *delete),
                _ => repo_decision,
            }
        }
        Subject::Route { route, method, path } => policy.decide_route(route, method, path),
        Subject::Peer { sandbox, name, labels, accepted, address, .. } => match policy.denied(name) {
            // `deny` beats every allow, a peer agreement too.
            Some(rule) => Decision {
                verdict: Verdict::Deny { reason: DenyReason::HostDenied, rule: Some(rule) },
                report_only: false,
            },
            None => policy.decide_peer(sandbox, labels, *accepted && address.is_some()),
        },
    }
}

impl Policy {
    pub fn builder(name: &str, mode: Mode, default_ports: &[u16]) -> PolicyBuilder {
        PolicyBuilder {
            policy: Policy {
                name: name.into(),
                mode,
                default_ports: default_ports.to_vec(),
                rules: Vec::new(),
                allow: RuleSet::default(),
                deny: RuleSet::default(),
                git: GitRules::default(),
                vpce: Vec::new(),
                routes: Vec::new(),
                allow_all: None,
                peers: Vec::new(),
                accept_from: Vec::new(),
                budget: None,
                inspect: RuleSet::default(),
                requests: Vec::new(),
            },
        }
    }

    /// The `inspect` rule that names `target`, if the policy inspects it.
    pub fn inspects(&self, target: &Target) -> Option<&RuleSource> {
        if self.inspect.hosts.is_empty() && self.inspect.nets.is_empty() {
            return None;
        }
        self.first_match(&self.inspect, target, |p| self.allow_port_matches(p, target.port))
    }

    /// True when the policy inspects some host.
    pub fn inspects_any(&self) -> bool {
        !(self.inspect.hosts.is_empty() && self.inspect.nets.is_empty())
    }

    /// The request rules, in the order written.
    pub fn request_rules(&self) -> &[requests::RequestRule] {
        &self.requests
    }

    /// Whether a request inside an inspected host may be sent: `path` as sent (with
    /// its query). Deny rules beat allow rules; no match is a deny. A path that cannot
    /// be judged (traversal, encoded separators) is a bad request.
    pub fn decide_request(&self, host: &Host, method: &str, path: &str, headers: &[(String, String)]) -> Decision<'_> {
        let report_only = self.mode == Mode::Report;
        let (raw_path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        let Ok(decoded) = requests::normalize_path(raw_path) else {
            return Decision { verdict: Verdict::Deny { reason: DenyReason::BadRequest, rule: None }, report_only };
        };
        // A method named in the query (`_method=DELETE`, which Rails, Laravel and
        // Symfony run for a POST) is judged as well as the request line's: the request
        // is allowed only as both.
        for (k, m) in requests::query_pairs(query) {
            if !requests::is_method_name(k.as_bytes()) {
                continue;
            }
            let named = requests::named_method(&m);
            if !named.eq_ignore_ascii_case(method) {
                let d = self.decide_method(host, &named, &decoded, query, headers);
                if d.reason().is_some() {
                    return Decision { verdict: d.verdict, report_only };
                }
            }
        }
        self.decide_method(host, method, &decoded, query, headers)
    }

    /// [`Policy::decide_request`] for one method, on the decoded path.
    fn decide_method(
        &self,
        host: &Host,
        method: &str,
        decoded: &str,
        query: Option<&str>,
        headers: &[(String, String)],
    ) -> Decision<'_> {
        let report_only = self.mode == Mode::Report;
        let view = requests::RequestView { host, method, path: decoded, query, headers };
        let mut allowed = None;
        for r in self.requests.iter().filter(|r| r.matches(&view)) {
            let Some(rule) = self.rules.get(r.rule) else { continue };
            match r.action {
                requests::Action::Deny => {
                    return Decision {
                        verdict: Verdict::Deny { reason: DenyReason::RequestNotAllowed, rule: Some(rule) },
                        report_only,
                    };
                }
                requests::Action::Allow => {
                    allowed.get_or_insert(rule);
                }
            }
        }
        let verdict = match allowed {
            Some(rule) => Verdict::Allow { rule },
            None => Verdict::Deny { reason: DenyReason::RequestNotAllowed, rule: None },
        };
        Decision { verdict, report_only }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, shared (no allocation for a record or registry entry that keeps it).
    pub fn shared_name(&self) -> std::sync::Arc<str> {
        self.name.clone()
    }

    /// The policy's egress budget, if it has one.
    pub fn budget(&self) -> Option<&Arc<budget::BudgetSpec>> {
        self.budget.as_ref()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The names of the API routes this policy's sandboxes may use.
    pub fn routes(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|r| r.name.as_str())
    }

    /// True when the policy lists route `name`.
    pub fn lists_route(&self, name: &str) -> bool {
        self.routes.iter().any(|r| r.name == name)
    }

    /// True when route `name` is listed and allows `method`.
    pub fn route_allows_method(&self, name: &str, method: &str) -> bool {
        self.routes.iter().any(|r| r.name == name && r.allows_method(method))
    }

    /// The method a `_method` query field names on route `name` that its entry does
    /// not allow (`path` with its query), if any.
    pub fn route_refused_query_method(&self, name: &str, method: &str, path: &str) -> Option<String> {
        self.routes.iter().find(|r| r.name == name)?.refused_query_method(method, path)
    }

    /// Every method some route entry of this policy names.
    pub fn route_methods(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().flat_map(|r| r.methods.iter().map(String::as_str))
    }

    /// Whether a request may use API route `route`: listed by the policy, with a method
    /// and path (query allowed) its `[[routes]]` entry allows. Always enforced.
    pub fn decide_route(&self, route: &str, method: &str, path: &str) -> Decision<'_> {
        let deny = |reason, rule| Decision { verdict: Verdict::Deny { reason, rule }, report_only: false };
        let Some(r) = self.routes.iter().find(|r| r.name == route) else {
            return deny(DenyReason::RouteNotAllowed, None);
        };
        let Some(rule) = self.rules.get(r.rule) else { return deny(DenyReason::RouteNotAllowed, None) };
        if !r.allows_method(method) || r.refused_query_method(method, path).is_some() {
            return deny(DenyReason::RouteNotAllowed, Some(rule));
        }
        let path = explain::path_only(path);
        if route::is_traversal(path) {
            return deny(DenyReason::BadRequest, Some(rule));
        }
        if !r.allows_path(path) {
            return deny(DenyReason::RouteNotAllowed, Some(rule));
        }
        Decision { verdict: Verdict::Allow { rule }, report_only: false }
    }

    /// VPC endpoint ids this policy's sandboxes must come through (empty: any).
    pub fn vpce(&self) -> &[String] {
        &self.vpce
    }

    /// The ports a host rule without `:PORT` allows.
    pub fn default_ports(&self) -> &[u16] {
        &self.default_ports
    }

    pub fn rules(&self) -> &[RuleSource] {
        &self.rules
    }

    /// Decides whether `target` may be reached. Deny rules beat allow rules; no match
    /// is a deny. The decision names the rule that matched.
    pub fn decide(&self, target: &Target) -> Decision<'_> {
        Decision { verdict: self.verdict(target), report_only: self.mode == Mode::Report }
    }

    /// Whether `repo` (`owner/name`) may be read, or written when `write`. A signed
    /// token's `repos` claim may narrow the policy (`narrow`); it can never widen it.
    ///
    /// Always enforced, whatever the policy's mode: the git route adds the gateway's
    /// own GitHub credential, and report mode must never lend it for something the
    /// policy refuses.
    pub fn decide_git(&self, repo: &str, write: bool, narrow: Option<&[String]>) -> Decision<'_> {
        let verdict = match self.git.repo_rule(repo).and_then(|i| self.rules.get(i)) {
            None => Verdict::Deny { reason: DenyReason::RepoNotConnected, rule: None },
            Some(_) if narrow.is_some_and(|n| !n.iter().any(|r| r.eq_ignore_ascii_case(repo))) => {
                Verdict::Deny { reason: DenyReason::RepoNotConnected, rule: None }
            }
            Some(rule) if write && !self.git.push_enabled() => {
                Verdict::Deny { reason: DenyReason::GitWriteDenied, rule: Some(rule) }
            }
            Some(rule) => Verdict::Allow { rule },
        };
        Decision { verdict, report_only: false }
    }

    /// Whether a push may update `refname` (`delete` when the new value is zero).
    /// Always enforced, like [`Policy::decide_git`].
    pub fn decide_ref(&self, refname: &str, delete: bool) -> Decision<'_> {
        let verdict = match self.git.push_rule(refname).and_then(|i| self.rules.get(i)) {
            Some(rule) if delete && !self.git.allow_delete => {
                Verdict::Deny { reason: DenyReason::GitRefDenied, rule: Some(rule) }
            }
            Some(rule) => Verdict::Allow { rule },
            None => Verdict::Deny { reason: DenyReason::GitRefDenied, rule: None },
        };
        Decision { verdict, report_only: false }
    }

    /// Whether this policy's sandboxes may reach the peer sandbox `id` (with `labels`);
    /// `accepted`: the peer's own policy accepts them. Both must hold. Always enforced:
    /// a peer is a private address the gateway dials as an exception to `egress.deny`.
    pub fn decide_peer(&self, id: &str, labels: &[String], accepted: bool) -> Decision<'_> {
        let verdict = match peers::first_match(&self.peers, id, labels).and_then(|p| self.rules.get(p.rule)) {
            None => Verdict::Deny { reason: DenyReason::PeerNotAllowed, rule: None },
            Some(rule) if !accepted => Verdict::Deny { reason: DenyReason::PeerNotAllowed, rule: Some(rule) },
            Some(rule) => Verdict::Allow { rule },
        };
        Decision { verdict, report_only: false }
    }

    /// Whether this policy's sandboxes accept connections from sandbox `id` (`labels`).
    pub fn accepts(&self, id: &str, labels: &[String]) -> bool {
        peers::first_match(&self.accept_from, id, labels).is_some()
    }

    /// `allow_all = true`.
    pub fn allows_all(&self) -> bool {
        self.allow_all.is_some()
    }

    pub fn allows_ref_deletion(&self) -> bool {
        self.git.allow_delete
    }

    /// The `deny` rule that names `target`, if any.
    fn denied(&self, target: &Target) -> Option<&RuleSource> {
        self.first_match(&self.deny, target, |p| deny_port_matches(p, target.port))
    }

    fn verdict(&self, target: &Target) -> Verdict<'_> {
        let port = target.port;
        if let Some(rule) = self.denied(target) {
            return Verdict::Deny { reason: DenyReason::HostDenied, rule: Some(rule) };
        }
        if let Some(rule) = self.first_match(&self.allow, target, |p| self.allow_port_matches(p, port)) {
            return Verdict::Allow { rule };
        }
        if let Some(rule) = self.allow_all.and_then(|i| self.rules.get(i)) {
            return Verdict::Allow { rule };
        }
        // The host is listed but not on this port: say so, naming the rule.
        if let Some(rule) = self.first_match(&self.allow, target, |_| true) {
            return Verdict::Deny { reason: DenyReason::PortNotAllowed, rule: Some(rule) };
        }
        Verdict::Deny { reason: DenyReason::HostNotAllowed, rule: None }
    }

    fn first_match(&self, set: &RuleSet, target: &Target, port_ok: impl Fn(PortSpec) -> bool) -> Option<&RuleSource> {
        let idx = match &target.host {
            Host::Name(name) => set.hosts.matching(name).find(|e| port_ok(e.ports)).map(|e| e.rule),
            Host::Ip(ip) => set.nets.matching(*ip).find(|e| port_ok(e.ports)).map(|e| e.rule),
        };
        idx.and_then(|i| self.rules.get(i))
    }

    fn allow_port_matches(&self, spec: PortSpec, port: u16) -> bool {
        match spec {
            PortSpec::Default => self.default_ports.contains(&port),
            PortSpec::Any => true,
            PortSpec::One(p) => p == port,
        }
    }
}

fn deny_port_matches(spec: PortSpec, port: u16) -> bool {
    match spec {
        PortSpec::Default | PortSpec::Any => true,
        PortSpec::One(p) => p == port,
    }
}

/// Adds rules to a policy under construction.
pub struct PolicyBuilder {
    policy: Policy,
}

impl PolicyBuilder {
    pub fn budget(&mut self, spec: budget::BudgetSpec) {
        self.policy.budget = Some(Arc::new(spec));
    }

    /// Adds one `git.repos` (`OWNER/REPO` glob) or `git.push` (ref glob) rule.
    pub fn add_git(&mut self, list: RuleList, text: &str, location: &str) -> Result<(), GitRuleError> {
        let idx = self.policy.rules.len();
        match list {
            RuleList::GitPush => self.policy.git.add_push(text, idx)?,
            _ => self.policy.git.add_repo(text, idx)?,
        }
        self.policy.rules.push(RuleSource::new(list, text, location));
        Ok(())
    }

    /// Lets the policy's sandboxes use API route `name`, with the methods (upper case)
    /// and path prefixes its `[[routes]]` entry allows (empty: any).
    pub fn add_route(&mut self, name: &str, methods: &[String], paths: &[String], location: &str) {
        let rule = self.policy.rules.len();
        self.policy.rules.push(RuleSource::new(RuleList::Routes, name, location));
        self.policy.routes.push(RouteRule {
            name: name.to_string(),
            methods: methods.to_vec(),
            paths: paths.to_vec(),
            rule,
        });
    }

    /// Binds the policy's sandboxes to these VPC endpoints (PROXY protocol v2 TLV).
    pub fn require_vpce(&mut self, vpce: Vec<String>) {
        self.policy.vpce = vpce;
    }

    /// `allow_all = true`: every destination but what `deny` (and `egress.deny`)
    /// refuses, on any port.
    pub fn allow_all(&mut self, location: &str) {
        let idx = self.policy.rules.len();
        self.policy.rules.push(RuleSource::new(RuleList::AllowAll, "allow_all", location));
        self.policy.allow_all = Some(idx);
    }

    /// Adds one `peers` or `accept_from` pattern.
    pub fn add_peer(&mut self, list: RuleList, text: &str, location: &str) -> Result<(), String> {
        let idx = self.policy.rules.len();
        let pattern = peers::PeerPattern::new(text, idx)?;
        self.policy.rules.push(RuleSource::new(list, text, location));
        match list {
            RuleList::AcceptFrom => self.policy.accept_from.push(pattern),
            _ => self.policy.peers.push(pattern),
        }
        Ok(())
    }

    /// Adds one `inspect` host (a host rule: `api.github.com`, `*.googleapis.com:443`).
    pub fn add_inspect(&mut self, text: &str, location: &str) -> Result<(), RuleError> {
        self.add(RuleList::Inspect, text, location)
    }

    /// Adds one `[[requests]]` rule; the error names the key at fault.
    pub fn add_request(&mut self, spec: &requests::RequestSpec<'_>, location: &str) -> Result<(), (String, String)> {
        let idx = self.policy.rules.len();
        let compiled = requests::RequestRule::compile(spec, idx)?;
        self.policy.rules.push(RuleSource::new(RuleList::Requests, &requests::describe(spec), location));
        self.policy.requests.push(compiled);
        Ok(())
    }

    /// Lets pushes delete refs that `git.push` matches.
    pub fn allow_ref_deletion(&mut self, allow: bool) {
        self.policy.git.allow_delete = allow;
    }

    /// Parses and adds one host rule (`allow`, `deny` or `inspect`). `location` is
    /// `file:line`.
    pub fn add(&mut self, list: RuleList, text: &str, location: &str) -> Result<(), RuleError> {
        let rule = parse_rule(text)?;
        let idx = self.policy.rules.len();
        self.policy.rules.push(RuleSource::new(list, text, location));
        let set = match list {
            RuleList::Deny => &mut self.policy.deny,
            RuleList::Inspect => &mut self.policy.inspect,
            _ => &mut self.policy.allow,
        };
        let entry = HostEntry { ports: rule.ports, rule: idx };
        match rule.pattern {
            HostPattern::Exact(name) => set.hosts.add_exact(&name, entry),
            HostPattern::Suffix(suffix) => set.hosts.add_suffix(&suffix, entry),
            HostPattern::Net(net) => set.nets.add(NetEntry { net, ports: rule.ports, rule: idx }),
        }
        Ok(())
    }

    pub fn build(self) -> Policy {
        self.policy
    }
}

/// A sandbox: its id, how it authenticates and which policy governs it.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: std::sync::Arc<str>,
    /// SHA-256 of the sandbox's static token.
    pub token_sha256: [u8; 32],
    pub policy: Arc<Policy>,
    /// VPC endpoint ids this sandbox must come through (empty: the policy's).
    pub vpce: Vec<String>,
    /// Source networks that identify it without a token.
    pub addresses: Vec<ipnet::IpNet>,
    /// Labels other policies' `peers` and `accept_from` may match.
    pub labels: Vec<String>,
}

impl Sandbox {
    /// The VPC endpoints it must come through under `policy` (empty: any): its own
    /// `vpce` when it lists one, else the policy's.
    pub fn vpce_under<'a>(&'a self, policy: &'a Policy) -> &'a [String] {
        if self.vpce.is_empty() { policy.vpce() } else { &self.vpce }
    }
}

/// The sandbox id a peer name (`ID.SUFFIX`, any case) names.
pub fn peer_id<'t>(target: &'t Target, suffix: &str) -> Option<&'t str> {
    if suffix.is_empty() {
        return None;
    }
    let name = target.host.as_name()?;
    let id = name.strip_suffix(suffix)?.strip_suffix('.')?;
    (!id.is_empty()).then_some(id)
}

/// Every policy and sandbox known to the gateway at one generation.
#[derive(Debug, Default)]
pub struct PolicySet {
    pub policies: HashMap<String, Arc<Policy>>,
    pub sandboxes: HashMap<String, Sandbox>,
    /// Which sandbox a source address belongs to (`sandboxes[].addresses`).
    pub claims: claims::Claims,
    /// Sandboxes reach each other as `ID.SUFFIX` (`egress.peer_suffix`).
    pub peer_suffix: String,
    /// Lowercase id -> id, for ids written with capitals (peer names are lowercase;
    /// ids are unique regardless of case).
    pub ids_by_lowercase: HashMap<String, String>,
}

impl PolicySet {
    pub fn sandbox(&self, id: &str) -> Option<&Sandbox> {
        self.sandboxes.get(id)
    }

    /// The VPC endpoints `sandbox`, under `policy`, must come through (empty: any): a
    /// sandbox listed with its own `vpce` stays bound to it whatever credential it
    /// presents; otherwise its policy's.
    pub fn vpce_binding<'a>(&'a self, sandbox: &str, policy: &'a Policy) -> &'a [String] {
        match self.sandbox(sandbox) {
            Some(sbx) => sbx.vpce_under(policy),
            None => policy.vpce(),
        }
    }

    /// The sandbox whose `addresses` hold `ip`.
    pub fn sandbox_at(&self, ip: std::net::IpAddr) -> Option<&Sandbox> {
        self.claims.sandbox_at(ip).and_then(|id| self.sandboxes.get(id))
    }

    /// What sandbox `caller` asks for when it names `target`: a peer when the name is
    /// `ID.SUFFIX` (with the callee's half of the agreement judged here), else the
    /// host itself.
    pub fn subject_for(&self, caller: &str, target: &Target) -> Subject {
        let Some(callee) = peer_id(target, &self.peer_suffix) else { return Subject::Host(target.clone()) };
        let caller_labels = self.sandboxes.get(caller).map_or(&[][..], |s| s.labels.as_slice());
        // The subject names the peer as asked: a refusal says nothing of whether the
        // sandbox exists, or how its id is written.
        match self.peer(callee) {
            Some(peer) => Subject::Peer {
                sandbox: callee.to_string(),
                name: target.clone(),
                labels: peer.labels.clone(),
                port: target.port,
                accepted: peer.policy.accepts(caller, caller_labels),
                address: self.peer_address(callee),
            },
            None => Subject::Peer {
                sandbox: callee.to_string(),
                name: target.clone(),
                labels: Vec::new(),
                port: target.port,
                accepted: false,
                address: None,
            },
        }
    }

    /// The sandbox a peer name's id means: ids are unique regardless of case (a load
    /// error otherwise), and names are lowercase.
    fn peer(&self, id: &str) -> Option<&Sandbox> {
        self.sandboxes.get(id).or_else(|| self.sandboxes.get(self.ids_by_lowercase.get(id)?))
    }

    /// The one address sandbox `id` can be reached at: its single-host `addresses`
    /// claim. A sandbox that claims a wider network, or several, has none.
    pub fn peer_address(&self, id: &str) -> Option<std::net::IpAddr> {
        match self.peer(id)?.addresses.as_slice() {
            [one] if one.prefix_len() == one.max_prefix_len() => Some(one.addr()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::parse_authority;

    fn policy(mode: Mode, allow: &[&str], deny: &[&str]) -> Policy {
        let mut b = Policy::builder("p", mode, &[80, 443]);
        for a in allow {
            b.add(RuleList::Allow, a, "test").unwrap();
        }
        for d in deny {
            b.add(RuleList::Deny, d, "test").unwrap();
        }
        b.build()
    }

    fn decide(p: &Policy, target: &str) -> (&'static str, Option<DenyReason>, Option<String>) {
        let t = parse_authority(target, None).unwrap();
        let d = p.decide(&t);
        (d.outcome().as_str(), d.reason(), d.rule().map(|r| r.text.to_string()))
    }

    #[test]
    fn allow_deny_and_ports() {
        let p = policy(
            Mode::Enforce,
            &[
                "pypi.org",
                "files.pythonhosted.org",
                "*.githubusercontent.com:443",
                "alt.example:*",
                "198.51.100.0/24:8443",
            ],
            &["upload.pypi.org", "*.evil.githubusercontent.com"],
        );
        assert_eq!(decide(&p, "pypi.org:443"), ("allow", None, Some("pypi.org".into())));
        assert_eq!(decide(&p, "pypi.org:80").0, "allow");
        assert_eq!(decide(&p, "pypi.org:22"), ("deny", Some(DenyReason::PortNotAllowed), Some("pypi.org".into())));
        assert_eq!(decide(&p, "upload.pypi.org:443").1, Some(DenyReason::HostDenied));
        assert_eq!(decide(&p, "raw.githubusercontent.com:443").0, "allow");
        assert_eq!(decide(&p, "raw.githubusercontent.com:80").1, Some(DenyReason::PortNotAllowed));
        assert_eq!(decide(&p, "githubusercontent.com:443").1, Some(DenyReason::HostNotAllowed));
        assert_eq!(
            decide(&p, "x.evil.githubusercontent.com:443"),
            ("deny", Some(DenyReason::HostDenied), Some("*.evil.githubusercontent.com".into()))
        );
        assert_eq!(decide(&p, "alt.example:9999").0, "allow");
        assert_eq!(decide(&p, "198.51.100.7:8443").0, "allow");
        assert_eq!(decide(&p, "198.51.100.7:443").1, Some(DenyReason::PortNotAllowed));
        assert_eq!(decide(&p, "[::ffff:198.51.100.7]:8443").0, "allow");
        assert_eq!(decide(&p, "example.com:443").1, Some(DenyReason::HostNotAllowed));
    }

    #[test]
    fn deny_beats_allow_and_ip_rules_match_only_literals() {
        let p = policy(Mode::Enforce, &["a.example.com", "203.0.113.7:443"], &["a.example.com:443"]);
        assert_eq!(decide(&p, "a.example.com:443").1, Some(DenyReason::HostDenied));
        assert_eq!(decide(&p, "a.example.com:80").0, "allow");
        assert_eq!(decide(&p, "203.0.113.7:443").0, "allow");
        assert_eq!(decide(&p, "203.0.113.8:443").1, Some(DenyReason::HostNotAllowed));
    }

    #[test]
    fn git_repos_writes_refs_and_narrowing() {
        let mut b = Policy::builder("g", Mode::Enforce, &[443]);
        b.add_git(RuleList::GitRepos, "acme/widgets", "t:1").unwrap();
        b.add_git(RuleList::GitRepos, "acme/tools-*", "t:2").unwrap();
        let read_only = b.build();
        assert_eq!(read_only.decide_git("acme/widgets", false, None).outcome(), Outcome::Allow);
        assert_eq!(read_only.decide_git("acme/other", false, None).reason(), Some(DenyReason::RepoNotConnected));
        assert_eq!(read_only.decide_git("acme/widgets", true, None).reason(), Some(DenyReason::GitWriteDenied));

        let mut b = Policy::builder("g", Mode::Enforce, &[443]);
        b.add_git(RuleList::GitRepos, "acme/*", "t:1").unwrap();
        b.add_git(RuleList::GitPush, "refs/heads/agent/*", "t:2").unwrap();
        let p = b.build();
        assert_eq!(p.decide_git("acme/widgets", true, None).outcome(), Outcome::Allow);
        let narrow = vec!["acme/tools".to_string()];
        assert_eq!(p.decide_git("acme/widgets", false, Some(&narrow)).reason(), Some(DenyReason::RepoNotConnected));
        assert_eq!(p.decide_git("ACME/Tools", false, Some(&narrow)).outcome(), Outcome::Allow);
        assert_eq!(p.decide_ref("refs/heads/agent/x", false).outcome(), Outcome::Allow);
        assert_eq!(p.decide_ref("refs/heads/main", false).reason(), Some(DenyReason::GitRefDenied));
        assert_eq!(p.decide_ref("refs/heads/agent/x", true).reason(), Some(DenyReason::GitRefDenied));
    }

    #[test]
    fn routes_methods_paths_and_traversal() {
        let mut b = Policy::builder("r", Mode::Enforce, &[443]);
        b.add_route("api", &["GET".to_string()], &["/v1/".to_string(), "/health".to_string()], "t:3");
        let p = b.build();
        let route = |m: &str, path: &str| {
            let s = Subject::Route { route: "api".into(), method: m.into(), path: path.into() };
            let d = super::decide(&p, &s, None);
            (d.outcome(), d.reason(), d.rule().map(|r| r.location.clone()))
        };
        assert_eq!(route("GET", "/v1/models?x=1"), (Outcome::Allow, None, Some("t:3".into())));
        assert_eq!(route("GET", "/health"), (Outcome::Allow, None, Some("t:3".into())));
        assert_eq!(route("GET", "/healthz").1, Some(DenyReason::RouteNotAllowed));
        assert_eq!(route("POST", "/v1/models").1, Some(DenyReason::RouteNotAllowed));
        assert_eq!(route("GET", "/v1/../admin").1, Some(DenyReason::BadRequest));
        assert_eq!(route("GET", "/v1/%2E%2e/admin").1, Some(DenyReason::BadRequest));
        for tricky in [
            "/v1/%252e%252e/admin",
            "/v1/%c0%ae%c0%ae/admin",
            "/v1/..%5cadmin",
            "/v1/a%2F%2Fb",
            // IIS's %u, fullwidth dots (NFKC), and `.` segments, as written or encoded.
            "/v1/%u002e%u002e/admin",
            "/v1/%25u002e%25U002E/admin",
            "/v1/%EF%BC%8E%EF%BC%8E/admin",
            "/v1/\u{ff0e}\u{ff0e}/admin",
            "/v1/\u{2025}/admin",
            "/v1/.\u{2024}/admin",
            "/v1/\u{fe52}\u{fe52}/admin",
            "/v1/\u{fe30}/admin",
            "/v1/\u{2026}/admin",
            "/v1/a\u{fe68}admin",
            "/v1/%25E2%2580%25A5/admin",
            "/v1/./x",
            "/v1/%2e/x",
            "/v1/x/.",
        ] {
            assert_eq!(route("GET", tricky).1, Some(DenyReason::BadRequest), "{tricky}");
        }
        assert_eq!(route("GET", "/v1/a%20b").0, Outcome::Allow);
        let other = Subject::Route { route: "other".into(), method: "GET".into(), path: "/".into() };
        assert_eq!(super::decide(&p, &other, None).rule(), None);
        let hint = explain::explain(
            "s",
            &p,
            None,
            &Subject::Route { route: "api".into(), method: "DELETE".into(), path: "/v1/x".into() },
        )
        .hint;
        assert_eq!(hint.as_deref(), Some("method DELETE is not allowed on route api"));
    }

    #[test]
    fn allow_all_and_peers() {
        let mut b = Policy::builder("open", Mode::Enforce, &[80, 443]);
        b.add(RuleList::Deny, "evil.example", "t:2").unwrap();
        b.allow_all("t:1");
        let open = b.build();
        assert_eq!(decide(&open, "anything.example:8443"), ("allow", None, Some("allow_all".into())));
        assert_eq!(decide(&open, "evil.example:443").1, Some(DenyReason::HostDenied));

        let mut b = Policy::builder("p", Mode::Report, &[443]);
        b.add_peer(RuleList::Peers, "team-a/*", "t:3").unwrap();
        b.add_peer(RuleList::AcceptFrom, "sbx-runner", "t:4").unwrap();
        assert!(b.add_peer(RuleList::Peers, "bad pattern", "t:5").is_err());
        b.add(RuleList::Deny, "sbx-secret.sandboxes.internal", "t:6").unwrap();
        b.add(RuleList::Deny, "*.sandboxes.internal:22", "t:7").unwrap();
        let p = b.build();
        let peer_at = |id: &str, label: &str, accepted: bool, port: u16| {
            let address = Some(std::net::IpAddr::from([10, 0, 0, 3]));
            let name = format!("{id}.sandboxes.internal:{port}").parse().unwrap();
            let s = Subject::Peer { sandbox: id.into(), name, labels: vec![label.into()], port, accepted, address };
            let d = super::decide(&p, &s, None);
            (d.outcome(), d.rule().map(|r| r.location.clone()))
        };
        // `deny` beats a peer agreement, by name and by port.
        assert_eq!(peer_at("sbx-secret", "team-a/db", true, 5432), (Outcome::Deny, Some("t:6".into())));
        assert_eq!(peer_at("sbx-db", "team-a/db", true, 22), (Outcome::Deny, Some("t:7".into())));
        let peer = |id: &str, label: &str, accepted: bool| peer_at(id, label, accepted, 5432);
        // Report mode never lets a peer through: both sides must agree.
        assert_eq!(peer("sbx-db", "team-a/db", true), (Outcome::Allow, Some("t:3".into())));
        assert_eq!(peer("sbx-db", "team-a/db", false), (Outcome::Deny, Some("t:3".into())));
        assert_eq!(peer("sbx-db", "team-b/db", true), (Outcome::Deny, None));
        assert!(p.accepts("sbx-runner", &[]) && !p.accepts("sbx-other", &["team-a/x".into()]));
    }

    #[test]
    fn report_mode_permits_and_labels() {
        let p = policy(Mode::Report, &["a.com"], &[]);
        let t = parse_authority("b.com:443", None).unwrap();
        let d = p.decide(&t);
        assert!(d.permits());
        // Git and route decisions ignore report mode.
        assert_eq!(
            super::decide(&p, &Subject::Route { route: "r".into(), method: "GET".into(), path: "/".into() }, None)
                .outcome(),
            Outcome::Deny
        );
        assert_eq!(d.outcome(), Outcome::WouldDeny);
        assert_eq!(d.reason(), Some(DenyReason::HostNotAllowed));
    }
}
