//! Security regressions, attack class: HTTP parsing and connection abuse. Malformed and
//! binary heads, obs-fold, request smuggling (CL+TE), Host/URI mismatch, pipelining,
//! oversized heads, slow clients, connection floods, redirects.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::raw::{self, read_response, status};
use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, TestOrigin, basic, curl, standard_policy, start_http};

#[test]
fn malformed_heads_are_refused_and_reach_nothing() {
    let (gw, origin) = start_http();
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
fn host_header_cannot_redirect_the_request() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let req = format!(
        "GET http://origin.test:{port}/echo HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: {}\r\n\r\n",
        basic("sbx-a", TOKEN_A)
    );
    let resp = raw::request(gw.addr, req.as_bytes());
    assert_eq!(status(&resp), 200, "{resp}");
    let rec = &origin.recorded()[0];
    assert!(rec.headers.contains(&("host".into(), format!("origin.test:{port}"))), "{rec:?}");
}

#[test]
fn cl_te_smuggling_does_not_reach_the_origin() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    // Transfer-Encoding wins over Content-Length; the "body" after the terminating chunk
    // is a second request that must never be processed (the connection is closed).
    let smuggled = format!("GET http://origin.test:{port}/smuggled HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    let req = format!(
        "POST http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        5 + smuggled.len()
    );
    let mut s = raw::connect(gw.addr);
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let all = raw::read_all(&mut s);
    assert_eq!(all.matches("HTTP/1.1 ").count(), 1, "exactly one response: {all}");
    assert!(origin.recorded().iter().all(|r| !r.uri.contains("smuggled")), "{:?}", origin.recorded());

    // Conflicting Content-Length values are rejected outright.
    let req = format!(
        "POST http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"
    );
    let resp = raw::exchange(gw.addr, req.as_bytes());
    assert_eq!(status(&resp), 400, "{resp}");
    assert_eq!(origin.recorded().len(), 1);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let one =
        |p: &str| format!("GET http://origin.test:{port}/echo?{p} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
    let mut s = raw::connect(gw.addr);
    s.write_all(format!("{}{}{}", one("n=1"), one("n=2"), one("n=3")).as_bytes()).unwrap();
    for n in 1..=3 {
        let resp = read_response(&mut s);
        assert_eq!(status(&resp), 200, "{resp}");
        assert!(resp.contains(&format!("/echo?n={n}")), "response {n} out of order: {resp}");
    }
}

