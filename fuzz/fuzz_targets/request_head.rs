#![no_main]
//! Thin shim: the property lives in egress_gateway::fuzzing::request_head (raw client
//! bytes through the real connection handler, dials recorded instead of made), which
//! the corpus replay in `cargo test` also runs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| egress_gateway::fuzzing::request_head(data));
