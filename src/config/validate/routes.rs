//! The `[[routes]]` entries: credential-injecting API routes.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

/// A credential-injecting API route (`[[routes]]`).
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// `https://HOST[:PORT]`, no path.
    pub upstream: http::Uri,
    /// The upstream host, as absolute-form requests name it.
    pub host: String,
    pub header: http::HeaderName,
    pub prefix: String,
    pub secret: SecretSource,
    /// Upper-case methods allowed; empty: any.
    pub methods: Vec<String>,
    /// Path prefixes allowed; empty: any.
    pub paths: Vec<String>,
    pub sandbox_requests_per_minute: u32,
}

pub(super) fn validate_routes(
    routes: Vec<crate::config::raw::RawRoute>,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<Vec<RouteConfig>, ConfigError> {
    let mut out: Vec<RouteConfig> = Vec::with_capacity(routes.len());
    for (i, r) in routes.into_iter().enumerate() {
        let key = |k: &str| format!("routes[{i}].{k}");
        let valid_name = !r.name.is_empty()
            && r.name.len() <= 64
            && r.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid_name {
            return Err(ConfigError::invalid(file, key("name"), "expected a name of letters, digits, '-' or '_'"));
        }
        if let Some(j) = out.iter().position(|o| o.name == r.name) {
            return Err(ConfigError::invalid(file, key("name"), format!("{:?} is already routes[{j}].name", r.name)));
        }
        let upstream: http::Uri = r.upstream.trim_end_matches('/').parse().map_err(|_| {
            ConfigError::invalid(file, key("upstream"), format!("expected https://HOST, got {:?}", r.upstream))
        })?;
        if upstream.scheme_str() != Some("https") || !(upstream.path() == "/" || upstream.path().is_empty()) {
            return Err(ConfigError::invalid(file, key("upstream"), "expected https://HOST[:PORT] without a path"));
        }
        let host = upstream
            .host()
            .and_then(|h| addr::normalize_hostname(h).ok())
            .ok_or_else(|| ConfigError::invalid(file, key("upstream"), "expected a hostname"))?;
        let header = http::HeaderName::from_bytes(r.inject.header.as_bytes())
            .map_err(|_| ConfigError::invalid(file, key("inject.header"), "expected a header name"))?;
        let secret = match (r.inject.secret_file, r.inject.secret_env) {
            (Some(f), None) => SecretSource::File(clean_path(&base_dir.join(f))),
            (None, Some(env)) => SecretSource::Env(env),
            _ => {
                return Err(ConfigError::invalid(
                    file,
                    key("inject"),
                    "expected exactly one of secret_file and secret_env",
                ));
            }
        };
        for (j, p) in r.paths.iter().enumerate() {
            if !p.starts_with('/') || p.contains("..") || p.contains('%') {
                return Err(ConfigError::invalid(
                    file,
                    format!("routes[{i}].paths[{j}]"),
                    "expected a path prefix starting with /",
                ));
            }
        }
        out.push(RouteConfig {
            name: r.name,
            upstream,
            host,
            header,
            prefix: r.inject.prefix,
            secret,
            methods: r.methods.iter().map(|m| m.to_ascii_uppercase()).collect(),
            paths: r.paths,
            sandbox_requests_per_minute: r.sandbox_requests_per_minute,
        });
    }
    Ok(out)
}
