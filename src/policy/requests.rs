//! Request rules inside inspected hosts (`[[policies.NAME.requests]]`): host, methods,
//! path globs, and optional query and header matchers, each `allow` or `deny`. Deny
//! beats allow; no match is a deny. Pure.
//!
//! Paths are matched after one percent-decoding, without regard to case (GitHub's
//! owners and repositories, like many APIs' names, are case-insensitive: `Secrets` must
//! not dodge a deny rule for `secrets`). A path that climbs (`..`, `.`, `//`, `\`, as
//! written or encoded), encodes a slash (`%2F`, `%5C`), is encoded twice, or holds `;`
//! parameters or control characters is refused before any rule is consulted, so an
//! encoded form can neither dodge a deny rule nor ride an allow rule into another path
//! once the upstream decodes it. A query or header matcher must match every value the
//! request carries for its name (a duplicate cannot smuggle a second value past it).

use globset::{GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};

use super::rule::{HostPattern, parse_rule};
use crate::addr::Host;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// One request rule, compiled.
#[derive(Debug)]
pub struct RequestRule {
    pub host: HostPattern,
    /// Upper-case methods; empty: any.
    pub methods: Vec<String>,
    /// Path globs (`*` within a segment, `**` across); `None`: any path.
    paths: Option<GlobSet>,
    /// Query parameters that must be present with a matching value.
    query: Vec<(String, GlobMatcher)>,
    /// Headers (lower-case names) that must be present with a matching value.
    headers: Vec<(String, GlobMatcher)>,
    pub action: Action,
    /// Index of the rule in the policy's rule list.
    pub rule: usize,
}

/// A request rule as written.
#[derive(Debug, Default, Clone)]
pub struct RequestSpec<'a> {
    pub host: &'a str,
    pub methods: &'a [String],
    pub paths: &'a [String],
    pub query: Vec<(&'a str, &'a str)>,
    pub headers: Vec<(&'a str, &'a str)>,
    /// `"allow"` or `"deny"`.
    pub action: &'a str,
}

/// What a request rule is matched against: the path decided (see [`normalize_path`]).
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub host: &'a Host,
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a [(String, String)],
}

fn glob(pattern: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .case_insensitive(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("invalid glob {pattern:?}: {e}"))
}

