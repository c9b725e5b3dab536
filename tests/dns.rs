//! The DNS firewall, driven over real UDP and TCP on loopback with hickory-proto
//! messages and hickory's resolver.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::{DNSClass, RData, RecordType};
use support::TestGateway;
use support::dns::{query, tcp, tcp_raw, udp, udp_raw, udp_socket};

fn gateway(extra_dns: &str) -> (TestGateway, SocketAddr) {
    let config = format!(
        "[resolver]\nnameservers = [\"127.0.0.1:9\"]\nhosts_file = false\n\n[dns]\nlisten = \"127.0.0.1:0\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [\"127.0.0.1\", \"::1\"]\nttl = 30\nnegative_ttl = 45\n{extra_dns}"
    );
    let gw = TestGateway::start(&config, "");
    let addr = gw.dns_addr();
    (gw, addr)
}

fn ips(m: &Message) -> Vec<String> {
    m.answers
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => a.0.to_string(),
            RData::AAAA(a) => a.0.to_string(),
            other => format!("{other:?}"),
        })
        .collect()
}

fn soa_minimum(m: &Message) -> Option<u32> {
    m.authorities.iter().find_map(|r| match &r.data {
        RData::SOA(soa) => Some(soa.minimum),
        _ => None,
    })
}

#[test]
fn gateway_name_answers_over_udp_and_tcp() {
    let (_gw, dns) = gateway("");
    for send in [udp as fn(SocketAddr, &Message) -> Message, tcp] {
        let r = send(dns, &query("gateway.sandbox.internal.", RecordType::A, None));
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative);
        assert_eq!(ips(&r), vec!["127.0.0.1"]);
        assert_eq!(r.answers[0].ttl, 30);
        let r = send(dns, &query("gateway.sandbox.internal.", RecordType::AAAA, None));
        assert_eq!(ips(&r), vec!["::1"]);
    }
}

#[test]
fn real_resolver_resolves_only_the_gateway() {
    use hickory_resolver::TokioResolver;
    use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
    use hickory_resolver::net::runtime::TokioRuntimeProvider;
    let (_gw, dns) = gateway("");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut udp = ConnectionConfig::udp();
        udp.port = dns.port();
        let ns = NameServerConfig::new(dns.ip(), true, vec![udp]);
        let resolver = TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(vec![ns]),
            TokioRuntimeProvider::default(),
        )
        .build()
        .unwrap();
        let ok = resolver.lookup_ip("gateway.sandbox.internal.").await.unwrap();
        let mut got: Vec<String> = ok.iter().map(|ip| ip.to_string()).collect();
        got.sort();
        assert_eq!(got, vec!["127.0.0.1", "::1"]);
        assert!(resolver.lookup_ip("pypi.org.").await.is_err());
    });
}

#[test]
fn other_types_ancestors_and_blocked_names() {
    let (gw, dns) = gateway("");
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::MX, None));
    assert_eq!((r.metadata.response_code, r.answers.len()), (ResponseCode::NoError, 0));
    assert_eq!(soa_minimum(&r), Some(45), "NODATA carries an SOA");

    for ancestor in ["sandbox.internal.", "internal."] {
        let r = udp(dns, &query(ancestor, RecordType::A, None));
        assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{ancestor}: never NXDOMAIN (RFC 8020)");
        assert!(r.answers.is_empty());
    }

    for blocked in
        ["pypi.org.", "x.gateway.sandbox.internal.", "evil.sandbox.internal.", "exfil-0123abcd.attacker.example."]
    {
        let r = udp(dns, &query(blocked, RecordType::A, None));
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain, "{blocked}");
        assert_eq!(soa_minimum(&r), Some(45), "negative TTL from the SOA minimum");
    }
    let line = gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "dns query blocked");
    assert!(line["client_addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{line}");
}

