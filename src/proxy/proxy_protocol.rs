//! PROXY protocol v1 and v2 (the header a load balancer such as an AWS NLB prepends
//! with the real client address). v2 is parsed by the `ppp` crate (faster than the
//! hand-written parser it replaced, `benches/handwritten.rs`); the one-line v1 text
//! format, and taking a header off a socket with a deadline ([`sniff`],
//! [`read_header`]), are ours. The AWS VPC endpoint id (TLV 0xEA, subtype 0x01) is
//! extracted and checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
const V1_PREFIX: &[u8] = b"PROXY ";
/// Longest v1 line, CRLF included (the spec's limit).
const V1_MAX: usize = 107;
/// Largest v2 payload accepted (addresses + TLVs); NLB headers are far smaller.
const V2_MAX_PAYLOAD: usize = 4096;
const TLV_AWS: u8 = 0xEA;
const AWS_VPCE_ID: u8 = 0x01;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// The original client, when the header carries one (not for LOCAL/UNKNOWN).
    pub source: Option<SocketAddr>,
    pub destination: Option<SocketAddr>,
    /// AWS PrivateLink: the VPC endpoint the connection came through.
    pub vpce: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("no PROXY protocol header")]
    Missing,
    #[error("malformed PROXY protocol v1 header")]
    BadV1,
    #[error("malformed PROXY protocol v2 header")]
    BadV2,
    #[error("incomplete PROXY protocol header")]
    Incomplete,
}

/// What the first bytes of a connection say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detect {
    V1,
    V2,
    /// Not a PROXY header.
    None,
    /// Too few bytes yet to tell.
    NeedMore,
}

pub fn detect(buf: &[u8]) -> Detect {
    let check = |sig: &[u8]| {
        let n = buf.len().min(sig.len());
        if buf[..n] != sig[..n] {
            Some(false)
        } else if n == sig.len() {
            Some(true)
        } else {
            None
        }
    };
    match (check(&V2_SIGNATURE), check(V1_PREFIX)) {
        (Some(true), _) => Detect::V2,
        (_, Some(true)) => Detect::V1,
        (Some(false), Some(false)) => Detect::None,
        _ => Detect::NeedMore,
    }
}

/// Parses a v1 line (with its CRLF).
pub fn parse_v1(line: &[u8]) -> Result<Header, ProxyHeaderError> {
    let text = std::str::from_utf8(line).map_err(|_| ProxyHeaderError::BadV1)?;
    let text = text.strip_suffix("\r\n").ok_or(ProxyHeaderError::BadV1)?;
    let mut parts = text.split(' ');
    if parts.next() != Some("PROXY") {
        return Err(ProxyHeaderError::BadV1);
    }
    let proto = parts.next().ok_or(ProxyHeaderError::BadV1)?;
    if proto == "UNKNOWN" {
        return Ok(Header::default());
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields.as_slice() else { return Err(ProxyHeaderError::BadV1) };
    let ip = |s: &str| -> Result<IpAddr, ProxyHeaderError> {
        match proto {
            "TCP4" => s.parse::<Ipv4Addr>().map(IpAddr::V4).map_err(|_| ProxyHeaderError::BadV1),
            "TCP6" => s.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| ProxyHeaderError::BadV1),
            _ => Err(ProxyHeaderError::BadV1),
        }
    };
    let port = |s: &str| -> Result<u16, ProxyHeaderError> {
        if s.is_empty() || s.len() > 5 || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(ProxyHeaderError::BadV1);
        }
        s.parse().map_err(|_| ProxyHeaderError::BadV1)
    };
    Ok(Header {
        source: Some(SocketAddr::new(ip(src)?, port(sport)?)),
        destination: Some(SocketAddr::new(ip(dst)?, port(dport)?)),
        vpce: None,
    })
}

