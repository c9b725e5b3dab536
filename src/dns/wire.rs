//! One DNS message in, its wire answer out: what both the UDP loops (plain and
//! batched) and the TCP loop call, below both.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_net::NetError;
use hickory_net::runtime::TokioTime;
use hickory_net::xfer::Protocol;
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::BinEncoder;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;

use super::firewall::Handler;

/// Largest datagram read; a longer one is cut by the kernel and then refused as longer
/// than a query ([`MAX_QUERY`]).
pub const MAX_DATAGRAM: usize = MAX_QUERY + 1;

/// How often a UDP thread looks at the shutdown token while no query arrives.
pub const UDP_POLL: Duration = Duration::from_millis(200);

/// The wire answer to one raw message; `None` means no answer (too short to carry a
/// header, a response message (no reflection), or a dropped query).
pub async fn answer_bytes(raw: &[u8], peer: SocketAddr, protocol: Protocol, handler: &Handler) -> Option<Vec<u8>> {
    if raw.len() < 12 || raw[2] & 0x80 != 0 {
        return None;
    }
    if !query_shaped(raw) || first_name_points(raw) {
        return handler.answer_unparseable(peer.ip(), protocol == Protocol::Tcp).then(|| formerr(raw));
    }
    match Request::from_bytes(raw.to_vec(), peer, protocol) {
        Ok(request) => {
            let slot = Responder { protocol, out: Arc::default() };
            handler.handle_request::<_, TokioTime>(&request, slot.clone()).await;
            slot.take()
        }
        Err(_) => handler.answer_unparseable(peer.ip(), protocol == Protocol::Tcp).then(|| formerr(raw)),
    }
}

/// Longest query taken, on either transport: the EDNS payload size of DNS Flag Day
/// 2020. A stub's query (a name of at most 255 bytes, an OPT record with a cookie, a
/// client subnet and padding to a block of 128, a TSIG record) is shorter. Within it,
/// a message of OPT options or pointer chains costs about 7 to 12 plain queries.
pub const MAX_QUERY: usize = 1232;

/// Whether the header describes a query the firewall could answer: at most one
/// question, no answer or authority records, at most two additional ones (an OPT and a
/// TSIG or SIG(0)), and at most [`MAX_QUERY`] bytes. Judged before parsing: the parser
/// reads every record, and a 64 KiB TCP message of records whose owner names are
/// pointers into one long chain of labels cost about 600 plain queries of CPU while
/// the per-source limit counted it as one.
fn query_shaped(raw: &[u8]) -> bool {
    let count = |at: usize| u16::from_be_bytes([raw[at], raw[at + 1]]);
    raw.len() <= MAX_QUERY && count(4) <= 1 && count(6) == 0 && count(8) == 0 && count(10) <= 2
}

/// Whether the first question's name holds a compression pointer: nothing precedes
/// it but the header, so a pointer can only lead into the header (or forward), and
/// the answer, which echoes the question as sent, would point into its own header.
fn first_name_points(raw: &[u8]) -> bool {
    if raw.get(4..6) == Some(&[0, 0]) {
        return false;
    }
    let mut at = 12;
    while let Some(&len) = raw.get(at) {
        if len & 0xC0 != 0 {
            return true;
        }
        if len == 0 {
            return false;
        }
        at += 1 + usize::from(len);
    }
    false
}

/// A bare FORMERR header echoing the query's id, opcode and RD bit (RFC 1035 4.1.1:
/// RD is copied into the response).
pub fn formerr(raw: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[..2].copy_from_slice(&raw[..2]);
    h[2] = 0x80 | (raw[2] & 0x79); // QR, original opcode, RD
    h[3] = 0x01; // FORMERR
    h
}

/// An answer too long for the client's UDP payload size, cut to what RFC 1035 (4.1.1)
/// and RFC 6891 (7) ask for: the header with TC set, the question, and the OPT record
/// (so the client still learns the payload size), without a record cut in half. The
/// client asks again over TCP.
fn truncated(full: &[u8]) -> Option<Vec<u8>> {
    let mut m = hickory_proto::op::Message::from_vec(full).ok()?;
    m.answers.clear();
    m.authorities.clear();
    m.additionals.clear();
    m.signature = None;
    m.metadata.truncation = true;
    m.to_vec().ok()
}

/// Collects the encoded response for the socket loop to send. Over UDP the message is
/// bounded by the response's EDNS payload size (512 without EDNS) and truncated (TC,
/// [`truncated`]) beyond it.
#[derive(Clone)]
struct Responder {
    protocol: Protocol,
    out: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Responder {
    fn take(&self) -> Option<Vec<u8>> {
        self.out.lock().ok().and_then(|mut s| s.take())
    }
}

#[async_trait::async_trait]
impl ResponseHandler for Responder {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let max = match self.protocol {
            Protocol::Tcp => u16::MAX,
            _ => response.edns().map_or(512, |e| e.max_payload().max(512)),
        };
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(u16::MAX);
        let info = response.destructive_emit(&mut encoder).map_err(|e| NetError::from(e.to_string()))?;
        if bytes.len() > usize::from(max) {
            bytes = truncated(&bytes).ok_or_else(|| NetError::from("the answer cannot be truncated".to_string()))?;
        }
        if let Ok(mut slot) = self.out.lock() {
            *slot = Some(bytes);
        }
        Ok(info)
    }
}
