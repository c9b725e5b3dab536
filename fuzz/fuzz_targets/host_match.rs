#![no_main]
//! Thin shim: the property lives in egress_gateway::fuzzing::host_match, which the corpus
//! replay in `cargo test` also runs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| egress_gateway::fuzzing::host_match(data));
