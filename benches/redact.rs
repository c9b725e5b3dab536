//! Response redaction throughput: a 1 MiB answer from a host with one value bound,
//! streamed through `redact::body` in 16 KiB chunks, as prose, as bytes that are all
//! the value's first byte (the worst case an upstream that reflects sandbox text can
//! serve), and as random bytes. Reported by criterion in MiB/s.
//!
//! `cargo bench --bench redact`
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a bench fails loudly on bad setup")]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use egress_gateway::redact;
use http_body::{Body, Frame};
use http_body_util::BodyExt;

const SIZE: usize = 1 << 20;
const CHUNK: usize = 16 << 10;
const SECRET: &str = "sk-live+Q2x/9fJ0aB7=kLm3";

/// A typical API response's header fields.
const HEADERS: &[(&str, &str)] = &[
    ("content-type", "application/json; charset=utf-8"),
    ("date", "Mon, 07 Dec 2026 14:00:00 GMT"),
    ("server", "upstream"),
    ("cache-control", "no-store"),
    ("x-request-id", "req_0123456789abcdef0123456789"),
    ("x-ratelimit-limit-requests", "10000"),
    ("x-ratelimit-remaining-requests", "9999"),
    ("x-ratelimit-reset-requests", "6ms"),
    ("strict-transport-security", "max-age=31536000; includeSubDomains; preload"),
    ("vary", "Origin, Accept-Encoding"),
    ("openai-processing-ms", "412"),
    ("alt-svc", "h3=\":443\"; ma=86400"),
];

/// A body of ready chunks.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
    }
}

fn inputs() -> Vec<(&'static str, Vec<u8>)> {
    let prose = b"The quick brown fox says: see the sk-docs at https://example.test/keys?q=1 & more. ";
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let random = (0..SIZE)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    vec![
        ("prose", prose.iter().copied().cycle().take(SIZE).collect()),
        ("first byte", vec![b's'; SIZE]),
        ("random", random),
    ]
}

fn redaction(c: &mut Criterion) {
    let redactor = redact::redactor(&[SECRET]);
    let mut g = c.benchmark_group("redact_1mib");
    g.throughput(Throughput::Bytes(SIZE as u64));
    g.sample_size(20);
    for (name, input) in inputs() {
        let input = Bytes::from(input);
        g.bench_function(name, |b| {
            b.iter(|| {
                let chunks = (0..SIZE).step_by(CHUNK).map(|at| input.slice(at..(at + CHUNK).min(SIZE))).collect();
                let body = redact::body(Chunks(chunks), redactor.clone());
                let out = futures_executor::block_on(body.collect()).unwrap().to_bytes();
                assert!(out.len() >= SIZE / 2);
            })
        });
    }
    g.finish();
    // What a response pays before its first byte: the redactor of its values (cached
    // after the first response), the pass over twelve header fields, the body's setup.
    let mut g = c.benchmark_group("redact_setup");
    g.bench_function("one value, redactor cached", |b| {
        b.iter(|| {
            let r = redact::redactor(&[black_box(SECRET)]);
            let mut h = http::HeaderMap::new();
            for (k, v) in HEADERS {
                h.insert(*k, http::HeaderValue::from_static(v));
            }
            r.headers(&mut h);
            let body = redact::body(Chunks(VecDeque::from([Bytes::from_static(b"ok")])), r);
            futures_executor::block_on(body.collect()).unwrap().to_bytes()
        })
    });
    g.bench_function("one value, redactor built", |b| {
        b.iter(|| redact::Redactor::from_forms(redact::echo_forms(black_box(SECRET))))
    });
    g.finish();
}

criterion_group!(benches, redaction);
criterion_main!(benches);
