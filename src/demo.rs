//! The built-in demo that `serve` runs without `--config`: proxy on 127.0.0.1:4002, one
//! sandbox `demo` with a token generated at start-up, and a policy that allows a few
//! package registries.

use std::path::Path;

use crate::auth;
use crate::config::{self, Config, ConfigError, DisplayPath, PolicySource};

/// The demo's gateway config; also shipped as `config/demo.toml`.
pub const DEMO_CONFIG: &str = include_str!("../config/demo.toml");

/// The demo policy; `{TOKEN_SHA256}` is replaced with the generated token's hash.
const DEMO_POLICY: &str = r#"
[policies.demo]
allow = [
  "pypi.org", "files.pythonhosted.org",
  "registry.npmjs.org",
  "crates.io", "index.crates.io", "static.crates.io",
  "deb.debian.org",
  "github.com", "codeload.github.com", "*.githubusercontent.com:443",
]

[[sandboxes]]
id = "demo"
token_sha256 = "{TOKEN_SHA256}"
policy = "demo"
"#;

pub const DEMO_SANDBOX: &str = "demo";

/// Returns the demo config and the freshly generated demo token.
pub fn config() -> Result<(Config, String), ConfigError> {
    let token = auth::generate_token();
    let mut cfg = config::parse(DEMO_CONFIG, &DisplayPath("<built-in demo>".into()), Path::new("."))?;
    let text = DEMO_POLICY.replace("{TOKEN_SHA256}", &hex::encode(auth::token_sha256(&token)));
    cfg.policy.source = PolicySource::Inline { label: "<built-in demo policy>".into(), text };
    Ok((cfg, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_loads_and_authenticates_its_token() {
        let (cfg, token) = config().unwrap();
        assert_eq!(cfg.proxy.listen.to_string(), "127.0.0.1:4002");
        let set = config::load_policies(&cfg).unwrap();
        let creds = auth::Credentials::new(DEMO_SANDBOX, &token);
        assert!(auth::authenticate(&set, &crate::tokens::Verifier::default(), &creds, 0).is_ok());
    }
}
