//! Gateway configuration: raw (serde) -> validated -> typed values.

pub mod drift;
pub mod error;
pub mod keys;
pub mod policy_files;
pub mod raw;
pub mod validate;

use std::path::Path;

pub use error::{ConfigError, DisplayPath};
pub use keys::{load_placeholder_secrets, load_route_secrets, load_verifier};
pub use policy_files::{load_policies, load_shadow};
pub use validate::{
    AdminConfig, BlockMode, Config, DnsAnswer, DnsConfig, DrainConfig, GithubConfig, InterceptConfig, KeyAlg,
    KeySource, LimitStore, LimitsConfig, LogConfig, LogFormat, PLACEHOLDER_PREFIX, PolicyConfig, PolicySource,
    ProxyConfig, ProxyProtocol, RateLimitAction, ResolverConfig, RouteConfig, SecretConfig, SecretSource, TokensConfig,
    TransparentConfig,
};

/// Reads and validates a gateway config file. Relative paths in it are relative to the
/// file's directory.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: path.into(), error: e })?;
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    let mut config = parse(&text, &path.into(), base)?;
    config.baseline = drift::Baseline::new(path, &text);
    Ok(config)
}

/// Parses and validates config text.
pub fn parse(text: &str, file: &DisplayPath, base_dir: &Path) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig = toml::from_str(text).map_err(|e| ConfigError::toml(file, text, &e))?;
    validate::validate(raw, file, base_dir)
}
