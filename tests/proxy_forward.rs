//! Absolute-form HTTP forwarding through the real gateway: real curl, raw sockets for
//! what curl will not send, and a local origin that records what arrives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::raw::{self, read_response, status};
use support::{STANDARD_CONFIG, TOKEN_A, TOKEN_B, TestGateway, TestOrigin, basic, curl, standard_policy, start_http};

#[test]
fn forwards_with_clean_headers_and_host_from_the_uri() {
    let (gw, origin) = start_http();
    let url = format!("http://origin.test:{}/echo?q=1", origin.port());
    let out = curl(&[
        "-x",
        &gw.proxy_url("sbx-a", TOKEN_A),
        "-H",
        "Connection: x-hop",
        "-H",
        "X-Hop: must-not-pass",
        "-H",
        "Proxy-Connection: keep-alive",
        "-H",
        "X-End-To-End: passes",
        "-H",
        "Proxy-Status: egress-gateway; error=http_request_denied",
        "-H",
        "X-Egress-Budget: upload_bytes",
        "-H",
        "X-Egress-Deny-Reason: host_denied",
        // The token under names that are not `Proxy-Authorization` but read as it.
        "-H",
        &format!("X-Proxy-Authorization: {}", basic("sbx-a", TOKEN_A)),
        "-H",
        &format!("Proxy_Authorization: sbx-a:{TOKEN_A}"),
        &url,
    ]);
    assert_eq!((out.exit, out.status), (0, 200), "{out:?}");
    let rec = &origin.recorded()[0];
    assert_eq!(rec.uri, "/echo?q=1", "origin-form upstream");
    let header = |n: &str| rec.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(header("host").as_deref(), Some(format!("origin.test:{}", origin.port()).as_str()));
    assert_eq!(header("x-end-to-end").as_deref(), Some("passes"));
    // The gateway's own fields are its word alone, in either direction.
    let gateway_only = ["proxy-status", "x-egress-budget", "x-egress-deny-reason"];
    let credentials = ["proxy-authorization", "x-proxy-authorization", "proxy_authorization"];
    for gone in ["proxy-connection", "x-hop", "connection"].into_iter().chain(gateway_only).chain(credentials) {
        assert!(header(gone).is_none(), "{gone} must be stripped: {:?}", rec.headers);
    }
    let seen = format!("{:?}", rec.headers);
    let encoded = basic("sbx-a", TOKEN_A);
    let encoded = encoded.trim_start_matches("Basic ");
    assert!(!seen.contains(TOKEN_A) && !seen.contains(encoded), "token reached the origin: {seen}");

    let log = gw.access_for(&format!("origin.test:{}", origin.port()));
    assert_eq!(log["kind"], "forward");
    assert_eq!(log["method"], "GET");
    assert_eq!(log["status"], 200);
    assert_eq!(log["decision"], "allow");
    assert!(log["bytes_down"].as_u64().unwrap() > 10, "{log}");
    assert!(!gw.log_text().contains(TOKEN_A));
}

#[test]
fn streams_large_bodies_both_ways() {
    let (gw, origin) = start_http();
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("up.bin");
    std::fs::write(&upload, vec![7u8; 3 * 1024 * 1024]).unwrap();
    let url = format!("http://origin.test:{}/upload", origin.port());
    let out = curl(&[
        "-x",
        &gw.proxy_url("sbx-a", TOKEN_A),
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &format!("@{}", upload.display()),
        &url,
    ]);
    assert_eq!(out.status, 200, "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.body).unwrap();
    assert_eq!(v["body_len"], 3 * 1024 * 1024);
    let log = gw.access_for(&format!("origin.test:{}", origin.port()));
    assert_eq!(log["bytes_up"], 3 * 1024 * 1024, "{log}");

    let url = format!("http://origin.test:{}/bytes/{}", origin.port(), 8 * 1024 * 1024);
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), "-o", "/dev/null", &url]);
    assert_eq!(out.status, 200, "{out:?}");
    gw.wait_for_log(Duration::from_secs(10), |v| v["log"] == "access" && v["bytes_down"] == 8 * 1024 * 1024);
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let (gw, origin) = start_http();
    let a = format!("http://origin.test:{}/echo", origin.port());
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &a, &a, &a]);
    assert_eq!(out.exit, 0, "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let logs = gw.wait_for_access(3, |_| true);
    assert_eq!(logs.len(), 3, "{logs:?}");
    let client = &logs[0]["client_addr"];
    assert!(logs.iter().all(|l| &l["client_addr"] == client), "one client connection reused: {logs:?}");
    // Upstream, the pooled connection is reused too.
    let peers: Vec<_> = origin.recorded().iter().map(|r| r.peer).collect();
    assert_eq!(peers.len(), 3);
    assert!(peers.iter().all(|p| *p == peers[0]), "one upstream connection reused: {peers:?}");
}

