//! The git smart-HTTP path grammar, strictly: `OWNER/REPO[.git]/info/refs?service=...`,
//! `POST OWNER/REPO[.git]/git-upload-pack`, `POST OWNER/REPO[.git]/git-receive-pack`.
//! Anything else (dumb protocol, LFS, odd encodings, traversal) is refused. Pure.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    UploadPack,
    ReceivePack,
}

impl Service {
    pub fn name(self) -> &'static str {
        match self {
            Service::UploadPack => "git-upload-pack",
            Service::ReceivePack => "git-receive-pack",
        }
    }

    /// Writes (pushes) need `git.push` rules.
    pub fn is_write(self) -> bool {
        self == Service::ReceivePack
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `GET info/refs?service=...`: ref advertisement.
    InfoRefs,
    /// `POST git-upload-pack` or `POST git-receive-pack`.
    Rpc,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRequest {
    pub owner: String,
    pub repo: String,
    pub service: Service,
    pub op: Op,
}

impl GitRequest {
    /// `owner/repo`, as policies match it.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }

    /// The upstream path and query (`/OWNER/REPO.git/...`).
    pub fn upstream_path(&self) -> String {
        match self.op {
            Op::InfoRefs => format!("/{}/{}.git/info/refs?service={}", self.owner, self.repo, self.service.name()),
            Op::Rpc => format!("/{}/{}.git/{}", self.owner, self.repo, self.service.name()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("malformed git path: {0}")]
    Malformed(&'static str),
    #[error("only git smart-HTTP clone, fetch and push are routed (no dumb protocol, no LFS)")]
    Unsupported,
    #[error("method not allowed for this git path")]
    Method,
}

fn owner_ok(s: &str) -> bool {
    (1..=39).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn repo_ok(s: &str) -> bool {
    (1..=100).contains(&s.len())
        && !s.contains("..")
        && s != "."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Parses `path` (after the `/github.com` prefix, or the whole path of an
/// absolute-form URL) with its `query` and the request `method`.
pub fn parse(method: &str, path: &str, query: Option<&str>) -> Result<GitRequest, PathError> {
    if !path.is_ascii() || path.contains(['%', '\\']) || path.contains("//") {
        return Err(PathError::Malformed("'%', '\\\\', '//' and non-ASCII are not allowed"));
    }
    let rest = path.strip_prefix('/').ok_or(PathError::Malformed("expected /OWNER/REPO/..."))?;
    let mut parts = rest.splitn(3, '/');
    let (Some(owner), Some(repo), Some(tail)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(PathError::Malformed("expected /OWNER/REPO/..."));
    };
    if tail.split('/').any(|seg| seg == "." || seg == "..") || owner == ".." || repo == ".." {
        return Err(PathError::Malformed("'.' and '..' segments are not allowed"));
    }
    let repo = repo.strip_suffix(".git").unwrap_or(repo);
    if !owner_ok(owner) {
        return Err(PathError::Malformed("owner must be 1-39 letters, digits or '-'"));
    }
    if !repo_ok(repo) {
        return Err(PathError::Malformed("repository must be 1-100 letters, digits, '.', '_' or '-'"));
    }
    let (service, op) = match (tail, query) {
        ("info/refs", Some("service=git-upload-pack")) => (Service::UploadPack, Op::InfoRefs),
        ("info/refs", Some("service=git-receive-pack")) => (Service::ReceivePack, Op::InfoRefs),
        // Without a service: the dumb protocol.
        ("info/refs", None) => return Err(PathError::Unsupported),
        ("info/refs", Some(_)) => {
            return Err(PathError::Malformed("info/refs takes exactly ?service=git-upload-pack or git-receive-pack"));
        }
        ("git-upload-pack", None) => (Service::UploadPack, Op::Rpc),
        ("git-receive-pack", None) => (Service::ReceivePack, Op::Rpc),
        ("git-upload-pack" | "git-receive-pack", Some(_)) => return Err(PathError::Malformed("unexpected query")),
        _ => return Err(PathError::Unsupported),
    };
    let method_ok = match op {
        Op::InfoRefs => method == "GET" || method == "HEAD",
        Op::Rpc => method == "POST",
    };
    if !method_ok {
        return Err(PathError::Method);
    }
    Ok(GitRequest { owner: owner.to_string(), repo: repo.to_string(), service, op })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_smart_http_grammar() {
        let r = parse("GET", "/acme/widgets.git/info/refs", Some("service=git-upload-pack")).unwrap();
        assert_eq!((r.full_name(), r.service, r.op), ("acme/widgets".into(), Service::UploadPack, Op::InfoRefs));
        assert_eq!(r.upstream_path(), "/acme/widgets.git/info/refs?service=git-upload-pack");
        let r = parse("POST", "/acme/widgets/git-receive-pack", None).unwrap();
        assert_eq!((r.service, r.op), (Service::ReceivePack, Op::Rpc));
        assert!(parse("GET", "/Acme-1/my.repo_x/info/refs", Some("service=git-receive-pack")).is_ok());
    }

    #[test]
    fn refuses_everything_else() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("GET", "/acme/widgets.git/info/refs", None),
            ("GET", "/acme/widgets.git/info/refs", Some("service=git-upload-pack&x=1")),
            ("GET", "/acme/widgets.git/HEAD", None),
            ("GET", "/acme/widgets.git/objects/info/packs", None),
            ("POST", "/acme/widgets.git/info/lfs/objects/batch", None),
            ("GET", "/acme/widgets.git/git-upload-pack", None),
            ("POST", "/acme/widgets.git/info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/../info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/widgets.git/../other/info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/./info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme//widgets/info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/wid%67ets/info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/widgets\\x/info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/wídgets/info/refs", Some("service=git-upload-pack")),
            ("GET", "/ac_me/widgets/info/refs", Some("service=git-upload-pack")),
            ("GET", "/acme/widgets", None),
            // Found by the git_route fuzzer: '..' inside a repository name.
            ("POST", "/acme/wiei..its.gi../git-receive-pack", None),
            ("POST", "/acme/widgets.git/git-upload-pack", Some("x")),
        ];
        for (m, p, q) in cases {
            assert!(parse(m, p, *q).is_err(), "{m} {p} {q:?}");
        }
        let long_owner = format!("/{}/r/info/refs", "a".repeat(40));
        assert!(parse("GET", &long_owner, Some("service=git-upload-pack")).is_err());
    }
}
