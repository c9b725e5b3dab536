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

/// Reads a CONNECT refusal's status, deny reason and JSON body.
fn refusal_parts(resp: &str) -> (u16, Option<String>, serde_json::Value) {
    let reason = resp.lines().find_map(|l| {
        l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("x-egress-deny-reason")).map(|(_, v)| v.trim().into())
    });
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status(resp), reason, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// A CONNECT head that arrives in one piece is answered by the fast path, one that
/// arrives in two by hyper: the same answer either way, for a refusal and for a tunnel.
#[test]
fn a_connect_split_across_writes_is_answered_like_one_in_a_single_write() {
    use std::io::Write;
    let (gw, origin) = support::start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let denied = format!("CONNECT example.com:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    let whole = support::raw::request(gw.addr, &denied);
    let mut s = support::raw::connect(gw.addr);
    let (first, rest) = denied.split_at(20);
    s.write_all(first.as_bytes()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    s.write_all(rest.as_bytes()).unwrap();
    let split = support::raw::read_response(&mut s);
    assert_eq!(refusal_parts(&whole), refusal_parts(&split), "{whole}\n---\n{split}");
    assert_eq!(refusal_parts(&whole).1.as_deref(), Some("host_not_allowed"), "{whole}");

    // An allowed one, split: a tunnel all the same.
    let allowed = format!("CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    let mut s = support::raw::connect(gw.addr);
    let (first, rest) = allowed.split_at(10);
    s.write_all(first.as_bytes()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    s.write_all(rest.as_bytes()).unwrap();
    assert_eq!(status(&support::raw::read_head(&mut s)), 200);
    s.write_all(b"GET /split HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n").unwrap();
    let answer = support::raw::read_all(&mut s);
    assert_eq!(status(&answer), 200, "{answer}");
}

/// A refused CONNECT leaves an HTTP/1.1 connection open for the next request (curl's
/// 407, then the same request with credentials); HTTP/1.0 and `Connection: close`
/// close it, and say so.
#[test]
fn a_refused_connect_keeps_the_connection_for_the_next_request() {
    use std::io::Write;
    let (gw, origin) = support::start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let mut s = support::raw::connect(gw.addr);
    s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes()).unwrap();
    let first = support::raw::read_response(&mut s);
    assert_eq!(refusal_parts(&first).0, 407, "{first}");
    s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes())
        .unwrap();
    assert_eq!(status(&support::raw::read_head(&mut s)), 200);
    s.write_all(b"GET /after-407 HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n").unwrap();
    let answer = support::raw::read_all(&mut s);
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(origin.recorded().iter().any(|r| r.uri == "/after-407"), "the origin did not see it");

    for (version, extra) in [("1.0", ""), ("1.1", "Connection: close\r\n")] {
        let req =
            format!("CONNECT origin.test:{port} HTTP/{version}\r\n{extra}\r\nGET http://origin.test/ HTTP/1.1\r\n\r\n");
        // read_all returns once the gateway closes: the pipelined GET is not served.
        let resp = exchange(gw.addr, req.as_bytes());
        assert_eq!(status(&resp), 407, "{resp}");
        assert_eq!(resp.matches("HTTP/1.").count(), 1, "HTTP/{version}: a second answer: {resp}");
        assert!(resp.to_ascii_lowercase().contains("connection: close"), "{resp}");
    }
}

/// Bytes a client sends right behind the CONNECT head reach the origin once.
#[test]
fn bytes_pipelined_behind_a_connect_reach_the_origin_once() {
    use std::io::Write;
    let (gw, origin) = support::start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let mut s = support::raw::connect(gw.addr);
    let req = format!(
        "CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n\
         GET /pipelined HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    assert_eq!(status(&support::raw::read_head(&mut s)), 200);
    let answer = support::raw::read_all(&mut s);
    assert_eq!(status(&answer), 200, "{answer}");
    let seen = origin.recorded().iter().filter(|r| r.uri == "/pipelined").count();
    assert_eq!(seen, 1);
}

/// A client that resets its end of a tunnel ends the tunnel: the upstream is closed at
/// once, not held until `proxy.tunnel_idle_timeout` (30 s here).
#[test]
fn a_client_reset_closes_the_upstream_side() {
    use std::io::{Read, Write};
    let (gw, _origin) = support::start_http();
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port();
    let auth = basic("sbx-a", TOKEN_A);
    let mut s = support::raw::connect(gw.addr);
    s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n").as_bytes())
        .unwrap();
    let (mut accepted, _) = upstream.accept().unwrap();
    assert_eq!(status(&support::raw::read_head(&mut s)), 200);
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    accepted.read_exact(&mut b).unwrap();
    // Close with a reset (linger 0), leaving the upstream silent.
    socket2::SockRef::from(&s).set_linger(Some(std::time::Duration::ZERO)).unwrap();
    drop(s);
    accepted.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let ended = match accepted.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    };
    assert!(ended, "the upstream side stayed open for {:?}", started.elapsed());
}

/// A CONNECT has no content: one that declares a body (`Content-Length` above 0,
/// `Transfer-Encoding`) is `400 bad_request`, where hyper had taken the client's first
/// tunnel bytes as a body and dropped them. `Content-Length: 0` is a CONNECT like any.
#[test]
fn a_connect_that_declares_a_body_is_refused() {
    let (gw, origin) = support::start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    for framing in ["Content-Length: 5", "Transfer-Encoding: chunked"] {
        let req =
            format!("CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n{framing}\r\n\r\nhello");
        let resp = exchange(gw.addr, req.as_bytes());
        assert_eq!(status(&resp), 400, "{framing}: {resp}");
        assert!(resp.contains("has no content"), "{resp}");
    }
    let mut s = support::raw::connect(gw.addr);
    let req = format!(
        "CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\nContent-Length: 0\r\n\r\n\
         GET /after-zero HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n"
    );
    std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
    assert_eq!(status(&support::raw::read_head(&mut s)), 200);
    let answer = support::raw::read_all(&mut s);
    assert_eq!(status(&answer), 200, "{answer}");
    assert_eq!(origin.recorded().iter().filter(|r| r.uri == "/after-zero").count(), 1);
}
