//! Refusals in git's own smart-HTTP terms, so that git prints the reason instead of a
//! bare `HTTP 403`: an `ERR` pkt-line (`fatal: remote error: ...`) for a refused ref
//! advertisement or RPC, and a `report-status` (`! [remote rejected] main -> main
//! (reason)`) for a refused push, as a forge reports a protected branch.

use bytes::Bytes;

use super::path::Service;
use super::pktline::pkt;

/// The content type git expects for the answer to `info/refs?service=S`.
pub fn advertisement_type(service: Service) -> String {
    format!("application/x-{}-advertisement", service.name())
}

/// The content type of an RPC's result.
pub fn result_type(service: Service) -> String {
    format!("application/x-{}-result", service.name())
}

/// A one-line message safe in a pkt-line: printable ASCII, bounded.
fn clean(message: &str) -> String {
    message.chars().take(900).map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect()
}

/// The answer to a refused `info/refs`: the service line git checks, then `ERR`.
pub fn advertisement_error(service: Service, message: &str) -> Bytes {
    let mut out = pkt(&format!("# service={}\n", service.name()));
    out.push_str("0000");
    out.push_str(&pkt(&format!("ERR {}\n", clean(message))));
    Bytes::from(out)
}

/// The answer to a refused RPC (`git-upload-pack`, or a push without report-status).
pub fn rpc_error(message: &str) -> Bytes {
    Bytes::from(pkt(&format!("ERR {}\n", clean(message))))
}

/// A `report-status` for a push the gateway refused: `ng` for every ref, with its own
/// reason for the refused ones. In a side band (`side-band-64k`) when the client asked.
pub fn report_status(refs: &[(String, Option<String>)], sideband: bool) -> Bytes {
    let mut status = pkt("unpack ok\n");
    for (refname, why) in refs {
        let why = why.as_deref().unwrap_or("not pushed: another ref in this push was refused");
        status.push_str(&pkt(&format!("ng {refname} {}\n", clean(why))));
    }
    status.push_str("0000");
    if !sideband {
        return Bytes::from(status);
    }
    // Band 1 carries the report; packets stay under the 65520-byte pkt-line limit.
    let mut out = Vec::with_capacity(status.len() + 16);
    for chunk in status.as_bytes().chunks(65_000) {
        out.extend_from_slice(format!("{:04x}", chunk.len() + 5).as_bytes());
        out.push(1);
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(b"0000");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_pkt_lines_git_reads() {
        let a = advertisement_error(Service::UploadPack, "repository acme/secret is not connected");
        assert_eq!(
            &a[..],
            &b"001e# service=git-upload-pack\n00000030ERR repository acme/secret is not connected\n"[..]
        );
        let r = report_status(&[("refs/heads/main".into(), Some("git_ref_denied: no".into()))], false);
        assert_eq!(&r[..], &b"000eunpack ok\n002ang refs/heads/main git_ref_denied: no\n0000"[..]);
        let s = report_status(&[("refs/heads/main".into(), None)], true);
        assert_eq!(s[4], 1, "band 1");
        assert!(s.ends_with(b"0000"));
        assert_eq!(&rpc_error("x\ny")[..], b"000cERR x?y\n");
    }
}
