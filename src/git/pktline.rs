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

/// Most ref updates in one push; far above what agents do.
pub const MAX_COMMANDS: usize = 1000;

/// Parses the command list at the start of `buf`. Returns the updates and the length of
/// the command section (through the flush packet), or `Incomplete` if `buf` ends first.
pub fn parse_commands(buf: &[u8]) -> Result<(Vec<RefUpdate>, usize), PktError> {
    let mut pos = 0;
    let mut updates = Vec::new();
    loop {
        let len_hex = buf.get(pos..pos + 4).ok_or(PktError::Incomplete)?;
        let len_str = std::str::from_utf8(len_hex).map_err(|_| PktError::Malformed)?;
        let len = usize::from_str_radix(len_str, 16).map_err(|_| PktError::Malformed)?;
        if len == 0 {
            return Ok((updates, pos + 4));
        }
        if len < 4 {
            return Err(PktError::Malformed);
        }
        let payload = buf.get(pos + 4..pos + len).ok_or(PktError::Incomplete)?;
        let line = payload.split(|b| *b == 0).next().unwrap_or(&[]);
        let line = std::str::from_utf8(line).map_err(|_| PktError::Malformed)?.trim_end_matches('\n');
        // `shallow OID` lines may precede the commands.
        if !line.starts_with("shallow ") {
            let mut it = line.splitn(3, ' ');
            let (Some(old), Some(new), Some(refname)) = (it.next(), it.next(), it.next()) else {
                return Err(PktError::Malformed);
            };
            let hex = |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex(old) || !hex(new) || !refname.starts_with("refs/") && refname != "HEAD" {
                return Err(PktError::Malformed);
            }
            updates.push(RefUpdate { old: old.into(), new: new.into(), refname: refname.into() });
            if updates.len() > MAX_COMMANDS {
                return Err(PktError::TooMany);
            }
        }
        pos += len;
    }
}

/// A pkt-line with `payload`.
pub fn pkt(payload: &str) -> String {
    format!("{:04x}{payload}", payload.len() + 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_finds_the_pack() {
        let a = "a".repeat(40);
        let mut body = pkt(&format!("{ZERO_ID} {a} refs/heads/agent/x\0report-status side-band-64k\n"));
        body.push_str(&pkt(&format!("{a} {ZERO_ID} refs/heads/old\n")));
        body.push_str("0000PACK....");
        let (u, end) = parse_commands(body.as_bytes()).unwrap();
        assert_eq!(u.len(), 2);
        assert_eq!(u[0].refname, "refs/heads/agent/x");
        assert!(!u[0].is_delete());
        assert!(u[1].is_delete());
        assert_eq!(&body[end..], "PACK....");
        assert_eq!(parse_commands(&body.as_bytes()[..10]), Err(PktError::Incomplete));
        assert_eq!(parse_commands(b"zzzz"), Err(PktError::Malformed));
        assert_eq!(parse_commands(pkt("nonsense\n").as_bytes()), Err(PktError::Malformed));
        assert_eq!(parse_commands(b"0003"), Err(PktError::Malformed));
    }
}
