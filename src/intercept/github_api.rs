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
    /// None: a write to the repository (tags, releases, objects, settings).
    Repo,
    /// A GraphQL request: refused when it runs a mutation that writes refs
    /// ([`graphql_write`]), which names no repository the git rules could judge.
    GraphQl,
    /// A write the git rules cannot judge, refused with this reason.
    Refused(&'static str),
}

/// GraphQL mutations that write a repository's refs or contents, or its protection.
const REF_MUTATIONS: &[&str] = &[
    "createref",
    "updateref",
    "updaterefs",
    "deleteref",
    "createcommitonbranch",
    "mergebranch",
    "mergepullrequest",
    "updatepullrequestbranch",
    "enablepullrequestautomerge",
    "revertpullrequest",
    "createbranchprotectionrule",
    "updatebranchprotectionrule",
    "deletebranchprotectionrule",
    "clonetemplaterepository",
    "updaterepository",
    "archiverepository",
];

/// The ref-writing mutation a GraphQL body names, if any (matched in its text, so a
/// batch, an alias or a variable cannot hide it).
pub fn graphql_write(body: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    let words: Vec<&str> = text.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').collect();
    REF_MUTATIONS.iter().copied().find(|m| words.contains(m))
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
    if trimmed.eq_ignore_ascii_case("/graphql") {
        return Some(ApiWrite { repo: String::new(), at: RefAt::GraphQl });
    }
    // A repository by id names no owner/name the git rules know.
    if trimmed.get(..14).is_some_and(|p| p.eq_ignore_ascii_case("/repositories/")) {
        let why = "writes through /repositories/ID are refused: use /repos/OWNER/REPO, which the git rules judge";
        return Some(ApiWrite { repo: String::new(), at: RefAt::Refused(why) });
    }
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
        // The branch a merge (or a branch update) writes is the pull request's, which
        // the request does not name: judged as `HEAD`, which no git.push pattern is.
        (_, t) if t.starts_with("pulls/") && (t.ends_with("/merge") || t.ends_with("/update-branch")) => {
            RefAt::Path { name: "HEAD".into(), delete: false }
        }
        // The repository itself: settings (the default branch), its deletion.
        ("PATCH" | "DELETE", "") => RefAt::Repo,
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
    if matches!(w.at, RefAt::GraphQl | RefAt::Refused(_)) {
        return Vec::new();
    }
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
        RefAt::Repo | RefAt::GraphQl | RefAt::Refused(_) => None,
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
        assert_eq!(
            write_of("PUT", "/repos/a/b/pulls/3/merge").unwrap().at,
            RefAt::Path { name: "HEAD".into(), delete: false }
        );
        assert_eq!(write_of("PATCH", "/repos/a/b").unwrap().at, RefAt::Repo);
        assert!(matches!(write_of("POST", "/repositories/42/git/refs").unwrap().at, RefAt::Refused(_)));
        assert_eq!(write_of("POST", "/graphql").unwrap().at, RefAt::GraphQl);
        let q = br#"{"query":"mutation { a: createCommitOnBranch(input: $i) { commit { oid } } }"}"#;
        assert_eq!(graphql_write(q), Some("createcommitonbranch"));
        assert_eq!(graphql_write(br#"{"query":"mutation { createPullRequest(input: $i) { x } }"}"#), None);
        let w = write_of("POST", "/repos/a/b/git/refs").unwrap();
        let s = subjects(&w, Some(&serde_json::json!({"ref": "refs/tags/v1", "sha": "x"})));
        assert!(matches!(&s[1], Subject::Git { access: GitAccess::Ref { name, .. }, .. } if name == "refs/tags/v1"));
    }
}
