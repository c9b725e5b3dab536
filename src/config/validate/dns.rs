//! The `[dns]` section: the embedded DNS firewall.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

/// The most UDP sockets `dns.udp_sockets` may ask for (each has a task of its own).
const MAX_UDP_SOCKETS: usize = 256;

/// What the DNS firewall answers for names that are not the gateway's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockMode {
    NxDomain,
    NoData,
    Refused,
}

/// Which names the firewall answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsAnswer {
    /// Only the gateway's own hostnames.
    Hostnames,
    /// Also every name the asking sandbox (by source address) may reach, answered with
    /// `dns.addresses` (the transparent listeners' address).
    Gateway,
}

/// Over the per-source rate: drop the query silently, or answer REFUSED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitAction {
    Drop,
    Refused,
}

#[derive(Debug, Clone)]
pub struct DnsConfig {
    pub listen: SocketAddr,
    /// Normalised (lowercase A-label, no trailing dot).
    pub hostnames: Vec<String>,
    pub addresses: Vec<IpAddr>,
    pub blocked: BlockMode,
    pub ttl: u32,
    pub negative_ttl: u32,
    /// 0 disables rate limiting.
    pub rate_limit_qps: u32,
    pub rate_limit_burst: u32,
    pub rate_limit_action: RateLimitAction,
    pub tcp_max_connections: usize,
    pub tcp_max_per_client: usize,
    pub tcp_idle_timeout: Duration,
    /// 0: one per core.
    pub udp_sockets: usize,
    pub log_blocked_per_second: u32,
    pub answer: DnsAnswer,
    /// TTL of answer-mode answers (s): short, so a policy change reaches clients soon.
    pub answer_ttl: u32,
}

pub(super) fn validate_dns(d: crate::config::raw::RawDns, file: &DisplayPath) -> Result<DnsConfig, ConfigError> {
    let err = |key: &str, msg: String| ConfigError::invalid(file, key, msg);
    let listen = d.listen.parse().map_err(|_| err("dns.listen", format!("expected IP:PORT, got {:?}", d.listen)))?;
    if d.hostnames.is_empty() {
        return Err(err("dns.hostnames", "expected at least one hostname (the gateway's own name)".into()));
    }
    let mut hostnames = Vec::with_capacity(d.hostnames.len());
    for (i, h) in d.hostnames.iter().enumerate() {
        let n = addr::normalize_hostname(h)
            .map_err(|e| err(&format!("dns.hostnames[{i}]"), format!("expected a hostname, got {h:?}: {e}")))?;
        hostnames.push(n);
    }
    let mut addresses = Vec::with_capacity(d.addresses.len());
    for (i, a) in d.addresses.iter().enumerate() {
        addresses.push(
            a.parse::<IpAddr>()
                .map_err(|_| err(&format!("dns.addresses[{i}]"), format!("expected an IP address, got {a:?}")))?,
        );
    }
    let blocked = match d.blocked.as_str() {
        "nxdomain" => BlockMode::NxDomain,
        "nodata" => BlockMode::NoData,
        "refused" => BlockMode::Refused,
        other => {
            return Err(err("dns.blocked", format!("expected \"nxdomain\", \"nodata\" or \"refused\", got {other:?}")));
        }
    };
    let rate_limit_action = match d.rate_limit_action.as_str() {
        "drop" => RateLimitAction::Drop,
        "refused" => RateLimitAction::Refused,
        other => {
            return Err(err("dns.rate_limit_action", format!("expected \"drop\" or \"refused\", got {other:?}")));
        }
    };
    if d.rate_limit_qps > 0 && d.rate_limit_burst == 0 {
        return Err(err("dns.rate_limit_burst", "expected at least 1 when dns.rate_limit_qps is set".into()));
    }
    if !(1..=super::MAX_CONNECTIONS).contains(&d.tcp_max_connections) {
        let max = super::MAX_CONNECTIONS;
        return Err(err("dns.tcp_max_connections", format!("expected 1 to {max}, got {}", d.tcp_max_connections)));
    }
    if d.udp_sockets > MAX_UDP_SOCKETS {
        return Err(err(
            "dns.udp_sockets",
            format!("expected 0 (one per CPU) to {MAX_UDP_SOCKETS}, got {}", d.udp_sockets),
        ));
    }
    positive(file, "dns.tcp_idle_timeout", d.tcp_idle_timeout)?;
    let answer = match d.answer.as_str() {
        "hostnames" => DnsAnswer::Hostnames,
        "gateway" if addresses.is_empty() => {
            return Err(err(
                "dns.addresses",
                "dns.answer = \"gateway\" answers with these addresses: list at least one".into(),
            ));
        }
        "gateway" => DnsAnswer::Gateway,
        other => return Err(err("dns.answer", format!("expected \"hostnames\" or \"gateway\", got {other:?}"))),
    };
    Ok(DnsConfig {
        listen,
        hostnames,
        addresses,
        blocked,
        ttl: d.ttl,
        negative_ttl: d.negative_ttl,
        rate_limit_qps: d.rate_limit_qps,
        rate_limit_burst: d.rate_limit_burst,
        rate_limit_action,
        tcp_max_connections: d.tcp_max_connections,
        tcp_max_per_client: match d.tcp_max_per_client {
            Some(0) => return Err(err("dns.tcp_max_per_client", "expected at least 1".into())),
            Some(n) => n,
            None => (d.tcp_max_connections / 8).clamp(1, 64),
        },
        tcp_idle_timeout: d.tcp_idle_timeout,
        udp_sockets: d.udp_sockets,
        log_blocked_per_second: d.log_blocked_per_second,
        answer,
        answer_ttl: d.answer_ttl,
    })
}
