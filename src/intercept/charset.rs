//! Whether an upstream could read a value written into a request in a charset other
//! than UTF-8. A value's bytes read as UTF-16, EBCDIC or UTF-7 become other characters:
//! an upstream that echoes them sends back text the redactor does not know, from which
//! the sandbox recovers the value by encoding it back. An upstream picks the charset
//! from a declaration (`charset=` in the request's `Content-Type`, in a multipart
//! part's headers, a form's `_charset_` field), from a byte order mark, or by sniffing
//! NULs (JSON readers detect UTF-16 and UTF-32 so). [`Charset`] watches the bytes the
//! sandbox wrote for any of these.

/// The labels a value may be written under: its bytes are then read as they are.
const SAME: [&[u8]; 4] = [b"utf-8", b"utf8", b"us-ascii", b"ascii"];

/// The word that starts a declaration, compared without regard to case.
const WORD: &[u8] = b"charset";

/// The longest label read; a longer run is no label this allows.
const LABEL_MAX: usize = 16;

/// What the sandbox's bytes so far say about the charset they will be read in.
#[derive(Clone, Default)]
pub struct Charset {
    /// How much of [`WORD`] the last bytes spell.
    matched: usize,
    /// After [`WORD`]: the label read so far (`None`: not in a declaration).
    label: Option<Vec<u8>>,
    /// A NUL, a byte that starts a byte order mark, or a declaration of another charset.
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
        if let Some(label) = self.label.take() {
            self.foreign |= !SAME.contains(&label.as_slice());
        }
        self.matched = 0;
    }

    /// Whether a value written now could be read in another charset. A declaration
    /// still being read counts: its label is not known yet.
    pub fn foreign(&self) -> bool {
        self.foreign || self.label.is_some()
    }

    fn byte(&mut self, b: u8) {
        // NUL: UTF-16 or UTF-32 text. 0xFE and 0xFF never occur in UTF-8: a byte order
        // mark of UTF-16 or UTF-32.
        if b == 0 || b >= 0xFE {
            self.foreign = true;
        }
        if let Some(label) = &mut self.label {
            let lower = b.to_ascii_lowercase();
            match lower {
                // Between the word and its label: `charset=`, `charset="`, `_charset_`
                // and, in a multipart part, the line breaks before its value.
                b'=' | b'"' | b'\'' | b' ' | b'\t' | b'_' | b':' | b'\r' | b'\n' if label.is_empty() => return,
                b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' if label.len() < LABEL_MAX => {
                    label.push(lower);
                    return;
                }
                _ => self.finish(),
            }
        }
        let lower = b.to_ascii_lowercase();
        if lower == WORD[self.matched] {
            self.matched += 1;
            if self.matched == WORD.len() {
                self.matched = 0;
                self.label = Some(Vec::new());
            }
        } else {
            self.matched = usize::from(lower == WORD[0]);
        }
    }
}

/// Whether the header values `declared` (a request's `Content-Type`) name a charset
/// other than UTF-8 or ASCII, as a [`Charset`] a body's bytes are then fed to.
pub fn declared<'a>(declared: impl IntoIterator<Item = &'a [u8]>) -> Charset {
    let mut c = Charset::default();
    for v in declared {
        c.feed(v);
        c.finish();
    }
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
            b"{\0\"\0k\0",
            b"\xff\xfe{",
            b"mentions charset once",
            // A label not ended yet is not known to be UTF-8.
            b"charset=utf-8",
            // Longer than any label allowed: `utf-8` is only its start.
            b"charset=utf-8aaaaaaaaaaaaaaaaaaaa ",
        ] {
            assert!(foreign(text), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn utf8_and_ascii_declarations_and_plain_text_are_not() {
        for text in [
            &b"Content-Type: application/json; charset=UTF-8\r\n\r\n"[..],
            b"<meta charset=\"utf-8\">",
            b"_charset_=us-ascii&key=",
            b"{\"k\": \"caf\xc3\xa9 chars et\"}",
            b"",
        ] {
            assert!(!foreign(text), "{:?}", String::from_utf8_lossy(text));
        }
        // A header value read whole ends its label.
        assert!(!declared([&b"application/json; charset=utf-8"[..]]).foreign());
        assert!(declared([&b"application/json; charset=utf-16"[..]]).foreign());
        assert!(!declared([&b"application/json"[..]]).foreign());
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
