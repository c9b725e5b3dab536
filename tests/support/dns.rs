//! A small DNS client over std sockets, using hickory-proto for the messages.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{DNSClass, Name, RecordType};

pub fn query(name: &str, qtype: RecordType, edns: Option<Edns>) -> Message {
    let mut m = Message::query();
    m.metadata.id = rand_id();
    m.metadata.recursion_desired = true;
    let mut q = Query::query(Name::from_ascii(name).unwrap(), qtype);
    q.set_query_class(DNSClass::IN);
    m.add_query(q);
    if let Some(e) = edns {
        m.set_edns(e);
    }
    m
}

fn rand_id() -> u16 {
    use std::time::{SystemTime, UNIX_EPOCH};
    (SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos() & 0xffff) as u16
}

pub fn udp_socket(bind_ip: &str) -> UdpSocket {
    let s = UdpSocket::bind(format!("{bind_ip}:0")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s
}

/// Sends raw bytes over UDP; returns the raw reply, or None on timeout.
pub fn udp_raw(server: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let s = udp_socket("127.0.0.1");
    s.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    s.send_to(bytes, server).unwrap();
    let mut buf = [0u8; 65535];
    s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

pub fn udp(server: SocketAddr, msg: &Message) -> Message {
    let reply = udp_raw(server, &msg.to_vec().unwrap()).expect("udp reply");
    Message::from_vec(&reply).unwrap()
}

pub fn tcp_raw(server: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(server).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    s.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

pub fn tcp(server: SocketAddr, msg: &Message) -> Message {
    let reply = tcp_raw(server, &msg.to_vec().unwrap()).expect("tcp reply");
    Message::from_vec(&reply).unwrap()
}
