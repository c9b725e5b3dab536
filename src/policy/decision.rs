//! The outcome of a policy decision and the stable deny-reason codes.

use std::fmt;

/// Stable deny-reason codes. Users script against these strings: never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    AuthRequired,
    AuthInvalid,
    TokenExpired,
    HostNotAllowed,
    HostDenied,
    PortNotAllowed,
    AddressDenied,
    ResolveFailed,
    RepoNotConnected,
    GitWriteDenied,
    GitRefDenied,
    RouteNotAllowed,
    BadRequest,
    RequestTooLarge,
    UpstreamUnreachable,
    UpstreamTimeout,
    LimitExceeded,
    UpstreamEncoding,
    /// The upstream answered, but not with an HTTP answer the gateway can relay (a
    /// head too large, not HTTP/1.1, a switch to another protocol than WebSocket).
    UpstreamInvalid,
    PeerNotAllowed,
    RequestNotAllowed,
    SecretNotAllowed,
    /// A reload or expiry sweep ended the request: the policies or credentials changed
    /// and no longer allow it.
    Revoked,
}

impl DenyReason {
    pub const ALL: [DenyReason; 23] = [
        DenyReason::AuthRequired,
        DenyReason::AuthInvalid,
        DenyReason::TokenExpired,
        DenyReason::HostNotAllowed,
        DenyReason::HostDenied,
        DenyReason::PortNotAllowed,
        DenyReason::AddressDenied,
        DenyReason::ResolveFailed,
        DenyReason::RepoNotConnected,
        DenyReason::GitWriteDenied,
        DenyReason::GitRefDenied,
        DenyReason::RouteNotAllowed,
        DenyReason::BadRequest,
        DenyReason::RequestTooLarge,
        DenyReason::UpstreamUnreachable,
        DenyReason::UpstreamTimeout,
        DenyReason::LimitExceeded,
        DenyReason::UpstreamEncoding,
        DenyReason::UpstreamInvalid,
        DenyReason::PeerNotAllowed,
        DenyReason::RequestNotAllowed,
        DenyReason::SecretNotAllowed,
        DenyReason::Revoked,
    ];

    pub fn code(self) -> &'static str {
        match self {
            DenyReason::AuthRequired => "auth_required",
            DenyReason::AuthInvalid => "auth_invalid",
            DenyReason::TokenExpired => "token_expired",
            DenyReason::HostNotAllowed => "host_not_allowed",
            DenyReason::HostDenied => "host_denied",
            DenyReason::PortNotAllowed => "port_not_allowed",
            DenyReason::AddressDenied => "address_denied",
            DenyReason::ResolveFailed => "resolve_failed",
            DenyReason::RepoNotConnected => "repo_not_connected",
            DenyReason::GitWriteDenied => "git_write_denied",
            DenyReason::GitRefDenied => "git_ref_denied",
            DenyReason::RouteNotAllowed => "route_not_allowed",
            DenyReason::BadRequest => "bad_request",
            DenyReason::RequestTooLarge => "request_too_large",
            DenyReason::UpstreamUnreachable => "upstream_unreachable",
            DenyReason::UpstreamTimeout => "upstream_timeout",
            DenyReason::LimitExceeded => "limit_exceeded",
            DenyReason::UpstreamEncoding => "upstream_encoding",
            DenyReason::UpstreamInvalid => "upstream_invalid",
            DenyReason::PeerNotAllowed => "peer_not_allowed",
            DenyReason::RequestNotAllowed => "request_not_allowed",
            DenyReason::SecretNotAllowed => "secret_not_allowed",
            DenyReason::Revoked => "revoked",
        }
    }

    /// A one-line explanation for people reading a denial.
    pub fn message(self) -> &'static str {
        match self {
            DenyReason::AuthRequired => "proxy credentials required",
            DenyReason::AuthInvalid => "proxy credentials are not valid",
            DenyReason::TokenExpired => "sandbox token has expired",
            DenyReason::HostNotAllowed => "destination host is not in the sandbox policy",
            DenyReason::HostDenied => "destination host is denied by the sandbox policy",
            DenyReason::PortNotAllowed => "destination port is not allowed for this host",
            DenyReason::AddressDenied => "destination resolves only to denied addresses",
            DenyReason::ResolveFailed => "destination host could not be resolved",
            DenyReason::RepoNotConnected => "repository is not connected for this sandbox",
            DenyReason::GitWriteDenied => "pushing to this repository is not allowed",
            DenyReason::GitRefDenied => "pushing to this ref is not allowed",
            DenyReason::RouteNotAllowed => "the API route does not allow this request",
            DenyReason::BadRequest => "malformed or unsupported request",
            DenyReason::RequestTooLarge => "request head or URI is larger than the gateway accepts",
            DenyReason::UpstreamUnreachable => "upstream could not be reached",
            DenyReason::UpstreamTimeout => "upstream did not answer in time",
            DenyReason::LimitExceeded => "a gateway limit was exceeded",
            DenyReason::UpstreamEncoding => "the upstream answered with a content coding the gateway cannot redact",
            DenyReason::UpstreamInvalid => "the upstream answered with something the gateway cannot relay",
            DenyReason::PeerNotAllowed => "the sandboxes' policies do not both allow this connection",
            DenyReason::RequestNotAllowed => "no request rule of the sandbox policy allows this request",
            DenyReason::SecretNotAllowed => "the request carries a secret placeholder where its value may not go",
            DenyReason::Revoked => "the policies or credentials changed and no longer allow this",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Which list a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleList {
    Allow,
    Deny,
    /// `git.repos`
    GitRepos,
    /// `git.push`
    GitPush,
    /// `routes`: an API route, with the methods and paths its `[[routes]]` entry allows.
    Routes,
    /// `allow_all = true`: every destination but what `deny` and `egress.deny` refuse.
    AllowAll,
    /// `peers`: other sandboxes this policy's sandboxes may reach.
    Peers,
    /// `accept_from`: other sandboxes this policy's sandboxes accept connections from.
    AcceptFrom,
    /// `inspect`: hosts whose TLS is terminated and whose requests are decided one by one.
    Inspect,
    /// `[[requests]]`: a request rule inside an inspected host.
    Requests,
}

impl RuleList {
    /// The key under `policies.NAME` that holds rules of this list.
    pub fn key(self) -> &'static str {
        match self {
            RuleList::Allow => "allow",
            RuleList::Deny => "deny",
            RuleList::GitRepos => "git.repos",
            RuleList::GitPush => "git.push",
            RuleList::Routes => "routes",
            RuleList::AllowAll => "allow_all",
            RuleList::Peers => "peers",
            RuleList::AcceptFrom => "accept_from",
            RuleList::Inspect => "inspect",
            RuleList::Requests => "requests",
        }
    }
}

