//! GitHub REST API requests that write a repository's refs or contents, mapped to the
//! git route's subjects, so that a sandbox cannot push through the API what its `git`
//! rules refuse it through git. Pure.

use crate::policy::{GitAccess, Subject};

/// Where the ref a write touches is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefAt {
    /// In the path (`/git/refs/heads/x`).
    Path { name: String, delete: bool },
    /// In a JSON body field, with the prefix that makes it a full ref name; a body
    /// without the field writes the default branch, which is judged as `HEAD`.
    Body { field: &'static str, prefix: &'static str },
    /// None: a write to the repository (tags, releases, objects, pull merges).
    Repo,
}

/// A write through the API: the repository and where its ref is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiWrite {
    pub repo: String,
    pub at: RefAt,
}

/// The write `method` on `path` (no query) makes, if it is one the git rules decide.
pub fn write_of(method: &str, path: &str) -> Option<ApiWrite> {
    if !matches!(method, "POST" | "PUT" | "PATCH" | "DELETE") {
        return None;
    }
    let rest = path.strip_prefix("/repos/")?;
    let mut parts = rest.splitn(3, '/');
    let (owner, repo) = (parts.next()?, parts.next()?);
    if owner.is_empty() || repo.is_empty() {
        return None;
    }
    let tail = parts.next().unwrap_or("");
    let repo_name = format!("{owner}/{repo}");
    let at = match (method, tail) {
        ("POST", "git/refs") => RefAt::Body { field: "ref", prefix: "" },
        ("PATCH" | "DELETE", t) if let Some(r) = t.strip_prefix("git/refs/") => {
            RefAt::Path { name: format!("refs/{r}"), delete: method == "DELETE" }
        }
        ("POST", "git/tags" | "git/commits" | "git/trees" | "git/blobs") => RefAt::Repo,
        ("PUT" | "DELETE", t) if t.starts_with("contents/") => RefAt::Body { field: "branch", prefix: "refs/heads/" },
        ("POST", "merges" | "merge-upstream") => {
            RefAt::Body { field: if tail == "merges" { "base" } else { "branch" }, prefix: "refs/heads/" }
        }
        ("POST", "releases") | ("PATCH" | "DELETE", _) if tail.starts_with("releases") => RefAt::Repo,
        ("PUT", t) if t.starts_with("pulls/") && t.ends_with("/merge") => RefAt::Repo,
        ("POST", t) if t.starts_with("branches/") && t.ends_with("/rename") => {
            let branch = t.trim_start_matches("branches/").trim_end_matches("/rename");
            RefAt::Path { name: format!("refs/heads/{branch}"), delete: true }
        }
        _ => return None,
    };
    Some(ApiWrite { repo: repo_name, at })
}

/// The subjects a write is decided as: the repository's write, then its ref when
/// known (`body`: the JSON request body, for refs named there).
pub fn subjects(w: &ApiWrite, body: Option<&serde_json::Value>) -> Vec<Subject> {
    let mut out = vec![Subject::Git { repo: w.repo.clone(), access: GitAccess::Write }];
    let reference = match &w.at {
        RefAt::Path { name, delete } => Some((name.clone(), *delete)),
        RefAt::Body { field, prefix } => {
            let named = body.and_then(|b| b.get(*field)).and_then(|v| v.as_str());
            Some(match named {
                Some(n) if n.starts_with("refs/") => (n.to_string(), false),
                Some(n) => (format!("{prefix}{n}"), false),
                None => ("HEAD".to_string(), false),
            })
        }
        RefAt::Repo => None,
    };
    if let Some((name, delete)) = reference {
        out.push(Subject::Git { repo: w.repo.clone(), access: GitAccess::Ref { name, delete } });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_map_to_git_subjects() {
        assert_eq!(write_of("GET", "/repos/a/b/git/refs"), None);
        assert_eq!(write_of("POST", "/repos/a/b/issues"), None);
        let w = write_of("DELETE", "/repos/a/b/git/refs/heads/main").unwrap();
        assert_eq!(w.at, RefAt::Path { name: "refs/heads/main".into(), delete: true });
        let w = write_of("PUT", "/repos/acme/widgets/contents/src/x.rs").unwrap();
        let body = serde_json::json!({"branch": "agent/x", "message": "m"});
        let s = subjects(&w, Some(&body));
        assert_eq!(
            s[1],
            Subject::Git {
                repo: "acme/widgets".into(),
                access: GitAccess::Ref { name: "refs/heads/agent/x".into(), delete: false }
            }
        );
        let s = subjects(&w, Some(&serde_json::json!({})));
        assert!(matches!(&s[1], Subject::Git { access: GitAccess::Ref { name, .. }, .. } if name == "HEAD"));
        assert_eq!(write_of("POST", "/repos/a/b/releases").unwrap().at, RefAt::Repo);
        assert_eq!(write_of("PUT", "/repos/a/b/pulls/3/merge").unwrap().at, RefAt::Repo);
        let w = write_of("POST", "/repos/a/b/git/refs").unwrap();
        let s = subjects(&w, Some(&serde_json::json!({"ref": "refs/tags/v1", "sha": "x"})));
        assert!(matches!(&s[1], Subject::Git { access: GitAccess::Ref { name, .. }, .. } if name == "refs/tags/v1"));
    }
}