impl RequestRule {
    /// Compiles `spec`; the error says which part is wrong and what was expected.
    pub fn compile(spec: &RequestSpec<'_>, rule: usize) -> Result<RequestRule, (String, String)> {
        let parsed = parse_rule(spec.host).map_err(|e| ("host".to_string(), e.to_string()))?;
        let action = match spec.action {
            "allow" => Action::Allow,
            "deny" => Action::Deny,
            other => return Err(("action".into(), format!("expected \"allow\" or \"deny\", got {other:?}"))),
        };
        let mut methods = Vec::with_capacity(spec.methods.len());
        for m in spec.methods {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err(("methods".into(), format!("expected an HTTP method such as \"GET\", got {m:?}")));
            }
            methods.push(m.to_ascii_uppercase());
        }
        let paths = if spec.paths.is_empty() {
            None
        } else {
            let mut set = GlobSetBuilder::new();
            for p in spec.paths {
                if !p.starts_with('/') || p.contains("..") || p.contains('%') {
                    return Err((
                        "paths".into(),
                        format!("expected a path glob starting with / (no query), got {p:?}"),
                    ));
                }
                // `/admin/**` covers `/admin` itself too.
                let base = p.strip_suffix("/**").filter(|b| !b.is_empty());
                for pattern in std::iter::once(p.as_str()).chain(base) {
                    set.add(
                        GlobBuilder::new(pattern)
                            .literal_separator(true)
                            .case_insensitive(true)
                            .build()
                            .map_err(|e| ("paths".to_string(), format!("invalid glob {p:?}: {e}")))?,
                    );
                }
            }
            Some(set.build().map_err(|e| ("paths".to_string(), e.to_string()))?)
        };
        let query = spec
            .query
            .iter()
            .map(|(k, v)| Ok((k.to_string(), glob(v)?)))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| ("query".to_string(), e))?;
        let headers = spec
            .headers
            .iter()
            .map(|(k, v)| {
                if http_token(k) {
                    Ok((k.to_ascii_lowercase(), glob(v)?))
                } else {
                    Err(format!("invalid header name {k:?}"))
                }
            })
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| ("headers".to_string(), e))?;
        Ok(RequestRule { host: parsed.pattern, methods, paths, query, headers, action, rule })
    }

    /// Methods without regard to case (an upstream may upper-case `delete`); query
    /// names without regard to case; header values split at commas. An allow rule's
    /// matcher needs every value the request carries for its name to match, a deny
    /// rule's any one of them: a duplicate can neither smuggle a second value past an
    /// allow rule nor hide the first from a deny rule.
    ///
    /// A deny rule also matches the spellings some upstreams read as the same: the
    /// path without its trailing `/`, with the letters Unicode case-folds to ASCII
    /// (`ſ`, `ı`, the Kelvin sign) folded, query values without surrounding white space
    /// or NULs; for both actions, query names lose a `[]` suffix and white space, pairs
    /// split at `;` as at `&`, and header names match with `_` for `-` (CGI reads
    /// both as one).
    pub fn matches(&self, r: &RequestView<'_>) -> bool {
        let deny = self.action == Action::Deny;
        let fits = |values: Vec<String>, g: &GlobMatcher| {
            if deny {
                values
                    .iter()
                    .any(|v| g.is_match(v) || g.is_match(v.trim_matches(|c: char| c.is_whitespace() || c == '\0')))
            } else {
                !values.is_empty() && values.iter().all(|v| g.is_match(v))
            }
        };
        let path_fits = |p: &GlobSet| {
            p.is_match(r.path)
                || (deny && {
                    let folded = fold_lookalikes(r.path);
                    let trimmed = |s: &str| -> Option<String> {
                        let t = s.trim_end_matches('/');
                        (t.len() != s.len() && !t.is_empty()).then(|| t.to_string())
                    };
                    let bare = trimmed(&folded).unwrap_or_else(|| folded.clone());
                    p.is_match(&folded)
                        || trimmed(r.path).is_some_and(|t| p.is_match(&t))
                        || p.is_match(&bare)
                        || without_suffix(&bare).is_some_and(|t| p.is_match(&t))
                })
        };
        self.host.matches(r.host)
            && (self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(r.method)))
            && self.paths.as_ref().is_none_or(path_fits)
            && self.query.iter().all(|(k, g)| {
                fits(
                    query_pairs(r.query)
                        .filter(|(qk, _)| query_name(qk).eq_ignore_ascii_case(k))
                        .map(|(_, v)| v)
                        .collect(),
                    g,
                )
            })
            && self.headers.iter().all(|(k, g)| {
                let values = r
                    .headers
                    .iter()
                    .filter(|(hk, _)| same_name(hk, k))
                    .flat_map(|(_, v)| v.split(',').map(|x| x.trim().to_string()))
                    .collect();
                fits(values, g)
            })
    }
}

/// A query name as array-taking frameworks read it: `ref[]`, `ref[0]` and ` ref` are
/// `ref`.
fn query_name(k: &str) -> &str {
    let k = k.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    // `ref[]`, `ref[0]`, `ref[x]`: an array or map named `ref` to PHP, Rack and qs.
    match k.split_once('[') {
        Some((name, rest)) if rest.ends_with(']') && !name.is_empty() => name,
        _ => k,
    }
}

/// Header names alike, `_` and `-` taken as one (both are lower case here).
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes().zip(b.bytes()).all(|(x, y)| x == y || (x == b'_' && y == b'-') || (x == b'-' && y == b'_'))
}

/// The letters whose Unicode case folding is ASCII (Java's and .NET's case-insensitive
/// comparisons take `ſ` for `s`, `ı` for `i`, the Kelvin sign for `k`), folded.
pub(super) fn fold_lookalikes(path: &str) -> String {
    path.chars()
        // Invisible (Unicode's default-ignorable code points): soft hyphen, combining
        // grapheme joiner, zero-width and direction marks, word joiner and invisible
        // operators, variation selectors, byte order mark, tags.
        .filter(|c| {
            !matches!(c,
                '\u{ad}' | '\u{34f}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
                | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}'
                | '\u{1d173}'..='\u{1d17a}' | '\u{e0000}'..='\u{e0fff}')
        })
        .map(|c| match c {
            '\u{17f}' => 's',
            '\u{131}' => 'i',
            '\u{212a}' => 'k',
            // Fullwidth forms, which NFKC makes ASCII.
            '\u{ff01}'..='\u{ff5e}' => char::from_u32(c as u32 - 0xfee0).unwrap_or(c),
            c => c,
        })
        .collect()
}

