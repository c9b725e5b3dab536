//! Property checks over hostile input, shared by the cargo-fuzz targets (`fuzz/`) and
//! the corpus replay that runs in every `cargo test` (`tests/fuzz_corpus.rs`). Each
//! function takes arbitrary bytes and asserts a property, not only absence of panics.

use std::net::SocketAddr;

mod request_head;
pub use request_head::request_head;

use crate::addr::{self, Host};
use crate::policy::hosts::{HostEntry, HostRules};
use crate::policy::rule::PortSpec;

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A normalised target re-parses to itself; nothing is both a hostname and an IP
/// literal; a hostname is lowercase ASCII without a trailing dot.
pub fn authority(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(t) = addr::parse_authority(s, None) {
        let again = addr::parse_authority(&t.to_string(), None);
        assert_eq!(again.as_ref(), Ok(&t), "round trip of {s:?}");
        if let Host::Name(n) = &t.host {
            assert!(n.is_ascii() && !n.ends_with('.') && n.to_ascii_lowercase() == *n, "{n:?}");
            assert!(addr::parse_dotted_quad(n).is_err(), "{n:?} is both a hostname and an IP literal");
        }
    }
    if let Ok(n) = addr::normalize_hostname(s) {
        assert!(addr::parse_dotted_quad(&n).is_err() && !n.contains(':'), "{s:?} -> {n:?}");
    }
}

/// The suffix-map matcher agrees with a deliberately simple reference matcher. Input:
/// lines; those starting with `*.` or `=` are rules, the rest names.
pub fn host_match(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let mut rules: Vec<(bool, String)> = Vec::new();
    let mut names = Vec::new();
    for line in s.lines().take(64) {
        if let Some(suffix) = line.strip_prefix("*.") {
            if let Ok(n) = addr::normalize_hostname(suffix) {
                rules.push((true, n));
            }
        } else if let Some(exact) = line.strip_prefix('=') {
            if let Ok(n) = addr::normalize_hostname(exact) {
                rules.push((false, n));
            }
        } else if let Ok(n) = addr::normalize_hostname(line) {
            names.push(n);
        }
    }
    let mut hr = HostRules::default();
    for (i, (suffix, n)) in rules.iter().enumerate() {
        let e = HostEntry { ports: PortSpec::Any, rule: i };
        if *suffix { hr.add_suffix(n, e) } else { hr.add_exact(n, e) }
    }
    for name in &names {
        let mut got: Vec<usize> = hr.matching(name).map(|e| e.rule).collect();
        let mut want: Vec<usize> = rules
            .iter()
            .enumerate()
            .filter(|(_, (suffix, r))| if *suffix { name.ends_with(&format!(".{r}")) } else { name == r })
            .map(|(i, _)| i)
            .collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "rules {rules:?} name {name:?}");
    }
}

/// Basic credentials parse or fail cleanly, and what parses re-encodes to itself.
pub fn basic_auth(data: &[u8]) {
    use base64::Engine;
    if let Ok(c) = crate::auth::parse_basic(data) {
        let enc = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.user(), c.secret()))
        );
        match crate::auth::parse_basic(enc.as_bytes()) {
            Ok(again) => assert!(again.user() == c.user() && again.secret() == c.secret()),
            Err(e) => unreachable_failure(&format!("re-encoded credentials failed: {e}")),
        }
    }
    if let Some(s) = text(data) {
        let _ = crate::tokens::looks_signed(s);
        let _ = jsonwebtoken::decode_header(s);
    }
}

/// Config and policy TOML: never panics, and loading is deterministic.
pub fn config_toml(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let file = crate::config::DisplayPath("fuzz.toml".into());
    let a = crate::config::parse(s, &file, std::path::Path::new("/nonexistent")).map(|_| ());
    let b = crate::config::parse(s, &file, std::path::Path::new("/nonexistent")).map(|_| ());
    assert_eq!(a.is_ok(), b.is_ok());
    let Ok(mut cfg) = crate::config::parse("", &file, std::path::Path::new("/")) else { return };
    cfg.policy.source = crate::config::PolicySource::Inline { label: "fuzz-policy.toml".into(), text: s.to_string() };
    let p1 = crate::config::load_policies(&cfg).map(|set| (set.policies.len(), set.sandboxes.len()));
    let p2 = crate::config::load_policies(&cfg).map(|set| (set.policies.len(), set.sandboxes.len()));
    assert_eq!(p1.ok(), p2.ok());
}

