//! Property tests (proptest) for the normaliser, the host matcher and address vetting.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use egress_gateway::addr::{self, Host};
use egress_gateway::policy::net::{EgressFilter, builtin_deny};
use egress_gateway::policy::{Mode, Policy, RuleList};
use ipnet::IpNet;
use proptest::prelude::*;

fn label() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?"
}

fn hostname() -> impl Strategy<Value = String> {
    (prop::collection::vec(label(), 1..5), "[a-z]{2,6}").prop_map(|(ls, tld)| format!("{}.{tld}", ls.join(".")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn normalising_is_idempotent_and_case_blind(s in "[A-Za-z0-9.\\-_]{1,40}") {
        if let Ok(n) = addr::normalize_hostname(&s) {
            prop_assert_eq!(addr::normalize_hostname(&n), Ok(n.clone()));
            prop_assert_eq!(addr::normalize_hostname(&s.to_ascii_uppercase()), Ok(n.clone()));
            prop_assert!(addr::parse_dotted_quad(&n).is_err());
        }
    }

    #[test]
    fn any_authority_round_trips(s in "\\PC{0,40}") {
        if let Ok(t) = addr::parse_authority(&s, None) {
            prop_assert_eq!(addr::parse_authority(&t.to_string(), None), Ok(t));
        }
    }

    #[test]
    fn matcher_agrees_with_a_reference(
        exact in prop::collection::vec(hostname(), 0..6),
        suffixes in prop::collection::vec(hostname(), 0..6),
        probe_prefix in prop::collection::vec(label(), 0..3),
        pick in 0usize..12,
    ) {
        let mut b = Policy::builder("p", Mode::Enforce, &[443]);
        for e in &exact { b.add(RuleList::Allow, e, "t").unwrap(); }
        for s in &suffixes { b.add(RuleList::Allow, &format!("*.{s}"), "t").unwrap(); }
        let p = b.build();
        let pool: Vec<&String> = exact.iter().chain(suffixes.iter()).collect();
        let base = pool.get(pick % pool.len().max(1)).map(|s| s.as_str()).unwrap_or("unlisted.example");
        let name = if probe_prefix.is_empty() { base.to_string() } else { format!("{}.{base}", probe_prefix.join(".")) };
        let expected = exact.iter().any(|e| e == &name) || suffixes.iter().any(|s| name.ends_with(&format!(".{s}")));
        let target = addr::parse_authority(&format!("{name}:443"), None).unwrap();
        prop_assert_eq!(p.decide(&target).permits(), expected, "name {}", name);
    }

    #[test]
    fn every_denied_ipv4_is_refused_in_every_form(net_idx in 0usize..64, host in any::<u32>()) {
        let f = EgressFilter::builtin();
        let v4_nets: Vec<IpNet> = builtin_deny().into_iter().filter(|n| matches!(n, IpNet::V4(_))).collect();
        let IpNet::V4(net) = v4_nets[net_idx % v4_nets.len()] else { unreachable!() };
        let mask = u32::MAX.checked_shr(u32::from(net.prefix_len())).unwrap_or(0);
        let v4 = Ipv4Addr::from((u32::from(net.network()) & !mask) | (host & mask));
        prop_assert!(f.vet(IpAddr::V4(v4)).is_err(), "{}", v4);
        let o = v4.octets();
        let forms: [Ipv6Addr; 5] = [
            v4.to_ipv6_mapped(),
            v4.to_ipv6_compatible(),
            Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([o[2], o[3]])),
            Ipv6Addr::new(0x2002, u16::from_be_bytes([o[0], o[1]]), u16::from_be_bytes([o[2], o[3]]), 0, 0, 0, 0, 1),
            Ipv6Addr::new(0x2001, 0, 0x4136, 0xe378, 0x8000, 0x63bf, !u16::from_be_bytes([o[0], o[1]]), !u16::from_be_bytes([o[2], o[3]])),
        ];
        for v6 in forms {
            prop_assert!(f.vet(IpAddr::V6(v6)).is_err(), "{} embeds {}", v6, v4);
            // The same, written as a bracketed literal a sandbox could send.
            let Ok(Host::Ip(ip)) = addr::parse_host(&format!("[{v6}]")) else { return Err(TestCaseError::fail("parse")) };
            prop_assert!(f.vet(ip).is_err());
        }
        // Textual tricks never even parse as addresses.
        let decimal = u32::from(v4).to_string();
        prop_assert!(addr::parse_host(&decimal).is_err());
        let hex = format!("0x{:x}", u32::from(v4));
        prop_assert!(addr::parse_host(&hex).is_err());
        let octal = format!("0{:o}.0.0.1", o[0].max(1));
        prop_assert!(addr::parse_host(&octal).is_err());
    }

    #[test]
    fn every_denied_ipv6_is_refused(net_idx in 0usize..64, host in any::<u128>()) {
        let f = EgressFilter::builtin();
        let v6_nets: Vec<IpNet> = builtin_deny().into_iter().filter(|n| matches!(n, IpNet::V6(_))).collect();
        let IpNet::V6(net) = v6_nets[net_idx % v6_nets.len()] else { unreachable!() };
        let mask = u128::MAX.checked_shr(u32::from(net.prefix_len())).unwrap_or(0);
        let v6 = Ipv6Addr::from((u128::from(net.network()) & !mask) | (host & mask));
        match v6.to_ipv4_mapped() {
            // IPv4-mapped addresses are judged as the IPv4 address they carry.
            Some(v4) => prop_assert_eq!(f.vet(IpAddr::V6(v6)).is_ok(), f.vet(IpAddr::V4(v4)).is_ok()),
            None => prop_assert!(f.vet(IpAddr::V6(v6)).is_err(), "{}", v6),
        }
    }
}
