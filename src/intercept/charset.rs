//! Whether an upstream could read a value written into a request as something other
//! than its bytes. A value's bytes read as UTF-16, EBCDIC or UTF-7, or decoded as
//! base64 or quoted-printable, become other characters: an upstream that echoes them
//! sends back text the redactor does not know, from which the sandbox recovers the
//! value by encoding it back. An upstream picks the reading from a declaration
//! (`charset=` in the request's `Content-Type`, in a multipart part's headers, a form's
//! `_charset_` field; a part's `Content-Transfer-Encoding`), from a byte order mark, or
//! by sniffing NULs at the start (JSON readers detect UTF-16 and UTF-32 so).
//! [`Charset`] watches the bytes the sandbox wrote for any of these.

/// A declaration the sandbox's bytes may make, and the labels under which a value's
/// bytes are read as they are.
struct Kind {
    /// The word that starts it, compared without regard to case.
    word: &'static [u8],
    /// What, between the word and its label, makes it a declaration.
    says: &'static [u8],
    same: &'static [&'static [u8]],
}

const KINDS: [Kind; 3] = [
    // `charset=` (a parameter, a form field) or, in a multipart part, a line break.
    Kind { word: b"charset", says: b"=\r\n", same: &[b"utf-8", b"utf8", b"us-ascii", b"ascii"] },
    // A multipart part's body in base64 or quoted-printable: decoded upstream.
    Kind { word: b"content-transfer-encoding", says: b":", same: &[b"7bit", b"8bit", b"binary"] },
    // An XML declaration's `encoding="..."` (a JDK parser reads EBCDIC by it).
    Kind { word: b"encoding", says: b"=", same: &[b"utf-8", b"utf8", b"us-ascii", b"ascii"] },
];

/// The longest label read; a longer run is no label this allows.
const LABEL_MAX: usize = 16;

/// How many bytes at the start of a body are looked at for a byte order mark or the
/// NULs of UTF-16 or UTF-32 (JSON readers detect those from the first four).
const SNIFFED: usize = 4;

/// One [`Kind`] of declaration being read.
#[derive(Clone, Default)]
struct Reading {
    /// How much of the word the last bytes spell.
    matched: usize,
    /// After the word: the label read so far (`None`: not in a declaration).
    label: Option<Vec<u8>>,
    /// After the word, before the label: a `=` or a line break was seen (a
    /// declaration, not the word in prose).
    declared: bool,
}

/// What the sandbox's bytes so far say about how the value would be read.
#[derive(Clone, Default)]
pub struct Charset {
    reading: [Reading; 3],
    /// Bytes read (a body's first [`SNIFFED`] are sniffed).
    seen: usize,
    /// A byte order mark or NUL at the start, or a declaration of another reading.
    foreign: bool,
}

impl Charset {
    /// Reads the sandbox's `bytes` (never a value written by the gateway).
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// The end of a piece read whole (a header value): a label running to its end ends.
    pub fn finish(&mut self) {
        for k in 0..KINDS.len() {
            self.end_label(k);
            self.reading[k].matched = 0;
        }
    }

    /// Whether a value written now could be read otherwise than as its bytes. A
    /// declaration still being read counts: its label is not known yet.
    pub fn foreign(&self) -> bool {
        self.foreign || self.reading.iter().any(|r| r.label.is_some() && r.declared)
    }

    fn end_label(&mut self, k: usize) {
        let r = &mut self.reading[k];
        if let Some(label) = r.label.take() {
            self.foreign |= r.declared && !KINDS[k].same.contains(&label.as_slice());
        }
        r.declared = false;
    }