#[test]
fn block_modes() {
    let (_gw, dns) = gateway("blocked = \"nodata\"\n");
    let r = udp(dns, &query("pypi.org.", RecordType::A, None));
    assert_eq!((r.metadata.response_code, r.answers.len()), (ResponseCode::NoError, 0));
    assert!(soa_minimum(&r).is_some());
    let (_gw, dns) = gateway("blocked = \"refused\"\n");
    let r = udp(dns, &query("pypi.org.", RecordType::A, None));
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
}

#[test]
fn case_is_echoed_and_matched_insensitively() {
    let (_gw, dns) = gateway("");
    let r = udp(dns, &query("GaTeWaY.SaNdBoX.InTeRnAl.", RecordType::A, None));
    assert_eq!(ips(&r), vec!["127.0.0.1"]);
    assert_eq!(r.queries[0].name().to_string(), "GaTeWaY.SaNdBoX.InTeRnAl.");
    assert_eq!(r.answers[0].name.to_string(), "GaTeWaY.SaNdBoX.InTeRnAl.");
}

#[test]
fn refused_notimp_and_any() {
    let (_gw, dns) = gateway("");
    let mut q = query("gateway.sandbox.internal.", RecordType::A, None);
    q.queries[0].set_query_class(DNSClass::CH);
    assert_eq!(udp(dns, &q).metadata.response_code, ResponseCode::Refused);
    let r = tcp(dns, &query("sandbox.internal.", RecordType::AXFR, None));
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    let mut q = query("gateway.sandbox.internal.", RecordType::A, None);
    q.metadata.op_code = OpCode::Status;
    assert_eq!(udp(dns, &q).metadata.response_code, ResponseCode::NotImp);
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::ANY, None));
    assert_eq!(ips(&r), vec!["127.0.0.1"], "minimal ANY answer (RFC 8482)");
}

#[test]
fn edns_handling() {
    let (_gw, dns) = gateway("");
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::A, None));
    assert!(r.edns.is_none(), "no OPT without one in the query");

    let mut e = Edns::new();
    e.set_max_payload(4096);
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::A, Some(e)));
    assert_eq!(r.edns.as_ref().map(|e| e.max_payload()), Some(1232));
    assert_eq!(ips(&r), vec!["127.0.0.1"]);

    let mut e = Edns::new();
    e.set_version(1);
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::A, Some(e)));
    // BADVERS and BADSIG share code 16; the decoder names it BADSIG.
    assert_eq!(u16::from(r.metadata.response_code), 16, "BADVERS");
    assert_eq!(r.edns.as_ref().map(|e| e.version()), Some(0));

    let mut e = Edns::new();
    e.options_mut().insert(EdnsOption::Unknown(65001, vec![1, 2, 3]));
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::A, Some(e)));
    assert_eq!(ips(&r), vec!["127.0.0.1"], "unknown options are ignored");
}

#[test]
fn truncation_then_tcp() {
    let many: Vec<String> = (1..=60).map(|i| format!("\"2001:db8::{i:x}\"")).collect();
    let config = format!(
        "[resolver]\nnameservers = [\"127.0.0.1:9\"]\n\n[dns]\nlisten = \"127.0.0.1:0\"\nhostnames = [\"gateway.sandbox.internal\"]\naddresses = [{}]\n",
        many.join(", ")
    );
    let gw = TestGateway::start(&config, "");
    let dns = gw.dns_addr();
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::AAAA, None));
    assert!(r.metadata.truncation, "60 AAAA records do not fit in 512 bytes");
    let r = tcp(dns, &query("gateway.sandbox.internal.", RecordType::AAAA, None));
    assert!(!r.metadata.truncation);
    assert_eq!(r.answers.len(), 60);
}

fn header(id: u16, qdcount: u16) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[..2].copy_from_slice(&id.to_be_bytes());
    h[2] = 0x01; // RD
    h[4..6].copy_from_slice(&qdcount.to_be_bytes());
    h
}

