//! "May sandbox S reach X, and by which rule?": a decision with its rule, the rule's
//! file and line, and the smallest change that would allow it. What `check`, `policy
//! test` and `replay` print, and the hint every live refusal carries. Pure.

use super::subject::{GitAccess, Subject};
use super::{Decision, DenyReason, Outcome, Policy, PolicySet, RuleList, decide};

/// The answer, as `check` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Answer {
    pub sandbox: String,
    pub policy: Option<String>,
    pub target: String,
    /// `allow`, `deny` or `would_deny` (report mode: let through).
    pub decision: Outcome,
    pub reason: Option<&'static str>,
    pub rule: Option<String>,
    /// `allow`, `deny`, `git.repos`, `git.push` or `routes`: the list the rule is in.
    pub rule_list: Option<&'static str>,
    pub rule_location: Option<String>,
    pub hint: Option<String>,
}

impl Answer {
    /// True when the gateway would let the traffic through.
    pub fn permits(&self) -> bool {
        self.decision.permits()
    }
}

/// Decides `subject` for `sandbox` under `policy`, with a signed token's `repos` claim
/// (`narrow`) when there is one.
pub fn explain(sandbox: &str, policy: &Policy, narrow: Option<&[String]>, subject: &Subject) -> Answer {
    // A request to a host the policy does not inspect is decided (and shown) as the
    // host: the tunnel is opaque.
    let host;
    let subject = match subject {
        Subject::Request { target, .. } if policy.inspects(target).is_none() => {
            host = Subject::Host(target.clone());
            &host
        }
        other => other,
    };
    let decision = decide(policy, subject, narrow);
    Answer {
        sandbox: sandbox.to_string(),
        policy: Some(policy.name().to_string()),
        target: subject.to_string(),
        decision: decision.outcome(),
        reason: decision.reason().map(DenyReason::code),
        rule: decision.rule().map(|r| r.text.to_string()),
        rule_list: decision.rule().map(|r| r.list.key()),
        rule_location: decision.rule().map(|r| r.location.clone()).filter(|l| !l.is_empty()),
        hint: decision.reason().and_then(|r| hint(policy, r, subject, &decision)),
    }
}

/// Decides `subject` for sandbox `sandbox_id` under `set`.
pub fn evaluate(set: &PolicySet, sandbox_id: &str, subject: &Subject) -> Answer {
    let peer;
    let subject = match subject {
        Subject::Host(t) | Subject::Request { target: t, .. } if super::peer_id(t, &set.peer_suffix).is_some() => {
            peer = set.subject_for(sandbox_id, t);
            &peer
        }
        other => other,
    };
    match set.sandbox(sandbox_id) {
        Some(sbx) => explain(sandbox_id, &sbx.policy, None, subject),
        None => Answer {
            sandbox: sandbox_id.to_string(),
            policy: None,
            target: subject.to_string(),
            decision: Outcome::Deny,
            reason: Some(DenyReason::AuthInvalid.code()),
            rule: None,
            rule_list: None,
            rule_location: None,
            hint: Some(format!("no sandbox {sandbox_id:?} is defined in the policy files")),
        },
    }
}

/// The smallest change that would allow a denied subject, or what denies it.
pub fn hint(policy: &Policy, reason: DenyReason, subject: &Subject, decision: &Decision<'_>) -> Option<String> {
    let name = policy.name();
    let rule_at = |d: &Decision<'_>| {
        d.rule().map(|r| if r.location.is_empty() { format!("{r}") } else { format!("{r} at {}", r.location) })
    };
    match (reason, subject) {
        (DenyReason::HostNotAllowed | DenyReason::PortNotAllowed, Subject::Host(t)) => {
            let rule = if reason == DenyReason::HostNotAllowed && policy.default_ports().contains(&t.port) {
                t.host.to_string()
            } else {
                t.to_string()
            };
            Some(format!("to allow it, add \"{rule}\" to policies.{name}.allow"))
        }
        (DenyReason::HostDenied, _) => rule_at(decision).map(|r| format!("denied by {r}")),
        (DenyReason::RepoNotConnected, Subject::Git { repo, .. }) => {
            Some(format!("to connect it, add \"{repo}\" to policies.{name}.{}", RuleList::GitRepos.key()))
        }
        (DenyReason::GitWriteDenied, _) => {
            Some(format!("pushes need ref patterns in policies.{name}.{}", RuleList::GitPush.key()))
        }
        (DenyReason::GitRefDenied, Subject::Git { access: GitAccess::Ref { name: r, delete }, .. }) => {
            if *delete && !policy.allows_ref_deletion() && decision.rule().is_some() {
                Some(format!("deleting {r} is not allowed (git.allow_delete)"))
            } else {
                Some(format!(
                    "{r} is not in git.push; to allow it, add \"{r}\" to policies.{name}.{}",
                    RuleList::GitPush.key()
                ))
            }
        }
        (DenyReason::RouteNotAllowed, Subject::Route { route, method, path }) => Some(match decision.rule() {
            None => format!("policy {name} does not list route {route:?} (policies.NAME.routes)"),
            Some(_) if !policy.route_allows_method(route, method) => {
                format!("method {method} is not allowed on route {route}")
            }
            Some(_) if let Some(named) = policy.route_refused_query_method(route, method, path) => format!(
                "the query field _method={named} asks the API to run this {method} as {named}, which route \
                 {route} does not allow"
            ),
            Some(_) => match path_only(path) {
                "" => format!("an empty path is not allowed on route {route}"),
                p => format!("path {p} is not allowed on route {route}"),
            },
        }),
        (DenyReason::BadRequest, Subject::Route { .. }) => Some("path traversal is not allowed".into()),
        (DenyReason::BadRequest, Subject::Request { .. }) => {
            Some("the path climbs or encodes a separator (.., //, %2F): it cannot be judged".into())
        }
        (DenyReason::RequestNotAllowed, Subject::Request { target, method, path, .. }) => Some(match decision.rule() {
            Some(r) => format!("denied by {r}{}", at(&r.location)),
            None => format!(
                "{} is inspected: no request rule allows {method} {}; to allow it, add [[policies.{name}.requests]] \
                 host = \"{}\" methods = [\"{method}\"] paths = [\"{}\"] action = \"allow\"",
                target.host,
                path_only(path),
                target.host,
                path_only(path)
            ),
        }),
        (DenyReason::PeerNotAllowed, Subject::Peer { sandbox, .. }) => Some(match decision.rule() {
            None => {
                format!("to allow it, add \"{sandbox}\" to policies.{name}.peers (and the caller to its accept_from)")
            }
            Some(_) => {
                format!("sandbox {sandbox} does not accept this sandbox: its policy's accept_from must match it")
            }
        }),
        _ => None,
    }
}

fn at(location: &str) -> String {
    if location.is_empty() { String::new() } else { format!(" at {location}") }
}

/// The path without its query.
pub(crate) fn path_only(path: &str) -> &str {
    path.split('?').next().unwrap_or("/")
}