    fn byte(&mut self, b: u8) {
        // NUL: UTF-16 or UTF-32 text. 0xFE and 0xFF never occur in UTF-8: a byte order
        // mark of UTF-16 or UTF-32.
        if self.seen < SNIFFED && (b == 0 || b >= 0xFE) {
            self.foreign = true;
        }
        self.seen = self.seen.saturating_add(1);
        let lower = b.to_ascii_lowercase();
        for (k, kind) in KINDS.iter().enumerate() {
            let r = &mut self.reading[k];
            if let Some(label) = &mut r.label {
                match lower {
                    // Between the word and its label: `charset=`, `charset="`,
                    // `_charset_` and, in a multipart part, the line breaks before its
                    // value.
                    _ if label.is_empty() && kind.says.contains(&lower) => {
                        r.declared = true;
                        continue;
                    }
                    b'=' | b'\r' | b'\n' | b'"' | b'\'' | b' ' | b'\t' | b'_' | b':' if label.is_empty() => continue,
                    b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' if label.len() < LABEL_MAX => {
                        label.push(lower);
                        continue;
                    }
                    _ => self.end_label(k),
                }
            }
            let r = &mut self.reading[k];
            let word = kind.word;
            if lower == word[r.matched] {
                r.matched += 1;
                if r.matched == word.len() {
                    r.matched = 0;
                    r.label = Some(Vec::new());
                }
            } else {
                r.matched = usize::from(lower == word[0]);
            }
        }
    }
}

/// What the header values `declared` (a request's `Content-Type`) say of how a body is
/// read, as a [`Charset`] the body's bytes are then fed to.
pub fn declared<'a>(declared: impl IntoIterator<Item = &'a [u8]>) -> Charset {
    let mut c = Charset::default();
    for v in declared {
        c.feed(v);
        c.finish();
    }
    // The body's own first bytes are the ones sniffed.
    c.seen = 0;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn foreign(text: &[u8]) -> bool {
        let mut c = Charset::default();
        c.feed(text);
        c.foreign()
    }

    #[test]
    fn declarations_of_other_charsets_and_utf16_bytes_are_foreign() {
        for text in [
            &b"Content-Type: text/plain; charset=utf-16le\r\n\r\n"[..],
            b"_charset_=UTF-16&key=",
            b"name=\"_charset_\"\r\n\r\nutf-7\r\n",
            b"Content-Type: text/plain; CHARSET=\"cp037\"\r\n\r\n",
            b"Content-Transfer-Encoding: base64\r\n\r\n",
            b"content-transfer-encoding: Quoted-Printable\r\n\r\n",
            b"<?xml version=\"1.0\" encoding=\"IBM037\"?>",
            b"{\0\"\0k\0",
            b"\xff\xfe{",
            // A label not ended yet is not known to be UTF-8.
            b"charset=utf-8",
            // Longer than any label allowed: `utf-8` is only its start.
            b"charset=utf-8aaaaaaaaaaaaaaaaaaaa ",
        ] {
            assert!(foreign(text), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn utf8_and_ascii_declarations_prose_and_later_binary_are_not() {
        for text in [
            &b"Content-Type: application/json; charset=UTF-8\r\n\r\n"[..],
            b"<meta charset=\"utf-8\">",
            b"_charset_=us-ascii&key=",
            b"Content-Transfer-Encoding: 8bit\r\n\r\n",
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>",
            b"Content-Encoding: gzip",
            b"{\"k\": \"caf\xc3\xa9 chars et\"}",
            // The word in prose, or as a JSON key, declares nothing.
            b"{\"q\": \"Which charset does this page use?\"}",
            b"{\"charset\": \"utf-16\"}",
            // Binary after the first bytes (a JPEG part before a text field).
            b"--b\r\n\r\n\xff\xd8\xff\0\0\r\n--b\r\n",
            b"",
        ] {
            assert!(!foreign(text), "{:?}", String::from_utf8_lossy(text));
        }
        // A header value read whole ends its label.
        assert!(!declared([&b"application/json; charset=utf-8"[..]]).foreign());
        assert!(declared([&b"application/json; charset=utf-16"[..]]).foreign());
        assert!(!declared([&b"application/json"[..]]).foreign());
        // The body's own first bytes are sniffed after a declaration.
        let mut c = declared([&b"application/json; charset=utf-8"[..]]);
        c.feed(b"\xfe\xff");
        assert!(c.foreign());
    }

    #[test]
    fn a_declaration_split_anywhere_reads_the_same() {
        let text = b"x; charset=utf-16 y";
        for cut in 0..=text.len() {
            let mut c = Charset::default();
            c.feed(&text[..cut]);
            c.feed(&text[cut..]);
            assert!(c.foreign(), "cut at {cut}");
        }
    }
}