#[test]
fn oversized_heads_get_431_and_do_not_disturb_others() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let big = format!(
        "GET http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let resp = raw::exchange(gw.addr, big.as_bytes());
    assert_eq!(status(&resp), 431, "{}", &resp[..resp.len().min(200)]);

    let mut many = format!("GET http://origin.test:{port}/echo HTTP/1.1\r\nProxy-Authorization: {auth}\r\n");
    for i in 0..2000 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let resp = raw::exchange(gw.addr, many.as_bytes());
    assert_eq!(status(&resp), 431, "{}", &resp[..resp.len().min(200)]);

    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{port}/echo")]);
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(origin.recorded().len(), 1);

    // The parser's own answers are in the access log, with a reason.
    gw.wait_for_log(Duration::from_secs(5), |v| v["kind"] == "forward");
    let refused: Vec<_> = gw.wait_for_access(2, |v| v["kind"] == "unparsed");
    assert_eq!(refused.len(), 2, "{refused:?}");
    for v in &refused {
        assert_eq!(v["reason"], "request_too_large", "{v}");
        assert_eq!(v["status"], 431, "{v}");
        assert_eq!(v["decision"], "deny", "{v}");
        assert!(v["client_addr"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "{v}");
        assert!(v.get("method").is_none() && v.get("target").is_none() && v.get("sandbox").is_none(), "{v}");
    }
}

/// A head over `proxy.max_header_bytes` (but within twice it, where hyper's bare 431
/// takes over) is refused with the reason and the limit it broke, for a real client as
/// for a raw one, and for CONNECT as for absolute form.
#[test]
fn heads_over_the_limits_are_refused_with_the_limit_they_broke() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let big = "a".repeat(40 * 1024);
    let out = curl(&[
        "-x",
        &gw.proxy_url("sbx-a", TOKEN_A),
        "-H",
        &format!("X-Big: {big}"),
        &format!("http://origin.test:{port}/echo"),
    ]);
    assert_eq!(out.status, 431, "{out:?}");
    assert!(out.body.contains("request_too_large") && out.body.contains("(proxy.max_header_bytes)"), "{}", out.body);

    let connect = format!("CONNECT origin.test:{port} HTTP/1.1\r\nProxy-Authorization: {auth}\r\nX-Big: {big}\r\n\r\n");
    let resp = raw::exchange(gw.addr, connect.as_bytes());
    assert_eq!(status(&resp), 431, "{}", &resp[..resp.len().min(300)]);
    assert!(resp.to_ascii_lowercase().contains("x-egress-deny-reason: request_too_large"), "{resp}");
    assert!(resp.to_ascii_lowercase().contains("connection: close"), "{resp}");

    // Within the limits, the same client goes through; nothing refused reached the origin.
    let out = curl(&[
        "-x",
        &gw.proxy_url("sbx-a", TOKEN_A),
        "-H",
        &format!("X-Big: {}", &big[..20 * 1024]),
        &format!("http://origin.test:{port}/echo"),
    ]);
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(origin.recorded().len(), 1, "{:?}", origin.recorded());
    let refused = gw.wait_for_access(2, |v| v["reason"] == "request_too_large");
    assert_eq!(refused.len(), 2, "{refused:?}");
    for v in &refused {
        assert_eq!((&v["status"], &v["decision"]), (&431.into(), &"deny".into()), "{v}");
        assert!(v["kind"] == "forward" || (v["kind"] == "connect" && v["method"] == "CONNECT"), "{v}");
        assert!(v["target"].as_str().is_some_and(|t| t.contains("origin.test")), "{v}");
    }
}

#[test]
fn parser_refusals_are_logged_with_a_reason() {
    // A head limit above 65,534 bytes, so that a long URI is refused as a URI (414).
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nmax_header_bytes = 131072\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let origin = TestOrigin::http();
    let port = origin.port();
    let auth = basic("sbx-a", TOKEN_A);
    let garbage = [0x16, 0x03, 0x01, 0x02, 0x00, b'\r', b'\n', b'\r', b'\n'];
    assert_eq!(status(&raw::exchange(gw.addr, &garbage)), 400);
    let long_uri =
        format!("GET http://origin.test:{port}/{} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n", "u".repeat(70_000));
    assert_eq!(status(&raw::exchange(gw.addr, long_uri.as_bytes())), 414);
    let v = gw.wait_for_log(Duration::from_secs(5), |v| v["kind"] == "unparsed" && v["status"] == 414);
    assert_eq!(v["reason"], "request_too_large", "{v}");
    let v = gw.wait_for_log(Duration::from_secs(5), |v| v["kind"] == "unparsed" && v["status"] == 400);
    assert_eq!(v["reason"], "bad_request", "{v}");
    assert!(origin.recorded().is_empty());
    let text = gw.log_text();
    assert!(!text.contains(TOKEN_A), "a token reached the log");
}

#[test]
fn slow_clients_are_cut_off_while_others_are_served() {
    let (gw, origin) = start_http();
    let port = origin.port();
    // 50 clients that send half a request head and stall.
    let mut slow: Vec<_> = (0..50)
        .map(|_| {
            let mut s = raw::connect(gw.addr);
            s.write_all(b"GET http://origin.test/ HTTP/1.1\r\nX-Slow: ").unwrap();
            s
        })
        .collect();
    for _ in 0..5 {
        let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{port}/echo")]);
        assert_eq!(out.status, 200, "{out:?}");
    }
    // header_read_timeout is 2 s in the test config: every stalled connection is closed.
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        let mut buf = [0u8; 1024];
        let started = std::time::Instant::now();
        let r = s.read(&mut buf);
        assert!(started.elapsed() < Duration::from_secs(6), "stalled connection still open");
        // Closed (0), answered with 408, or reset: anything but an open connection.
        if let Ok(n) = r {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
        }
    }
}

