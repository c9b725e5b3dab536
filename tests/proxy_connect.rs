//! CONNECT through the real gateway with real curl to a local TLS origin (test CA).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use support::raw::{exchange, status};
use support::tls::TestCa;
use support::{STANDARD_CONFIG, TOKEN_A, TOKEN_B, TestGateway, TestOrigin, basic, curl, standard_policy};

fn start() -> (TestGateway, TestOrigin, TestCa) {
    let ca = TestCa::new(&["tls.test", "origin.test", "rebind.test", "a.deep.wild.test"]);
    let origin = TestOrigin::https(&ca);
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    (gw, origin, ca)
}

fn curl_via(gw: &TestGateway, ca: &TestCa, id: &str, token: &str, url: &str) -> support::CurlOutput {
    curl(&["--cacert", ca.ca_pem_path.to_str().unwrap(), "-x", &gw.proxy_url(id, token), url])
}

#[test]
fn allowed_connect_reaches_tls_origin_and_is_logged_without_the_token() {
    let (gw, origin, ca) = start();
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
    let (gw, origin, ca) = start();
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_A, &format!("https://a.deep.wild.test:{}/echo", origin.port()));
    assert_eq!(out.status, 200, "{out:?}");
}

#[test]
fn denials_carry_reason_codes() {
    let (gw, origin, ca) = start();
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
    let (gw, origin, _ca) = start();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let req = format!(
        "CONNECT example.com:{port} HTTP/1.1\r\nHost: example.com:{port}\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    let resp = exchange_one(&gw, &req);
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
    let resp = exchange_one(&gw, &req);
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("upstream_unreachable"), "{resp}");
}

fn exchange_one(gw: &TestGateway, req: &str) -> String {
    support::raw::request(gw.addr, req.as_bytes())
}

#[test]
fn credentials_are_required_and_checked() {
    let (gw, origin, ca) = start();
    let url = format!("https://tls.test:{}/", origin.port());
    let out = curl(&["--cacert", ca.ca_pem_path.to_str().unwrap(), "-x", &gw.addr.to_string(), &url]);
    assert_eq!(out.connect_status, 407, "{out:?}");
    let out = curl_via(&gw, &ca, "sbx-a", "wrong-token", &url);
    assert_eq!(out.connect_status, 407, "{out:?}");
    let out = curl_via(&gw, &ca, "nobody", TOKEN_A, &url);
    assert_eq!(out.connect_status, 407, "{out:?}");

    let req = format!("CONNECT tls.test:{} HTTP/1.1\r\n\r\n", origin.port());
    let resp = exchange_one(&gw, &req);
    assert!(
        resp.contains("Proxy-Authenticate: Basic realm=\"egress-gateway\"")
            || resp.to_ascii_lowercase().contains("proxy-authenticate: basic realm=\"egress-gateway\""),
        "{resp}"
    );
    assert!(resp.contains("auth_required"), "{resp}");
    let log = gw.log_text();
    assert!(!log.contains("wrong-token") && !log.contains(TOKEN_A));
}

#[test]
fn one_sandboxs_token_does_not_open_another_sandboxs_hosts() {
    let (gw, origin, ca) = start();
    // sbx-b's own token, sbx-a's host.
    let out = curl_via(&gw, &ca, "sbx-b", TOKEN_B, &format!("https://tls.test:{}/", origin.port()));
    assert_eq!(out.connect_status, 403, "{out:?}");
    // sbx-b's token presented as sbx-a.
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_B, &format!("https://tls.test:{}/", origin.port()));
    assert_eq!(out.connect_status, 407, "{out:?}");
    let rec = gw.access_for(&format!("tls.test:{}", origin.port()));
    assert_eq!(rec["sandbox"], "sbx-b");
    assert_eq!(rec["reason"], "host_not_allowed");
}

#[test]
fn ip_literal_encodings() {
    let (gw, origin, _ca) = start();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let connect =
        |target: &str| exchange_one(&gw, &format!("CONNECT {target} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"));
    for bad in [
        format!("2130706433:{port}"),
        format!("0x7f.1:{port}"),
        format!("0177.0.0.1:{port}"),
        format!("127.1:{port}"),
        format!("0x7f000001:{port}"),
        format!("127.0.0.01:{port}"),
        format!("user@origin.test:{port}"),
        "origin.test:0".to_string(),
        "origin.test:65536".to_string(),
        "origin.test".to_string(),
    ] {
        let resp = connect(&bad);
        assert_eq!(status(&resp), 400, "{bad}: {resp}");
        assert!(resp.contains("bad_request"), "{bad}: {resp}");
    }
    // An unbracketed IPv6 authority does not even parse as a request line: hyper
    // answers 400 itself, before the gateway sees the request.
    assert_eq!(status(&connect(&format!("::1:{port}"))), 400);
    // The canonical literal of an address the config treats as public-for-tests.
    let resp = connect(&format!("127.0.0.1:{port}"));
    assert_eq!(status(&resp), 200, "{resp}");
    // IPv4-mapped IPv6 is judged by the IPv4 address it embeds: 127.0.0.2 is private.
    let resp = connect(&format!("[::ffff:127.0.0.2]:{port}"));
    assert_eq!(status(&resp), 403, "{resp}");
    assert!(resp.contains("address_denied"), "{resp}");
}

#[test]
fn connect_needs_http11_and_an_authority() {
    let (gw, origin, _ca) = start();
    let auth = basic("sbx-a", TOKEN_A);
    let port = origin.port();
    let resp = exchange_one(&gw, &format!("CONNECT tls.test:{port} HTTP/1.0\r\nProxy-Authorization: {auth}\r\n\r\n"));
    assert_eq!(status(&resp), 400, "{resp}");
    let resp = exchange(gw.addr, format!("CONNECT /x HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes());
    assert_eq!(status(&resp), 400, "{resp}");
}

#[test]
fn mixed_answers_dial_only_the_vetted_address() {
    // mixed.test resolves to 127.0.0.2 (private for this config) and 127.0.0.1: only the
    // latter may be dialled.
    let (gw, origin, ca) = start();
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_A, &format!("https://mixed.test:{}/echo", origin.port()));
    assert_ne!(out.exit, 0, "certificate does not name mixed.test, but the tunnel must open: {out:?}");
    assert_eq!(out.connect_status, 200, "{out:?}");
    let rec = gw.access_for(&format!("mixed.test:{}", origin.port()));
    assert_eq!(rec["upstream_addr"], format!("127.0.0.1:{}", origin.port()));
}
