//! Criterion benches for the hot pure functions: policy decisions at 10 to 100k rules
//! (exact hit, wildcard hit at depth 1 and 4, miss), target parsing, token checks.
//!
//!     cargo bench --bench decision

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use egress_gateway::addr::parse_authority;
use egress_gateway::auth::{self, Credentials};
use egress_gateway::policy::{Mode, Policy, PolicySet, RuleList, Sandbox};

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
        Sandbox { id: "sbx-1".into(), token_sha256: auth::token_sha256("tok-123"), policy: p, vpce: Vec::new() },
    );
    let verifier = egress_gateway::tokens::Verifier::default();
    let creds = Credentials::new("sbx-1", "tok-123");
    c.bench_function("authenticate_static_token", |b| {
        b.iter(|| black_box(auth::authenticate(&set, &verifier, black_box(&creds), 0).is_ok()))
    });
}

criterion_group!(benches, decisions, parsing, tokens);
criterion_main!(benches);