/// Parses a complete v2 header (signature, 4 fixed bytes, payload) with the `ppp`
/// crate. Returns the header and the number of bytes it occupied. Only TCP over IPv4
/// or IPv6 carries a client address; LOCAL, UNSPEC and UNIX carry none.
pub fn parse_v2(buf: &[u8]) -> Result<(Header, usize), ProxyHeaderError> {
    use ppp::v2::{Addresses, Command, Protocol};
    if buf.len() < 16 {
        return Err(ProxyHeaderError::Incomplete);
    }
    if buf[..12] != V2_SIGNATURE {
        return Err(ProxyHeaderError::BadV2);
    }
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > V2_MAX_PAYLOAD {
        return Err(ProxyHeaderError::BadV2);
    }
    let total = 16 + len;
    let whole = buf.get(..total).ok_or(ProxyHeaderError::Incomplete)?;
    let parsed = ppp::v2::Header::try_from(whole).map_err(|_| ProxyHeaderError::BadV2)?;
    if !checksum_holds(whole) {
        return Err(ProxyHeaderError::BadV2);
    }
    let mut header = match (parsed.command, parsed.protocol, parsed.addresses) {
        // LOCAL: the proxy's own connection (health checks); addresses are ignored.
        (Command::Local, _, _) => return Ok((Header::default(), total)),
        (Command::Proxy, Protocol::Stream, Addresses::IPv4(a)) => Header {
            source: Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)),
            destination: Some(SocketAddr::new(IpAddr::V4(a.destination_address), a.destination_port)),
            vpce: None,
        },
        (Command::Proxy, Protocol::Stream, Addresses::IPv6(a)) => Header {
            source: Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port)),
            destination: Some(SocketAddr::new(IpAddr::V6(a.destination_address), a.destination_port)),
            vpce: None,
        },
        (Command::Proxy, _, Addresses::Unspecified | Addresses::Unix(_)) => Header::default(),
        _ => return Err(ProxyHeaderError::BadV2),
    };
    for tlv in parsed.tlvs() {
        let tlv = tlv.map_err(|_| ProxyHeaderError::BadV2)?;
        if tlv.kind == TLV_AWS && tlv.value.first() == Some(&AWS_VPCE_ID) {
            let id = std::str::from_utf8(&tlv.value[1..]).map_err(|_| ProxyHeaderError::BadV2)?;
            if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(ProxyHeaderError::BadV2);
            }
            // Two ids would leave the binding to whichever came last: refused.
            if header.vpce.replace(id.to_string()).is_some() {
                return Err(ProxyHeaderError::BadV2);
            }
        }
    }
    Ok((header, total))
}

/// The CRC32c TLV (type 0x03), when the header carries one: its value must be the
/// CRC32c of the whole header with the value's own four bytes zeroed (the PROXY
/// protocol specification, 2.2.5: a receiver that checks it drops a header that
/// fails). A header without one holds.
fn checksum_holds(whole: &[u8]) -> bool {
    const TLV_CRC32C: u8 = 0x03;
    let addresses = match whole[13] >> 4 {
        1 => 12,
        2 => 36,
        3 => 216,
        _ => 0,
    };
    let mut at = 16 + addresses;
    while let Some(&[kind, hi, lo]) = whole.get(at..at + 3) {
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        let value = at + 3;
        if kind == TLV_CRC32C {
            let Some(sent) = whole.get(value..value + 4).filter(|_| len == 4) else { return false };
            let sent = u32::from_be_bytes([sent[0], sent[1], sent[2], sent[3]]);
            let mut zeroed = whole.to_vec();
            zeroed[value..value + 4].fill(0);
            return crc32c(&zeroed) == sent;
        }
        at = value + len;
    }
    true
}

/// CRC-32C (Castagnoli), bit by bit: a header is at most a few hundred bytes.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