/// A policy rule as written, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSource {
    /// Shared: a host or git rule's record names it by this very text.
    pub text: std::sync::Arc<str>,
    pub list: RuleList,
    /// `file:line` where the rule is defined (empty for built-in policies).
    pub location: String,
    /// How the access log names a rule of the lists it does not name by text, made
    /// once when the policy is loaded.
    logged: Option<std::sync::Arc<str>>,
}

impl RuleSource {
    pub fn new(list: RuleList, text: &str, location: &str) -> Self {
        let logged = match list {
            RuleList::Routes | RuleList::Peers | RuleList::AcceptFrom | RuleList::Inspect | RuleList::Requests => {
                Some(format!("{} {text:?}", list.key()).into())
            }
            _ => None,
        };
        RuleSource { text: text.into(), list, location: location.to_string(), logged }
    }

    /// The rule as the access log names it: a host or git rule by its text, a route
    /// as `routes "NAME"`. Shared: a decision's record takes no allocation for it.
    pub fn logged(&self) -> std::sync::Arc<str> {
        self.logged.as_ref().unwrap_or(&self.text).clone()
    }
}

impl fmt::Display for RuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.list.key(), self.text)
    }
}

/// What the policy says about one target. Borrowed from the policy: no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'p> {
    Allow { rule: &'p RuleSource },
    Deny { reason: DenyReason, rule: Option<&'p RuleSource> },
}

/// What happens to the traffic: the one typed result of every decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Allow,
    Deny,
    /// Denied by a policy in report mode, and let through.
    WouldDeny,
}

impl Outcome {
    /// `allow`, `deny` or `would_deny`, as the access log writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Deny => "deny",
            Outcome::WouldDeny => "would_deny",
        }
    }

    /// True when traffic passes.
    pub fn permits(self) -> bool {
        self != Outcome::Deny
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verdict together with the policy mode: in report mode a deny verdict is let
/// through and logged as `would_deny`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'p> {
    pub verdict: Verdict<'p>,
    pub report_only: bool,
}

impl<'p> Decision<'p> {
    /// True when traffic may pass (allowed, or denied in report mode).
    pub fn permits(&self) -> bool {
        matches!(self.verdict, Verdict::Allow { .. }) || self.report_only
    }

    pub fn outcome(&self) -> Outcome {
        match (self.verdict, self.report_only) {
            (Verdict::Allow { .. }, _) => Outcome::Allow,
            (Verdict::Deny { .. }, false) => Outcome::Deny,
            (Verdict::Deny { .. }, true) => Outcome::WouldDeny,
        }
    }

    pub fn rule(&self) -> Option<&'p RuleSource> {
        match self.verdict {
            Verdict::Allow { rule } => Some(rule),
            Verdict::Deny { rule, .. } => rule,
        }
    }

    pub fn reason(&self) -> Option<DenyReason> {
        match self.verdict {
            Verdict::Allow { .. } => None,
            Verdict::Deny { reason, .. } => Some(reason),
        }
    }
}
