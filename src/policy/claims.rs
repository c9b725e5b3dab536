//! Which sandbox a source address belongs to: the `addresses` sandboxes claim, for
//! clients that send no token (transparent listeners, the DNS firewall's answer
//! mode). Claims never overlap (a load error names both), so an address has at most
//! one owner, found by one binary search.

use std::net::IpAddr;

use ipnet::IpNet;

/// One sandbox's claim on a network, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub net: IpNet,
    pub sandbox: String,
    /// `file:line`.
    pub location: String,
}

/// Every claim, sorted by family and first address.
#[derive(Debug, Default)]
pub struct Claims {
    sorted: Vec<(Span, usize)>,
    claims: Vec<Claim>,
}

/// A network as (family, first, last), comparable across claims of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Span {
    v6: bool,
    first: u128,
    last: u128,
}

fn span(net: &IpNet) -> Span {
    match net {
        IpNet::V4(n) => Span { v6: false, first: u32::from(n.network()).into(), last: u32::from(n.broadcast()).into() },
        IpNet::V6(n) => Span { v6: true, first: u128::from(n.network()), last: u128::from(n.broadcast()) },
    }
}

fn point(ip: IpAddr) -> (bool, u128) {
    match ip.to_canonical() {
        IpAddr::V4(v4) => (false, u32::from(v4).into()),
        IpAddr::V6(v6) => (true, u128::from(v6)),
    }
}

impl Claims {
    /// Indexes `claims`; two that overlap (the same address claimed twice, or by two
    /// sandboxes) are returned as the error, in the order they were written.
    pub fn build(claims: Vec<Claim>) -> Result<Claims, Box<(Claim, Claim)>> {
        let mut sorted: Vec<(Span, usize)> = claims.iter().enumerate().map(|(i, c)| (span(&c.net), i)).collect();
        sorted.sort_unstable();
        for pair in sorted.windows(2) {
            let [(a, ai), (b, bi)] = pair else { continue };
            if a.v6 == b.v6 && b.first <= a.last {
                let (first, second) = if ai < bi { (*ai, *bi) } else { (*bi, *ai) };
                return Err(Box::new((claims[first].clone(), claims[second].clone())));
            }
        }
        Ok(Claims { sorted, claims })
    }

    /// The sandbox that claims `ip` (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn sandbox_at(&self, ip: IpAddr) -> Option<&str> {
        let (v6, x) = point(ip);
        let key = Span { v6, first: x, last: u128::MAX };
        let i = self.sorted.partition_point(|(s, _)| *s <= key);
        let (s, idx) = self.sorted.get(i.checked_sub(1)?)?;
        (s.v6 == v6 && s.first <= x && x <= s.last).then(|| self.claims[*idx].sandbox.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(net: &str, sandbox: &str, line: u32) -> Claim {
        Claim { net: net.parse().unwrap(), sandbox: sandbox.into(), location: format!("p.toml:{line}") }
    }

    #[test]
    fn lookup_and_overlaps() {
        let c = Claims::build(vec![
            claim("10.1.2.3/32", "a", 1),
            claim("10.1.3.0/24", "b", 2),
            claim("fd00::/64", "c", 3),
            claim("10.1.2.4/32", "d", 4),
        ])
        .unwrap();
        let at = |s: &str| c.sandbox_at(s.parse().unwrap());
        assert_eq!(at("10.1.2.3"), Some("a"));
        assert_eq!(at("10.1.2.4"), Some("d"));
        assert_eq!(at("10.1.2.5"), None);
        assert_eq!(at("10.1.3.77"), Some("b"));
        assert_eq!(at("::ffff:10.1.3.1"), Some("b"));
        assert_eq!(at("fd00::1"), Some("c"));
        assert_eq!(at("fd00:0:0:1::1"), None);
        assert_eq!(at("0.0.0.0"), None);

        let dup = Claims::build(vec![claim("10.0.0.0/8", "a", 7), claim("10.9.9.9/32", "b", 9)]).unwrap_err();
        assert_eq!((dup.0.location.as_str(), dup.1.location.as_str()), ("p.toml:7", "p.toml:9"));
        assert!(Claims::build(vec![claim("10.0.0.1/32", "a", 1), claim("10.0.0.1/32", "a", 2)]).is_err());
        assert!(Claims::build(vec![claim("10.0.0.0/31", "a", 1), claim("10.0.0.2/31", "b", 2)]).is_ok());
    }
}
