//! The hand-written parts ARCHITECTURE.md keeps, measured against the well-kept crates
//! that could replace them, in the same run: the PROXY protocol v2 parser against
//! `ppp` (parse a header with the AWS VPC endpoint TLV, extract source and endpoint),
//! and the per-source token bucket of the DNS firewall against `governor`'s keyed
//! limiter (1,000 sources round-robin, under the rate).
//!
//! `cargo bench --bench handwritten`
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a bench fails loudly on bad setup")]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use egress_gateway::dns::ratelimit::RateLimiter;
use egress_gateway::proxy::proxy_protocol::{encode_v2, parse_v2};

fn proxy_protocol(c: &mut Criterion) {
    let src: SocketAddr = "203.0.113.7:51234".parse().unwrap();
    let dst: SocketAddr = "10.0.0.2:4002".parse().unwrap();
    let header = encode_v2(src, dst, Some("vpce-0123456789abcdef0"));
    let mut g = c.benchmark_group("proxy_v2_parse");
    g.bench_function("hand-written", |b| {
        b.iter(|| {
            let (h, _) = parse_v2(black_box(&header)).unwrap();
            black_box((h.source, h.vpce))
        })
    });
    g.bench_function("ppp", |b| {
        b.iter(|| {
            let h = ppp::v2::Header::try_from(black_box(&header[..])).unwrap();
            let source = match h.addresses {
                ppp::v2::Addresses::IPv4(a) => Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)),
                _ => None,
            };
            // The AWS TLV: type 0xEA, then a subtype byte 0x01 and the endpoint id.
            let vpce = h
                .tlvs()
                .filter_map(Result::ok)
                .find(|t| t.kind == 0xEA && t.value.first() == Some(&0x01))
                .map(|t| String::from_utf8_lossy(&t.value[1..]).into_owned());
            black_box((source, vpce))
        })
    });
    g.finish();
}

fn token_buckets(c: &mut Criterion) {
    let sources: Vec<IpAddr> = (0..1000u32).map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))).collect();
    let mut g = c.benchmark_group("per_source_bucket");
    let ours = RateLimiter::new(1_000_000, 2_000_000);
    let mut i = 0usize;
    g.bench_function("hand-written", |b| {
        b.iter(|| {
            i = (i + 1) % sources.len();
            black_box(ours.allow(sources[i], Instant::now()))
        })
    });
    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
        .allow_burst(NonZeroU32::new(2_000_000).unwrap());
    let theirs = governor::RateLimiter::keyed(quota);
    let mut j = 0usize;
    g.bench_function("governor (dashmap)", |b| {
        b.iter(|| {
            j = (j + 1) % sources.len();
            black_box(theirs.check_key(&sources[j]).is_ok())
        })
    });
    let theirs = governor::RateLimiter::hashmap(quota);
    let mut k = 0usize;
    g.bench_function("governor (hashmap)", |b| {
        b.iter(|| {
            k = (k + 1) % sources.len();
            black_box(theirs.check_key(&sources[k]).is_ok())
        })
    });
    g.finish();
}

criterion_group!(benches, proxy_protocol, token_buckets);
criterion_main!(benches);
