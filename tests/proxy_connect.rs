//! CONNECT through the real gateway with real curl to a local TLS origin (test CA).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use support::raw::{exchange, status};
use support::{TOKEN_A, basic, curl_via, start_tls};

#[test]
fn allowed_connect_reaches_tls_origin_and_is_logged_without_the_token() {
    let (gw, origin, ca) = start_tls();
    let url = format!("https://tls.test:{}/echo", origin.port());
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_A, &url);
    assert_eq!((out.exit, out.connect_status, out.status), (0, 200, 200), "{out:?}");
    let echoed: serde_json::Value = serde_json::from_str(&out.body).unwrap();
    assert_eq!(echoed["uri"], "/echo");

    let rec = gw.access_for(&format!("tls.test:{}", origin.port()));
    assert_eq!(rec["kind"], "connect");
    assert_eq!(rec["decision"], "allow");
    assert_eq!(rec["sandbox"], "sbx-a");
    assert_eq!(rec["policy"], "a");
    assert_eq!(rec["rule"], "tls.test:*");
    assert_eq!(rec["upstream_addr"], format!("127.0.0.1:{}", origin.port()));
    assert_eq!(rec["status"], 200);
    assert!(rec["bytes_up"].as_u64().unwrap() > 100, "TLS handshake bytes counted: {rec}");
    assert!(rec["bytes_down"].as_u64().unwrap() > 100, "{rec}");
    for field in ["ts", "method", "policy_generation", "duration_ms", "client_addr"] {
        assert!(!rec[field].is_null(), "{field} missing in {rec}");
    }
    assert!(!gw.log_text().contains(TOKEN_A), "token leaked into logs");
}

#[test]
fn wildcard_rules_match_any_depth() {
    let (gw, origin, ca) = start_tls();
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_A, &format!("https://a.deep.wild.test:{}/echo", origin.port()));
    assert_eq!(out.status, 200, "{out:?}");
}

#[test]
fn denials_carry_reason_codes() {
    let (gw, origin, ca) = start_tls();
    let port = origin.port();
    let cases = [
        (format!("https://example.com:{port}/"), "host_not_allowed", "example.com"),
        (format!("https://blocked.origin.test:{port}/"), "host_denied", "blocked.origin.test"),
        ("https://portless.test:8443/".to_string(), "port_not_allowed", "portless.test"),
        (format!("https://rebind.test:{port}/"), "address_denied", "rebind.test"),
        (format!("https://nxdomain.test:{port}/"), "resolve_failed", "nxdomain.test"),
    ];
    for (url, reason, host) in cases {
        let out = curl_via(&gw, &ca, "sbx-a", TOKEN_A, &url);
        assert_ne!(out.exit, 0, "{url} must fail");
        let rec = gw.wait_for_log(std::time::Duration::from_secs(10), |v| {
            v["log"] == "access" && v["target"].as_str().is_some_and(|t| t.starts_with(host))
        });
        assert_eq!(rec["reason"], reason, "{url}: {rec}");
        assert_eq!(rec["decision"], "deny");
    }
    // The blocked host is named by its deny rule.
    let rec = gw.access_for(&format!("blocked.origin.test:{port}"));
    assert_eq!(rec["rule"], "blocked.origin.test");
}

#[test]
fn connect_denial_statuses_and_body() {
    let (gw, origin, _ca) = start_tls();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let req = format!(
        "CONNECT example.com:{port} HTTP/1.1\r\nHost: example.com:{port}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let resp = support::raw::request(gw.addr, &req);
    assert_eq!(status(&resp), 403, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("x-egress-deny-reason: host_not_allowed"), "{resp}");
    let body = resp.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["reason"], "host_not_allowed");
    assert_eq!(v["sandbox"], "sbx-a");
    assert_eq!(v["policy"], "a");
    assert!(v["hint"].as_str().unwrap().contains("policies.a.allow"), "{v}");
    assert!(!resp.contains(TOKEN_A));

    // Upstream refusing the connection: 502.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = closed.local_addr().unwrap().port();
    drop(closed);
    let req = format!("CONNECT origin.test:{dead_port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    let resp = support::raw::request(gw.addr, &req);
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("upstream_unreachable"), "{resp}");
}

/// Python's http.client (pip, requests, urllib) sends `CONNECT host:port HTTP/1.0`
/// without a Host header: accepted like HTTP/1.1. A target that is not an authority is
/// not.
#[test]
fn connect_accepts_http10_and_needs_an_authority() {
    let (gw, origin, _ca) = start_tls();
    let auth = basic("sbx-a", TOKEN_A);
    let port = origin.port();
    let mut s = support::raw::connect(gw.addr);
    std::io::Write::write_all(
        &mut s,
        format!("CONNECT tls.test:{port} HTTP/1.0\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let head = support::raw::read_head(&mut s);
    assert_eq!(status(&head), 200, "{head}");
    drop(s);
    let rec = gw.access_for(&format!("tls.test:{port}"));
    assert_eq!(rec["decision"], "allow");
    let resp = exchange(gw.addr, format!("CONNECT /x HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes());
    assert_eq!(status(&resp), 400, "{resp}");
}