#[test]
fn a_connection_flood_does_not_starve_other_clients() {
    let (gw, origin) = start_http();
    // 300 connections opened and held (bounded), some sending junk, from another
    // address than the client's.
    let flood: Vec<_> = (0..300)
        .filter_map(|i| {
            let mut s = raw::connect_from([127, 0, 0, 5], gw.addr).ok()?;
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
fn redirects_are_passed_back_never_followed() {
    let (gw, origin) = start_http();
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/redirect", origin.port())]);
    assert_eq!(out.status, 302, "{out:?}");
    assert_eq!(origin.recorded().len(), 1, "the gateway fetched nothing else");
    // Following it is a new request, decided on its own: the metadata address is refused.
    let out =
        curl(&["-L", "-x", &gw.proxy_url("sbx-a", TOKEN_A), &format!("http://origin.test:{}/redirect", origin.port())]);
    assert_eq!(out.status, 403, "{out:?}");
}

/// Idle sockets from one address cannot take all of `proxy.max_connections`: an address
/// holds at most its share of connections that have not authenticated, and failed
/// authentications from one address are rated (`429` with `Retry-After`), while another
/// sandbox is served throughout.
#[test]
fn one_address_cannot_starve_others_before_authenticating() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG.replace(
        "header_read_timeout = \"2s\"",
        "header_read_timeout = \"20s\"\nmax_connections = 32\nauth_failures_per_second = 5",
    );
    let gw = TestGateway::start(&config, &standard_policy());
    let url = format!("http://origin.test:{}/echo", origin.port());
    // 32 idle sockets from 127.0.0.3: a quarter of max_connections (8) is its share.
    let mut idle: Vec<_> = (0..32).map(|_| raw::connect_from([127, 0, 0, 3], gw.addr).unwrap()).collect();
    // Which 24 are refused depends on the order the proxy threads admit them in: read
    // each until it answers, or until it has stayed silent (admitted and idle) a while.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut answers: Vec<String> = Vec::new();
    loop {
        answers = idle
            .iter_mut()
            .map(|s| {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let mut buf = vec![0u8; 4096];
                match s.read(&mut buf) {
                    Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
                    Err(_) => String::new(),
                }
            })
            .zip(answers.iter().cloned().chain(std::iter::repeat(String::new())))
            .map(|(new, old)| if old.is_empty() { new } else { old })
            .collect();
        if answers.iter().filter(|a| !a.is_empty()).count() >= 24 || std::time::Instant::now() > deadline {
            break;
        }
    }
    let refused: Vec<&String> = answers.iter().filter(|a| !a.is_empty()).collect();
    assert_eq!(refused.len(), 24, "all but 8 refused: {answers:?}");
    for r in refused {
        assert_eq!(status(r), 429, "{r}");
        assert!(r.contains("limit_exceeded") && r.to_ascii_lowercase().contains("retry-after: 1"), "{r}");
    }
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &url]);
    assert_eq!(out.status, 200, "another address is served: {out:?}");

    // Wrong tokens from 127.0.0.4: five are checked (407), then 429 without a check.
    let attempt = |token: &str| {
        let mut s = raw::connect_from([127, 0, 0, 4], gw.addr).unwrap();
        let req = format!(
            "GET {url} HTTP/1.1\r\nProxy-Authorization: {}\r\nConnection: close\r\n\r\n",
            basic("sbx-a", token)
        );
        s.write_all(req.as_bytes()).unwrap();
        raw::read_all(&mut s)
    };
    // A sandbox already in on a kept connection from the same address (one NAT).
    let mut kept = raw::connect_from([127, 0, 0, 4], gw.addr).unwrap();
    let kept_req = format!("GET {url} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A));
    let mut kept_get = || {
        kept.write_all(kept_req.as_bytes()).unwrap();
        status(&raw::read_response(&mut kept))
    };
    assert_eq!(kept_get(), 200);
    let statuses: Vec<u16> = (0..8).map(|i| status(&attempt(&format!("wrong-{i}")))).collect();
    assert_eq!(&statuses[..5], &[407; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(kept_get(), 200, "a connection that proved its credentials is not shut out by another's failures");
    // Nor is a new connection that presents a value some request proved lately; a
    // guess still is.
    let served = attempt(TOKEN_A);
    assert_eq!(status(&served), 200, "a proved value on a new connection: {served}");
    assert_eq!(status(&attempt("wrong-9")), 429);
    // Another spelling of the same credentials (the scheme's case, spaces) is the same
    // proved value: spellings cannot crowd out the ones proved.
    let respelt = basic("sbx-a", TOKEN_A).replacen("Basic ", "bAsIc    ", 1);
    let mut s = raw::connect_from([127, 0, 0, 4], gw.addr).unwrap();
    s.write_all(
        format!("GET {url} HTTP/1.1\r\nProxy-Authorization: {respelt}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(status(&raw::read_all(&mut s)), 200);
    let out = curl(&["-x", &gw.proxy_url("sbx-a", TOKEN_A), &url]);
    assert_eq!(out.status, 200, "other addresses keep their budget: {out:?}");
    drop(idle);
}

/// Authorized connections count for their sandbox: one sandbox holding its share of
/// keep-alive connections gets `429` for more, and another sandbox is served.
#[test]
fn one_sandbox_cannot_hold_every_connection() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG
        .replace("header_read_timeout = \"2s\"", "header_read_timeout = \"20s\"\nsandbox_max_connections = 4");
    let gw = TestGateway::start(&config, &standard_policy());
    let get = |s: &mut std::net::TcpStream, user: &str, token: &str, host: &str| {
        let req = format!(
            "GET http://{host}:{}/echo HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: {}\r\n\r\n",
            origin.port(),
            basic(user, token)
        );
        s.write_all(req.as_bytes()).unwrap();
        read_response(s)
    };
    let mut held: Vec<std::net::TcpStream> = Vec::new();
    for i in 0..4 {
        let mut s = raw::connect(gw.addr);
        assert_eq!(status(&get(&mut s, "sbx-a", TOKEN_A, "origin.test")), 200, "connection {i}");
        held.push(s);
    }
    // The same connections keep serving; a fifth is refused.
    assert_eq!(status(&get(&mut held[0], "sbx-a", TOKEN_A, "origin.test")), 200);
    let mut fifth = raw::connect(gw.addr);
    let resp = get(&mut fifth, "sbx-a", TOKEN_A, "origin.test");
    assert_eq!(status(&resp), 429, "{resp}");
    assert!(resp.contains("sandbox_max_connections"), "{resp}");
    let mut other = raw::connect(gw.addr);
    assert_eq!(status(&get(&mut other, "sbx-b", support::TOKEN_B, "b-only.test")), 200, "another sandbox is served");
    // A closed connection frees its place.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = raw::connect(gw.addr);
        if status(&get(&mut s, "sbx-a", TOKEN_A, "origin.test")) == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the place of a closed connection is never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A tunnel is a connection its sandbox holds: open CONNECT tunnels count against
/// `proxy.sandbox_max_connections` for as long as they live, whether the CONNECT was
/// answered by the fast path (one write) or by hyper (a head in two writes).
#[test]
fn open_tunnels_count_for_their_sandbox() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG
        .replace("header_read_timeout = \"2s\"", "header_read_timeout = \"2s\"\nsandbox_max_connections = 2");
    let gw = TestGateway::start(&config, &standard_policy());
    let req = format!(
        "CONNECT origin.test:{} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        origin.port(),
        basic("sbx-a", TOKEN_A)
    );
    let open = |split: bool| {
        let mut s = raw::connect(gw.addr);
        if split {
            s.write_all(&req.as_bytes()[..12]).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(&req.as_bytes()[12..]).unwrap();
        } else {
            s.write_all(req.as_bytes()).unwrap();
        }
        let head = read_response(&mut s);
        (s, head)
    };
    // A tunnel, once the places of tunnels closed earlier are free again (the gateway
    // notices a close asynchronously).
    let open_allowed = |split: bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (s, head) = open(split);
            if status(&head) == 200 {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "closed tunnels never freed their places: {head}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    for split in [false, true] {
        let held = [open_allowed(split), open_allowed(split)];
        let (_third, head) = open(split);
        assert_eq!(status(&head), 429, "split {split}: {head}");
        assert!(head.contains("sandbox_max_connections"), "{head}");
        drop(held);
    }
    // And the places come back.
    let _again = [open_allowed(false), open_allowed(true)];
}
