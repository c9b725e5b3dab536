//! Security regressions by attack class, each a real request against a real gateway on
//! loopback. (More classes live beside the features they attack: IP-literal encodings
//! and rebinding in proxy_connect.rs, smuggling and oversized heads in proxy_forward.rs,
//! git path and ref tricks in git_route.rs, DNS floods in dns.rs, token forms in
//! tokens.rs, PROXY header spoofing in proxy_protocol.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::raw::{self, status};
use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, TestOrigin, basic, curl, standard_policy};

fn start() -> (TestGateway, TestOrigin) {
    (TestGateway::start(STANDARD_CONFIG, &standard_policy()), TestOrigin::http())
}

#[test]
fn malformed_heads_are_refused_and_reach_nothing() {
    let (gw, origin) = start();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let cases: Vec<Vec<u8>> = vec![
        // obs-fold (a continuation line) in a header
        format!(
            "GET http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\nX-A: 1\r\n folded\r\n\r\n"
        )
        .into_bytes(),
        // NUL in a header value
        format!("GET http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\nX-A: a\0b\r\n\r\n")
            .into_bytes(),
        // binary garbage instead of a request line
        vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, b'\r', b'\n', b'\r', b'\n'],
        // a request line with spaces in the target
        format!("GET http://origin.test:{port}/a b HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n").into_bytes(),
        // an HTTP/2 preface on an HTTP/1 proxy
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        // a header name with a space before the colon
        format!("GET http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization : {auth}\r\n\r\n").into_bytes(),
    ];
    for req in cases {
        let resp = raw::exchange(gw.addr, &req);
        let code = status(&resp);
        assert!(code == 400 || code == 0 || code == 505, "{:?} -> {resp}", String::from_utf8_lossy(&req));
    }
    assert!(origin.recorded().is_empty(), "nothing reached the origin: {:?}", origin.recorded());
    // Bare LF line endings are tolerated by the HTTP parser, but the request still goes
    // through the full decision path (and here is allowed).
    let resp = raw::request(
        gw.addr,
        format!("GET http://origin.test:{port}/echo HTTP/1.1\nProxy-Authorization: {auth}\n\n").as_bytes(),
    );
    assert!(status(&resp) == 200 || status(&resp) == 400, "{resp}");
}

#[test]
fn redirects_are_passed_back_never_followed() {
    let (gw, origin) = start();
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/redirect", origin.port())]);
    assert_eq!(out.status, 302, "{out:?}");
    assert_eq!(origin.recorded().len(), 1, "the gateway fetched nothing else");
    // Following it is a new request, decided on its own: the metadata address is refused.
    let out =
        curl(&["-L", "-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/redirect", origin.port())]);
    assert_eq!(out.status, 403, "{out:?}");
}

#[test]
fn a_connection_flood_does_not_starve_other_clients() {
    let (gw, origin) = start();
    // 300 connections opened and held (bounded), some sending junk.
    let flood: Vec<_> = (0..300)
        .filter_map(|i| {
            let mut s = std::net::TcpStream::connect(gw.addr).ok()?;
            if i % 3 == 0 {
                let _ = s.write_all(b"\x00\x01\x02garbage");
            }
            Some(s)
        })
        .collect();
    assert!(flood.len() > 200);
    for _ in 0..5 {
        let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/echo", origin.port())]);
        assert_eq!(out.status, 200, "{out:?}");
    }
    drop(flood);
}

#[test]
fn secrets_never_appear_in_error_bodies_or_logs() {
    let (gw, origin) = start();
    let port = origin.port();
    // Denied, malformed and upstream-failure answers.
    let requests = [
        format!("GET http://example.com:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A)),
        format!("GET http://origin.test:1/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A)),
        format!("CONNECT bad host:1 HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A)),
        format!(
            "GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
            basic("sbx-a", "guess-1234")
        ),
    ];
    for r in &requests {
        let resp = raw::exchange(gw.addr, r.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1).as_bytes());
        assert!(!resp.contains(TOKEN_A) && !resp.contains("guess-1234"), "{resp}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let log = gw.log_text();
    assert!(!log.contains(TOKEN_A) && !log.contains("guess-1234"));
    assert!(!log.contains(&basic("sbx-a", TOKEN_A)[6..]), "not even base64-encoded");
}

#[test]
fn tunnels_carry_only_what_was_decided() {
    // CONNECT to an allowed host:port cannot be turned into a second request elsewhere:
    // bytes after the 200 go to that upstream only.
    let (gw, origin) = start();
    let mut s = raw::connect(gw.addr);
    let req = format!(
        "CONNECT origin.test:{} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\nGET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
        origin.port(),
        basic("sbx-a", TOKEN_A)
    );
    s.write_all(req.as_bytes()).unwrap();
    assert_eq!(status(&raw::read_head(&mut s)), 200);
    let mut buf = [0u8; 2048];
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let n = s.read(&mut buf).unwrap_or(0);
    assert!(n > 0);
    let rec = &origin.recorded()[0];
    assert_eq!(rec.uri, "http://example.com/", "the pipelined request went to the decided upstream, as opaque bytes");
}