/// Looks at the first bytes of `stream` without consuming them, waiting up to
/// `timeout` for enough of them to tell whether a PROXY header is there.
pub async fn sniff(stream: &TcpStream, timeout: Duration) -> Result<Detect, ProxyHeaderError> {
    let peek = async {
        use nix::sys::socket::{MsgFlags, recv};
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 12];
        let mut seen = 0;
        loop {
            let ready = stream.ready(tokio::io::Interest::READABLE).await.map_err(|_| ProxyHeaderError::Incomplete)?;
            // The client closed its side: what is buffered is all there will be.
            let ended = ready.is_read_closed();
            // Peeking leaves the bytes buffered, so the socket stays readable: when no
            // byte came since the last look, say "would block", which makes the next
            // wait last until more arrive (no polling while a client trickles).
            let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
                let n = recv(stream.as_raw_fd(), &mut buf, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT)?;
                if n > 0 && n == seen {
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            let n = match peeked {
                Ok(0) => return Err(ProxyHeaderError::Incomplete),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !ended => continue,
                Err(_) => return Err(ProxyHeaderError::Incomplete),
            };
            seen = n;
            match detect(&buf[..n]) {
                Detect::NeedMore if ended => return Err(ProxyHeaderError::Incomplete),
                Detect::NeedMore => {}
                d => return Ok(d),
            }
        }
    };
    tokio::time::timeout(timeout, peek).await.map_err(|_| ProxyHeaderError::Incomplete)?
}

/// Reads and parses the header `sniff` detected, consuming exactly its bytes.
pub async fn read_header(stream: &mut TcpStream, kind: Detect, timeout: Duration) -> Result<Header, ProxyHeaderError> {
    let read = async {
        match kind {
            Detect::V2 => {
                let mut fixed = [0u8; 16];
                stream.read_exact(&mut fixed).await.map_err(|_| ProxyHeaderError::Incomplete)?;
                let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
                if len > V2_MAX_PAYLOAD {
                    return Err(ProxyHeaderError::BadV2);
                }
                let mut all = fixed.to_vec();
                all.resize(16 + len, 0);
                stream.read_exact(&mut all[16..]).await.map_err(|_| ProxyHeaderError::Incomplete)?;
                parse_v2(&all).map(|(h, _)| h)
            }
            Detect::V1 => {
                // Byte by byte up to CRLF: the line is short and must not over-read.
                let mut line = Vec::with_capacity(V1_MAX);
                while !line.ends_with(b"\r\n") {
                    if line.len() >= V1_MAX {
                        return Err(ProxyHeaderError::BadV1);
                    }
                    line.push(stream.read_u8().await.map_err(|_| ProxyHeaderError::Incomplete)?);
                }
                parse_v1(&line)
            }
            _ => Err(ProxyHeaderError::Missing),
        }
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| ProxyHeaderError::Incomplete)?
}

