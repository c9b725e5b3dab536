//! Network rules and egress address vetting.
//!
//! [`EgressFilter::vet`] is the last word on which addresses the gateway may dial:
//! every resolved or literal address passes through it. IPv4-mapped IPv6 addresses
//! are canonicalised to IPv4 first, so `::ffff:10.0.0.1` is judged as `10.0.0.1`.

use std::net::IpAddr;

use ipnet::IpNet;

use super::rule::PortSpec;

/// The built-in deny set: every range that is not the public internet, plus the
/// transition prefixes that embed IPv4 addresses (NAT64, 6to4, Teredo) and the EC2
/// IPv6 instance-metadata range.
pub const BUILTIN_DENY: &[&str] = &[
    "0.0.0.0/8",       // "this network", unspecified
    "10.0.0.0/8",      // RFC 1918
    "100.64.0.0/10",   // CGNAT
    "127.0.0.0/8",     // loopback
    "169.254.0.0/16",  // link-local, incl. 169.254.169.254 metadata
    "172.16.0.0/12",   // RFC 1918
    "192.0.0.0/24",    // IETF protocol assignments
    "192.0.2.0/24",    // TEST-NET-1
    "192.88.99.0/24",  // 6to4 relay anycast
    "192.168.0.0/16",  // RFC 1918
    "198.18.0.0/15",   // benchmarking
    "198.51.100.0/24", // TEST-NET-2
    "203.0.113.0/24",  // TEST-NET-3
    "224.0.0.0/4",     // multicast
    "240.0.0.0/4",     // reserved, incl. broadcast
    "::/128",          // unspecified
    "::1/128",         // loopback
    "::/96",           // IPv4-compatible (deprecated)
    "::ffff:0:0/96",   // IPv4-mapped (canonicalised before matching)
    "::ffff:0:0:0/96", // IPv4-translated (SIIT, RFC 2765)
    "64:ff9b::/96",    // NAT64
    "64:ff9b:1::/48",  // local-use NAT64
    "100::/64",        // discard-only
    "2001::/32",       // Teredo
    "2001:db8::/32",   // documentation
    "2002::/16",       // 6to4
    "3fff::/20",       // documentation
    "fc00::/7",        // ULA
    "fd00:ec2::/32",   // EC2 IPv6 metadata and DNS
    "fe80::/10",       // link-local
    "fec0::/10",       // site-local (deprecated)
    "ff00::/8",        // multicast
];

/// Returns the built-in deny set as networks.
pub fn builtin_deny() -> Vec<IpNet> {
    BUILTIN_DENY.iter().filter_map(|s| s.parse().ok()).collect()
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes IPv4; everything else is unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Which addresses may be dialled: everything outside `deny`, plus the `allow`
/// exceptions inside it.
#[derive(Debug, Clone)]
pub struct EgressFilter {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
}

/// Why an address was refused: the deny network it fell into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressDenied {
    pub addr: IpAddr,
    pub net: IpNet,
}

impl EgressFilter {
    pub fn new(deny: Vec<IpNet>, allow: Vec<IpNet>) -> Self {
        EgressFilter { deny, allow }
    }

    /// The built-in deny set with no exceptions.
    pub fn builtin() -> Self {
        EgressFilter::new(builtin_deny(), Vec::new())
    }

    /// Canonicalises `ip` and returns it if the gateway may dial it.
    pub fn vet(&self, ip: IpAddr) -> Result<IpAddr, AddressDenied> {
        let ip = canonical(ip);
        if self.allow.iter().any(|n| n.contains(&ip)) {
            return Ok(ip);
        }
        match self.deny.iter().find(|n| n.contains(&ip)) {
            Some(net) => Err(AddressDenied { addr: ip, net: *net }),
            None => Ok(ip),
        }
    }
}

/// One IP/CIDR rule.
#[derive(Debug, Clone, Copy)]
pub struct NetEntry {
    pub net: IpNet,
    pub ports: PortSpec,
    pub rule: usize,
}

/// IP and CIDR rules; they match IP-literal targets only.
#[derive(Debug, Default)]
pub struct NetRules {
    entries: Vec<NetEntry>,
}

impl NetRules {
    pub fn add(&mut self, entry: NetEntry) {
        self.entries.push(entry);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn matching(&self, ip: IpAddr) -> impl Iterator<Item = &NetEntry> {
        let ip = canonical(ip);
        self.entries.iter().filter(move |e| e.net.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vet(f: &EgressFilter, s: &str) -> bool {
        f.vet(s.parse().unwrap()).is_ok()
    }

    #[test]
    fn builtin_set_parses_completely() {
        assert_eq!(builtin_deny().len(), BUILTIN_DENY.len());
    }

    #[test]
    fn private_and_metadata_addresses_are_refused() {
        let f = EgressFilter::builtin();
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0:127.0.0.3",
            "::ffff:0:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fd00:ec2::254",
            "fe80::1",
            "fc00::1",
            "ff02::1",
        ] {
            assert!(!vet(&f, bad), "{bad} must be refused");
        }
        for good in ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c", "::ffff:93.184.215.14"] {
            assert!(vet(&f, good), "{good} must pass");
        }
    }

    #[test]
    fn allow_exceptions_and_canonical_form() {
        let f = EgressFilter::new(builtin_deny(), vec!["127.0.0.1/32".parse().unwrap()]);
        assert_eq!(f.vet("::ffff:127.0.0.1".parse().unwrap()), Ok("127.0.0.1".parse().unwrap()));
        assert!(!vet(&f, "127.0.0.2"));
    }
}
