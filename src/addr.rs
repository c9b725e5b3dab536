//! Target (authority) parsing and normalisation.
//!
//! Everything a sandbox names as a destination passes through here before any
//! decision is made, so the rules are strict: lowercase, at most one trailing dot
//! stripped, IDNA to A-labels, and IP literals only in their canonical textual forms
//! (dotted-quad IPv4, bracketed IPv6). Forms that some resolvers read as addresses
//! (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`) are neither IP literals nor
//! hostnames here: they are rejected, so no later component can disagree about them.
//!
//! No I/O, no tokio, no hyper: the CLI, fuzzers and benches use this exact code.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why a target was rejected. Each maps to the `bad_request` deny reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("empty host")]
    EmptyHost,
    #[error("authority must not contain userinfo, a path, spaces, '%' or control characters")]
    ForbiddenCharacter,
    #[error("missing port")]
    MissingPort,
    #[error("invalid port (expected 1-65535)")]
    InvalidPort,
    #[error("not a valid IP literal (use dotted-quad IPv4 or bracketed IPv6)")]
    InvalidIpLiteral,
    #[error("invalid hostname")]
    InvalidHostname,
    #[error("hostname too long")]
    HostnameTooLong,
}

/// A normalised destination host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lowercase ASCII (A-label) hostname without trailing dot.
    Name(String),
    /// An IP literal; IPv4-mapped IPv6 literals are kept as written (vetting
    /// canonicalises them).
    Ip(IpAddr),
}

impl Host {
    pub fn as_name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => crate::digits::ipv4(f, *a),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// A normalised `host:port` destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl Target {
    /// `host:port` as `Display` writes it, to a writer known at compile time: without
    /// `core::fmt`'s dynamic dispatch, which cost a forwarded request about 1,000
    /// instructions through `format_args!`.
    pub fn write_to(&self, w: &mut impl fmt::Write) -> fmt::Result {
        match &self.host {
            Host::Name(n) => w.write_str(n)?,
            Host::Ip(IpAddr::V4(a)) => crate::digits::ipv4(w, *a)?,
            Host::Ip(IpAddr::V6(a)) => write!(w, "[{a}]")?,
        }
        w.write_char(':')?;
        crate::digits::u64(w, u64::from(self.port))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

impl FromStr for Target {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_authority(s, None)
    }
}

/// Maximum length of a hostname in presentation form (RFC 1035).
const MAX_HOSTNAME: usize = 253;
const MAX_LABEL: usize = 63;

/// Parses an authority (`host:port`, `[v6]:port`). When `default_port` is `None` the
/// port is required (CONNECT); otherwise a missing port takes the default (absolute-form
/// URIs). Userinfo, paths and other stray characters are rejected, not stripped.
pub fn parse_authority(s: &str, default_port: Option<u16>) -> Result<Target, AddrError> {
    if s.bytes().any(forbidden_in_authority) {
        return Err(AddrError::ForbiddenCharacter);
    }
    let (host_part, port_part) = split_host_port(s)?;
    let port = match (port_part, default_port) {
        // `http://host:/` is `http://host/` (RFC 3986, 3.2.3: an empty port is the
        // scheme's default); a CONNECT target has no default and needs its port.
        (Some(""), Some(default)) => default,
        (Some(p), _) => parse_port(p)?,
        (None, default) => default.ok_or(AddrError::MissingPort)?,
    };
    let host = parse_host(host_part)?;
    Ok(Target { host, port })
}

fn forbidden_in_authority(b: u8) -> bool {
    matches!(b, b'@' | b'/' | b'\\' | b'%' | b'?' | b'#' | b' ') || b.is_ascii_control()
}

fn split_host_port(s: &str) -> Result<(&str, Option<&str>), AddrError> {
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or(AddrError::InvalidIpLiteral)?;
        let host = &s[..end + 2];
        let after = &rest[end + 1..];
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host, Some(p))),
                None => Err(AddrError::InvalidIpLiteral),
            },
        };
    }
    match s.rfind(':') {
        // A bare IPv6 address without brackets is not an authority.
        Some(i) if s[..i].contains(':') => Err(AddrError::InvalidIpLiteral),
        Some(i) => Ok((&s[..i], Some(&s[i + 1..]))),
        None => Ok((s, None)),
    }
}

/// Parses a port: 1 to 5 ASCII digits, value 1-65535.
pub fn parse_port(p: &str) -> Result<u16, AddrError> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AddrError::InvalidPort);
    }
    match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => u16::try_from(n).map_err(|_| AddrError::InvalidPort),
        _ => Err(AddrError::InvalidPort),
    }
}