/// PROXY protocol headers: never panic; a parsed v2 header fits its buffer and
/// re-encodes to the same addresses.
pub fn proxy_protocol(data: &[u8]) {
    use crate::proxy::proxy_protocol as pp;
    let _ = pp::detect(data);
    let _ = pp::parse_v1(data);
    if let Ok((h, used)) = pp::parse_v2(data) {
        assert!(used <= data.len());
        if let (Some(src), Some(dst)) = (h.source, h.destination)
            && src.is_ipv4() == dst.is_ipv4()
        {
            let enc = pp::encode_v2(src, dst, h.vpce.as_deref());
            match pp::parse_v2(&enc) {
                Ok((again, n)) => {
                    assert_eq!(n, enc.len());
                    assert_eq!((again.source, again.destination, again.vpce), (h.source, h.destination, h.vpce));
                }
                Err(e) => unreachable_failure(&format!("re-encoded header failed: {e}")),
            }
        }
    }
}

/// The git path grammar: accepted requests are well formed and their upstream path
/// parses back to the same request.
pub fn git_route(data: &[u8]) {
    use crate::git::path as route;
    let Some(s) = text(data) else { return };
    let (method, rest) = s.split_once(' ').unwrap_or(("GET", s));
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if let Ok(r) = route::parse(method, path, query) {
        assert!(!r.owner.is_empty() && !r.repo.contains('/') && !r.repo.contains(".."));
        let up = r.upstream_path();
        let (p, q) = match up.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (up.as_str(), None),
        };
        assert_eq!(route::parse(method, p, q).as_ref(), Ok(&r));
    }
}

/// Receive-pack command lists: never panic; what parses re-encodes to the same list.
pub fn pktline(data: &[u8]) {
    use crate::git::pktline;
    if let Ok((updates, end)) = pktline::parse_commands(data) {
        assert!(end <= data.len());
        let mut enc = String::new();
        for u in &updates {
            enc.push_str(&pktline::pkt(&format!("{} {} {}\n", u.old, u.new, u.refname)));
        }
        enc.push_str("0000");
        match pktline::parse_commands(enc.as_bytes()) {
            Ok((again, n)) => {
                assert_eq!(again, updates);
                assert_eq!(n, enc.len());
            }
            Err(e) => unreachable_failure(&format!("re-encoded commands failed: {e}")),
        }
    }
}

/// The DNS firewall on a raw datagram: no answer (a deliberate drop), or a response
/// that parses, with the question's id echoed.
pub fn dns_datagram(data: &[u8]) {
    use std::sync::OnceLock;
    static HANDLER: OnceLock<Option<crate::dns::firewall::Handler>> = OnceLock::new();
    let handler = HANDLER.get_or_init(|| {
        let file = crate::config::DisplayPath("fuzz".into());
        let cfg = crate::config::parse(
            "[dns]\nlisten = \"127.0.0.1:0\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [\"127.0.0.1\", \"::1\"]\nrate_limit_qps = 0\n",
            &file,
            std::path::Path::new("/"),
        )
        .ok()?;
        let fw = crate::dns::firewall::Firewall::new(cfg.dns.as_ref()?).ok()?;
        Some(crate::dns::firewall::Handler::new(fw))
    });
    let Some(handler) = handler else { return };
    let peer: SocketAddr = ([127, 0, 0, 1], 5353).into();
    for proto in [hickory_net::xfer::Protocol::Udp, hickory_net::xfer::Protocol::Tcp] {
        let reply = futures_executor::block_on(crate::dns::wire::answer_bytes(data, peer, proto, handler));
        if let Some(r) = reply {
            assert!(r.len() >= 12 && r[..2] == data[..2], "id echoed");
            assert!(r[2] & 0x80 != 0, "a response");
            if r[3] & 0x0f != 1 {
                assert!(hickory_proto::op::Message::from_vec(&r).is_ok(), "a parseable response");
            }
        }
    }
}

#[track_caller]
fn unreachable_failure(msg: &str) {
    assert!(msg.is_empty(), "{msg}");
}

/// A property check over arbitrary bytes.
pub type Check = fn(&[u8]);

/// Every target, by name, for the corpus replay.
pub const TARGETS: &[(&str, Check)] = &[
    ("authority", authority),
    ("host_match", host_match),
    ("basic_auth", basic_auth),
    ("config_toml", config_toml),
    ("proxy_protocol", proxy_protocol),
    ("git_route", git_route),
    ("pktline", pktline),
    ("dns_datagram", dns_datagram),
    ("request_head", request_head),
];
