//! Parsing of one policy rule as written in a policy file.
//!
//! Forms: `example.com`, `*.example.com`, `203.0.113.7`, `198.51.100.0/24`,
//! `[2001:db8::1]`, `[2001:db8::/32]`, each optionally followed by `:PORT` or `:*`.
//! A bare rule means the default ports (`egress.ports`) in an allow list and every port
//! in a deny list.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{self, AddrError, Host};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// One exact hostname (normalised).
    Exact(String),
    /// Every name strictly below this suffix (normalised, without `*.`).
    Suffix(String),
    /// IP-literal targets inside this network.
    Net(IpNet),
}

impl HostPattern {
    /// True when `host` (normalised) is what the pattern names: the exact name, a name
    /// strictly below the suffix, or an IP literal inside the network.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(p), Host::Name(n)) => p == n,
            (HostPattern::Suffix(s), Host::Name(n)) => {
                n.len() > s.len() && n.ends_with(s.as_str()) && n.as_bytes()[n.len() - s.len() - 1] == b'.'
            }
            (HostPattern::Net(net), Host::Ip(ip)) => net.contains(&super::net::canonical(*ip)),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpec {
    /// No port written: the default ports in an allow list, any port in a deny list.
    Default,
    Any,
    One(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pattern: HostPattern,
    pub ports: PortSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("empty rule")]
    Empty,
    #[error("a bare \"*\" would allow everything; list hosts or \"*.suffix\" patterns")]
    MatchAll,
    #[error("'*' is only allowed as the whole first label (\"*.example.com\")")]
    MisplacedWildcard,
    #[error("invalid port {0:?} (expected 1-65535 or *)")]
    Port(String),
    #[error("invalid network {0:?} (expected an address or CIDR)")]
    Net(String),
    #[error("invalid host: {0}")]
    Host(AddrError),
    #[error("a rule is HOST[:PORT], not a URL: write {0:?}")]
    Url(String),
}

/// Parses one rule string.
pub fn parse_rule(text: &str) -> Result<Rule, RuleError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(RuleError::Empty);
    }
    // `https://example.com/path`: say what to write instead.
    if let Some((_, rest)) = text.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let authority = authority.rsplit('@').next().unwrap_or_default();
        return Err(RuleError::Url(authority.to_string()));
    }
    let (host, port) = split_port(text)?;
    let ports = match port {
        None => PortSpec::Default,
        Some("*") => PortSpec::Any,
        Some(p) => PortSpec::One(addr::parse_port(p).map_err(|_| RuleError::Port(p.to_string()))?),
    };
    Ok(Rule { pattern: parse_pattern(host)?, ports })
}

fn split_port(text: &str) -> Result<(&str, Option<&str>), RuleError> {
    if let Some(rest) = text.strip_prefix('[') {
        let end = rest.find(']').ok_or_else(|| RuleError::Net(text.to_string()))?;
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| RuleError::Net(text.to_string()))?),
        };
        return Ok((&text[..end + 2], port));
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => text.split_once(':').map(|(h, p)| (h, Some(p))).ok_or(RuleError::Empty),
        // Unbracketed IPv6 address or network: no port possible.
        _ => Ok((text, None)),
    }
}

fn parse_pattern(host: &str) -> Result<HostPattern, RuleError> {
    let unbracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if unbracketed.contains('/') || unbracketed.contains(':') {
        return parse_net(unbracketed).map(HostPattern::Net);
    }
    if host == "*" {
        return Err(RuleError::MatchAll);
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(RuleError::MisplacedWildcard);
        }
        let name = addr::normalize_hostname(suffix).map_err(RuleError::Host)?;
        return Ok(HostPattern::Suffix(name));
    }
    if host.contains('*') {
        return Err(RuleError::MisplacedWildcard);
    }
    match addr::parse_host(host).map_err(RuleError::Host)? {
        Host::Name(n) => Ok(HostPattern::Exact(n)),
        Host::Ip(ip) => Ok(HostPattern::Net(IpNet::from(ip))),
    }
}

fn parse_net(s: &str) -> Result<IpNet, RuleError> {
    if let Ok(net) = s.parse::<IpNet>() {
        // Reject host bits set (`10.0.0.1/8`): almost always a typo.
        if net.trunc() != net {
            return Err(RuleError::Net(s.to_string()));
        }
        return Ok(canonical_net(net));
    }
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => {
            addr::parse_dotted_quad(s).map(|a| IpNet::from(IpAddr::V4(a))).map_err(|_| RuleError::Net(s.to_string()))
        }
        Ok(ip) => Ok(canonical_net(IpNet::from(ip))),
        Err(_) => Err(RuleError::Net(s.to_string())),
    }
}

/// An IPv4-mapped IPv6 network (`::ffff:a.b.c.d/120`) becomes the IPv4 network it
/// covers, because targets are canonicalised the same way before matching.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net,
        },
        _ => net,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let r = parse_rule("PyPI.org").unwrap();
        assert_eq!(r, Rule { pattern: HostPattern::Exact("pypi.org".into()), ports: PortSpec::Default });
        let r = parse_rule("*.githubusercontent.com:443").unwrap();
        assert_eq!(r.pattern, HostPattern::Suffix("githubusercontent.com".into()));
        assert_eq!(r.ports, PortSpec::One(443));
        assert_eq!(parse_rule("a.com:*").unwrap().ports, PortSpec::Any);
        let r = parse_rule("198.51.100.0/24:*").unwrap();
        assert_eq!(r.pattern, HostPattern::Net("198.51.100.0/24".parse().unwrap()));
        let r = parse_rule("203.0.113.7:443").unwrap();
        assert_eq!(r.pattern, HostPattern::Net("203.0.113.7/32".parse().unwrap()));
        let r = parse_rule("[2001:db8::/32]:443").unwrap();
        assert_eq!(r.pattern, HostPattern::Net("2001:db8::/32".parse().unwrap()));
        assert_eq!(parse_rule("2001:db8::1").unwrap().ports, PortSpec::Default);
        let r = parse_rule("[::ffff:192.0.2.0/120]:*").unwrap();
        assert_eq!(r.pattern, HostPattern::Net("192.0.2.0/24".parse().unwrap()));
    }

    #[test]
    fn rejects() {
        for bad in ["", "*", "*:443", "a.*.com", "*a.com", "a.com:0", "a.com:x", "10.0.0.1/8", "127.1", "[::1", "a b"] {
            assert!(parse_rule(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_rule("https://example.com/x").unwrap_err().to_string(),
            r#"a rule is HOST[:PORT], not a URL: write "example.com""#
        );
        assert_eq!(parse_rule("http://u@a.test:8080?q").unwrap_err(), RuleError::Url("a.test:8080".into()));
    }
}
