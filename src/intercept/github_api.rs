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
    /// without the field writes the default branch, which is judged as `HEAD`, unless
    /// `optional` (an edit that names a ref only when it moves one).
    Body { field: &'static str, prefix: &'static str, optional: bool },
    /// None: a write to the repository (objects, settings, who may write it).
    Repo,
    /// A GraphQL request: refused when it runs a mutation that writes refs
    /// ([`graphql_write`]), which names no repository the git rules could judge.
    GraphQl,
    /// A branch rename: the old ref (deleted) and the new one, named in the body's
    /// `new_name` (created).
    Rename { from: String },
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
    "unarchiverepository",
    "createlinkedbranch",
    "enqueuepullrequest",
    "createrepositoryruleset",
    "updaterepositoryruleset",
    "deleterepositoryruleset",
    "createenvironment",
    "updateenvironment",
    "deleteenvironment",
    "updateteamsrepository",
    "addenterpriseorganizationmember",
    "updaterepositorywebcommitsignoffsetting",
];

/// Repository paths (after `/repos/OWNER/REPO/`, lower case) whose writes grant
/// access to the repository.
const ACCESS: &[&str] = &["keys", "collaborators", "invitations", "transfer"];

/// Repository paths whose writes run code in the repository (hooks, dispatches,
/// Actions) or change its rules: judged as a write to the repository, as a push is.
const AUTOMATION: &[&str] = &[
    "hooks",
    "dispatches",
    "actions",
    "environments",
    "rulesets",
    "pages",
    "autolinks",
    "vulnerability-alerts",
    "automated-security-fixes",
    "interaction-limits",
    "properties",
];

/// Whether a write to `path` grants access through an organisation or a team: a
/// team's repositories (`/orgs/O/teams/T/repos/O/R`, `/teams/ID/repos/O/R`), members,
/// memberships, outside collaborators, invitations.
fn grants_org_access(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if !(lower.starts_with("/orgs/") || lower.starts_with("/teams/")) {
        return false;
    }
    let segments: Vec<&str> = lower.split('/').collect();
    segments.iter().enumerate().any(|(i, s)| {
        matches!(*s, "members" | "memberships" | "outside_collaborators" | "invitations" | "security-managers")
            || (*s == "repos" && segments.get(i + 1).is_some_and(|next| !next.is_empty()))
    })
}

/// Whether `tail` is one of `paths` or below one.
fn under(tail: &str, paths: &[&str]) -> bool {
    paths.iter().any(|p| tail.strip_prefix(p).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

/// The ref-writing mutation a GraphQL body names, if any (matched in its text, so a
/// batch, an alias or a variable cannot hide it).
/// Every JSON string is read decoded as well (`\u0063reateRef` is `createRef` to
/// GitHub), each occurrence of a key on its own (a parser that keeps the first of two
/// `query` keys sees what one that keeps the last does not).
pub fn graphql_write(body: &[u8]) -> Option<&'static str> {
    mutation_in(&String::from_utf8_lossy(body)).or_else(|| json_strings(body).find_map(|s| mutation_in(&s)))
}

/// The ref-writing mutation a GraphQL request sent in a URL's query names, if any
/// (`GET /graphql?query=mutation…`): the query string read form-decoded (`+` is a
/// space, `%XX` a byte), then as a body is.
pub fn graphql_query_write(query: &str) -> Option<&'static str> {
    graphql_write(query.as_bytes())
        .or_else(|| graphql_write(&crate::policy::requests::percent_decode(query.as_bytes(), true)))
}

/// The first of [`REF_MUTATIONS`] that `text` has as a word (GraphQL names are ASCII
/// letters, digits and `_`, matched without regard to case).
fn mutation_in(text: &str) -> Option<&'static str> {
    let text = text.to_ascii_lowercase();
    let words: Vec<&str> = text.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').collect();
    REF_MUTATIONS.iter().copied().find(|m| words.contains(m))
}

