//! What a decision is about: every kind of egress the gateway judges, as one value.
//! Live traffic, `check`, `policy test`, `replay`, shadow policies and the revocation
//! sweep all decide a [`Subject`] with [`super::decide`].

use crate::addr::{self, Target};

/// One thing a sandbox asks to reach.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A CONNECT or absolute-form destination.
    Host(Target),
    /// A repository on the git route, and what is done to it.
    Git { repo: String, access: GitAccess },
    /// A request on a credential-injecting API route.
    Route { route: String, method: String, path: String },
    /// Another sandbox (`ID.sandboxes.internal:PORT`, `sandbox` as named): its labels,
    /// whether its own policy's `accept_from` admits the caller (the callee's half of
    /// the agreement, judged from the same policy set), and the one address it is
    /// reached at (`None`: it has none, and cannot be reached). A reload that moves
    /// the peer ends connections held to the old address.
    /// `name` is the peer as asked (`ID.SUFFIX:PORT`): the policy's `deny` rules are
    /// matched against it.
    Peer {
        sandbox: String,
        name: Target,
        labels: Vec<String>,
        port: u16,
        accepted: bool,
        address: Option<std::net::IpAddr>,
    },
    /// One request to `target` (HTTPS inside an inspected host, or plain HTTP through
    /// the proxy to a host the policy inspects): its method, path as sent (with its
    /// query) and headers (lower-case names; never `Proxy-Authorization`). Decided by
    /// request rules where the policy inspects the host, by the host rules elsewhere.
    Request { target: Target, method: String, path: String, headers: Vec<(String, String)> },
}

impl Subject {
    /// The destination a host or request subject names.
    pub fn target(&self) -> Option<&Target> {
        match self {
            Subject::Host(t) | Subject::Request { target: t, .. } => Some(t),
            _ => None,
        }
    }
}

/// What a git request does to its repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GitAccess {
    /// Clone or fetch.
    Read,
    /// A push, before its refs are known.
    Write,
    /// A push's update of one ref (`delete`: to the zero id).
    Ref { name: String, delete: bool },
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Host(t) => write!(f, "{t}"),
            Subject::Git { repo, access: GitAccess::Read } => write!(f, "git {repo} (read)"),
            Subject::Git { repo, access: GitAccess::Write } => write!(f, "git {repo} (push)"),
            Subject::Git { repo, access: GitAccess::Ref { name, delete: false } } => {
                write!(f, "git {repo} (push {name})")
            }
            Subject::Git { repo, access: GitAccess::Ref { name, delete: true } } => {
                write!(f, "git {repo} (delete {name})")
            }
            Subject::Route { route, method, path } => write!(f, "route:{route} {method} {path}"),
            Subject::Peer { sandbox, port, .. } => write!(f, "peer {sandbox}:{port}"),
            Subject::Request { target, method, path, .. } => {
                let path = path.split('?').next().unwrap_or("/");
                match target.port {
                    80 => write!(f, "{method} http://{}{path}", target.host),
                    443 => write!(f, "{method} https://{}{path}", target.host),
                    _ => write!(f, "{method} https://{target}{path}"),
                }
            }
        }
    }
}

/// Hosts whose `/OWNER/REPO` URLs are git repositories for the git route.
pub const GIT_HOSTS: &[&str] = &["github.com"];

/// Parses a target as written on the command line or in a test file: `host:port`, a
/// URL (`https://pypi.org/simple/`), a git URL (`https://github.com/acme/widgets.git`;
/// `push` names a ref to make it a push) or an API route (`route:NAME/PATH`, with
/// `method`, GET when absent).
pub fn parse_subject(target: &str, push: Option<&str>, method: Option<&str>) -> Result<Subject, String> {
    if let Some(rest) = target.strip_prefix("route:") {
        if push.is_some() {
            return Err("--push needs a git URL such as https://github.com/OWNER/REPO.git".into());
        }
        let (route, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if route.is_empty() {
            return Err(format!("invalid route target {target:?} (write route:NAME/PATH)"));
        }
        let method = method.unwrap_or("GET").to_ascii_uppercase();
        let path = if path.is_empty() { "/".to_string() } else { path.to_string() };
        return Ok(Subject::Route { route: route.to_string(), method, path });
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        if push.is_some() {
            return Err("--push needs a git URL such as https://github.com/OWNER/REPO.git".into());
        }
        return addr::parse_authority(target, None)
            .map(Subject::Host)
            .map_err(|e| format!("invalid target {target:?}: {e} (write host:port or a URL, or route:NAME/PATH)"));
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
            let access = match push {
                Some(r) => GitAccess::Ref { name: r.to_string(), delete: false },
                None => GitAccess::Read,
            };
            Ok(Subject::Git { repo, access })
        }
        _ if push.is_some() => Err(format!("--push needs a git URL on {}", GIT_HOSTS.join(", "))),
        // A request: decided by request rules where the policy inspects the host, by
        // the host rules elsewhere (`explain` shows it as the host then).
        _ => {
            let path = path.split('#').next().unwrap_or("");
            let path = if path.is_empty() || path.starts_with('?') { format!("/{path}") } else { path.to_string() };
            let method = method.unwrap_or("GET").to_ascii_uppercase();
            Ok(Subject::Request { target: host, method, path, headers: Vec::new() })
        }
    }
}

fn repo_of(path: &str) -> Option<String> {
    let mut parts = path.trim_start_matches('/').split('/');
    let owner = parts.next().filter(|s| !s.is_empty())?;
    let repo = parts.next().filter(|s| !s.is_empty())?;
    let repo = repo.strip_suffix(".git").unwrap_or(repo);
    Some(format!("{owner}/{repo}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects() {
        let parse = |t: &str| parse_subject(t, None, None);
        assert_eq!(parse("pypi.org:443").unwrap().to_string(), "pypi.org:443");
        assert_eq!(parse("https://PyPI.org/simple/?q=1").unwrap().to_string(), "GET https://pypi.org/simple/");
        assert_eq!(parse("http://example.com").unwrap().to_string(), "GET http://example.com/");
        assert_eq!(
            parse_subject("https://api.github.com:8443/repos?x", None, Some("post")).unwrap(),
            Subject::Request {
                target: addr::parse_authority("api.github.com:8443", None).unwrap(),
                method: "POST".into(),
                path: "/repos?x".into(),
                headers: vec![]
            }
        );
        assert_eq!(
            parse("https://github.com/acme/widgets.git").unwrap(),
            Subject::Git { repo: "acme/widgets".into(), access: GitAccess::Read }
        );
        assert_eq!(
            parse_subject("https://github.com/acme/widgets", Some("refs/heads/x"), None).unwrap(),
            Subject::Git {
                repo: "acme/widgets".into(),
                access: GitAccess::Ref { name: "refs/heads/x".into(), delete: false }
            }
        );
        assert_eq!(
            parse("https://github.com/acme/widgets").unwrap().to_string(),
            "GET https://github.com/acme/widgets"
        );
        assert_eq!(
            parse_subject("route:openai/v1/chat", None, Some("post")).unwrap(),
            Subject::Route { route: "openai".into(), method: "POST".into(), path: "/v1/chat".into() }
        );
        assert_eq!(parse("route:openai").unwrap().to_string(), "route:openai GET /");
        for bad in ["pypi.org", "ftp://x/", "https://user@x/", "127.1:80", "route:"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse_subject("pypi.org:443", Some("refs/heads/x"), None).is_err());
    }
}