/// Builds a v2 header (for tests and tools): PROXY command, TCP over the family of
/// `src`, with an optional AWS VPC endpoint TLV.
pub fn encode_v2(src: SocketAddr, dst: SocketAddr, vpce: Option<&str>) -> Vec<u8> {
    let mut payload = Vec::new();
    let family = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            payload.extend_from_slice(&s.octets());
            payload.extend_from_slice(&d.octets());
            0x11
        }
        (s, d) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            payload.extend_from_slice(&v6(s).octets());
            payload.extend_from_slice(&v6(d).octets());
            0x21
        }
    };
    payload.extend_from_slice(&src.port().to_be_bytes());
    payload.extend_from_slice(&dst.port().to_be_bytes());
    if let Some(id) = vpce {
        payload.push(TLV_AWS);
        payload.extend_from_slice(&u16::try_from(id.len() + 1).unwrap_or(0).to_be_bytes());
        payload.push(AWS_VPCE_ID);
        payload.extend_from_slice(id.as_bytes());
    }
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x21);
    out.push(family);
    out.extend_from_slice(&u16::try_from(payload.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1() {
        let h = parse_v1(b"PROXY TCP4 203.0.113.9 10.0.0.2 51234 4002\r\n").unwrap();
        assert_eq!(h.source, Some("203.0.113.9:51234".parse().unwrap()));
        let h = parse_v1(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 4002\r\n").unwrap();
        assert_eq!(h.source, Some("[2001:db8::1]:1".parse().unwrap()));
        assert_eq!(parse_v1(b"PROXY UNKNOWN\r\n").unwrap(), Header::default());
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"[..],
            b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 70000\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        ] {
            assert!(parse_v1(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn v2_round_trip_with_vpce() {
        let src: SocketAddr = "198.51.100.7:40000".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:4002".parse().unwrap();
        let bytes = encode_v2(src, dst, Some("vpce-0123456789abcdef0"));
        assert_eq!(detect(&bytes), Detect::V2);
        let (h, used) = parse_v2(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(h.source, Some(src));
        assert_eq!(h.vpce.as_deref(), Some("vpce-0123456789abcdef0"));
        let v6: SocketAddr = "[2001:db8::7]:1".parse().unwrap();
        let (h, _) = parse_v2(&encode_v2(v6, "[2001:db8::2]:4002".parse().unwrap(), None)).unwrap();
        assert_eq!(h.source, Some(v6));
        assert_eq!(parse_v2(&bytes[..20]), Err(ProxyHeaderError::Incomplete));
        let mut bad_tlv = bytes.clone();
        let last = bad_tlv.len() - 1;
        bad_tlv[last] = b'!';
        assert_eq!(parse_v2(&bad_tlv), Err(ProxyHeaderError::BadV2));
        let mut truncated_tlv = encode_v2(src, dst, None);
        truncated_tlv[15] += 2;
        truncated_tlv.extend_from_slice(&[0xEA, 0x00]);
        assert_eq!(parse_v2(&truncated_tlv), Err(ProxyHeaderError::BadV2));
    }

    /// A CRC32c TLV that holds is taken; one that does not refuses the header.
    #[test]
    fn v2_crc32c_is_checked_when_present() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283, "the standard check value");
        let src: SocketAddr = "203.0.113.7:40000".parse().unwrap();
        let dst: SocketAddr = "10.0.0.5:4002".parse().unwrap();
        let mut bytes = encode_v2(src, dst, Some("vpce-0123"));
        bytes.extend_from_slice(&[0x03, 0, 4, 0, 0, 0, 0]);
        let len = u16::from_be_bytes([bytes[14], bytes[15]]) + 7;
        bytes[14..16].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c(&bytes).to_be_bytes();
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&crc);
        let (header, used) = parse_v2(&bytes).unwrap();
        assert_eq!((header.source, header.vpce.as_deref(), used), (Some(src), Some("vpce-0123"), bytes.len()));
        bytes[at] ^= 1;
        assert_eq!(parse_v2(&bytes), Err(ProxyHeaderError::BadV2));
    }

    #[test]
    fn v2_with_two_vpce_ids_is_refused() {
        let src: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let dst: SocketAddr = "127.0.0.1:4002".parse().unwrap();
        let mut bytes = encode_v2(src, dst, Some("vpce-aaaa"));
        // The same TLV again, and the header's length grown to hold it.
        let tlv = [&[TLV_AWS, 0, 10, AWS_VPCE_ID][..], b"vpce-bbbb"].concat();
        bytes.extend_from_slice(&tlv);
        let len = u16::from_be_bytes([bytes[14], bytes[15]]) + tlv.len() as u16;
        bytes[14..16].copy_from_slice(&len.to_be_bytes());
        assert!(parse_v2(&bytes).is_err());
    }

    #[test]
    fn detection() {
        assert_eq!(detect(b"PRO"), Detect::NeedMore);
        assert_eq!(detect(b"PROXY T"), Detect::V1);
        assert_eq!(detect(b"GET / HTTP/1.1"), Detect::None);
        assert_eq!(detect(b"\r\n\r\n\0"), Detect::NeedMore);
        assert_eq!(detect(b"CONNECT x:1"), Detect::None);
    }
}
