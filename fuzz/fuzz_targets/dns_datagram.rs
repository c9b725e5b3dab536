#![no_main]
//! Thin shim: the property lives in egress_gateway::fuzzing::dns_datagram, which the corpus
//! replay in `cargo test` also runs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| egress_gateway::fuzzing::dns_datagram(data));
