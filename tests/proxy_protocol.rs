//! PROXY protocol v1/v2 on the proxy port: real headers (with the AWS VPC endpoint TLV)
//! from trusted and untrusted peers; the real client address and endpoint in logs;
//! sandboxes bound to endpoints.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use egress_gateway::proxy::proxy_protocol::encode_v2;
use support::raw::{read_response, status};
use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, TestOrigin, basic, standard_policy};

fn config(mode: &str) -> String {
    STANDARD_CONFIG
        .replace("[proxy]\n", &format!("[proxy]\nproxy_protocol = \"{mode}\"\ntrusted_proxies = [\"127.0.0.1/32\"]\n"))
}

/// A connection from `source` (a loopback address) to the gateway.
fn connect_from(source: &str, gw: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&format!("{source}:0").parse::<SocketAddr>().unwrap().into()).unwrap();
    sock.connect(&gw.into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn request(origin: &TestOrigin, user: &str) -> String {
    format!(
        "GET http://origin.test:{}/echo HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        origin.port(),
        basic(user, TOKEN_A)
    )
}

/// True when the gateway closed the connection without answering.
fn closed_silently(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

fn client() -> SocketAddr {
    "198.51.100.7:40000".parse().unwrap()
}

#[test]
fn trusted_headers_carry_the_client_and_endpoint() {
    let origin = TestOrigin::http();
    let gw = TestGateway::start(&config("optional"), &standard_policy());
    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(&encode_v2(client(), gw.addr, Some("vpce-0abc123"))).unwrap();
    s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
    assert_eq!(status(&read_response(&mut s)), 200);
    let rec = gw.access_for(&format!("origin.test:{}", origin.port()));
    assert_eq!(rec["client_addr"], "198.51.100.7:40000");
    assert_eq!(rec["vpce"], "vpce-0abc123");

    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(b"PROXY TCP4 203.0.113.50 127.0.0.1 51000 4002\r\n").unwrap();
    s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
    assert_eq!(status(&read_response(&mut s)), 200);
    gw.wait_for_log(Duration::from_secs(5), |v| v["log"] == "access" && v["client_addr"] == "203.0.113.50:51000");

    // Optional mode: a trusted peer may also connect without a header.
    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
    assert_eq!(status(&read_response(&mut s)), 200);
}

#[test]
fn headers_from_untrusted_peers_and_malformed_headers_close_the_connection() {
    let origin = TestOrigin::http();
    let gw = TestGateway::start(&config("optional"), &standard_policy());
    let mut s = connect_from("127.0.0.2", gw.addr);
    s.write_all(&encode_v2(client(), gw.addr, Some("vpce-0abc123"))).ok();
    s.write_all(request(&origin, "sbx-a").as_bytes()).ok();
    assert!(closed_silently(&mut s), "a header from an untrusted peer is refused");
    let mut s = connect_from("127.0.0.2", gw.addr);
    s.write_all(b"PROXY TCP4 203.0.113.50 127.0.0.1 51000 4002\r\n").ok();
    assert!(closed_silently(&mut s));

    // The untrusted peer without a header is an ordinary client.
    let mut s = connect_from("127.0.0.2", gw.addr);
    s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
    assert_eq!(status(&read_response(&mut s)), 200);

    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(b"PROXY TCP4 not-an-ip 127.0.0.1 1 2\r\n").ok();
    assert!(closed_silently(&mut s), "malformed header");
    let mut bad = encode_v2(client(), gw.addr, None);
    bad[12] = 0x31; // version 3
    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(&bad).ok();
    assert!(closed_silently(&mut s));
    assert_eq!(origin.recorded().len(), 1);
}

#[test]
fn required_mode_closes_connections_without_a_header() {
    let origin = TestOrigin::http();
    let gw = TestGateway::start(&config("required"), &standard_policy());
    for source in ["127.0.0.1", "127.0.0.2"] {
        let mut s = connect_from(source, gw.addr);
        s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
        assert!(closed_silently(&mut s), "{source}");
    }
    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(&encode_v2(client(), gw.addr, None)).unwrap();
    s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
    assert_eq!(status(&read_response(&mut s)), 200);
}

#[test]
fn sandboxes_bound_to_an_endpoint() {
    let origin = TestOrigin::http();
    let policy = standard_policy()
        .replace("[[sandboxes]]\nid = \"sbx-a\"", "[[sandboxes]]\nid = \"sbx-a\"\nvpce = [\"vpce-good\"]");
    let gw = TestGateway::start(&config("optional"), &policy);
    let via = |vpce: Option<&str>| {
        let mut s = connect_from("127.0.0.1", gw.addr);
        if let Some(v) = vpce {
            s.write_all(&encode_v2(client(), gw.addr, Some(v))).unwrap();
        }
        s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
        read_response(&mut s)
    };
    assert_eq!(status(&via(Some("vpce-good"))), 200);
    for other in [Some("vpce-other"), None] {
        let resp = via(other);
        assert_eq!(status(&resp), 407, "{other:?}: {resp}");
        assert!(resp.contains("auth_invalid") && resp.contains("VPC endpoint"), "{resp}");
    }
}

#[test]
fn a_reload_that_rebinds_a_sandbox_to_another_endpoint_closes_its_open_tunnels() {
    let origin = TestOrigin::http();
    let bound = |vpce: &str| {
        standard_policy()
            .replace("[[sandboxes]]\nid = \"sbx-a\"", &format!("[[sandboxes]]\nid = \"sbx-a\"\nvpce = [\"{vpce}\"]"))
    };
    let gw = TestGateway::start(&config("optional"), &bound("vpce-good"));
    let tunnel = |vpce: &str| {
        let mut s = connect_from("127.0.0.1", gw.addr);
        s.write_all(&encode_v2(client(), gw.addr, Some(vpce))).unwrap();
        let req = format!(
            "CONNECT origin.test:{} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
            origin.port(),
            basic("sbx-a", TOKEN_A)
        );
        s.write_all(req.as_bytes()).unwrap();
        assert_eq!(status(&support::raw::read_head(&mut s)), 200);
        s.write_all(b"GET /echo HTTP/1.1\r\nHost: origin.test\r\n\r\n").unwrap();
        assert_eq!(status(&read_response(&mut s)), 200, "the tunnel works");
        s
    };
    let mut old = tunnel("vpce-good");
    // Bound to another endpoint: what is open through the old one closes.
    std::fs::write(gw.dir.path().join("policy/test.toml"), bound("vpce-new")).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "tunnels closed after reload" && v["closed"] == 1);
    let mut buf = [0u8; 16];
    old.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert!(matches!(old.read(&mut buf), Ok(0) | Err(_)), "the tunnel through the old endpoint is closed");
    // One through the new endpoint works, and survives a reload that keeps it.
    let mut new = tunnel("vpce-new");
    std::fs::write(gw.dir.path().join("policy/test.toml"), bound("vpce-new") + "\n# touched\n").unwrap();
    gw.signal("HUP");
    gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded" && v["generation"] == 3);
    new.write_all(b"GET /echo HTTP/1.1\r\nHost: origin.test\r\n\r\n").unwrap();
    assert_eq!(status(&read_response(&mut new)), 200, "a tunnel through the bound endpoint is untouched");
}

#[test]
fn headers_that_arrive_a_byte_at_a_time_are_read() {
    let origin = TestOrigin::http();
    let gw = TestGateway::start(&config("optional"), &standard_policy());
    let v1 = b"PROXY TCP4 203.0.113.51 127.0.0.1 51000 4002\r\n".to_vec();
    for (header, client_addr) in
        [(encode_v2(client(), gw.addr, Some("vpce-slow")), "198.51.100.7:40000"), (v1, "203.0.113.51:51000")]
    {
        let mut s = connect_from("127.0.0.1", gw.addr);
        s.set_nodelay(true).unwrap();
        // The first bytes, which tell a header from none, one at a time with pauses.
        for b in &header[..14] {
            s.write_all(&[*b]).unwrap();
            std::thread::sleep(Duration::from_millis(15));
        }
        s.write_all(&header[14..]).unwrap();
        s.write_all(request(&origin, "sbx-a").as_bytes()).unwrap();
        assert_eq!(status(&read_response(&mut s)), 200, "{client_addr}");
        gw.wait_for_log(Duration::from_secs(5), |v| v["log"] == "access" && v["client_addr"] == client_addr);
    }
    // The start of a header, then the client's end of the connection: nothing more
    // can come, so it is closed at once, not at the (here 30 s) header timeout.
    let config = config("optional").replace("header_read_timeout = \"2s\"", "header_read_timeout = \"30s\"");
    let gw = TestGateway::start(&config, &standard_policy());
    let mut s = connect_from("127.0.0.1", gw.addr);
    s.write_all(b"\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    let r = s.read(&mut buf);
    assert!(
        matches!(&r, Ok(0)) || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "closed before the header timeout: {r:?}"
    );
}
