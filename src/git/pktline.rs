//! The command list at the head of a `git-receive-pack` request: pkt-lines of
//! `OLD NEW REF` (the first with `\0capabilities`), ended by a flush packet, then the
//! pack. Read ahead so that a push can be judged ref by ref before any of it is sent.

pub const ZERO_ID: &str = "0000000000000000000000000000000000000000";
const ZERO_ID_SHA256: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub old: String,
    pub new: String,
    pub refname: String,
}

impl RefUpdate {
    pub fn is_delete(&self) -> bool {
        self.new == ZERO_ID || self.new == ZERO_ID_SHA256
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PktError {
    #[error("need more bytes")]
    Incomplete,
    #[error("malformed pkt-line")]
    Malformed,
    #[error("push has too many commands")]
    TooMany,
}

/// Most pkt-lines (ref updates and `shallow` lines together) in one push command list;
/// far above what agents do.
pub const MAX_COMMANDS: usize = 1000;

/// Parses the command list at the start of `buf`. Returns the updates and the length of
/// the command section (through the flush packet), or `Incomplete` if `buf` ends first.
pub fn parse_commands(buf: &[u8]) -> Result<(Vec<RefUpdate>, usize), PktError> {
    let mut reader = CommandReader::default();
    match reader.advance(buf)? {
        Some(end) => Ok((reader.into_updates(), end)),
        None => Err(PktError::Incomplete),
    }
}

/// Reads a command list as its bytes arrive: each call to [`CommandReader::advance`]
/// resumes at the first pkt-line not yet complete, so every byte is examined once
/// however finely the body is split (re-parsing from the start on every frame is
/// quadratic: a 128 KiB list in 1-byte frames cost seconds of CPU).
#[derive(Debug, Default)]
pub struct CommandReader {
    /// Where the next pkt-line starts.
    pos: usize,
    updates: Vec<RefUpdate>,
    /// Every pkt-line so far, `shallow` lines included.
    lines: usize,
    /// Payload bytes parsed, for tests of the once-only property.
    examined: usize,
    /// The capabilities the client listed after the first command (`report-status`,
    /// `side-band-64k`, ...).
    capabilities: Vec<String>,
}

impl CommandReader {
    /// Parses the complete pkt-lines of `buf` (which holds everything received so far)
    /// from where the last call stopped. `Some(end)` once the flush packet is read:
    /// the command list is `buf[..end]`.
    pub fn advance(&mut self, buf: &[u8]) -> Result<Option<usize>, PktError> {
        loop {
            let Some(len_hex) = buf.get(self.pos..self.pos + 4) else { return Ok(None) };
            let len = hex4(len_hex)?;
            if len == 0 {
                return Ok(Some(self.pos + 4));
            }
            if len < 4 {
                return Err(PktError::Malformed);
            }
            let Some(payload) = buf.get(self.pos + 4..self.pos + len) else { return Ok(None) };
            self.examined += payload.len();
            self.lines += 1;
            if self.lines > MAX_COMMANDS {
                return Err(PktError::TooMany);
            }
            let mut parts = payload.splitn(2, |b| *b == 0);
            let line = parts.next().unwrap_or(&[]);
            let line = std::str::from_utf8(line).map_err(|_| PktError::Malformed)?.trim_end_matches('\n');
            if self.updates.is_empty()
                && let Some(caps) = parts.next()
            {
                self.capabilities =
                    String::from_utf8_lossy(caps).split_ascii_whitespace().map(str::to_string).collect();
            }
            // `shallow OID` lines may precede the commands.
            if !line.starts_with("shallow ") {
                self.updates.push(parse_update(line)?);
            }
            self.pos += len;
        }
    }

    pub fn into_updates(self) -> Vec<RefUpdate> {
        self.updates
    }

    pub fn updates(&self) -> &[RefUpdate] {
        &self.updates
    }

    /// True when the client listed capability `name` with its first command.
    pub fn has_capability(&self, name: &str) -> bool {
        self.capabilities.iter().any(|c| c == name)
    }
}

/// A pkt-line length: exactly four hex digits, as git reads it (`from_str_radix`
/// would also take a sign: `+000` is not a flush to git).
fn hex4(digits: &[u8]) -> Result<usize, PktError> {
    digits.iter().try_fold(0usize, |n, &b| {
        let d = (b as char).to_digit(16).ok_or(PktError::Malformed)?;
        Ok(n * 16 + d as usize)
    })
}

fn parse_update(line: &str) -> Result<RefUpdate, PktError> {
    let mut it = line.splitn(3, ' ');
    let (Some(old), Some(new), Some(refname)) = (it.next(), it.next(), it.next()) else {
        return Err(PktError::Malformed);
    };
    let hex = |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(old) || !hex(new) || !refname.starts_with("refs/") && refname != "HEAD" {
        return Err(PktError::Malformed);
    }
    Ok(RefUpdate { old: old.into(), new: new.into(), refname: refname.into() })
}

/// A pkt-line with `payload`.
pub fn pkt(payload: &str) -> String {
    format!("{:04x}{payload}", payload.len() + 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_four_hex_digits_and_nothing_else() {
        assert_eq!(hex4(b"00aF"), Ok(0xaf));
        for bad in [&b"+000"[..], b"-001", b" 0a0", b"0x10", b"00g0"] {
            assert_eq!(hex4(bad), Err(PktError::Malformed), "{bad:?}");
            assert_eq!(CommandReader::default().advance(bad), Err(PktError::Malformed));
        }
    }

    #[test]
    fn parses_commands_and_finds_the_pack() {
        let a = "a".repeat(40);
        let mut body = pkt(&format!("{ZERO_ID} {a} refs/heads/agent/x\0report-status side-band-64k\n"));
        body.push_str(&pkt(&format!("{a} {ZERO_ID} refs/heads/old\n")));
        body.push_str("0000PACK....");
        let (u, end) = parse_commands(body.as_bytes()).unwrap();
        assert_eq!(u.len(), 2);
        let mut reader = CommandReader::default();
        assert_eq!(reader.advance(body.as_bytes()), Ok(Some(end)));
        assert!(reader.has_capability("side-band-64k") && reader.has_capability("report-status"));
        assert!(!reader.has_capability("atomic"));
        assert_eq!(u[0].refname, "refs/heads/agent/x");
        assert!(!u[0].is_delete());
        assert!(u[1].is_delete());
        assert_eq!(&body[end..], "PACK....");
        assert_eq!(parse_commands(&body.as_bytes()[..10]), Err(PktError::Incomplete));
        assert_eq!(parse_commands(b"zzzz"), Err(PktError::Malformed));
        assert_eq!(parse_commands(pkt("nonsense\n").as_bytes()), Err(PktError::Malformed));
        assert_eq!(parse_commands(b"0003"), Err(PktError::Malformed));
    }

    #[test]
    fn byte_by_byte_examines_each_byte_once_and_counts_shallow_lines() {
        let a = "a".repeat(40);
        let mut body = String::new();
        for i in 0..200 {
            body.push_str(&pkt(&format!("shallow {a}\n")));
            body.push_str(&pkt(&format!("{ZERO_ID} {a} refs/heads/agent/{i}\n")));
        }
        body.push_str("0000PACK");
        let bytes = body.as_bytes();
        let mut reader = CommandReader::default();
        let mut end = None;
        for n in 1..=bytes.len() {
            if let Some(e) = reader.advance(&bytes[..n]).unwrap() {
                end = Some(e);
                break;
            }
        }
        assert_eq!(end, Some(bytes.len() - 4));
        assert!(reader.examined <= bytes.len(), "examined {} of {} bytes", reader.examined, bytes.len());
        assert_eq!(reader.into_updates().len(), 200);

        // Shallow lines count toward the limit.
        let mut many = String::new();
        for _ in 0..=MAX_COMMANDS {
            many.push_str(&pkt(&format!("shallow {a}\n")));
        }
        assert_eq!(parse_commands(many.as_bytes()), Err(PktError::TooMany));
    }
}
