//! The `[intercept]` section (TLS inspection) and the `[[secrets]]` entries
//! (placeholder credentials bound to hosts).

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;
use crate::policy::{HostPattern, parse_rule};

/// `[intercept]`.
#[derive(Debug, Clone)]
pub struct InterceptConfig {
    pub ca_cert_file: PathBuf,
    pub ca_key_file: PathBuf,
    /// Hosts never inspected (certificate-pinning clients); their CONNECTs are tunnels.
    pub never: Vec<HostPattern>,
    pub leaf_ttl: Duration,
    pub upstream_ca_file: Option<PathBuf>,
}

impl InterceptConfig {
    /// True when `host` is listed in `intercept.never`.
    pub fn never_inspects(&self, host: &crate::addr::Host) -> bool {
        self.never.iter().any(|p| p.matches(host))
    }
}

/// One `[[secrets]]` entry: what the sandbox holds is [`SecretConfig::placeholder`].
#[derive(Debug, Clone)]
pub struct SecretConfig {
    pub name: String,
    pub source: SecretSource,
    /// Host rules with their ports (a bare host: 443).
    pub hosts: Vec<(HostPattern, crate::policy::PortSpec)>,
    /// Empty: every policy.
    pub policies: Vec<String>,
    pub query: bool,
    pub body: bool,
}

/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "EGRESS_SECRET_";

impl SecretConfig {
    /// `EGRESS_SECRET_NAME`: the text the sandbox holds instead of the value.
    pub fn placeholder(&self) -> String {
        format!("{PLACEHOLDER_PREFIX}{}", self.name)
    }

    /// True when the value may be sent to `target` by a sandbox under `policy`.
    pub fn bound_to(&self, target: &crate::addr::Target, policy: &str) -> bool {
        self.on_host(target) && (self.policies.is_empty() || self.policies.iter().any(|p| p == policy))
    }

    /// Whether this secret is bound to `host` on any port.
    pub fn on_host_name(&self, host: &crate::addr::Host) -> bool {
        self.hosts.iter().any(|(p, _)| p.matches(host))
    }

    /// Whether this secret is bound to `target` for any policy: its value is then
    /// redacted from every answer `target` gives, whoever asked.
    pub fn on_host(&self, target: &crate::addr::Target) -> bool {
        use crate::policy::PortSpec;
        let port_ok = |spec: &PortSpec| match spec {
            PortSpec::Default => target.port == 443,
            PortSpec::Any => true,
            PortSpec::One(p) => *p == target.port,
        };
        self.hosts.iter().any(|(p, ports)| p.matches(&target.host) && port_ok(ports))
    }

    /// The secret whose placeholder appears in `bytes` (the longest, where one name
    /// begins another).
    pub fn find_in<'s>(secrets: &'s [SecretConfig], bytes: &[u8]) -> Option<&'s SecretConfig> {
        let prefix = PLACEHOLDER_PREFIX.as_bytes();
        if !bytes.windows(prefix.len()).any(|w| w == prefix) {
            return None;
        }
        // The longest one found: `EGRESS_SECRET_a` is also inside `EGRESS_SECRET_ab`.
        secrets
            .iter()
            .filter(|s| {
                let ph = s.placeholder();
                bytes.windows(ph.len()).any(|w| w == ph.as_bytes())
            })
            .max_by_key(|s| s.name.len())
    }
}

pub(super) fn validate_intercept(
    raw: crate::config::raw::RawIntercept,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<InterceptConfig, ConfigError> {
    let mut never = Vec::with_capacity(raw.never.len());
    for (i, n) in raw.never.iter().enumerate() {
        let rule = parse_rule(n).map_err(|e| ConfigError::invalid(file, format!("intercept.never[{i}]"), e))?;
        never.push(rule.pattern);
    }
    if raw.leaf_ttl < Duration::from_secs(300) || raw.leaf_ttl > Duration::from_secs(30 * 24 * 3600) {
        return Err(ConfigError::invalid(file, "intercept.leaf_ttl", "expected a lifetime from 5m to 30d"));
    }
    Ok(InterceptConfig {
        ca_cert_file: clean_path(&base_dir.join(raw.ca_cert_file)),
        ca_key_file: clean_path(&base_dir.join(raw.ca_key_file)),
        never,
        leaf_ttl: raw.leaf_ttl,
        upstream_ca_file: raw.upstream_ca_file.map(|p| clean_path(&base_dir.join(p))),
    })
}

pub(super) fn validate_secrets(
    raw: Vec<crate::config::raw::RawSecret>,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<Vec<SecretConfig>, ConfigError> {
    let mut out: Vec<SecretConfig> = Vec::with_capacity(raw.len());
    for (i, s) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("secrets[{i}].{k}");
        let valid = !s.name.is_empty()
            && s.name.len() <= 64
            && s.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ConfigError::invalid(file, key("name"), "expected a name of letters, digits, '-' or '_'"));
        }
        if let Some(j) = out.iter().position(|o| o.name == s.name) {
            return Err(ConfigError::invalid(file, key("name"), format!("{:?} is already secrets[{j}].name", s.name)));
        }
        let source = match (s.value_file, s.value_env) {
            (Some(f), None) => SecretSource::File(clean_path(&base_dir.join(f))),
            (None, Some(env)) => SecretSource::Env(env),
            _ => {
                return Err(ConfigError::invalid(
                    file,
                    key("value_file"),
                    "expected exactly one of value_file and value_env",
                ));
            }
        };
        if s.hosts.is_empty() {
            return Err(ConfigError::invalid(file, key("hosts"), "expected at least one host the secret is bound to"));
        }
        let mut hosts = Vec::with_capacity(s.hosts.len());
        for (j, h) in s.hosts.iter().enumerate() {
            let rule = parse_rule(h).map_err(|e| ConfigError::invalid(file, format!("secrets[{i}].hosts[{j}]"), e))?;
            hosts.push((rule.pattern, rule.ports));
        }
        out.push(SecretConfig { name: s.name, source, hosts, policies: s.policies, query: s.query, body: s.body });
    }
    Ok(out)
}
