//! A policy's egress budget (`[policies.NAME.budget]`): how much its sandboxes may
//! send, fetch and ask for per window, and how many distinct hosts they may contact.
//! Only what is written here; counting is [`crate::budget`]'s.

use std::time::Duration;

/// Most per-host overrides in one budget: each is a counter per sandbox.
pub const MAX_HOST_OVERRIDES: usize = 64;
/// Largest `new_hosts`: each instance keeps the fleet's hosts of the window in memory.
pub const MAX_NEW_HOSTS: u64 = 100_000;

/// One policy's budget. Every limit is optional; `None` is unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetSpec {
    /// Windows are aligned to the Unix epoch, so every instance's windows agree.
    pub window: Duration,
    pub limits: Limits,
    /// Distinct hosts contacted per window.
    pub new_hosts: Option<u64>,
    /// Host-specific limits, counted apart from (and as well as) the policy's.
    pub hosts: Vec<HostBudget>,
}

/// Bytes and requests per window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Client to upstream.
    pub upload_bytes: Option<u64>,
    /// Upstream to client.
    pub download_bytes: Option<u64>,
    pub requests: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBudget {
    /// As written (`*.s3.amazonaws.com`); names the override in refusals and usage.
    pub host: String,
    pub limits: Limits,
}

impl HostBudget {
    /// `api.example.com` matches itself; `*.example.com` every name strictly below.
    pub fn matches(&self, host: &str) -> bool {
        host_matches(&self.host, host)
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        }
        None => host.eq_ignore_ascii_case(pattern),
    }
}

impl BudgetSpec {
    /// The overrides that apply to `host`.
    pub fn hosts_for<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a HostBudget> {
        self.hosts.iter().filter(move |h| h.matches(host))
    }
}

/// Checks an override's host pattern: a hostname, or `*.` and one.
pub fn check_host_pattern(pattern: &str) -> Result<(), String> {
    let name = pattern.strip_prefix("*.").unwrap_or(pattern);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if ok { Ok(()) } else { Err(format!("expected a hostname or *.suffix, got {pattern:?}")) }
}

/// A size: a whole number of bytes, or a number with a unit (`"100MiB"`, `"1.5 GB"`,
/// `"512k"`). Binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`kB`, `MB`, `GB`, `TB`)
/// units; `k`, `M`, `G`, `T` alone are binary.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let expected = || format!("expected a size such as 1048576, \"100MiB\" or \"2GB\", got {text:?}");
    let n: f64 = num.parse().map_err(|_| expected())?;
    let mult: u64 = match unit {
        "" | "B" | "b" => 1,
        "k" | "K" | "KiB" | "kiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(expected()),
    };
    let bytes = n * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(expected());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("2 GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("10 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn host_overrides_match_exact_and_below() {
        let h = |p: &str| HostBudget { host: p.into(), limits: Limits::default() };
        assert!(h("*.s3.amazonaws.com").matches("bucket.s3.amazonaws.com"));
        assert!(h("*.s3.amazonaws.com").matches("Bucket.S3.amazonaws.com."));
        assert!(!h("*.s3.amazonaws.com").matches("s3.amazonaws.com"));
        assert!(!h("*.s3.amazonaws.com").matches("evils3.amazonaws.com"));
        assert!(h("pypi.org").matches("PYPI.org"));
        assert!(!h("pypi.org").matches("files.pypi.org"));
        assert!(check_host_pattern("*.s3.amazonaws.com").is_ok());
        assert!(check_host_pattern("a b").is_err());
        assert!(check_host_pattern("*.").is_err());
    }
}