#[test]
fn malformed_datagrams() {
    let (_gw, dns) = gateway("");
    // Too short to carry a header: deliberately dropped, on both transports.
    assert!(udp_raw(dns, &[1, 2, 3, 4, 5]).is_none());
    assert!(tcp_raw(dns, &[1, 2, 3, 4, 5]).is_none());

    let mut pointer_loop = header(0x1234, 1);
    pointer_loop.extend_from_slice(&[0xC0, 0x0C, 0, 1, 0, 1]);
    // A pointer into the header: the echoed question would point into the answer's.
    let mut into_header = header(0x1235, 1);
    into_header.extend_from_slice(&[0xC0, 0x00, 0, 1, 0, 1]);
    let mut long_name = header(0x2345, 1);
    for _ in 0..5 {
        long_name.push(63);
        long_name.extend_from_slice(&[b'a'; 63]);
    }
    long_name.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut two = query("gateway.sandbox.internal.", RecordType::A, None);
    two.add_query(two.queries[0].clone());
    two.metadata.id = 0x4567;
    let mut none = query("gateway.sandbox.internal.", RecordType::A, None);
    none.queries.clear();
    none.metadata.id = 0x5678;

    // Not shaped like a query: records in the answer section, or more additional
    // records than an OPT and a signature.
    let a = |name: &str| {
        let rdata = RData::A(hickory_proto::rr::rdata::A(std::net::Ipv4Addr::LOCALHOST));
        hickory_proto::rr::Record::from_rdata(hickory_proto::rr::Name::from_ascii(name).unwrap(), 30, rdata)
    };
    let mut with_answer = query("gateway.sandbox.internal.", RecordType::A, None);
    with_answer.answers.push(a("gateway.sandbox.internal."));
    with_answer.metadata.id = 0x6789;
    let mut three_additional = query("gateway.sandbox.internal.", RecordType::A, None);
    three_additional.additionals.extend([a("a.example."), a("b.example."), a("c.example.")]);
    three_additional.metadata.id = 0x789a;

    let cases = [
        (with_answer.to_vec().unwrap(), 0x6789),
        (three_additional.to_vec().unwrap(), 0x789a),
        (pointer_loop, 0x1234u16),
        (into_header, 0x1235),
        (long_name, 0x2345),
        (two.to_vec().unwrap(), 0x4567),
        (none.to_vec().unwrap(), 0x5678),
    ];
    for (bytes, id) in cases {
        for reply in [udp_raw(dns, &bytes), tcp_raw(dns, &bytes)] {
            let reply = reply.expect("malformed queries get an answer");
            assert_eq!(u16::from_be_bytes([reply[0], reply[1]]), id, "id echoed");
            assert!(reply[2] & 0x80 != 0, "a response");
            assert_eq!(reply[3] & 0x0f, 1, "FORMERR");
        }
    }
    // Still serving.
    assert_eq!(ips(&udp(dns, &query("gateway.sandbox.internal.", RecordType::A, None))), vec!["127.0.0.1"]);
}

/// A TCP message of thousands of records whose names point into one long chain of
/// labels is refused from its header, unparsed: parsed, each cost about 600 plain
/// queries of CPU, counted by the per-source limit as one.
#[test]
fn a_message_of_pointer_chains_is_refused_unparsed() {
    let (_gw, dns) = gateway("");
    let mut m = query("gateway.sandbox.internal.", RecordType::A, None).to_vec().unwrap();
    let records: u16 = 2000;
    m[10..12].copy_from_slice(&records.to_be_bytes());
    // The first additional record's name: 120 one-byte labels.
    let chain_at = u16::try_from(m.len()).unwrap();
    for _ in 0..120 {
        m.extend_from_slice(&[1, b'x']);
    }
    m.push(0);
    let a_record = [0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 127, 0, 0, 1]; // A, IN, TTL 30, 127.0.0.1
    m.extend_from_slice(&a_record);
    // Every other one points at the chain.
    for _ in 1..records {
        m.extend_from_slice(&(0xC000 | chain_at).to_be_bytes());
        m.extend_from_slice(&a_record);
    }
    let id = u16::from_be_bytes([m[0], m[1]]);
    let reply = tcp_raw(dns, &m).expect("an answer");
    assert_eq!(u16::from_be_bytes([reply[0], reply[1]]), id, "id echoed");
    assert_eq!(reply[3] & 0x0f, 1, "FORMERR, not an answer: {reply:?}");
    // Still serving over TCP.
    let ok = tcp(dns, &query("gateway.sandbox.internal.", RecordType::A, None));
    assert_eq!(ips(&ok), vec!["127.0.0.1"]);
}