/// The string literals in a JSON text (keys and values, duplicates included), each
/// decoded; a literal that does not decode is skipped (the body is refused as JSON
/// elsewhere).
fn json_strings(body: &[u8]) -> impl Iterator<Item = String> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        loop {
            let start = at + body.get(at..)?.iter().position(|&b| b == b'"')?;
            let mut i = start + 1;
            while let Some(&b) = body.get(i) {
                match b {
                    b'\\' => i += 2,
                    b'"' => break,
                    _ => i += 1,
                }
            }
            let end = (i + 1).min(body.len());
            at = end;
            if let Ok(s) = serde_json::from_slice::<String>(&body[start..end]) {
                return Some(s);
            }
            if end >= body.len() {
                return None;
            }
        }
    })
}

/// Whether `method` may write: every method but the safe ones.
pub fn is_write(method: &str) -> bool {
    !["GET", "HEAD", "OPTIONS"].iter().any(|m| m.eq_ignore_ascii_case(method))
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
    if !is_write(method) {
        return None;
    }
    let method = match method.to_ascii_uppercase().as_str() {
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
    if grants_org_access(trimmed) {
        let why = "organisation and team writes that grant access (team repositories, members, outside \
                   collaborators, invitations) are refused: the access they grant reaches past the git rules";
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
    let body = |field, prefix| RefAt::Body { field, prefix, optional: false };
    let at = match (method.as_str(), tail.as_str()) {
        ("PATCH" | "DELETE", t) if t.starts_with("git/refs/") || t.starts_with("git/ref/") => {
            // The ref keeps its case: taken from the path as written (same length). The
            // singular `git/ref/` is GitHub's read path, judged alike should it write.
            let skip = if t.starts_with("git/refs/") { "git/refs/".len() } else { "git/ref/".len() };
            let name = tail_raw.get(skip..).unwrap_or_default();
            RefAt::Path { name: format!("refs/{name}"), delete: method == "DELETE" }
        }
        (_, t) if t.starts_with("git/refs") => body("ref", ""),
        (_, "git/tags" | "git/commits" | "git/trees" | "git/blobs") => RefAt::Repo,
        (_, t) if t.starts_with("contents/") || t == "contents" => body("branch", "refs/heads/"),
        (_, "merges") => body("base", "refs/heads/"),
        (_, t) if t.starts_with("merge") => body("branch", "refs/heads/"),
        // A release creates its tag (`tag_name`) when the tag does not exist yet; an
        // edit moves it only when it names one.
        ("POST", "releases") => body("tag_name", "refs/tags/"),
        ("PATCH", t) if t.starts_with("releases/") && !t.contains("/assets") => {
            RefAt::Body { field: "tag_name", prefix: "refs/tags/", optional: true }
        }
        (_, t) if t.starts_with("releases") || t.starts_with("tags") => RefAt::Repo,
        // A workflow run on a ref runs that ref's code with the repository's secrets.
        ("POST", t) if t.starts_with("actions/workflows/") && t.ends_with("/dispatches") => body("ref", "refs/heads/"),
        // Who may write the repository: a deploy key or a collaborator could then push
        // any ref, past every git rule.
        (_, t) if under(t, ACCESS) => RefAt::Refused(
            "writes that grant access to a repository (deploy keys, collaborators, invitations, transfers) are \
             refused: the access they grant reaches past the git rules",
        ),
        // What runs in the repository and its rules: as a push.
        (_, t) if under(t, AUTOMATION) => RefAt::Repo,
        // The branch a merge (or a branch update) writes is the pull request's, which
        // the request does not name: judged as `HEAD`, which no git.push pattern is.
        (_, t) if t.starts_with("pulls/") && (t.ends_with("/merge") || t.ends_with("/update-branch")) => {
            RefAt::Path { name: "HEAD".into(), delete: false }
        }
        // The repository itself: settings (the default branch), its deletion.
        ("PATCH" | "DELETE", "") => RefAt::Repo,
        ("POST", t) if t.starts_with("branches/") && t.ends_with("/rename") => {
            RefAt::Rename { from: format!("refs/heads/{}", branch_of(tail_raw)) }
        }
        // A new repository from this template: no git rule names it.
        ("POST", "generate") => RefAt::Refused(
            "creating a repository from a template is refused: the new repository is not one the git rules name",
        ),
        (_, t) if t.starts_with("branches/") => {
            RefAt::Path { name: format!("refs/heads/{}", branch_of(tail_raw)), delete: true }
        }
        (_, t) if t.starts_with("git/") => RefAt::Repo,
        _ => return None,
    };
    Some(ApiWrite { repo: repo_name, at })
}

/// The branch a `branches/{branch}[/protection…|/rename]` path names: a branch name may
/// hold `/` (GitHub takes it unencoded), so it runs to the first sub-resource segment
/// (`protection`, `rename`), or to the end.
fn branch_of(tail_raw: &str) -> String {
    let rest = tail_raw.get("branches/".len()..).unwrap_or_default();
    let segments: Vec<&str> = rest.split('/').collect();
    let end = segments
        .iter()
        .position(|s| s.eq_ignore_ascii_case("protection") || s.eq_ignore_ascii_case("rename"))
        .unwrap_or(segments.len());
    segments[..end].join("/")
}

/// The subjects a write is decided as: the repository's write, then its ref when
/// known (`body`: the JSON request body, for refs named there).
pub fn subjects(w: &ApiWrite, body: Option<&serde_json::Value>) -> Vec<Subject> {
    if matches!(w.at, RefAt::GraphQl | RefAt::Refused(_)) {
        return Vec::new();
    }
    let mut out = vec![Subject::Git { repo: w.repo.clone(), access: GitAccess::Write }];
    if let RefAt::Rename { from } = &w.at {
        let to = match body.and_then(|b| b.get("new_name")).and_then(|v| v.as_str()) {
            Some(n) if n.starts_with("refs/") => n.to_string(),
            Some(n) => format!("refs/heads/{n}"),
            None => "HEAD".to_string(),
        };
        for (name, delete) in [(from.clone(), true), (to, false)] {
            out.push(Subject::Git { repo: w.repo.clone(), access: GitAccess::Ref { name, delete } });
        }
        return out;
    }
    let reference = match &w.at {
        RefAt::Path { name, delete } => Some((name.clone(), *delete)),
        RefAt::Body { field, prefix, optional } => {
            let named = body.and_then(|b| b.get(*field)).and_then(|v| v.as_str());
            match named {
                Some(n) if n.starts_with("refs/") => Some((n.to_string(), false)),
                Some(n) => Some((format!("{prefix}{n}"), false)),
                None if *optional => None,
                None => Some(("HEAD".to_string(), false)),
            }
        }
        RefAt::Repo | RefAt::GraphQl | RefAt::Rename { .. } | RefAt::Refused(_) => None,
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
    fn a_mutation_is_found_however_the_json_spells_it() {
        let escaped = br#"{"query":"mutation { \u0063reateRef(input:{name:\"refs/heads/main\"}) { ref { id } } }"}"#;
        assert_eq!(graphql_write(escaped), Some("createref"));
        let twice =
            br#"{"query":"mutation { \u0075pdateRef(input:{}) { clientMutationId } }","query":"{ viewer { login } }"}"#;
        assert_eq!(graphql_write(twice), Some("updateref"));
        let batch =
            br#"[{"query":"{ viewer { login } }"},{"query":"mutation{m\u0065rgeBranch(input:{}){clientMutationId}}"}]"#;
        assert_eq!(graphql_write(batch), Some("mergebranch"));
        let plain = br#"{"query":"mutation { createRef(input:{}) { clientMutationId } }"}"#;
        assert_eq!(graphql_write(plain), Some("createref"));
        assert_eq!(graphql_write(br#"{"query":"{ viewer { login \"createRef\" } }"#), Some("createref"));
        let read =
            br#"{"query":"query { repository(owner:\"a\", name:\"b\") { refs(first: 5) { nodes { name } } } }"}"#;
        assert_eq!(graphql_write(read), None);
        let branch = |m: &str, p: &str| write_of(m, p).map(|w| w.at);
        assert_eq!(
            branch("DELETE", "/repos/a/b/branches/release/1.0/protection"),
            Some(RefAt::Path { name: "refs/heads/release/1.0".into(), delete: true })
        );
        assert_eq!(
            branch("POST", "/repos/a/b/branches/release/1.0/rename"),
            Some(RefAt::Rename { from: "refs/heads/release/1.0".into() })
        );
        assert_eq!(
            branch("PUT", "/repos/a/b/branches/main/protection/required_status_checks"),
            Some(RefAt::Path { name: "refs/heads/main".into(), delete: true })
        );
        assert_eq!(
            graphql_query_write("query=mutation+%7B+c%72eateRef(input%3A%7B%7D)+%7B+x+%7D+%7D"),
            Some("createref")
        );
        assert_eq!(graphql_query_write("query=mutation%20%7B%20updateRef%7D"), Some("updateref"));
        assert_eq!(graphql_query_write("query=%7B+viewer+%7B+login+%7D+%7D"), None);
        assert_eq!(graphql_write(b"\"unterminated \\u0063reateRef"), None);
    }

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
        let w = write_of("POST", "/repos/a/b/releases").unwrap();
        let s = subjects(&w, Some(&serde_json::json!({"tag_name": "v9", "target_commitish": "main"})));
        assert!(matches!(&s[1], Subject::Git { access: GitAccess::Ref { name, .. }, .. } if name == "refs/tags/v9"));
        let w = write_of("PATCH", "/repos/a/b/releases/1").unwrap();
        assert_eq!(subjects(&w, Some(&serde_json::json!({"body": "notes"}))).len(), 1, "an edit naming no tag");
        let s = subjects(&w, Some(&serde_json::json!({"tag_name": "v10"})));
        assert!(matches!(&s[1], Subject::Git { access: GitAccess::Ref { name, .. }, .. } if name == "refs/tags/v10"));
        for path in ["keys", "Keys/", "collaborators/evil", "invitations/3", "transfer"] {
            assert!(matches!(write_of("PUT", &format!("/repos/a/b/{path}")).unwrap().at, RefAt::Refused(_)), "{path}");
        }
        for path in ["dispatches", "hooks/1/tests", "actions/secrets/X", "rulesets"] {
            assert_eq!(write_of("PUT", &format!("/repos/a/b/{path}")).unwrap().at, RefAt::Repo, "{path}");
        }
        assert_eq!(write_of("POST", "/repos/a/b/keysmith"), None);
        for path in [
            "/orgs/acme/teams/agents/repos/acme/widgets",
            "/teams/42/repos/acme/widgets",
            "/orgs/acme/memberships/evil",
            "/orgs/acme/outside_collaborators/evil",
            "/orgs/acme/invitations",
            "/Teams/42/Members/evil",
        ] {
            assert!(matches!(write_of("PUT", path).unwrap().at, RefAt::Refused(_)), "{path}");
        }
        assert_eq!(write_of("POST", "/orgs/acme/repos"), None, "a new repository grants nothing on an old one");
        assert!(matches!(write_of("POST", "/repos/a/b/generate").unwrap().at, RefAt::Refused(_)));
        let w = write_of("POST", "/repos/a/b/branches/scratch/rename").unwrap();
        let s = subjects(&w, Some(&serde_json::json!({"new_name": "main-hotfix"})));
        let refs: Vec<(String, bool)> = s
            .iter()
            .filter_map(|s| match s {
                Subject::Git { access: GitAccess::Ref { name, delete }, .. } => Some((name.clone(), *delete)),
                _ => None,
            })
            .collect();
        assert_eq!(refs, [("refs/heads/scratch".to_string(), true), ("refs/heads/main-hotfix".to_string(), false)]);
        assert_eq!(
            graphql_write(br#"{"query":"mutation { createLinkedBranch(input:{}) { x } }"}"#),
            Some("createlinkedbranch")
        );
        let w = write_of("POST", "/repos/a/b/actions/workflows/ci.yml/dispatches").unwrap();
        let s = subjects(&w, Some(&serde_json::json!({"ref": "main"})));
        assert!(matches!(&s[1], Subject::Git { access: GitAccess::Ref { name, .. }, .. } if name == "refs/heads/main"));
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