/// Parses and normalises a host: a bracketed IPv6 literal, a dotted-quad IPv4 literal,
/// or a hostname (see [`normalize_hostname`]).
pub fn parse_host(s: &str) -> Result<Host, AddrError> {
    if s.is_empty() {
        return Err(AddrError::EmptyHost);
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(AddrError::InvalidIpLiteral)?;
        return Ipv6Addr::from_str(inner).map(|a| Host::Ip(IpAddr::V6(a))).map_err(|_| AddrError::InvalidIpLiteral);
    }
    if s.contains(':') {
        return Err(AddrError::InvalidIpLiteral);
    }
    if looks_numeric(s) {
        return parse_dotted_quad(s).map(|a| Host::Ip(IpAddr::V4(a)));
    }
    normalize_hostname(s).map(Host::Name)
}

/// True for strings made only of digits and dots: these are IP-literal attempts and must
/// be exact dotted quads.
fn looks_numeric(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Strict dotted-quad: four decimal octets, no leading zeros, no trailing dot.
pub fn parse_dotted_quad(s: &str) -> Result<Ipv4Addr, AddrError> {
    let mut octets = [0u8; 4];
    let mut parts = s.as_bytes().split(|&b| b == b'.');
    for octet in &mut octets {
        let p = parts.next().ok_or(AddrError::InvalidIpLiteral)?;
        // Digits only (`u8::from_str` would take a sign: `+1`).
        if p.is_empty() || p.len() > 3 || (p.len() > 1 && p[0] == b'0') || !p.iter().all(u8::is_ascii_digit) {
            return Err(AddrError::InvalidIpLiteral);
        }
        let n = p.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
        *octet = u8::try_from(n).map_err(|_| AddrError::InvalidIpLiteral)?;
    }
    if parts.next().is_some() {
        return Err(AddrError::InvalidIpLiteral);
    }
    Ok(Ipv4Addr::from(octets))
}

/// Normalises a hostname: IDNA (UTS 46) to lowercase A-labels, one trailing dot
/// stripped, labels of letters, digits, `-` and `_` (1-63 bytes, no leading or trailing
/// hyphen), total at most 253 bytes. A name whose last label is numeric or hex
/// (`0x7f.1`, `foo.123`) is rejected: URL parsers treat such names as IPv4 addresses.
pub fn normalize_hostname(s: &str) -> Result<String, AddrError> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() {
        return Err(AddrError::EmptyHost);
    }
    let ascii = if s.is_ascii() {
        s.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii(s).map_err(|_| AddrError::InvalidHostname)?
    };
    check_hostname(&ascii)?;
    Ok(ascii)
}

fn check_hostname(name: &str) -> Result<(), AddrError> {
    if name.is_empty() {
        return Err(AddrError::EmptyHost);
    }
    if name.len() > MAX_HOSTNAME {
        return Err(AddrError::HostnameTooLong);
    }
    let mut last = "";
    for label in name.split('.') {
        let ok_len = !label.is_empty() && label.len() <= MAX_LABEL;
        let ok_chars = label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok_len || !ok_chars || label.starts_with('-') || label.ends_with('-') {
            return Err(AddrError::InvalidHostname);
        }
        last = label;
    }
    if is_numeric_label(last) {
        return Err(AddrError::InvalidIpLiteral);
    }
    Ok(())
}

