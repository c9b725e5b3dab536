//! The name a TLS client asks for, read from its ClientHello without terminating TLS:
//! the bytes are kept, to be replayed upstream untouched.

use std::time::Duration;

use tokio::net::TcpStream;

use super::ReadError;

/// Longest ClientHello read (post-quantum key shares make hellos of a few KiB; several
/// records at most).
const MAX_HELLO: usize = 64 * 1024;

/// Reads until the ClientHello is complete; returns the SNI host name (`None`: the
/// client sent none, or an IP literal) and every byte read.
pub async fn read(stream: &mut TcpStream, timeout: Duration) -> Result<(Option<String>, Vec<u8>), ReadError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut acceptor = rustls::server::Acceptor::default();
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    let mut fed = 0;
    loop {
        super::read_more(stream, &mut buf, deadline).await?;
        if buf.len() > MAX_HELLO {
            return Err(ReadError::TooLarge);
        }
        while fed < buf.len() {
            match acceptor.read_tls(&mut &buf[fed..]) {
                Ok(0) => break,
                Ok(n) => fed += n,
                Err(e) => return Err(ReadError::Malformed(format!("not a TLS ClientHello: {e}"))),
            }
            match acceptor.accept() {
                Ok(None) => {}
                Ok(Some(accepted)) => {
                    let name = accepted.client_hello().server_name().map(str::to_owned);
                    return Ok((name, buf));
                }
                Err((e, _alert)) => return Err(ReadError::Malformed(format!("not a TLS ClientHello: {e}"))),
            }
        }
    }
}

/// A fatal TLS alert record (TLS 1.2 framing, which every client reads before the
/// handshake): how a refusal is told to a TLS client the gateway does not terminate.
pub fn alert(description: u8) -> [u8; 7] {
    [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, description]
}

/// `access_denied`: the policy, authentication or a limit refused it.
pub const ACCESS_DENIED: u8 = 49;
/// `unrecognized_name`: no usable SNI name.
pub const UNRECOGNIZED_NAME: u8 = 112;
/// `decode_error`: not a ClientHello.
pub const DECODE_ERROR: u8 = 50;
/// `internal_error`: the upstream could not be reached.
pub const INTERNAL_ERROR: u8 = 80;
