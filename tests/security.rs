//! The security regression suite is organised by attack class, one file each:
//! `security_addresses.rs` (IP-literal encodings, IPv6 embeddings, rebinding, tunnel
//! misuse), `security_http.rs` (malformed heads, smuggling, pipelining, oversized heads,
//! slow clients, floods, redirects) and `security_credentials.rs` (cross-sandbox tokens,
//! secret leakage). Classes whose fixtures are heavy stay beside them: git path and ref
//! tricks in git_route.rs, DNS floods and malformed datagrams in dns.rs, signed-token
//! forms in tokens.rs, PROXY header spoofing in proxy_protocol.rs, and the fuzz corpora
//! in fuzz_corpus.rs. This file checks that the index above stays true.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

use std::path::Path;

#[test]
fn every_attack_class_has_its_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let has = |file: &str, test: &str| {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(text.contains(&format!("fn {test}(")), "{file} lost {test}");
    };
    has("security_addresses.rs", "ip_literal_encodings");
    has("security_addresses.rs", "mixed_answers_dial_only_the_vetted_address");
    has("security_http.rs", "cl_te_smuggling_does_not_reach_the_origin");
    has("security_http.rs", "slow_clients_are_cut_off_while_others_are_served");
    has("security_credentials.rs", "secrets_never_appear_in_error_bodies_or_logs");
    has("git_route.rs", "path_tricks_and_unsupported_paths");
    has("dns.rs", "a_flooding_source_is_limited_while_others_are_answered");
    has("proxy_protocol.rs", "headers_from_untrusted_peers_and_malformed_headers_close_the_connection");
}
