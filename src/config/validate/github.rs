//! The `[github]` section: the git route's GitHub (or GHES) URLs and App credentials.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

#[derive(Debug, Clone)]
pub struct GithubConfig {
    /// `https://github.com` (or a GitHub Enterprise URL), without a trailing slash.
    pub web_url: http::Uri,
    /// The web host as the git route matches it (`github.com`).
    pub web_host: String,
    pub api_url: http::Uri,
    pub ca_file: Option<PathBuf>,
    pub app: Option<(u64, PathBuf)>,
    /// Lowercase owner -> static token file.
    pub token_files: HashMap<String, PathBuf>,
    pub refresh_before: Duration,
    pub idle_timeout: Duration,
    /// App tokens one sandbox may cause to be minted per minute (0: any number).
    pub sandbox_mints_per_minute: u32,
}

pub(super) fn validate_github(
    g: crate::config::raw::RawGithub,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<GithubConfig, ConfigError> {
    let url = |key: &str, v: &str| -> Result<http::Uri, ConfigError> {
        let u: http::Uri = v
            .trim_end_matches('/')
            .parse()
            .map_err(|_| ConfigError::invalid(file, key, format!("expected an https:// URL, got {v:?}")))?;
        // The API URL may carry a path: GitHub Enterprise Server's is /api/v3.
        let path_ok = u.path() == "/"
            || u.path().is_empty()
            || key == "github.api_url"
                && u.query().is_none()
                && !u.path().contains("..")
                && !u.path().contains("//")
                && u.path().bytes().all(|b| b.is_ascii_alphanumeric() || b"/-._".contains(&b));
        match (u.scheme_str(), u.host()) {
            // https only: the gateway's token would cross the network in clear, and the
            // git rules judge API writes only inside inspected TLS.
            (Some("https"), Some(_)) if path_ok => Ok(u),
            _ if key == "github.api_url" => Err(ConfigError::invalid(
                file,
                key,
                format!("expected https://HOST[:PORT][/PATH] (e.g. https://ghe.example.com/api/v3), got {v:?}"),
            )),
            _ => {
                Err(ConfigError::invalid(file, key, format!("expected https://HOST[:PORT] without a path, got {v:?}")))
            }
        }
    };
    let web_url = url("github.web_url", &g.web_url)?;
    let api_url = url("github.api_url", &g.api_url)?;
    let web_host = web_url
        .host()
        .and_then(|h| addr::normalize_hostname(h).ok())
        .ok_or_else(|| ConfigError::invalid(file, "github.web_url", "expected a hostname"))?;
    let path = |p: &str| (!p.is_empty()).then(|| clean_path(&base_dir.join(p)));
    let app = match (g.app_id, g.private_key_file.map(|p| clean_path(&base_dir.join(p)))) {
        (0, None) => None,
        (id, Some(key)) if id > 0 => Some((id, key)),
        (0, Some(_)) => {
            return Err(ConfigError::invalid(file, "github.app_id", "expected the App id with private_key_file"));
        }
        _ => return Err(ConfigError::invalid(file, "github.private_key_file", "expected the App's private key (PEM)")),
    };
    let mut token_files = HashMap::new();
    for (owner, f) in g.token_files {
        let key = format!("github.token_files.{owner}");
        let p = path(&f).ok_or_else(|| ConfigError::invalid(file, &key, "expected a file"))?;
        // Read again on every use (a rotated token needs no reload); here only to fail
        // at start-up rather than on the first clone. The token itself is never shown.
        match std::fs::read_to_string(&p) {
            Err(e) => return Err(ConfigError::invalid(file, key, format!("cannot read {}: {e}", p.display()))),
            Ok(t) if t.trim().is_empty() => {
                return Err(ConfigError::invalid(file, key, format!("{} is empty: expected the token", p.display())));
            }
            Ok(_) => {}
        }
        if token_files.insert(owner.to_ascii_lowercase(), p).is_some() {
            return Err(ConfigError::invalid(file, key, "names an owner another entry names (owners ignore case)"));
        }
    }
    positive(file, "github.idle_timeout", g.idle_timeout)?;
    // Installation tokens live an hour; renewing them an hour early renews on every use.
    within(file, "github.refresh_before", g.refresh_before, Duration::ZERO, Duration::from_secs(50 * 60))?;
    Ok(GithubConfig {
        web_url,
        web_host,
        api_url,
        ca_file: g.ca_file.map(|p| clean_path(&base_dir.join(p))),
        app,
        token_files,
        refresh_before: g.refresh_before,
        idle_timeout: g.idle_timeout,
        sandbox_mints_per_minute: g.sandbox_mints_per_minute,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn github_urls_must_be_https() {
        let file = crate::config::DisplayPath("g.toml".into());
        for (key, url) in [("web_url", "http://github.example"), ("api_url", "http://api.github.example/api/v3")] {
            let text = format!("[github]\n{key} = \"{url}\"\n");
            let err = crate::config::parse(&text, &file, std::path::Path::new("/")).unwrap_err().to_string();
            assert!(err.contains(&format!("github.{key}")) && err.contains("https://"), "{err}");
        }
        let ok = "[github]\nweb_url = \"https://ghe.example\"\napi_url = \"https://ghe.example/api/v3\"\n";
        assert!(crate::config::parse(ok, &file, std::path::Path::new("/")).is_ok());
    }
}