/// `path` without what some servers strip from its last segment before routing: a
/// format extension (`/secret.json` is `/secret` to Rails) or an NTFS stream
/// (`::$DATA`). `None` when there is none.
fn without_suffix(path: &str) -> Option<String> {
    let (dir, last) = path.rsplit_once('/')?;
    let stem = last.split_once("::").map_or(last, |(s, _)| s);
    let stem = stem.rsplit_once('.').map_or(stem, |(s, _)| s);
    (stem.len() != last.len() && !stem.is_empty()).then(|| format!("{dir}/{stem}"))
}

fn http_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The path a rule is matched against, or why it cannot be judged: one
/// percent-decoding of `path` (without its query), refused when it climbs or encodes
/// a separator.
pub fn normalize_path(path: &str) -> Result<String, &'static str> {
    if !path.starts_with('/') {
        return Err("the request path must start with /");
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") {
        return Err("an encoded / or \\ in the path is not allowed");
    }
    // IIS reads `%u0073` as `s`: a path so encoded is not judged.
    if lower.as_bytes().windows(6).any(|w| w.starts_with(b"%u") && w[2..].iter().all(u8::is_ascii_hexdigit)) {
        return Err("a %u-encoded path is not allowed");
    }
    if super::route::is_traversal(path) || path.split('/').any(|s| s == ".") {
        return Err("path traversal is not allowed");
    }
    let decoded = String::from_utf8(percent_decode(path.as_bytes(), false))
        .map_err(|_| "the path is not valid UTF-8 once decoded")?;
    if decoded.bytes().any(|b| b < 0x20 || b == 0x7f || b == b';') {
        return Err("control characters and ; parameters are not allowed in the path");
    }
    // Still encoded after one decoding: an upstream that decodes twice would see
    // another path than the one judged.
    if decoded.as_bytes().windows(3).any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit()) {
        return Err("a path encoded twice is not allowed");
    }
    if decoded.split('/').any(|s| s == "." || s == "..") {
        return Err("path traversal is not allowed");
    }
    // `/admin./x` and `/admin /x` are `/admin/x` to some servers.
    if decoded
        .split('/')
        .any(|s| s.ends_with('.') || s.ends_with(char::is_whitespace) || s.starts_with(char::is_whitespace))
    {
        return Err("a path segment may not end with . or begin or end with white space");
    }
    Ok(decoded)
}

/// `k=v` pairs of a query, percent-decoded (`+` as a space).
pub fn query_pairs(query: Option<&str>) -> impl Iterator<Item = (String, String)> + '_ {
    query.unwrap_or("").split(['&', ';']).filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let d = |s: &str| String::from_utf8_lossy(&percent_decode(s.as_bytes(), true)).into_owned();
        (d(k), d(v))
    })
}

/// Whether a field name (decoded) is `_method` as some framework reads it: leading
/// spaces, quotes, backslashes, `[`, `]` and `<` dropped, `.` and spaces read as `_`,
/// backslashes removed, and the name cut at the first byte that cannot be part of it
/// (a NUL, `[`, `,`, a quote).
pub fn is_method_name(raw: &[u8]) -> bool {
    let mut name = Vec::with_capacity(8);
    for &b in raw {
        let b = b.to_ascii_lowercase();
        match b {
            b'\\' => continue,
            b' ' | b'\t' | b'"' | b'\'' | b'[' | b']' | b'<' | b'+' if name.is_empty() => continue,
            b'.' | b' ' => name.push(b'_'),
            b'a'..=b'z' | b'0'..=b'9' | b'_' => name.push(b),
            _ => break,
        }
        if name.len() > 7 {
            return false;
        }
    }
    name == b"_method"
}

/// The method a `_method` field names, as the frameworks compare it: trimmed, and
/// upper-cased through Unicode's case mappings, so no spelling escapes the rules that
/// name the method (JavaScript's `toLowerCase` reads the Kelvin sign as `k`, and its
/// `toUpperCase` reads `ſ` as `S`; Express's router runs `LOC\u{212A}` as LOCK).
pub fn named_method(m: &str) -> String {
    m.trim().to_lowercase().to_uppercase()
}

