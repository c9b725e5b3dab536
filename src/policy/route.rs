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

/// A path that climbs out of its prefix (`..`, `//`, an encoded dot): never allowed,
/// whatever the route's paths say.
pub fn is_traversal(path: &str) -> bool {
    path.contains("..") || path.contains("//") || path.contains('%') && path.to_ascii_lowercase().contains("%2e")
}