/// The WHATWG URL "ends in a number" rule: decimal, or `0x` followed by hex digits.
fn is_numeric_label(label: &str) -> bool {
    if label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match label.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// The address a per-client limit counts by: an IPv4-mapped IPv6 address as its IPv4
/// (one client, reached over a dual-stack socket, is not two). IPv6 addresses count
/// one by one: sandboxes on one node often share a /64, and keying by it would let
/// one of them spend its neighbours' shares.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn clients_count_by_address_a_mapped_one_as_its_ipv4() {
        let key = |s: &str| client_key(s.parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(key("192.0.2.7"), key("::ffff:192.0.2.7"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:2::2"), "neighbours in a /64 are apart");
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
    }
    use super::*;

    fn host(s: &str) -> Result<Host, AddrError> {
        parse_host(s)
    }

    #[test]
    fn hostnames_are_normalised() {
        assert_eq!(host("PyPI.org."), Ok(Host::Name("pypi.org".into())));
        assert_eq!(host("bücher.example"), Ok(Host::Name("xn--bcher-kva.example".into())));
        assert_eq!(host("_dmarc.example.com"), Ok(Host::Name("_dmarc.example.com".into())));
        assert_eq!(host("localhost"), Ok(Host::Name("localhost".into())));
    }

    #[test]
    fn only_canonical_ip_literals_are_accepted() {
        assert_eq!(host("127.0.0.1"), Ok(Host::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        assert!(matches!(host("[::1]"), Ok(Host::Ip(IpAddr::V6(_)))));
        for bad in [
            "2130706433",
            "0x7f.1",
            "0177.0.0.1",
            "127.1",
            "127.0.0.1.",
            "0x7f000001",
            "127.0.0.01",
            "256.0.0.1",
            "1.2.3.4.5",
            "::1",
            "[::1",
            "[fe80::1%eth0]",
            "foo.0x1f",
            "example.123",
            "1.2.3",
        ] {
            assert!(host(bad).is_err(), "{bad} must be rejected");
        }
        // It is public: strict on its own, whatever its callers check first.
        for bad in ["1.2.3.+4", "+1.2.3.4", "1.2.3.-0", "1.2.3. 4", "1..3.4", "1.2.3.999", "1.2.3.4."] {
            assert!(parse_dotted_quad(bad).is_err(), "{bad} must be rejected");
        }
        assert_eq!(parse_dotted_quad("255.0.10.9"), Ok(Ipv4Addr::new(255, 0, 10, 9)));
    }

    /// The hand-written parser agrees with the standard library's (which also
    /// takes only four decimal octets, with no leading zeros) on every string of up to
    /// eight characters drawn from digits, dots and a sign.
    #[test]
    fn the_dotted_quad_parser_agrees_with_the_standard_library() {
        let checked = every_string(b"0125.+", 8, |s| {
            assert_eq!(parse_dotted_quad(s).ok(), s.parse::<Ipv4Addr>().ok(), "{s:?}");
        });
        assert!(checked > 1_000_000);
    }

    /// Calls `check` with every string of up to `max_len` bytes from `alphabet`; how
    /// many there were.
    fn every_string(alphabet: &[u8], max_len: u32, mut check: impl FnMut(&str)) -> usize {
        let mut checked = 0;
        for len in 0..=max_len {
            for mut n in 0..alphabet.len().pow(len) {
                let mut s = String::new();
                for _ in 0..len {
                    s.push(char::from(alphabet[n % alphabet.len()]));
                    n /= alphabet.len();
                }
                check(&s);
                checked += 1;
            }
        }
        checked
    }

    /// Ports at and around their limits.
    #[test]
    fn ports_and_colons() {
        for (authority, port) in [("a.com:1", Ok(1)), ("a.com:00080", Ok(80)), ("a.com:65535", Ok(65535))] {
            assert_eq!(parse_authority(authority, None).map(|t| t.port), port, "{authority}");
        }
        for bad in ["a.com:", "a.com:0", "a.com:65536", "a.com:123456", "a.com:+80", "a:b:80", ":80", "a.com:8 0"] {
            assert!(parse_authority(bad, None).is_err(), "{bad} must be rejected");
        }
    }

    #[test]
    fn bad_hostnames_are_rejected() {
        let long = format!("{}.com", "a".repeat(64));
        for bad in ["", ".", "a..b", "-a.com", "a-.com", "a b.com", "a*.com", &long] {
            assert!(host(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(host(&"a.".repeat(128)), Err(AddrError::HostnameTooLong));
    }

    #[test]
    fn authorities() {
        let t = parse_authority("Example.COM:443", None).unwrap();
        assert_eq!(t.to_string(), "example.com:443");
        assert_eq!(parse_authority("example.com", None), Err(AddrError::MissingPort));
        assert_eq!(parse_authority("example.com", Some(80)).map(|t| t.port), Ok(80));
        assert_eq!(parse_authority("example.com:", Some(80)).map(|t| t.port), Ok(80));
        assert_eq!(parse_authority("[::1]:", Some(80)).map(|t| t.port), Ok(80));
        assert_eq!(parse_authority("example.com:", None), Err(AddrError::InvalidPort));
        assert_eq!(parse_authority("[::1]:8080", None).map(|t| t.to_string()), Ok("[::1]:8080".into()));
        for bad in [
            "example.com:0",
            "example.com:65536",
            "example.com:+80",
            "example.com:",
            "user@example.com:443",
            "example.com/x:443",
            "exa%6dple.com:443",
            "a.com:443:443",
            "[::1]x:443",
            "exa\0mple.com:1",
        ] {
            assert!(parse_authority(bad, None).is_err(), "{bad:?} must be rejected");
        }
    }
}