/// `s` with each `%XX` decoded once, and `+` as a space when `plus` (a form).
pub fn percent_decode(s: &[u8], plus: bool) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' if let (Some(h), Some(l)) =
                (s.get(i + 1).copied().and_then(hex), s.get(i + 2).copied().and_then(hex)) =>
            {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// How a request rule is named in refusals and `check`: its action, methods, host and
/// paths, as written.
pub fn describe(spec: &RequestSpec<'_>) -> String {
    let methods = if spec.methods.is_empty() { "*".to_string() } else { spec.methods.join(",").to_ascii_uppercase() };
    let paths = if spec.paths.is_empty() { "/**".to_string() } else { spec.paths.join(",") };
    let mut s = format!("{} {methods} {}{paths}", spec.action, spec.host);
    for (k, v) in &spec.query {
        s.push_str(&format!(" ?{k}={v}"));
    }
    for (k, v) in &spec.headers {
        s.push_str(&format!(" {k}: {v}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, methods: &[&str], paths: &[&str], action: &str) -> RequestRule {
        let methods: Vec<String> = methods.iter().map(|s| s.to_string()).collect();
        let paths: Vec<String> = paths.iter().map(|s| s.to_string()).collect();
        let spec = RequestSpec { host, methods: &methods, paths: &paths, action, ..Default::default() };
        RequestRule::compile(&spec, 0).unwrap()
    }

    fn view<'a>(host: &'a Host, method: &'a str, path: &'a str) -> RequestView<'a> {
        RequestView { host, method, path, query: None, headers: &[] }
    }

    #[test]
    fn a_named_method_is_read_through_unicode_case_mappings() {
        assert_eq!(named_method(" delete\t"), "DELETE");
        assert_eq!(named_method("LOC\u{212A}"), "LOCK", "the Kelvin sign");
        assert_eq!(named_method("Po\u{17F}t"), "POST", "the long s");
        assert_eq!(named_method("L\u{131}nk"), "LINK", "the dotless i");
    }

    #[test]
    fn globs_methods_and_hosts() {
        let r = rule("api.github.com", &["get"], &["/repos/acme/**"], "allow");
        let h = Host::Name("api.github.com".into());
        assert!(r.matches(&view(&h, "GET", "/repos/acme/widgets/pulls")));
        assert!(!r.matches(&view(&h, "DELETE", "/repos/acme/widgets")));
        assert!(!r.matches(&view(&h, "GET", "/repos/other/widgets")));
        let one = rule("*.googleapis.com", &[], &["/v1/*"], "allow");
        let g = Host::Name("storage.googleapis.com".into());
        assert!(one.matches(&view(&g, "PUT", "/v1/x")));
        assert!(!one.matches(&view(&g, "PUT", "/v1/x/y")), "* stays within a segment");
        assert!(r.matches(&view(&h, "GET", "/Repos/ACME/widgets")), "case does not dodge a rule");
        assert!(r.matches(&view(&h, "get", "/repos/acme")), "method case, and /** covers its base");
        assert!(!one.matches(&view(&Host::Name("googleapis.com".into()), "PUT", "/v1/x")));
    }

    #[test]
    fn query_and_header_matchers() {
        let methods = vec![];
        let paths = vec![];
        let spec = RequestSpec {
            host: "a.test",
            methods: &methods,
            paths: &paths,
            query: vec![("ref", "main")],
            headers: vec![("X-Api-Version", "2024-*")],
            action: "allow",
        };
        let r = RequestRule::compile(&spec, 0).unwrap();
        let h = Host::Name("a.test".into());
        let headers = vec![("x-api-version".to_string(), "2024-01".to_string())];
        let mut v = RequestView { host: &h, method: "GET", path: "/", query: Some("x=1&ref=main"), headers: &headers };
        assert!(r.matches(&v));
        v.query = Some("ref=dev");
        assert!(!r.matches(&v));
        v.query = Some("ref=dev&ref=main");
        assert!(!r.matches(&v), "every value of a duplicated parameter must match");
        // A deny rule fires on any value, any case of the name, any item of a list.
        let deny = RequestRule::compile(&RequestSpec { action: "deny", ..spec.clone() }, 1).unwrap();
        let listed = vec![("x-api-version".to_string(), "1999, 2024-01".to_string())];
        let dv = RequestView { host: &h, method: "get", path: "/", query: Some("REF=main&ref=dev"), headers: &listed };
        assert!(deny.matches(&dv));
        v.query = Some("ref=main");
        v.headers = &[];
        assert!(!r.matches(&v));
    }

    #[test]
    fn a_deny_rule_matches_the_spellings_upstreams_read_alike() {
        let (methods, paths) = (vec![], vec!["/echo/secret".to_string(), "/admin/**".to_string()]);
        let spec = RequestSpec {
            host: "a.test",
            methods: &methods,
            paths: &paths,
            query: vec![],
            headers: vec![],
            action: "deny",
        };
        let deny = RequestRule::compile(&spec, 0).unwrap();
        let allow = RequestRule::compile(&RequestSpec { action: "allow", ..spec.clone() }, 1).unwrap();
        let h = Host::Name("a.test".into());
        for path in [
            "/echo/secret/",
            "/echo/\u{17f}ecret",
            "/adm\u{131}n/x",
            "/echo/secret//",
            "/echo/secret.json",
            "/echo/secret::$DATA",
            "/echo/\u{ff53}ecret",
            "/echo/secret\u{200b}",
            "/echo/se\u{ad}cret",
            "/echo/secret\u{fe0f}",
            "/echo/SECRET\u{ff0f}",
        ] {
            assert!(deny.matches(&view(&h, "GET", path)), "{path}");
        }
        assert!(!allow.matches(&view(&h, "GET", "/echo/secret/")), "an allow rule stays exact");
        assert!(!deny.matches(&view(&h, "GET", "/echo/secrets")));

        let no_paths = vec![];
        let q = RequestSpec {
            paths: &no_paths,
            query: vec![("ref", "main")],
            headers: vec![("x-danger", "*")],
            ..spec.clone()
        };
        let deny = RequestRule::compile(&q, 2).unwrap();
        let danger = vec![("x_danger".to_string(), "1".to_string())];
        for query in [
            "x=1;ref=main",
            "ref[]=main",
            "ref%5B%5D=main",
            "ref[0]=main",
            "ref[x]=main",
            "%20ref=main",
            "ref=main%20",
            "ref=main+",
            "ref=main%00",
        ] {
            let v = RequestView { host: &h, method: "GET", path: "/", query: Some(query), headers: &danger };
            assert!(deny.matches(&v), "{query}");
        }
        let v = RequestView { host: &h, method: "GET", path: "/", query: Some("ref=mainline"), headers: &danger };
        assert!(!deny.matches(&v));
    }

    #[test]
    fn paths_are_normalized_or_refused() {
        assert_eq!(normalize_path("/repos/a%20b").unwrap(), "/repos/a b");
        for bad in [
            "/a/../b",
            "/a/%2e%2e/b",
            "/a%2Fb",
            "/a%5cb",
            "//x",
            "/a/./b",
            "relative",
            "/%c0%ae%c0%ae/",
            "/a;x/b",
            "/echo/%u0073ecret",
            "/a%00/b",
            "/a%2561",
            "/admin./x",
            "/admin%20/x",
            "/a/%2e/b",
        ] {
            assert!(normalize_path(bad).is_err(), "{bad}");
        }
        let pairs: Vec<_> = query_pairs(Some("a=1&b=x%20y+z&c")).collect();
        assert_eq!(pairs[1], ("b".to_string(), "x y z".to_string()));
        assert_eq!(pairs[2], ("c".to_string(), String::new()));
    }

    #[test]
    fn bad_specs_name_the_key() {
        let m = vec!["G E T".to_string()];
        let spec = RequestSpec { host: "a.test", methods: &m, action: "allow", ..Default::default() };
        assert_eq!(RequestRule::compile(&spec, 0).unwrap_err().0, "methods");
        let spec = RequestSpec { host: "a.test", action: "maybe", ..Default::default() };
        assert_eq!(RequestRule::compile(&spec, 0).unwrap_err().0, "action");
        let p = vec!["no-slash".to_string()];
        let spec = RequestSpec { host: "a.test", paths: &p, action: "deny", ..Default::default() };
        assert_eq!(RequestRule::compile(&spec, 0).unwrap_err().0, "paths");
        let spec = RequestSpec { host: "*", action: "deny", ..Default::default() };
        assert_eq!(RequestRule::compile(&spec, 0).unwrap_err().0, "host");
    }
}
