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

    /// A method a `_method` field of `path`'s query names (Rails, Laravel and Symfony
    /// run a POST so named as that method) which this route does not allow.
    pub fn refused_query_method(&self, method: &str, path: &str) -> Option<String> {
        let query = path.split_once('?').map(|(_, q)| q);
        super::requests::query_pairs(query)
            .filter(|(k, _)| super::requests::is_method_name(k.as_bytes()))
            .map(|(_, m)| super::requests::named_method(&m))
            .find(|named| !named.eq_ignore_ascii_case(method) && !self.allows_method(named))
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
/// or more): `..`, `//`, `\\` or a `.` segment as written or after percent-decoding,
/// after IIS's `%uXXXX` decoding, or once read through NFKC (which makes `．．`, `‥`
/// and `﹒﹒` `..`); and encodings that decode to invalid UTF-8 (overlong dots such as
/// `%c0%ae`). Never allowed, whatever the route's paths say.
pub fn is_traversal(path: &str) -> bool {
    let mut current = path.as_bytes().to_vec();
    for _ in 0..4 {
        if climbs(&current) || has_u_escape(&current) {
            return true;
        }
        let decoded = super::requests::percent_decode(&current, false);
        let Ok(text) = std::str::from_utf8(&decoded) else { return true };
        if !text.is_ascii() && climbs(nfkc(text).as_bytes()) {
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

/// `text` as an upstream that applies Unicode's compatibility normalisation (NFKC)
/// reads it, with the letters whose case folding is ASCII folded too: `‥` (U+2025) is
/// `..`, `﹒` (U+FE52) `.`, `＼` `\\`.
fn nfkc(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    super::requests::fold_lookalikes(&text.nfkc().collect::<String>())
}

/// `..`, `//`, `\\`, or a segment that is `.` alone.
fn climbs(path: &[u8]) -> bool {
    contains(path, b"..")
        || contains(path, b"//")
        || path.contains(&b'\\')
        || path.split(|&b| b == b'/').any(|s| s == b".")
}

/// IIS reads `%u002e` as `.`: `%u` and four hex digits.
fn has_u_escape(path: &[u8]) -> bool {
    path.windows(6)
        .any(|w| w[0] == b'%' && w[1].eq_ignore_ascii_case(&b'u') && w[2..].iter().all(u8::is_ascii_hexdigit))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
