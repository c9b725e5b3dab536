#![no_main]
//! Thin shim: the property lives in egress_gateway::fuzzing::authority, which the corpus
//! replay in `cargo test` also runs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| egress_gateway::fuzzing::authority(data));
