//! "May sandbox S reach X, and by which rule?": the shared core of `check`,
//! `policy test` and `policy replay`. Pure: it calls the same decision functions that
//! serve traffic, and does no I/O.

use crate::addr::{self, Target};
use crate::policy::{Decision, DenyReason, Policy, PolicySet, RuleList};

/// What is being asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A CONNECT or absolute-form destination.
    Host(Target),
    /// A repository on the git route; `push` names the ref for a push.
    Git { repo: String, push: Option<String> },
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Host(t) => write!(f, "{t}"),
            Subject::Git { repo, push: None } => write!(f, "git {repo} (read)"),
            Subject::Git { repo, push: Some(r) } => write!(f, "git {repo} (push {r})"),
        }
    }
}

/// Hosts whose `/OWNER/REPO` URLs are git repositories for the git route.
pub const GIT_HOSTS: &[&str] = &["github.com"];

/// Parses a target as written on the command line or in a test file: `host:port`, a
/// URL (`https://pypi.org/simple/`), or a git URL (`https://github.com/acme/widgets.git`);
/// `push` (a ref) makes it a git push.
pub fn parse_subject(target: &str, push: Option<&str>) -> Result<Subject, String> {
    let Some((scheme, rest)) = target.split_once("://") else {
        if push.is_some() {
            return Err("--push needs a git URL such as https://github.com/OWNER/REPO.git".into());
        }
        return addr::parse_authority(target, None)
            .map(Subject::Host)
            .map_err(|e| format!("invalid target {target:?}: {e} (write host:port or a URL)"));
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        other => return Err(format!("unsupported URL scheme {other:?} (use http or https)")),
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let host = addr::parse_authority(authority, Some(default_port))
        .map_err(|e| format!("invalid URL authority {authority:?}: {e}"))?;
    let repo = repo_of(path);
    let is_git_host = host.host.as_name().is_some_and(|n| GIT_HOSTS.contains(&n));
    match repo {
        Some(repo) if is_git_host && (push.is_some() || path.ends_with(".git") || path.contains(".git/")) => {
            Ok(Subject::Git { repo, push: push.map(str::to_string) })
        }
        _ if push.is_some() => Err(format!("--push needs a git URL on {}", GIT_HOSTS.join(", "))),
        _ => Ok(Subject::Host(host)),
    }
}

fn repo_of(path: &str) -> Option<String> {
    let mut parts = path.trim_start_matches('/').split('/');
    let owner = parts.next().filter(|s| !s.is_empty())?;
    let repo = parts.next().filter(|s| !s.is_empty())?;
    let repo = repo.strip_suffix(".git").unwrap_or(repo);
    Some(format!("{owner}/{repo}"))
}

/// The answer, as `check` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Answer {
    pub sandbox: String,
    pub policy: Option<String>,
    pub target: String,
    /// `allow`, `deny` or `would_deny` (report mode: let through).
    pub decision: &'static str,
    pub reason: Option<&'static str>,
    pub rule: Option<String>,
    /// `allow`, `deny`, `git.repos` or `git.push`: the list the rule is in.
    pub rule_list: Option<&'static str>,
    pub rule_location: Option<String>,
    pub hint: Option<String>,
}

impl Answer {
    /// True when the gateway would let the traffic through.
    pub fn permits(&self) -> bool {
        self.decision != "deny"
    }
}

/// Decides `subject` for an authenticated identity (a signed token's policy and
/// `repos` narrowing included).
pub fn evaluate_identity(identity: &crate::auth::Identity, subject: &Subject) -> Answer {
    let policy = &identity.policy;
    let decision = decide_narrowed(policy, subject, identity.repos.as_deref());
    answer_for(&identity.sandbox, policy, subject, &decision)
}

fn answer_for(sandbox: &str, policy: &Policy, subject: &Subject, decision: &Decision<'_>) -> Answer {
    Answer {
        sandbox: sandbox.to_string(),
        policy: Some(policy.name().to_string()),
        target: subject.to_string(),
        decision: decision.label(),
        reason: decision.reason().map(DenyReason::code),
        rule: decision.rule().map(|r| r.text.clone()),
        rule_list: decision.rule().map(|r| r.list.key()),
        rule_location: decision.rule().map(|r| r.location.clone()).filter(|l| !l.is_empty()),
        hint: decision.reason().and_then(|r| hint(policy, r, subject, decision)),
    }
}

/// Decides `subject` for sandbox `sandbox_id` under `set`.
pub fn evaluate(set: &PolicySet, sandbox_id: &str, subject: &Subject) -> Answer {
    let mut answer = Answer {
        sandbox: sandbox_id.to_string(),
        policy: None,
        target: subject.to_string(),
        decision: "deny",
        reason: Some(DenyReason::AuthInvalid.code()),
        rule: None,
        rule_list: None,
        rule_location: None,
        hint: Some(format!("no sandbox {sandbox_id:?} is defined in the policy files")),
    };
    let Some(sbx) = set.sandbox(sandbox_id) else {
        answer.hint = Some(format!("no sandbox {sandbox_id:?} is defined in the policy files"));
        return answer;
    };
    answer_for(sandbox_id, &sbx.policy, subject, &decide(&sbx.policy, subject))
}

/// The decision the gateway makes for `subject`: for a push, the repository decision
/// first, then the ref.
pub fn decide<'p>(policy: &'p Policy, subject: &Subject) -> Decision<'p> {
    decide_narrowed(policy, subject, None)
}

/// [`decide`], with a signed token's `repos` claim narrowing git repositories.
pub fn decide_narrowed<'p>(policy: &'p Policy, subject: &Subject, repos: Option<&[String]>) -> Decision<'p> {
    match subject {
        Subject::Host(t) => policy.decide(t),
        Subject::Git { repo, push } => {
            let repo_decision = policy.decide_git(repo, push.is_some(), repos);
            match push {
                Some(refname) if repo_decision.reason().is_none() => policy.decide_ref(refname, false),
                _ => repo_decision,
            }
        }
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
        (DenyReason::GitRefDenied, Subject::Git { push: Some(r), .. }) => {
            Some(format!("to allow it, add \"{r}\" to policies.{name}.{}", RuleList::GitPush.key()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects() {
        assert_eq!(parse_subject("pypi.org:443", None).unwrap().to_string(), "pypi.org:443");
        assert_eq!(parse_subject("https://PyPI.org/simple/", None).unwrap().to_string(), "pypi.org:443");
        assert_eq!(parse_subject("http://example.com", None).unwrap().to_string(), "example.com:80");
        assert_eq!(
            parse_subject("https://github.com/acme/widgets.git", None).unwrap(),
            Subject::Git { repo: "acme/widgets".into(), push: None }
        );
        assert_eq!(
            parse_subject("https://github.com/acme/widgets", Some("refs/heads/x")).unwrap(),
            Subject::Git { repo: "acme/widgets".into(), push: Some("refs/heads/x".into()) }
        );
        assert_eq!(parse_subject("https://github.com/acme/widgets", None).unwrap().to_string(), "github.com:443");
        for bad in ["pypi.org", "ftp://x/", "https://user@x/", "127.1:80"] {
            assert!(parse_subject(bad, None).is_err(), "{bad}");
        }
        assert!(parse_subject("pypi.org:443", Some("refs/heads/x")).is_err());
    }
}