#[test]
fn client_connections_never_share_an_upstream_connection() {
    // Three client connections, one after the other, to the same origin: each gets an
    // upstream connection of its own, never one an earlier client connection left open
    // (what one exchange leaves on a connection must not reach another's request).
    let (gw, origin) = start_http();
    let a = format!("http://origin.test:{}/echo", origin.port());
    for _ in 0..3 {
        let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &a, &a]);
        assert_eq!((out.exit, out.status), (0, 200), "{out:?}");
    }
    let peers: Vec<_> = origin.recorded().iter().map(|r| r.peer).collect();
    assert_eq!(peers.len(), 6, "{peers:?}");
    for (i, pair) in peers.chunks(2).enumerate() {
        assert_eq!(pair[0], pair[1], "connection {i}: its two requests share its upstream: {peers:?}");
    }
    let (first, second, third) = (peers[0], peers[2], peers[4]);
    assert!(first != second && second != third && first != third, "one upstream per client connection: {peers:?}");
}

#[test]
fn absolute_form_denials_and_bad_forms() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let cases = [
        (
            format!("GET http://example.com:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
            403,
            "host_not_allowed",
        ),
        (
            format!("GET http://rebind.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
            403,
            "address_denied",
        ),
        (
            format!("GET https://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
            400,
            "bad_request",
        ),
        (
            format!("GET http://user@origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
            400,
            "bad_request",
        ),
        (format!("GET http://2130706433:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"), 400, "bad_request"),
        (format!("GET ftp://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"), 400, "bad_request"),
        (
            format!("GET /echo HTTP/1.1\r\nHost: origin.test:{port}\r\nProxy-Authorization: {auth}\r\n\r\n"),
            400,
            "bad_request",
        ),
        (format!("GET http://origin.test:{port}/ HTTP/1.1\r\n\r\n"), 407, "auth_required"),
        // A coding beneath the chunked framing would reach the origin unannounced.
        (
            format!(
                "POST http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\
                 Transfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"
            ),
            400,
            "bad_request",
        ),
        (
            format!(
                "POST http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\
                 Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"
            ),
            400,
            "bad_request",
        ),
        (
            format!(
                "GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
                basic("sbx-b", TOKEN_B)
            ),
            403,
            "host_not_allowed",
        ),
    ];
    for (req, code, reason) in cases {
        let resp = raw::request(gw.addr, req.as_bytes());
        assert_eq!(status(&resp), code, "{req}\n{resp}");
        assert!(resp.contains(&format!("x-egress-deny-reason: {reason}")), "{req}\n{resp}");
    }
    assert!(origin.recorded().is_empty(), "nothing may reach the origin: {:?}", origin.recorded());

    // A target that never parsed is echoed raw, in the answer and in the access log.
    let raw_target = format!("ftp://origin.test:{port}/raw-echo");
    let resp = raw::request(gw.addr, format!("GET {raw_target} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"));
    assert!(resp.contains(&raw_target), "{resp}");
    let rec = gw.access_for(&raw_target);
    assert_eq!(rec["reason"], "bad_request");
}

/// `method` with a chunked `body` (as sent: chunk sizes and all) through a fresh
/// gateway to the echo origin; the response.
fn chunked(method: &str, body: &str) -> String {
    let (gw, origin) = start_http();
    let auth = basic("sbx-a", TOKEN_A);
    raw::request(
        gw.addr,
        format!(
            "{method} http://origin.test:{}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\
             Transfer-Encoding: chunked\r\n\r\n{body}",
            origin.port()
        ),
    )
}

#[test]
fn a_chunked_body_on_a_get_reaches_the_origin() {
    // Search APIs take a GET with a body; hyper, told nothing, would send it bodiless.
    let resp = chunked("GET", "5\r\nhello\r\n0\r\n\r\n");
    assert_eq!(status(&resp), 200, "{resp}");
    assert!(resp.contains("\"body_len\":5"), "{resp}");
}

#[test]
fn a_request_body_with_broken_framing_is_the_client_s_fault() {
    // A chunk size that is not hex: hyper fails the body while sending it upstream.
    let resp = chunked("POST", "ZZ\r\nab\r\n0\r\n\r\n");
    assert_eq!(status(&resp), 400, "{resp}");
    assert!(resp.contains("bad_request") && resp.contains("request body"), "{resp}");
}

#[test]
fn an_upstream_s_trailers_reach_a_client_that_takes_them() {
    // The origin answers with a declared trailer.
    let (port, rx) = answers_once(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n\
          4\r\nbody\r\n0\r\nX-Checksum: abc123\r\nProxy-Status: forged\r\n\r\n"
            .to_vec(),
    );
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    let resp = raw::exchange(
        gw.addr,
        format!(
            "GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\nTE: trailers\r\n\
             Connection: close, TE\r\n\r\n"
        )
        .as_bytes(),
    );
    let head = rx.recv_timeout(Duration::from_secs(10)).unwrap().to_ascii_lowercase();
    assert!(head.contains("\r\nte: trailers\r\n") && head.contains("\r\nconnection: te\r\n"), "{head}");
    let lower = resp.to_ascii_lowercase();
    assert!(lower.contains("\r\ntrailer: x-checksum\r\n"), "{resp}");
    assert!(lower.ends_with("\r\n0\r\nx-checksum: abc123\r\n\r\n"), "{resp}");
}

#[test]
fn an_upstream_head_too_large_is_named_as_such() {
    let fields: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let (port, _) = answers_once(format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n").into_bytes());
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    let resp = raw::request(
        gw.addr,
        format!("GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
    );
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("more than 100 fields") && resp.contains("upstream_invalid"), "{resp}");
    // An answer that is not HTTP/1.1 at all (an h2c-only origin's preface, say): the
    // upstream was reached, and answered with what the gateway cannot relay.
    let (port, _) = answers_once(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage\r\n\r\n".to_vec());
    let resp = raw::request(
        gw.addr,
        format!("GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"),
    );
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("upstream_invalid") && resp.contains("not HTTP the gateway can read"), "{resp}");
}

#[test]
fn an_upstream_s_transfer_codings_reach_the_client_as_chunked_alone() {
    // An origin that sends `gzip, chunked`. Python's http.client and urllib3 frame only
    // `chunked` exactly as chunked: sent on as it came, the answer would stall them
    // until the connection closed and hand them the gateway's framing as the body.
    let (port, _) = answers_once(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 99\r\n\r\n4\r\nGZIP\r\n0\r\n\r\n"
            .to_vec(),
    );
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    let resp = raw::exchange(
        gw.addr,
        format!("GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(status(&resp), 200, "{resp}");
    let lower = resp.to_ascii_lowercase();
    assert!(lower.contains("\r\ntransfer-encoding: chunked\r\n"), "{resp}");
    assert!(!lower.contains("gzip,") && !lower.contains("content-length"), "{resp}");
    assert!(resp.ends_with("\r\n\r\n4\r\nGZIP\r\n0\r\n\r\n"), "{resp}");
}

#[test]
fn a_stalled_forwarded_body_ends_after_the_idle_timeout() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG.replace("tunnel_idle_timeout = \"30s\"", "tunnel_idle_timeout = \"1s\"");
    assert_ne!(config, STANDARD_CONFIG);
    let gw = TestGateway::start(&config, &standard_policy());
    let proxy = gw.proxy_url("sbx-a", TOKEN_A);
    // Bytes every 400 ms for 2 s: never idle for 1 s, so the whole body arrives.
    let out = curl(&["-x", &proxy, &format!("http://origin.test:{}/slow/5/400", origin.port())]);
    assert_eq!((out.exit, out.status, out.body.len()), (0, 200, 5 * 1024), "{}", out.stderr);
    // Headers, then 3 s of silence: the gateway ends the response instead of waiting.
    let out = curl(&["-x", &proxy, &format!("http://origin.test:{}/slow/2/3000", origin.port())]);
    assert_ne!(out.exit, 0, "the stalled body must be cut, {} bytes arrived", out.body.len());
    assert!(out.body.is_empty(), "{} bytes arrived", out.body.len());
}

#[test]
fn connection_limit_answers_503_limit_exceeded() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nmax_connections = 2\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    let req = format!("GET http://origin.test:{}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n", origin.port());
    // Two kept-alive connections hold both slots.
    let mut held: Vec<_> = (0..2)
        .map(|_| {
            let mut s = raw::connect(gw.addr);
            s.write_all(req.as_bytes()).unwrap();
            assert_eq!(status(&read_response(&mut s)), 200);
            s
        })
        .collect();
    let resp = raw::exchange(gw.addr, req.as_bytes());
    assert_eq!(status(&resp), 503, "{resp}");
    assert!(resp.contains("limit_exceeded"), "{resp}");
    // The held connections still work.
    for s in &mut held {
        s.write_all(req.as_bytes()).unwrap();
        assert_eq!(status(&read_response(s)), 200);
    }
}

#[test]
fn report_mode_lets_denied_traffic_through_and_says_so() {
    let (gw, origin) = start_http();
    let url = format!("http://origin.test:{}/echo", origin.port());
    let out = curl(&["-x", &gw.proxy_url("sbx-r", TOKEN_B), &url]);
    assert_eq!(out.status, 200, "{out:?}");
    let rec = gw.access_for(&format!("origin.test:{}", origin.port()));
    assert_eq!(rec["decision"], "would_deny");
    assert_eq!(rec["reason"], "host_not_allowed");
    assert_eq!(rec["policy"], "r");
}

/// sbx-a's WebSocket handshake for `url`, in absolute form.
fn websocket_handshake(url: &str) -> String {
    format!(
        "GET {url} HTTP/1.1\r\nProxy-Authorization: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        basic("sbx-a", TOKEN_A)
    )
}

/// After an upgrade, an origin that shuts its sending side still gets every byte the
/// client sends until the client's own end: the half-close is passed on, and nothing
/// reads the client's side but the relay (a lingering close, meant for a connection
/// hyper ends, once dropped about half of them).
#[test]
fn an_upgraded_connection_half_closed_by_the_origin_still_carries_the_client_s_bytes() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let origin = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        raw::read_head(&mut s);
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nHELLO")
            .unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got.len()
    });
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut s = raw::connect(gw.addr);
    s.write_all(websocket_handshake(&format!("http://origin.test:{port}/ws")).as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let all = raw::read_all(&mut s);
    assert!(all.starts_with("HTTP/1.1 101") && all.ends_with("HELLO"), "{all}");
    for _ in 0..20 {
        s.write_all(&[b'x'; 1000]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(origin.join().unwrap(), 20_000);
}

/// A WebSocket handshake asked for as `http://` or, as aiohttp does, `ws://`.
#[test]
fn websocket_upgrade_is_relayed() {
    let (gw, origin) = start_http();
    let port = origin.port();
    for (i, scheme) in ["http", "ws", "WS"].into_iter().enumerate() {
        let mut s = raw::connect(gw.addr);
        s.write_all(websocket_handshake(&format!("{scheme}://origin.test:{port}/ws")).as_bytes()).unwrap();
        let head = raw::read_head(&mut s);
        assert_eq!(status(&head), 101, "{scheme}: {head}");
        assert!(head.to_ascii_lowercase().contains("upgrade: websocket"), "{head}");
        s.write_all(b"ping-through-gateway").unwrap();
        let mut buf = [0u8; 20];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping-through-gateway");
        let rec = &origin.recorded()[i];
        assert_eq!(rec.uri, "/ws", "{rec:?}");
        assert!(rec.headers.iter().any(|(k, v)| k == "upgrade" && v == "websocket"), "{rec:?}");
    }
    // `ws://` without the handshake, and `wss://` (TLS goes through CONNECT), are refused
    // with the reason.
    let auth = basic("sbx-a", TOKEN_A);
    for (url, hint) in [
        (format!("ws://origin.test:{port}/ws"), "only as a WebSocket handshake"),
        (format!("wss://origin.test:{port}/ws"), "go through CONNECT"),
    ] {
        let resp = raw::request(gw.addr, format!("GET {url} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"));
        assert_eq!(status(&resp), 400, "{resp}");
        assert!(resp.contains(hint) && resp.contains("bad_request"), "{resp}");
    }
    assert_eq!(origin.recorded().len(), 3);
}

#[test]
fn upstream_without_response_gets_504() {
    // A listener that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nresponse_header_timeout = \"1s\"\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let req =
        format!("GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A));
    let resp = raw::request(gw.addr, req.as_bytes());
    assert_eq!(status(&resp), 504, "{resp}");
    assert!(resp.contains("upstream_timeout"), "{resp}");
    drop(silent);
}

/// A config whose connections close after 1 s without a byte moving (the idle timeout,
/// and the wait for response headers and the git route's idle timeout, which bound it
/// from below).
fn quick_idle_config() -> String {
    let config = STANDARD_CONFIG
        .replace("tunnel_idle_timeout = \"30s\"", "tunnel_idle_timeout = \"1s\"\nresponse_header_timeout = \"1s\"");
    assert_ne!(config, STANDARD_CONFIG);
    format!("{config}\n[github]\nidle_timeout = \"1s\"\n")
}

/// `sbx-a`'s open connections, as the admin listener lists them.
fn open_connections(gw: &TestGateway) -> u64 {
    let resp = raw::request(
        gw.admin_addr(),
        "GET /v1/sandboxes/sbx-a HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n".as_bytes(),
    );
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"));
    v["open_connections"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

/// Polls `pred` every 50 ms until it holds; panics with `what` after `deadline`.
fn eventually(deadline: Duration, what: &str, mut pred: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + deadline;
    while !pred() {
        assert!(std::time::Instant::now() < end, "not within {deadline:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An origin that answers every request with an endless body, and reports (on the
/// channel) once a write fails: the gateway closed its connection.
fn endless_origin() -> (u16, std::sync::mpsc::Receiver<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = raw::read_head(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n");
        let chunk = vec![b'x'; 64 * 1024];
        let end = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < end {
            if s.write_all(&chunk).is_err() {
                let _ = tx.send(());
                return;
            }
        }
    });
    (port, rx)
}

/// A client connection through `gw` that asked `endless_origin` at `port` for its
/// body and got the head.
fn endless_response(gw: &TestGateway, port: u16) -> std::net::TcpStream {
    let mut client = raw::connect(gw.addr);
    let req =
        format!("GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A));
    client.write_all(req.as_bytes()).unwrap();
    assert_eq!(status(&raw::read_head(&mut client)), 200);
    client
}

/// Reads until the gateway closes `client` (within 10 s of silence); the bytes read.
fn read_until_closed(client: &mut std::net::TcpStream) -> usize {
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match client.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the client connection was not closed: {e} after {got} bytes"),
        }
    }
}

#[test]
fn a_client_that_stops_reading_a_forwarded_response_is_closed_after_the_idle_timeout() {
    // Hyper stops polling a response body while the client does not read it, so the
    // body's own idle timer never runs: the connection's watch closes it instead.
    let (port, origin_closed) = endless_origin();
    let gw = TestGateway::start(&quick_idle_config(), &standard_policy());
    let mut client = endless_response(&gw, port);
    assert_eq!(open_connections(&gw), 1, "the exchange is registered while it flows");
    // The client reads nothing more: buffers fill, then no byte moves for 1 s.
    origin_closed.recv_timeout(Duration::from_secs(15)).expect("the gateway closes the origin's connection");
    eventually(Duration::from_secs(5), "the exchange leaves the registry", || open_connections(&gw) == 0);
    let rec = gw.wait_for_access(1, |v| v["target"] == format!("origin.test:{port}"));
    assert_eq!(rec[0]["status"], 200, "{rec:?}");
    // What the kernel buffered arrives, then the end: nowhere near the endless body.
    let got = read_until_closed(&mut client);
    assert!(got < 256 << 20, "{got} bytes");
}

#[test]
fn a_client_reading_steadily_is_not_cut_by_the_idle_timeout() {
    // 1 MiB every 100 ms for 4 s, with a 1 s idle timeout: the response never stalls
    // for long, though the client reads far slower than loopback delivers.
    let (port, _origin_closed) = endless_origin();
    let gw = TestGateway::start(&quick_idle_config(), &standard_policy());
    let mut client = endless_response(&gw, port);
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        client.read_exact(&mut buf).unwrap_or_else(|e| panic!("cut after {got} bytes: {e}"));
        got += buf.len();
    }
    assert_eq!(open_connections(&gw), 1, "still streaming after {got} bytes");
}

#[test]
fn an_origin_that_stops_reading_a_request_body_releases_both_connections() {
    // The origin reads the head, then nothing: the upload stalls upstream, the gateway
    // stops reading the client, and neither side moves a byte.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, upstream_closed) = std::sync::mpsc::channel();
    let (go, read_now) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = raw::read_head(&mut s);
        let _ = read_now.recv();
        // Now drain: what the gateway sent, then the end, once it closed.
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(_) => return,
            }
        }
        let _ = tx.send(());
    });
    let gw = TestGateway::start(&quick_idle_config(), &standard_policy());
    let mut client = raw::connect(gw.addr);
    let req = format!(
        "POST http://origin.test:{port}/upload HTTP/1.1\r\nProxy-Authorization: {}\r\nContent-Length: 1099511627776\r\n\r\n",
        basic("sbx-a", TOKEN_A)
    );
    client.write_all(req.as_bytes()).unwrap();
    client.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let chunk = vec![b'y'; 64 * 1024];
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let closed = loop {
        assert!(std::time::Instant::now() < end, "the stalled upload was never closed");
        match client.write(&chunk) {
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(closed.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset), "{closed}");
    go.send(()).unwrap();
    upstream_closed.recv_timeout(Duration::from_secs(15)).expect("the gateway closes the origin's connection");
    eventually(Duration::from_secs(5), "the upload leaves the registry", || open_connections(&gw) == 0);
}

#[test]
fn a_reload_that_revokes_a_stalled_response_closes_it_at_once() {
    // A long idle timeout: only the sweep can end this exchange in time.
    let (port, origin_closed) = endless_origin();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut client = endless_response(&gw, port);
    // Let the buffers fill, so that nobody polls the response body.
    std::thread::sleep(Duration::from_millis(500));
    let narrowed = standard_policy().replace("\"origin.test:*\", ", "");
    std::fs::write(gw.dir.path().join("policy/test.toml"), narrowed).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "closing a connection");
    origin_closed.recv_timeout(Duration::from_secs(5)).expect("the sweep closes the origin's connection");
    eventually(Duration::from_secs(5), "the exchange leaves the registry", || open_connections(&gw) == 0);
    read_until_closed(&mut client);
}

/// An origin whose first connection answers one request, then reads the next head and
/// closes without answering (as at the end of its keep-alive timeout); later
/// connections answer every request with `again`. Sends each request line it reads on
/// the channel, with the connection's number.
fn closes_after_one() -> (u16, std::sync::mpsc::Receiver<(usize, String)>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate().take(3) {
            let Ok(mut s) = conn else { return };
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0.. {
                    let head = raw::read_head(&mut s);
                    if head.is_empty() {
                        return;
                    }
                    let _ = tx.send((n, head.lines().next().unwrap_or_default().to_string()));
                    if n == 0 && i == 1 {
                        return; // closed, unanswered
                    }
                    let body = if n == 0 { "first" } else { "again" };
                    let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    if s.write_all(resp.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

#[test]
fn a_safe_request_on_a_kept_connection_the_origin_closed_is_sent_again() {
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    // A GET: the kept connection closes under it, and it goes again on a new one.
    let (port, seen) = closes_after_one();
    let mut client = raw::connect(gw.addr);
    let get = format!("GET http://origin.test:{port}/x HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    client.write_all(get.as_bytes()).unwrap();
    let first = read_response(&mut client);
    assert!(first.ends_with("first"), "{first}");
    // Idle for over a second, as a connection an origin times out is.
    std::thread::sleep(Duration::from_millis(1100));
    client.write_all(get.as_bytes()).unwrap();
    let second = read_response(&mut client);
    assert_eq!(status(&second), 200, "{second}");
    assert!(second.ends_with("again"), "{second}");
    let lines: Vec<_> = seen.try_iter().collect();
    assert_eq!(lines.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0, 1], "{lines:?}");

    // A POST is not repeated: the client hears that the upstream failed.
    let (port, seen) = closes_after_one();
    let mut client = raw::connect(gw.addr);
    let get = format!("GET http://origin.test:{port}/x HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    client.write_all(get.as_bytes()).unwrap();
    assert!(read_response(&mut client).ends_with("first"));
    std::thread::sleep(Duration::from_millis(1100));
    let post = format!(
        "POST http://origin.test:{port}/x HTTP/1.1\r\nProxy-Authorization: {auth}\r\nContent-Length: 4\r\n\r\nbody"
    );
    client.write_all(post.as_bytes()).unwrap();
    let answer = read_response(&mut client);
    assert_eq!(status(&answer), 502, "{answer}");
    assert!(answer.contains("upstream_unreachable"), "{answer}");
    std::thread::sleep(Duration::from_millis(200));
    let lines: Vec<_> = seen.try_iter().collect();
    assert_eq!(lines.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0], "sent once only: {lines:?}");

    // Nor is a WebSocket handshake, though it is a GET without a body.
    let (port, seen) = closes_after_one();
    let get = format!("GET http://origin.test:{port}/x HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    let mut client = raw::connect(gw.addr);
    client.write_all(get.as_bytes()).unwrap();
    assert!(read_response(&mut client).ends_with("first"));
    std::thread::sleep(Duration::from_millis(1100));
    let upgrade = format!(
        "GET http://origin.test:{port}/ws HTTP/1.1\r\nProxy-Authorization: {auth}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    client.write_all(upgrade.as_bytes()).unwrap();
    let answer = read_response(&mut client);
    assert_eq!(status(&answer), 502, "{answer}");
    std::thread::sleep(Duration::from_millis(200));
    let lines: Vec<_> = seen.try_iter().collect();
    assert_eq!(lines.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0], "sent once only: {lines:?}");
}

/// An origin that answers its first connection's first request with `answer`; the
/// request head it read comes back on the channel.
fn answers_once(answer: Vec<u8>) -> (u16, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = tx.send(raw::read_head(&mut s));
        let _ = s.write_all(&answer);
    });
    (port, rx)
}

/// What a client reads when it sends `method` for `/` through a fresh gateway to an
/// origin that answers `answer` once.
fn answered_once(answer: &[u8], method: &str) -> String {
    let (port, _rx) = answers_once(answer.to_vec());
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    raw::request(
        gw.addr,
        format!(
            "{method} http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {}\r\n\r\n",
            basic("sbx-a", TOKEN_A)
        ),
    )
}

#[test]
fn a_refusal_that_leaves_a_body_unsent_says_the_connection_closes() {
    // A client waiting on `Expect: 100-continue` has sent no body: the refusal comes
    // without asking for it, and the connection cannot carry another request, so the
    // refusal says `Connection: close` and the gateway closes it.
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    for creds in ["", &format!("Proxy-Authorization: {auth}\r\n")] {
        let resp = raw::exchange(
            gw.addr,
            format!(
                "POST http://b-only.test/up HTTP/1.1\r\nHost: b-only.test\r\n{creds}Content-Length: 5\r\n\
                 Expect: 100-continue\r\n\r\n"
            )
            .as_bytes(),
        );
        assert!(matches!(status(&resp), 403 | 407), "{resp}");
        assert!(resp.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{resp}");
    }
    // A refused request whose body came whole is read past; the connection goes on.
    let mut s = raw::connect(gw.addr);
    let refused = format!(
        "POST http://b-only.test/up HTTP/1.1\r\nHost: b-only.test\r\nProxy-Authorization: {auth}\r\n\
         Content-Length: 5\r\n\r\nhello"
    );
    for _ in 0..2 {
        s.write_all(refused.as_bytes()).unwrap();
        let resp = read_response(&mut s);
        assert_eq!(status(&resp), 403, "{resp}");
        assert!(!resp.to_ascii_lowercase().contains("connection: close"), "{resp}");
    }
}

/// An origin that answers every request with `answer` as soon as its head is read, and
/// closes without reading the body (the kernel resets the connection: bytes are left
/// unread).
fn answers_early(answer: &'static [u8]) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            raw::read_head(&mut s);
            let _ = s.write_all(answer);
        }
    });
    port
}

/// An origin's early answer to an upload (`413` before reading the body, then a reset
/// connection) reaches the client every time, as it does without the gateway. The
/// write that fails on the reset no longer beats the read of the answer (it did in
/// about one upload in eight, and the client got `502 upstream_unreachable`).
#[test]
fn an_origin_s_early_answer_to_an_upload_reaches_the_client() {
    let port =
        answers_early(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\nConnection: close\r\n\r\ntoo large");
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("upload.bin");
    std::fs::write(&upload, vec![b'x'; 4 << 20]).unwrap();
    let url = format!("http://origin.test:{port}/up");
    let proxy = gw.proxy_url("sbx-a", TOKEN_A);
    for round in 0..30 {
        let expect = if round % 2 == 0 { "Expect: 100-continue" } else { "Expect:" };
        let out = curl(&["-x", &proxy, "-H", expect, "-T", upload.to_str().unwrap(), &url]);
        assert_eq!(out.status, 413, "round {round}: {} {}", out.body, out.stderr);
        assert!(out.body.starts_with("too large"), "round {round}: {}", out.body);
    }
}

/// A URL with `"`, `<` or `>` unencoded (Go's `net/http` and Python's `urllib` send a
/// JSON query so) cannot be forwarded: hyper refused it with a bare `400`; as a
/// connection's first request it is refused with the reason and what to encode.
#[test]
fn a_url_with_unencoded_quotes_is_refused_with_what_to_encode() {
    let (gw, origin) = start_http();
    let auth = basic("sbx-a", TOKEN_A);
    let url = format!("http://origin.test:{}/echo?filter={{\"name\":\"x\"}}", origin.port());
    let resp = raw::request(gw.addr, format!("GET {url} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"));
    assert_eq!(status(&resp), 400, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("x-egress-deny-reason: bad_request"), "{resp}");
    assert!(resp.contains("percent-encode them (\\\" as %22)"), "{resp}");
    // Python's urllib, as a sandbox would run it.
    let script = "import sys, urllib.request, urllib.error\n\
                  try:\n    urllib.request.urlopen(sys.argv[1], timeout=10)\n\
                  except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode())\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, &url])
        .env("http_proxy", gw.proxy_url("sbx-a", TOKEN_A))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("400") && text.contains("as %22"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(origin.recorded().is_empty());
    // Encoded, it goes through.
    let encoded = url.replace('"', "%22");
    let resp = raw::request(gw.addr, format!("GET {encoded} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"));
    assert_eq!(status(&resp), 200, "{resp}");
}

/// An origin that reports the head of the one request it takes, reads what follows
/// and never answers, until the gateway closes the connection.
fn silent_origin() -> (u16, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = tx.send(raw::read_head(&mut s));
        let mut sink = [0u8; 4096];
        while s.read(&mut sink).is_ok_and(|n| n > 0) {}
    });
    (port, rx)
}

/// A client that leaves before the answer (its timeout, a reset) still leaves a record
/// of a request that reached the origin: status 499, with the bytes that went up.
/// Before, hyper dropped the handler and nothing was logged or counted.
#[test]
fn a_request_whose_client_left_before_the_answer_is_still_recorded() {
    let (port, rx) = silent_origin();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut client = raw::connect(gw.addr);
    let req = format!(
        "POST http://origin.test:{port}/slow HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {}\r\n\
         Content-Length: 5\r\n\r\nhello",
        basic("sbx-a", TOKEN_A)
    );
    client.write_all(req.as_bytes()).unwrap();
    let head = rx.recv_timeout(Duration::from_secs(10)).expect("the request reached the origin");
    assert!(head.starts_with("POST /slow "), "{head}");
    drop(client);
    let log = gw.access_for(&format!("origin.test:{port}"));
    assert_eq!(log["status"], 499, "{log}");
    assert_eq!(log["decision"], "allow", "{log}");
    assert_eq!(log["sandbox"], "sbx-a", "{log}");
    assert!(log["bytes_up"].as_u64().unwrap_or(0) >= 5, "{log}");
}

/// An origin that answers each request on a connection in HTTP/1.0 with keep-alive,
/// and reports each request it read (head and body, a chunked one decoded by its end).
fn http10_origin() -> (u16, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                loop {
                    let head = raw::read_head(&mut s);
                    if head.is_empty() {
                        return;
                    }
                    let lower = head.to_ascii_lowercase();
                    let mut body = Vec::new();
                    if lower.contains("transfer-encoding: chunked") {
                        let mut b = [0u8; 1];
                        while !body.ends_with(b"0\r\n\r\n") && s.read(&mut b).unwrap_or(0) == 1 {
                            body.push(b[0]);
                        }
                    } else if let Some(len) = lower
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                    {
                        body = vec![0u8; len];
                        let _ = s.read_exact(&mut body);
                    }
                    let _ = tx.send(format!("{head}{}", String::from_utf8_lossy(&body)));
                    let answer = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok";
                    if s.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

/// The gateway answers in its own version, HTTP/1.1, whatever the origin's, and never
/// keeps an HTTP/1.0 upstream connection: on one, hyper sent the next request as
/// HTTP/1.0 with a chunked body dropped (neither `Content-Length` nor chunked).
#[test]
fn an_http10_origin_neither_sets_the_version_nor_loses_a_later_chunked_body() {
    let (port, rx) = http10_origin();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    let mut client = raw::connect(gw.addr);
    let get = format!(
        "GET http://origin.test:{port}/one HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    client.write_all(get.as_bytes()).unwrap();
    let resp = read_response(&mut client);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    client.write_all(chunked_post(port, &auth).as_bytes()).unwrap();
    let resp = read_response(&mut client);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let seen = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(seen.starts_with("POST /up HTTP/1.1\r\n"), "{seen}");
    assert!(
        seen.to_ascii_lowercase().ends_with("\r\n\r\nb\r\nhello world\r\n0\r\n\r\n"),
        "the body went missing: {seen:?}"
    );
}

fn chunked_post(port: u16, auth: &str) -> String {
    format!(
        "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\n\
         Transfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n"
    )
}

/// `Content-Length: 5, 5` from an origin (one value repeated, which hyper frames the
/// body by) reaches the client as `Content-Length: 5`: Python's `http.client` reads a
/// list as no length and waited for the connection to close.
#[test]
fn a_repeated_content_length_reaches_the_client_as_one_value() {
    let resp = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", "GET");
    assert_eq!(status(&resp), 200, "{resp}");
    let lower = resp.to_ascii_lowercase();
    assert!(lower.contains("\r\ncontent-length: 5\r\n"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nhello"), "{resp}");
}

/// An HTTP/1.0 client that asked for keep-alive, answered with a body of unknown length
/// (read to the close), is not told `keep-alive`: it could not tell the body's end.
#[test]
fn an_http10_client_is_not_told_keep_alive_for_a_body_read_to_the_close() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        raw::read_head(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nno length here");
    });
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut client = raw::connect(gw.addr);
    let req = format!(
        "GET http://origin.test:{port}/ HTTP/1.0\r\nConnection: keep-alive\r\nProxy-Authorization: {}\r\n\r\n",
        basic("sbx-a", TOKEN_A)
    );
    client.write_all(req.as_bytes()).unwrap();
    let resp = raw::read_all(&mut client);
    assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
    assert!(!resp.to_ascii_lowercase().contains("keep-alive"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nno length here"), "{resp}");
}

/// An upload to an origin that cannot be reached (nothing listens) is read and
/// discarded like a refused one's, so the client reads the `502` with its reason
/// instead of failing to write the rest (the gateway had closed with it unread). A
/// client waiting on `Expect: 100-continue` is told the connection closes.
#[test]
fn an_upload_to_an_unreachable_origin_is_answered_with_the_reason() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let auth = basic("sbx-a", TOKEN_A);
    let len = 32 << 20;
    let mut client = raw::connect(gw.addr);
    let head = format!(
        "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\n\
         Content-Length: {len}\r\n\r\n"
    );
    client.write_all(head.as_bytes()).unwrap();
    client.write_all(&vec![b'x'; len]).expect("the whole upload is read");
    let resp = read_response(&mut client);
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("upstream_unreachable"), "{resp}");

    let waits = format!(
        "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\n\
         Content-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    );
    let resp = raw::exchange(gw.addr, waits.as_bytes());
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{resp}");
}

/// An upstream that switches protocols unasked is `502 upstream_invalid`: its `101`
/// had been relayed without its `Upgrade`, and the connection closed.
#[test]
fn an_upstream_that_switches_protocols_unasked_is_refused() {
    let resp = answered_once(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n", "GET");
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("upstream_invalid"), "{resp}");
}

/// A listener whose accept queue is full, so that a dial to it hangs (until the
/// gateway's connect timeout): returns its port and what keeps it so.
fn hanging_dial() -> (u16, Vec<socket2::Socket>) {
    use socket2::{Domain, Socket, Type};
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    listener.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    listener.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let port = addr.as_socket().unwrap().port();
    let mut held = vec![listener];
    for _ in 0..3 {
        let c = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        c.set_nonblocking(true).unwrap();
        let _ = c.connect(&addr);
        held.push(c);
    }
    (port, held)
}

/// A client that leaves while the gateway is still dialling is recorded too (status
/// 499, no upstream address): before, the request was counted against budgets and
/// left no log line.
#[test]
fn a_client_that_leaves_during_the_dial_is_recorded() {
    let (port, _held) = hanging_dial();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut client = raw::connect(gw.addr);
    let req = format!(
        "GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {}\r\n\r\n",
        basic("sbx-a", TOKEN_A)
    );
    client.write_all(req.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(client);
    let log = gw.access_for(&format!("origin.test:{port}"));
    assert_eq!(log["status"], 499, "{log}");
    assert!(log.get("upstream_addr").is_none(), "{log}");
}

/// A client whose upload ends early (it closes mid-body) left: status 499, not a
/// refusal of its framing (`deny bad_request`, which counted it among refusals).
#[test]
fn a_client_that_leaves_mid_upload_is_recorded_as_left_not_refused() {
    let (port, rx) = silent_origin();
    let gw = TestGateway::start(STANDARD_CONFIG, &standard_policy());
    let mut client = raw::connect(gw.addr);
    let req = format!(
        "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {}\r\n\
         Content-Length: 1000\r\n\r\n{}",
        basic("sbx-a", TOKEN_A),
        "x".repeat(100)
    );
    client.write_all(req.as_bytes()).unwrap();
    rx.recv_timeout(Duration::from_secs(10)).expect("the request reached the origin");
    drop(client);
    let log = gw.access_for(&format!("origin.test:{port}"));
    assert_eq!(log["status"], 499, "{log}");
    assert_eq!(log["decision"], "allow", "{log}");
    assert!(log.get("reason").is_none(), "{log}");
}

/// A `HEAD` answered with `Content-Length` on two field lines (one value) reaches the
/// client with one: hyper's server had refused to write the pair on a bodiless answer,
/// and the client got nothing.
#[test]
fn a_head_answered_with_a_repeated_content_length_reaches_the_client() {
    let resp = answered_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", "HEAD");
    assert_eq!(status(&resp), 200, "{resp}");
    assert_eq!(resp.to_ascii_lowercase().matches("content-length: 5\r\n").count(), 1, "{resp}");
}
