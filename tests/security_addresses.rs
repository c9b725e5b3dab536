//! Security regressions, attack class: addresses. IP-literal encodings (decimal, hex,
//! octal, short forms), IPv6 embeddings of private addresses, DNS answers that mix
//! private and public addresses (rebinding), and tunnels used to reach a second host.
//! Refusals of real private ranges are proven without I/O in `policy::net` and
//! `tests/properties.rs`; here loopback addresses stand in for them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::raw::{self, status};
use support::{TOKEN_A, basic, curl_via, start_http, start_tls};

#[test]
fn ip_literal_encodings() {
    let (gw, origin, _ca) = start_tls();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let connect = |target: &str| {
        support::raw::request(gw.addr, format!("CONNECT {target} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n"))
    };
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
        // The refused target is echoed as it came, never as a normalised address (but
        // userinfo, where clients put credentials, is redacted).
        let echoed = bad.replace("user@", "[redacted]@");
        assert!(resp.contains(&format!("\"target\":\"{echoed}\"")), "{bad}: {resp}");
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
fn mixed_answers_dial_only_the_vetted_address() {
    // mixed.test resolves to 127.0.0.2 (private for this config) and 127.0.0.1: only the
    // latter may be dialled.
    let (gw, origin, ca) = start_tls();
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_A, &format!("https://mixed.test:{}/echo", origin.port()));
    assert_ne!(out.exit, 0, "certificate does not name mixed.test, but the tunnel must open: {out:?}");
    assert_eq!(out.connect_status, 200, "{out:?}");
    let rec = gw.access_for(&format!("mixed.test:{}", origin.port()));
    assert_eq!(rec["upstream_addr"], format!("127.0.0.1:{}", origin.port()));
}

#[test]
fn tunnels_carry_only_what_was_decided() {
    // CONNECT to an allowed host:port cannot be turned into a second request elsewhere:
    // bytes after the 200 go to that upstream only.
    let (gw, origin) = start_http();
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