#[test]
fn a_flooding_source_is_limited_while_others_are_answered() {
    let (_gw, dns) = gateway("rate_limit_qps = 20\nrate_limit_burst = 20\n");
    let flooder = udp_socket("127.0.0.2");
    let msg = query("pypi.org.", RecordType::A, None).to_vec().unwrap();
    for _ in 0..200 {
        flooder.send_to(&msg, dns).unwrap();
    }
    flooder.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut answered = 0;
    let mut buf = [0u8; 512];
    while flooder.recv(&mut buf).is_ok() {
        answered += 1;
    }
    assert!((15..=40).contains(&answered), "flooder answered {answered} of 200");
    // Another source is unaffected.
    let r = udp(dns, &query("gateway.sandbox.internal.", RecordType::A, None));
    assert_eq!(ips(&r), vec!["127.0.0.1"]);

    // Garbage spends the rate too: unparseable queries from a third source are
    // answered FORMERR up to its burst, then dropped.
    let garbage = udp_socket("127.0.0.3");
    let mut bad = header(0x0bad, 1);
    bad.extend_from_slice(&[0x3f, b'a', b'a']);
    for _ in 0..200 {
        garbage.send_to(&bad, dns).unwrap();
    }
    garbage.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut answered = 0;
    while garbage.recv(&mut buf).is_ok() {
        answered += 1;
    }
    assert!((15..=40).contains(&answered), "garbage answered {answered} of 200");
}

#[test]
fn tcp_connections_are_capped_and_idle_ones_closed() {
    use std::io::Read;
    let (_gw, dns) = gateway("tcp_max_connections = 2\ntcp_idle_timeout = \"1s\"\n");
    let held: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(dns).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut third = std::net::TcpStream::connect(dns).unwrap();
    third.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(third.read(&mut b).unwrap_or(0), 0, "over the cap: closed at once");
    for mut h in held {
        h.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(h.read(&mut b).unwrap_or(0), 0);
        assert!(started.elapsed() < Duration::from_secs(3), "idle connection closed");
    }
    let r = tcp(dns, &query("gateway.sandbox.internal.", RecordType::A, None));
    assert_eq!(ips(&r), vec!["127.0.0.1"]);
}

/// The idle timer restarts with every message, so a client that keeps talking could
/// hold every TCP slot: one source address holds at most `dns.tcp_max_per_client`.
#[test]
fn one_source_cannot_hold_every_tcp_slot() {
    use std::io::{Read, Write};
    let (_gw, dns) = gateway("tcp_max_connections = 4\ntcp_max_per_client = 2\ntcp_idle_timeout = \"5s\"\n");
    let q = query("gateway.sandbox.internal.", RecordType::A, None).to_vec().unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    let mut held: Vec<_> = (0..4).map(|_| support::raw::connect_from([127, 0, 0, 3], dns).unwrap()).collect();
    let mut answered = 0;
    for s in held.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(&framed);
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).is_ok() {
            answered += 1;
        }
    }
    assert_eq!(answered, 2, "two connections from one source, the rest closed at once");
    // Another source still gets a slot while those two are held.
    let r = tcp(dns, &query("gateway.sandbox.internal.", RecordType::A, None));
    assert_eq!(ips(&r), vec!["127.0.0.1"]);
    drop(held);
}

