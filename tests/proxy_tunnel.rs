//! The CONNECT relay itself, against a raw TCP origin on loopback: bytes pipelined
//! behind the CONNECT head, half-close in both directions, integrity of a large
//! transfer in both directions at once, and the idle timeout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use support::{STANDARD_CONFIG, TOKEN_A, TestGateway, basic, raw, standard_policy};

/// A raw origin: each connection is handed to `serve` on its own thread.
fn origin(serve: fn(TcpStream)) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

/// Echoes until the client half-closes, then says "bye" and closes.
fn echo_then_bye(mut s: TcpStream) {
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
    let _ = s.write_all(b"bye");
}

fn connect_head(target: SocketAddr) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A))
}

/// The standard gateway, with `idle` as the tunnel idle timeout.
fn gateway(idle: &str) -> TestGateway {
    let config = STANDARD_CONFIG.replace("tunnel_idle_timeout = \"30s\"", &format!("tunnel_idle_timeout = \"{idle}\""));
    TestGateway::start(&config, &standard_policy())
}

#[test]
fn bytes_sent_behind_the_connect_head_reach_the_origin_and_half_close_propagates() {
    let gw = gateway("30s");
    let target = origin(echo_then_bye);
    let mut s = raw::connect(gw.addr);
    // One write: the CONNECT head and the first tunnel bytes together.
    s.write_all(format!("{}early-bytes", connect_head(target)).as_bytes()).unwrap();
    let head = raw::read_head(&mut s);
    assert_eq!(raw::status(&head), 200, "{head}");
    let mut got = [0u8; 11];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"early-bytes");
    // Client half-closes: the origin sees EOF and still answers.
    s.shutdown(Shutdown::Write).unwrap();
    let rest = raw::read_all(&mut s);
    assert_eq!(rest, "bye");
    let rec = gw.access_for(&target.to_string());
    assert_eq!(rec["bytes_up"], 11, "{rec}");
    assert_eq!(rec["bytes_down"], 14, "{rec}");
    assert_eq!(rec["status"], 200, "{rec}");
}

/// A head in two writes is not the fast path's: hyper parses it from the bytes the fast
/// path already read and the rest of the socket, and the tunnel relays the bytes behind
/// it, then the socket itself, with every byte counted once.
#[test]
fn a_head_in_two_writes_is_served_by_hyper_and_tunnels_the_same() {
    let gw = gateway("30s");
    let target = origin(echo_then_bye);
    let mut s = raw::connect(gw.addr);
    let head = connect_head(target);
    s.write_all(&head.as_bytes()[..20]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.write_all(format!("{}early", &head[20..]).as_bytes()).unwrap();
    let answer = raw::read_head(&mut s);
    assert_eq!(raw::status(&answer), 200, "{answer}");
    s.write_all(b"-later").unwrap();
    let mut got = [0u8; 11];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"early-later");
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(raw::read_all(&mut s), "bye");
    let rec = gw.access_for(&target.to_string());
    assert_eq!(rec["bytes_up"], 11, "{rec}");
    assert_eq!(rec["bytes_down"], 14, "{rec}");
}

#[test]
fn large_transfers_in_both_directions_arrive_intact() {
    let gw = gateway("30s");
    let target = origin(echo_then_bye);
    let mut s = raw::connect(gw.addr);
    s.write_all(connect_head(target).as_bytes()).unwrap();
    assert_eq!(raw::status(&raw::read_head(&mut s)), 200);

    let mut data = vec![0u8; 24 * 1024 * 1024 + 7];
    let mut x: u32 = 0x9E37_79B9;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let want = Sha256::digest(&data);
    let mut writer = s.try_clone().unwrap();
    // Write and read at once so neither side's buffers fill up and stall.
    let sender = std::thread::spawn(move || {
        writer.write_all(&data).unwrap();
        writer.shutdown(Shutdown::Write).unwrap();
    });
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    sender.join().unwrap();
    assert_eq!(back.len(), 24 * 1024 * 1024 + 7 + 3);
    assert_eq!(&back[back.len() - 3..], b"bye");
    assert_eq!(Sha256::digest(&back[..back.len() - 3]), want, "bytes changed in the tunnel");
}

#[test]
fn idle_tunnels_are_closed_and_logged() {
    let gw = gateway("1s");
    let target = origin(echo_then_bye);
    let mut s = raw::connect(gw.addr);
    s.write_all(connect_head(target).as_bytes()).unwrap();
    assert_eq!(raw::status(&raw::read_head(&mut s)), 200);
    s.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    s.read_exact(&mut one).unwrap();
    let t = Instant::now();
    // Nothing more is sent: the gateway closes the tunnel after about a second.
    let rest = raw::read_all(&mut s);
    assert_eq!(rest, "", "nothing after the close");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(8), "closed after {waited:?}");
    let rec = gw.access_for(&target.to_string());
    assert_eq!((rec["bytes_up"].as_u64(), rec["bytes_down"].as_u64()), (Some(1), Some(1)), "{rec}");
}

#[test]
fn open_tunnels_count_against_the_connection_limit() {
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nmax_connections = 2\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let target = origin(echo_then_bye);
    let open = || {
        let mut s = raw::connect(gw.addr);
        s.write_all(connect_head(target).as_bytes()).unwrap();
        let head = raw::read_head(&mut s);
        (s, head)
    };
    let (first, h1) = open();
    let (_second, h2) = open();
    assert_eq!((raw::status(&h1), raw::status(&h2)), (200, 200));
    // Both slots are held by tunnels, which hyper no longer serves.
    let (_, h3) = open();
    assert_eq!(raw::status(&h3), 503, "{h3}");
    // Closing a tunnel frees its slot.
    first.shutdown(Shutdown::Both).unwrap();
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_s, h) = open();
        if raw::status(&h) == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slot not freed: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
