//! The security regression suite is organised by attack class, one file each:
//! `security_addresses.rs` (IP-literal encodings, IPv6 embeddings, rebinding, tunnel
//! misuse), `security_http.rs` (malformed heads, smuggling, pipelining, oversized heads,
//! slow clients, floods, one address starving others before authenticating, redirects)
//! and `security_credentials.rs` (cross-sandbox tokens, secret leakage, credentials in
//! URLs). Classes whose fixtures are heavy stay beside them: git path and ref tricks,
//! push encodings and report mode on the credentialed git route in git_route.rs; API-key
//! redaction around compression and ranges in routes.rs; DNS floods, malformed datagrams
//! and TCP slot hoarding in dns.rs; signed-token forms, and revocation, rotation and
//! expiry of open connections in tokens.rs; PROXY header spoofing in
//! proxy_protocol.rs; and the fuzz corpora in fuzz_corpus.rs. This file checks that the
//! index above stays true.
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
    has("security_http.rs", "one_address_cannot_starve_others_before_authenticating");
    has("security_credentials.rs", "credentials_in_urls_are_not_logged");
    has("git_route.rs", "report_mode_never_lends_the_gateways_credential");
    has("routes.rs", "compressed_or_ranged_echoes_never_leak_the_key");
    has("tokens.rs", "open_connections_end_when_their_credential_is_revoked_rotated_or_expires");
    has("dns.rs", "one_source_cannot_hold_every_tcp_slot");
}