/// A client that pipelines queries and never reads the answers fills the socket
/// buffers; the gateway's write then waits, and must not wait past the idle timeout
/// with the connection's slot held.
#[test]
fn a_client_that_never_reads_loses_its_tcp_slot() {
    use std::io::{Read, Write};
    let (_gw, dns) = gateway("tcp_max_connections = 1\ntcp_idle_timeout = \"1s\"\nrate_limit_qps = 0\n");
    let q = query("gateway.sandbox.internal.", RecordType::A, None).to_vec().unwrap();
    let mut framed = Vec::new();
    for _ in 0..256 {
        framed.extend_from_slice(&(q.len() as u16).to_be_bytes());
        framed.extend_from_slice(&q);
    }
    // A small receive window, so the answers back up after a few hundred KiB.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&dns.into()).unwrap();
    let mut hog: std::net::TcpStream = sock.into();
    hog.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    // Send until the gateway stops reading (its answers are stuck) or closes.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline && hog.write_all(&framed).is_ok() {}
    // The one slot is free again within a few idle periods: another client is served.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = std::net::TcpStream::connect(dns).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let _ = s.write_all(&framed[..2 + q.len()]);
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the slot stayed held by a client that never reads");
    }
    drop(hog);
}

/// An answer over TCP is not held back because part of the next query arrived with
/// the one it answers: the client is still writing that query (the idle timeout here
/// is 30 s, so a held answer fails the 3 s read).
#[test]
fn a_tcp_answer_goes_out_though_part_of_the_next_query_came_with_its_own() {
    use std::io::{Read, Write};
    let (_gw, dns) = gateway("tcp_idle_timeout = \"30s\"\n");
    let q = query("gateway.sandbox.internal.", RecordType::A, None).to_vec().unwrap();
    for partial in [1, 5] {
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        let next_len = (q.len() as u16).to_be_bytes();
        framed.extend(next_len.iter().chain(&q).take(partial));
        let mut s = std::net::TcpStream::connect(dns).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.write_all(&framed).unwrap();
        let mut len = [0u8; 2];
        s.read_exact(&mut len).unwrap_or_else(|e| panic!("with {partial} byte(s) of the next query: {e}"));
        let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        assert_eq!(Message::from_vec(&body).unwrap().metadata.id, Message::from_vec(&q).unwrap().metadata.id);
    }
}

/// An answer longer than the client's UDP payload size is cut to the header (TC), the
/// question and the OPT record, never in the middle of a record; TCP carries it whole.
#[test]
fn a_long_udp_answer_is_truncated_whole_and_tcp_carries_it() {
    let addresses: Vec<String> = (1..=100).map(|i| format!("\"127.0.1.{i}\"")).collect();
    let config = format!(
        "[resolver]\nnameservers = [\"127.0.0.1:9\"]\nhosts_file = false\n\n[dns]\nlisten = \"127.0.0.1:0\"\n\
         hostnames = [\"gateway.sandbox.internal\"]\naddresses = [{}]\n",
        addresses.join(", ")
    );
    let gw = TestGateway::start(&config, "");
    let dns = gw.dns_addr();
    for payload in [None, Some(700u16)] {
        let edns = payload.map(|p| {
            let mut e = Edns::new();
            e.set_max_payload(p);
            e
        });
        let q = query("gateway.sandbox.internal.", RecordType::A, edns);
        let raw = udp_raw(dns, &q.to_vec().unwrap()).expect("a UDP answer");
        assert!(raw.len() <= usize::from(payload.unwrap_or(512)), "{} bytes", raw.len());
        let r = Message::from_vec(&raw).expect("a well-formed truncated answer");
        assert!(r.metadata.truncation && r.answers.is_empty(), "{r:?}");
        assert_eq!(r.queries.len(), 1);
        assert_eq!(r.edns.as_ref().map(|e| e.max_payload()).is_some(), payload.is_some(), "{r:?}");
        let whole = tcp(dns, &q);
        assert_eq!(whole.answers.len(), 100);
    }
}
