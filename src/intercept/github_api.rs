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

/// The write `method` on `path` (decoded, no query) makes, if it is one the git rules
/// decide. Matched without regard to case or trailing slashes; every method but the
/// safe ones is a write, an unknown one the strictest (a delete).
pub fn write_of(method: &str, path: &str) -> Option<ApiWrite> {
    let method = match method.to_ascii_uppercase().as_str() {
        "GET" | "HEAD" | "OPTIONS" => return None,
        m @ ("POST" | "PUT" | "PATCH" | "DELETE") => m.to_string(),
        _ => "DELETE".to_string(),
    };
    let trimmed = path.trim_end_matches('/');
    let raw = trimmed.get(..7).filter(|p| p.eq_ignore_ascii_case("/repos/")).and(trimmed.get(7..))?;
    let mut parts = raw.splitn(3, '/');
    let (owner, repo) = (parts.next()?, parts.next()?);
    if owner.is_empty() || repo.is_empty() {
        return None;
    }
    let tail_raw = parts.next().unwrap_or("");
    let tail = tail_raw.to_ascii_lowercase();
    let repo_name = format!("{owner}/{repo}");
    let body = |field, prefix| RefAt::Body { field, prefix };
    let at = match (method.as_str(), tail.as_str()) {
        ("PATCH" | "DELETE", t) if t.starts_with("git/refs/") => {
            // The ref keeps its case: taken from the path as written (same length).
            let name = tail_raw.get("git/refs/".len()..).unwrap_or_default();
            RefAt::Path { name: format!("refs/{name}"), delete: method == "DELETE" }
        }
        (_, t) if t.starts_with("git/refs") => body("ref", ""),
        (_, "git/tags" | "git/commits" | "git/trees" | "git/blobs") => RefAt::Repo,
        (_, t) if t.starts_with("contents/") || t == "contents" => body("branch", "refs/heads/"),
        (_, "merges") => body("base", "refs/heads/"),
        (_, t) if t.starts_with("merge") => body("branch", "refs/heads/"),
        (_, t) if t.starts_with("releases") || t.starts_with("tags") => RefAt::Repo,
        (_, t) if t.starts_with("pulls/") && t.ends_with("/merge") => RefAt::Repo,
        (_, t) if t.starts_with("branches/") => {
            let branch = tail_raw.get("branches/".len()..).unwrap_or_default().split('/').next().unwrap_or("");
            RefAt::Path { name: format!("refs/heads/{branch}"), delete: true }
        }
        (_, t) if t.starts_with("git/") => RefAt::Repo,
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
        // Case, trailing slashes and unknown methods do not dodge the mapping.
        assert!(write_of("POST", "/repos/a/b/Git/Refs/").is_some());
        assert!(write_of("delete", "/repos/a/b/git/refs/heads/main").is_some());
        assert!(write_of("PURGE", "/repos/a/b/contents/x").is_some());
        assert!(write_of("POST", "/repos/a/b/branches/main/rename").is_some());
        assert_eq!(
            write_of("DELETE", "/repos/a/b/git/refs/heads/Agent/X").unwrap().at,
            RefAt::Path { name: "refs/heads/Agent/X".into(), delete: true }
        );
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
