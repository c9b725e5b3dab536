//! Criterion benches for the hot pure functions: policy decisions at 10 to 100k rules
//! (exact hit, wildcard hit at depth 1 and 4, miss), target parsing, token checks
//! (static, and signed with HS256 and EdDSA).
//!
//!     cargo bench --bench decision
#![allow(clippy::expect_used, clippy::panic, reason = "a bench fails loudly on bad setup")]

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use egress_gateway::addr::parse_authority;
use egress_gateway::auth::{self, Credentials};
use egress_gateway::policy::{Mode, Policy, PolicySet, RuleList, Sandbox};
use egress_gateway::tokens::{Claims, Key, Verifier};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};

fn policy(n: usize) -> Policy {
    let mut b = Policy::builder("p", Mode::Enforce, &[80, 443]);
    for i in 0..n / 2 {
        let _ = b.add(RuleList::Allow, &format!("host{i}.example{}.com", i % 97), "bench");
        let _ = b.add(RuleList::Allow, &format!("*.zone{i}.example.net"), "bench");
    }
    let _ = b.add(RuleList::Deny, "blocked.example.org", "bench");
    b.build()
}

fn decisions(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide");
    for n in [10usize, 1_000, 10_000, 100_000] {
        let p = policy(n);
        let cases = [
            ("exact_hit", "host3.example3.com:443"),
            ("wildcard_depth1", "a.zone4.example.net:443"),
            ("wildcard_depth4", "a.b.c.d.zone4.example.net:443"),
            ("miss", "nowhere.example.org:443"),
        ];
        for (name, t) in cases {
            let target = parse_authority(t, None).unwrap_or_else(|e| unreachable!("{e}"));
            g.bench_with_input(BenchmarkId::new(name, n), &target, |b, t| {
                b.iter(|| black_box(p.decide(black_box(t)).permits()))
            });
        }
    }
    g.finish();
}

fn parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_authority");
    for (name, s) in
        [("hostname", "files.pythonhosted.org:443"), ("ipv4", "203.0.113.7:8443"), ("idna", "bücher.example:443")]
    {
        g.bench_function(name, |b| b.iter(|| black_box(parse_authority(black_box(s), None).is_ok())));
    }
    g.finish();
}

fn tokens(c: &mut Criterion) {
    let p = std::sync::Arc::new(policy(10));
    let mut set = PolicySet::default();
    set.policies.insert("p".into(), p.clone());
    set.sandboxes.insert(
        "sbx-1".into(),
        Sandbox {
            id: "sbx-1".into(),
            token_sha256: auth::token_sha256("tok-123"),
            policy: p,
            vpce: Vec::new(),
            addresses: Vec::new(),
            labels: Vec::new(),
        },
    );
    let verifier = egress_gateway::tokens::Verifier::default();
    let creds = Credentials::new("sbx-1", "tok-123");
    c.bench_function("authenticate_static_token", |b| {
        b.iter(|| black_box(auth::authenticate(&set, &verifier, black_box(&creds), 0).is_ok()))
    });
}

/// The whole check of a signed token (header, key, signature, claims, policy lookup),
/// as every request that presents one pays it.
fn signed_tokens(c: &mut Criterion) {
    let mut set = PolicySet::default();
    set.policies.insert("p".into(), std::sync::Arc::new(policy(10)));
    let secret = b"0123456789abcdef0123456789abcdef";
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519 key");
    let mut keys = HashMap::new();
    let hs = Key {
        alg: Algorithm::HS256,
        decoding: DecodingKey::from_secret(secret).expect("hs256 key"),
        encoding: Some(EncodingKey::from_secret(secret).expect("hs256 key")),
        fingerprint: Key::fingerprint_of(secret),
    };
    keys.insert("k-hs".to_string(), hs);
    let eddsa = Key {
        alg: Algorithm::EdDSA,
        decoding: DecodingKey::from_ed_pem(ed.public_key_pem().as_bytes()).expect("ed25519 public key"),
        encoding: Some(EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).expect("ed25519 private key")),
        fingerprint: Key::fingerprint_of(ed.public_key_pem().as_bytes()),
    };
    keys.insert("k-ed".to_string(), eddsa);
    let verifier = Verifier::new(keys, Duration::from_secs(3600), Duration::from_secs(5), HashSet::new());
    let now = egress_gateway::tokens::now();
    let claims = Claims {
        sub: "sbx-1".into(),
        pol: "p".into(),
        exp: now + 1800,
        iat: Some(now),
        nbf: None,
        jti: Some("jti-1".into()),
        repos: None,
    };
    for (name, kid) in [("hs256", "k-hs"), ("eddsa", "k-ed")] {
        // First use: a new token (its own jti) each time, so the signature is checked.
        let mut n = 0u64;
        c.bench_function(&format!("authenticate_signed_token_{name}_first_use"), |b| {
            b.iter_batched(
                || {
                    n += 1;
                    let fresh = Claims { jti: Some(format!("jti-{n}")), ..claims.clone() };
                    Credentials::new("sbx-1", &verifier.mint(kid, &fresh).expect("mint"))
                },
                |creds| black_box(auth::authenticate(&set, &verifier, &creds, now).is_ok()),
                BatchSize::SmallInput,
            )
        });
        // Every later request with the same token: the verifier remembers it.
        let creds = Credentials::new("sbx-1", &verifier.mint(kid, &claims).expect("mint"));
        // A bench of the refusal path would say nothing about the cost of a good token.
        assert!(auth::authenticate(&set, &verifier, &creds, now).is_ok(), "{name} token refused");
        c.bench_function(&format!("authenticate_signed_token_{name}_again"), |b| {
            b.iter(|| black_box(auth::authenticate(&set, &verifier, black_box(&creds), now).is_ok()))
        });
    }
}

criterion_group!(benches, decisions, parsing, tokens, signed_tokens);
criterion_main!(benches);
