//! PROXY protocol v1 and v2 (the header a load balancer such as an AWS NLB prepends
//! with the real client address). Parsing is pure; [`read_header`] takes it off a
//! socket. v2 TLVs are parsed, including the AWS VPC endpoint id (type 0xEA, subtype
//! 0x01).

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

/// Parses a complete v2 header (signature, 4 fixed bytes, payload). Returns the header
/// and the number of bytes it occupied.
pub fn parse_v2(buf: &[u8]) -> Result<(Header, usize), ProxyHeaderError> {
    if buf.len() < 16 {
        return Err(ProxyHeaderError::Incomplete);
    }
    if buf[..12] != V2_SIGNATURE || buf[12] >> 4 != 2 {
        return Err(ProxyHeaderError::BadV2);
    }
    let command = buf[12] & 0x0f;
    let family = buf[13];
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > V2_MAX_PAYLOAD {
        return Err(ProxyHeaderError::BadV2);
    }
    let total = 16 + len;
    let payload = buf.get(16..total).ok_or(ProxyHeaderError::Incomplete)?;
    let (mut header, addr_len) = match (command, family) {
        // LOCAL: the proxy's own connection (health checks); addresses are ignored.
        (0, _) => (Header::default(), 0),
        (1, 0x11) if len >= 12 => {
            let src = Ipv4Addr::new(payload[0], payload[1], payload[2], payload[3]);
            let dst = Ipv4Addr::new(payload[4], payload[5], payload[6], payload[7]);
            let sport = u16::from_be_bytes([payload[8], payload[9]]);
            let dport = u16::from_be_bytes([payload[10], payload[11]]);
            let h = Header {
                source: Some(SocketAddr::new(IpAddr::V4(src), sport)),
                destination: Some(SocketAddr::new(IpAddr::V4(dst), dport)),
                vpce: None,
            };
            (h, 12)
        }
        (1, 0x21) if len >= 36 => {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&payload[..16]);
            d.copy_from_slice(&payload[16..32]);
            let sport = u16::from_be_bytes([payload[32], payload[33]]);
            let dport = u16::from_be_bytes([payload[34], payload[35]]);
            let h = Header {
                source: Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(s)), sport)),
                destination: Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(d)), dport)),
                vpce: None,
            };
            (h, 36)
        }
        // UNSPEC or UNIX: no usable address.
        (1, 0x00 | 0x31 | 0x32) => (Header::default(), len.min(216)),
        _ => return Err(ProxyHeaderError::BadV2),
    };
    if command == 1 {
        header.vpce = parse_tlvs(payload.get(addr_len..).unwrap_or(&[]))?;
    }
    Ok((header, total))
}

/// Walks the TLVs; returns the AWS VPC endpoint id if present.
fn parse_tlvs(mut tlvs: &[u8]) -> Result<Option<String>, ProxyHeaderError> {
    let mut vpce = None;
    while !tlvs.is_empty() {
        if tlvs.len() < 3 {
            return Err(ProxyHeaderError::BadV2);
        }
        let kind = tlvs[0];
        let len = usize::from(u16::from_be_bytes([tlvs[1], tlvs[2]]));
        let value = tlvs.get(3..3 + len).ok_or(ProxyHeaderError::BadV2)?;
        if kind == TLV_AWS && value.first() == Some(&AWS_VPCE_ID) {
            let id = std::str::from_utf8(&value[1..]).map_err(|_| ProxyHeaderError::BadV2)?;
            if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(ProxyHeaderError::BadV2);
            }
            vpce = Some(id.to_string());
        }
        tlvs = &tlvs[3 + len..];
    }
    Ok(vpce)
}

/// Looks at the first bytes of `stream` without consuming them, waiting up to
/// `timeout` for enough of them to tell whether a PROXY header is there.
pub async fn sniff(stream: &TcpStream, timeout: Duration) -> Result<Detect, ProxyHeaderError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = [0u8; 12];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .map_err(|_| ProxyHeaderError::Incomplete)?
            .map_err(|_| ProxyHeaderError::Incomplete)?;
        if n == 0 {
            return Err(ProxyHeaderError::Incomplete);
        }
        match detect(&buf[..n]) {
            Detect::NeedMore => {
                // Peek returns at once while data is buffered: wait a little for more.
                tokio::time::sleep(Duration::from_millis(5)).await;
                if tokio::time::Instant::now() >= deadline {
                    return Err(ProxyHeaderError::Incomplete);
                }
            }
            d => return Ok(d),
        }
    }
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

    #[test]
    fn detection() {
        assert_eq!(detect(b"PRO"), Detect::NeedMore);
        assert_eq!(detect(b"PROXY T"), Detect::V1);
        assert_eq!(detect(b"GET / HTTP/1.1"), Detect::None);
        assert_eq!(detect(b"\r\n\r\n\0"), Detect::NeedMore);
        assert_eq!(detect(b"CONNECT x:1"), Detect::None);
    }
}
