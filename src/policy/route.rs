//! API-route rules: which credential-injecting routes a policy's sandboxes may use,
//! and the methods and paths each route's `[[routes]]` entry allows.

/// One route a policy lists, with what its `[[routes]]` entry allows.
#[derive(Debug, Clone)]
pub struct RouteRule {
    pub name: String,
    /// Upper-case methods; empty: any.
    pub methods: Vec<String>,
    /// Path prefixes; empty: any.
    pub paths: Vec<String>,
    /// Index of the rule in the policy's rule list.
    pub rule: usize,
}

impl RouteRule {
    pub fn allows_method(&self, method: &str) -> bool {
        self.methods.is_empty() || self.methods.iter().any(|m| m == method)
    }

    /// `path` is the request path without its query.
    pub fn allows_path(&self, path: &str) -> bool {
        self.paths.is_empty()
            || self.paths.iter().any(|p| {
                path == p
                    || path.starts_with(&format!("{}/", p.trim_end_matches('/')))
                    || path.starts_with(p.as_str()) && p.ends_with('/')
            })
    }
}

/// A path that climbs out of its prefix, or could once an upstream decodes it (once
/// or more): `..`, `//` or `\\` as written or after percent-decoding, and encodings
/// that decode to invalid UTF-8 (overlong dots such as `%c0%ae`). Never allowed,
/// whatever the route's paths say.
pub fn is_traversal(path: &str) -> bool {
    let mut current = path.as_bytes().to_vec();
    for _ in 0..4 {
        if contains(&current, b"..") || contains(&current, b"//") || current.contains(&b'\\') {
            return true;
        }
        let decoded = super::requests::percent_decode(&current, false);
        if std::str::from_utf8(&decoded).is_err() {
            return true;
        }
        if decoded == current {
            return false;
        }
        current = decoded;
    }
    // Encoded four times over: no honest client sends that.
    true
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
