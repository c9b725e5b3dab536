//! Placeholders replaced in one pass, left to right, over a header value, a query or a
//! streaming request body. At each place the longest placeholder that matches is taken
//! (`EGRESS_SECRET_OPENAI_ORG` is not `EGRESS_SECRET_OPENAI` and `_ORG`), and each
//! occurrence is judged by what the upstream will read before it: the bytes written so
//! far, earlier values included. So no order of secrets hides an escape left open
//! before a value, and a value right before a placeholder is not taken for padding the
//! sandbox wrote ([`opens_escape`]).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::charset::Charset;
use crate::redact::{Patterns, Rewrite, Rewritten, Step};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How far back an unfinished escape before a placeholder is looked for.
pub const ESCAPE_LOOKBACK: usize = 12;

/// What goes where a placeholder was.
#[derive(Clone)]
pub enum Then {
    /// Its value (as it is to be sent: escaped for a query).
    Write(Vec<u8>),
    /// The placeholder itself, untouched (a secret not lent through this part).
    Keep,
    /// Nothing: the request is refused ([`Stop::Refused`]), the caller says why.
    Refuse,
}

/// One configured placeholder and what replaces it here.
#[derive(Clone)]
pub struct Swap {
    pub placeholder: Vec<u8>,
    pub then: Then,
}

/// The placeholders of a pass and what replaces each, found in one pass.
pub struct Swaps {
    pub list: Vec<Swap>,
    patterns: Patterns,
}

impl Swaps {
    pub fn new(list: Vec<Swap>) -> Self {
        let patterns = Patterns::new(list.iter().map(|s| s.placeholder.as_slice()));
        Swaps { list, patterns }
    }
}

/// Why a pass stopped, with the index of the placeholder in the caller's list.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// The placeholder follows an unfinished escape ([`opens_escape`]).
    Glued(usize),
    /// Its [`Swap`] says [`Then::Refuse`].
    Refused(usize),
    /// The bytes before it may make the upstream read the value in another charset
    /// ([`Charset`]).
    Foreign(usize),
}

/// A pass's output so far.
#[derive(Default)]
pub struct Output {
    pub bytes: Vec<u8>,
    /// Where the bytes after the last value written begin in `bytes`: the sandbox's own.
    own_from: usize,
    /// The placeholders written as values, by index (each once).
    pub written: Vec<usize>,
    /// What the sandbox's bytes say of the charset the value would be read in.
    pub charset: Charset,
}

impl Output {
    /// Appends `input` with its placeholders replaced. With `more` (a body's chunk,
    /// more to come), stops before a tail that could still become a placeholder and
    /// returns how many bytes of `input` it took; otherwise takes all.
    pub fn push(&mut self, input: &[u8], swaps: &Swaps, more: bool) -> Result<usize, Stop> {
        let mut at = 0;
        while at < input.len() {
            let i = match swaps.patterns.step(&input[at..], more) {
                Step::Plain(n) => {
                    self.own(&input[at..at + n]);
                    at += n;
                    continue;
                }
                Step::Wait => return Ok(at),
                Step::Found(i) => i,
            };
            let s = &swaps.list[i];
            match &s.then {
                Then::Refuse => return Err(Stop::Refused(i)),
                Then::Keep => self.own(&s.placeholder),
                Then::Write(value) => {
                    if opens_escape(&self.bytes, self.own_from) {
                        return Err(Stop::Glued(i));
                    }
                    if self.charset.foreign() {
                        return Err(Stop::Foreign(i));
                    }
                    self.bytes.extend_from_slice(value);
                    self.own_from = self.bytes.len();
                    if !self.written.contains(&i) {
                        self.written.push(i);
                    }
                }
            }
            at += s.placeholder.len();
        }
        Ok(input.len())
    }

    /// Appends bytes of the sandbox's own (not a value).
    fn own(&mut self, bytes: &[u8]) {
        self.charset.feed(bytes);
        self.bytes.extend_from_slice(bytes);
    }

    /// Keeps only the last [`ESCAPE_LOOKBACK`] bytes: all a later check reads.
    fn keep_lookback(&mut self) {
        let cut = self.bytes.len().saturating_sub(ESCAPE_LOOKBACK);
        self.bytes.drain(..cut);
        self.own_from = self.own_from.saturating_sub(cut);
    }
}

/// Whether `before` (what the upstream reads before a value) ends in an escape the
/// value's first characters could complete ([`ends_in_escape`]), as written,
/// percent-decoded once (`%25` is `%` to an upstream that decodes twice), or with
/// `\u00XX` decoded (`\u005cu` is `\u` to one that reads JSON twice); or whether the
/// sandbox's own bytes (from `own_from`, after the last value) fill the last
/// [`ESCAPE_LOOKBACK`] bytes with characters an escape can run on with
/// (`&#000000000000`: padding past what is looked at). A value right before is not
/// such padding: what preceded it was judged when it was written.
pub fn opens_escape(before: &[u8], own_from: usize) -> bool {
    let from = before.len().saturating_sub(ESCAPE_LOOKBACK);
    let window = &before[from..];
    // A byte that is not ASCII right before (a Shift_JIS or GBK lead byte folds the
    // next character into one), or a NUL near (UTF-16 text, which JSON readers detect).
    if window.last().is_some_and(|b| !b.is_ascii()) || window.contains(&0) {
        return true;
    }
    let own = &before[own_from.max(from)..];
    if own.len() == ESCAPE_LOOKBACK && own.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'{' | b'#')) {
        return true;
    }
    let decoded = percent_decoded(window);
    ends_in_escape(window)
        || ends_in_escape(&decoded)
        || ends_in_escape(&unicode_unescaped(window))
        || ends_in_escape(&unicode_unescaped(&decoded))
}

/// Whether `before` ends in an unfinished escape: `%`, `%h`, `%u` and up to three hex
/// digits (URLs, IIS); `\` alone or with up to five hex digits (CSS, octal), `\u`/`\U`
/// with fewer hex digits than they take, `\x` with any (C), `\u{`/`\x{`, `\N{` (JSON,
/// JavaScript, Python, C, Java); `&#`, `&#x` with digits, or `&` alone or with letters
/// (HTML, which reads a reference without its `;`).
fn ends_in_escape(before: &[u8]) -> bool {
    let from = before.len().saturating_sub(ESCAPE_LOOKBACK);
    (from..before.len()).rev().any(|at| {
        let tail = &before[at + 1..];
        let hex = |t: &[u8]| t.iter().all(u8::is_ascii_hexdigit);
        match before[at] {
            b'%' => match tail {
                [] => true,
                [b'u' | b'U', rest @ ..] => rest.len() < 4 && hex(rest),
                _ => tail.len() < 2 && hex(tail),
            },
            b'\\' => match tail {
                [] => true,
                [b'u' | b'x' | b'U' | b'X', b'{', rest @ ..] => hex(rest),
                [b'N', b'{', rest @ ..] => !rest.contains(&b'}'),
                [b'u', rest @ ..] => rest.len() < 4 && hex(rest),
                [b'U', rest @ ..] => rest.len() < 8 && hex(rest),
                [b'x' | b'X', rest @ ..] => hex(rest),
                _ => tail.len() < 6 && hex(tail),
            },
            b'&' => match tail {
                [b'#'] => true,
                [b'#', b'x' | b'X', rest @ ..] => hex(rest),
                [b'#', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
                // `&` and letters, or `&` alone: the value's own first letters could
                // spell a reference (`lt`, `not`, `amp`).
                _ => tail.iter().all(u8::is_ascii_alphabetic),
            },
            _ => false,
        }
    })
}

/// `bytes` with each `%XX` decoded once.
fn percent_decoded(bytes: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) =
                (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// `bytes` with each `\u00XX` (an ASCII character, as JSON writes one) decoded.
fn unicode_unescaped(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i..i + 6)
            .filter(|w| w.starts_with(b"\\u00"))
            .and_then(|w| std::str::from_utf8(&w[4..]).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .filter(u8::is_ascii);
        if let Some(code) = code {
            out.push(code);
            i += 6;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Why the pass refused the placeholder `stop` names, in words for the client.
pub fn why(stop: &Stop, swaps: &[Swap], place: &str) -> String {
    let (Stop::Glued(i) | Stop::Refused(i) | Stop::Foreign(i)) = *stop;
    let ph = swaps.get(i).map_or_else(String::new, |s| String::from_utf8_lossy(&s.placeholder).into_owned());
    match stop {
        Stop::Glued(_) => format!(
            "{ph} in the {place} follows an unfinished escape (%, \\u, \\x, &#): an upstream that decodes it would \
             alter the value; the request was not sent"
        ),
        Stop::Foreign(_) => format!(
            "{ph} in the {place} could be read in a charset other than UTF-8 (a charset= other than utf-8 before it, \
             a NUL, or a UTF-16 byte order mark): the value would turn into other characters; the request was not sent"
        ),
        Stop::Refused(_) => format!("{ph} may not go in the {place}; the request was not sent"),
    }
}

/// Placeholders replaced in a request body as it streams ([`Output::push`] over a
/// [`Rewritten`] body): only a tail that could still become a placeholder is held back
/// between chunks. A placeholder the pass refuses ends the body with an error, so the
/// upstream never gets a request that looks complete; why is left in `refused` for
/// the answer.
pub struct Substitute {
    swaps: Swaps,
    /// The last bytes written (for the next check), and where the sandbox's own begin.
    out: Output,
    refused: Arc<OnceLock<String>>,
}

impl Rewrite for Substitute {
    fn rewrite(&mut self, input: &[u8], more: bool) -> Result<(Bytes, Vec<u8>), BoxError> {
        let kept = self.out.bytes.len();
        let taken = self.out.push(input, &self.swaps, more).map_err(|stop| {
            let why = why(&stop, &self.swaps.list, "body");
            let _ = self.refused.set(why.clone());
            BoxError::from(why)
        })?;
        // The bytes before `kept` went out with an earlier chunk.
        let now = Bytes::copy_from_slice(&self.out.bytes[kept..]);
        self.out.keep_lookback();
        Ok((now, input[taken..].to_vec()))
    }
}

/// `inner` with `swaps` made as it streams. `declared`: what the request's head says
/// of the body's charset ([`charset::declared`](super::charset::declared)).
pub fn body<B>(
    inner: B,
    swaps: Vec<Swap>,
    declared: Charset,
    refused: Arc<OnceLock<String>>,
) -> Rewritten<B, Substitute> {
    let out = Output { charset: declared, ..Output::default() };
    Rewritten::new(inner, Substitute { swaps: Swaps::new(swaps), out, refused })
}

#[cfg(test)]
mod tests {
    use http_body::Frame;

    use super::*;
    use crate::redact::tests::Frames;

    fn write(placeholder: &str, value: &str) -> Swap {
        Swap { placeholder: placeholder.into(), then: Then::Write(value.into()) }
    }

    fn substitute(input: &[u8], swaps: &[Swap]) -> Result<Vec<u8>, Stop> {
        let mut out = Output::default();
        assert_eq!(out.push(input, &Swaps::new(swaps.to_vec()), false)?, input.len());
        Ok(out.bytes)
    }

    #[test]
    fn a_placeholder_inside_an_unfinished_escape_is_glued() {
        let glued = |before: &str| {
            let input = format!("{before}EGRESS_SECRET_k");
            match substitute(input.as_bytes(), &[write("EGRESS_SECRET_k", "v")]) {
                Err(Stop::Glued(0)) => true,
                Ok(out) => {
                    assert_eq!(out, format!("{before}v").into_bytes());
                    false
                }
                Err(other) => panic!("{other:?}"),
            }
        };
        for open in [
            "%",
            "%4",
            "%u",
            "%u3f",
            "\\",
            "\\u",
            "\\u3",
            "\\u3f9",
            "\\U0001",
            "\\x",
            "\\x4",
            "\\x41414",
            "\\u{",
            "\\x{1",
            "\\N{",
            "\\1",
            "\\12",
            "&#",
            "&#x",
            "&#x3f",
            "&#12",
            "a=\\u",
            "\\0000",
            "\\a",
            "\\123",
            "&sup",
            "a&",
            "v=\u{82}",
            "{\0\"\0v\0\"\0",
            "&time",
            "%25",
            "%5Cu",
            "\\u005cu",
            "v=%5Cu3",
            "&#000000000000",
            "x&#0000000000",
        ] {
            assert!(glued(open), "{open:?}");
        }
        for done in [
            "", "x=", "%20", "%41", "%u3f9a", "\\u3f9a", "\\n", "\\\"", "&amp;", "Bearer ", "\\N{DOT}", "key=abc",
            "a&b=",
        ] {
            assert!(!glued(done), "{done:?}");
        }
    }

    #[test]
    fn the_longest_placeholder_wins_whatever_the_order() {
        let short = write("EGRESS_SECRET_OPENAI", "sk-a");
        let long = write("EGRESS_SECRET_OPENAI_ORG", "org-b");
        let input = b"x EGRESS_SECRET_OPENAI_ORG EGRESS_SECRET_OPENAI_ EGRESS_SECRET_OPENAI";
        for swaps in [[short.clone(), long.clone()], [long, short]] {
            assert_eq!(substitute(input, &swaps).unwrap(), b"x org-b sk-a_ sk-a");
        }
    }

    #[test]
    fn a_value_before_a_placeholder_is_judged_as_sent_and_is_not_padding() {
        let a = |v: &str| write("EGRESS_SECRET_a", v);
        let b = write("EGRESS_SECRET_b", "B");
        // Back to back, after a value ending in twelve alphanumerics: the sandbox wrote
        // no padding (was refused before).
        let long = "sk0123456789abcdef";
        for swaps in [[a(long), b.clone()], [b.clone(), a(long)]] {
            assert_eq!(substitute(b"EGRESS_SECRET_aEGRESS_SECRET_b", &swaps).unwrap(), format!("{long}B").as_bytes());
        }
        // A value ending in an escape opener glues the next whatever the secrets'
        // order (the second order used to see the placeholder's text, not the value).
        for swaps in [[a("k%"), b.clone()], [b.clone(), a("k%")]] {
            let i = if matches!(swaps[0].then, Then::Write(ref v) if v == b"B") { 0 } else { 1 };
            assert_eq!(substitute(b"EGRESS_SECRET_aEGRESS_SECRET_b", &swaps), Err(Stop::Glued(i)));
        }
        // Padding the sandbox writes after a value still counts, but only its own bytes.
        let swaps = [a(long), b];
        assert_eq!(substitute(b"EGRESS_SECRET_a000000000000EGRESS_SECRET_b", &swaps), Err(Stop::Glued(1)));
        assert!(substitute(b"EGRESS_SECRET_a00000000000EGRESS_SECRET_b", &swaps).is_ok());
        // What came before the first value was judged when it was written.
        assert_eq!(substitute(b"&#EGRESS_SECRET_aEGRESS_SECRET_b", &swaps), Err(Stop::Glued(0)));
    }

    #[test]
    fn a_value_that_could_be_read_in_another_charset_is_not_written() {
        let swaps = [write("EGRESS_SECRET_a", "A")];
        // UTF-16 JSON padded past the escape check's window with `+` (U+2B2B).
        let utf16 = b"{\0\"\0k\0\"\0:\0\"\0++++++++++++EGRESS_SECRET_a";
        assert_eq!(substitute(utf16, &swaps), Err(Stop::Foreign(0)));
        let part = b"--b\r\nContent-Type: text/plain; charset=utf-7\r\n\r\nEGRESS_SECRET_a";
        assert_eq!(substitute(part, &swaps), Err(Stop::Foreign(0)));
        assert!(substitute(b"charset=utf-8\r\n\r\nEGRESS_SECRET_a", &swaps).is_ok());
        // What the head declared counts from the first byte.
        let mut out = Output {
            charset: crate::intercept::charset::declared([&b"text/plain; charset=utf-16le"[..]]),
            ..Output::default()
        };
        assert_eq!(out.push(b"EGRESS_SECRET_a", &Swaps::new(swaps.to_vec()), false), Err(Stop::Foreign(0)));
        // A value written is not read for a declaration: only the sandbox's bytes are.
        let kept = [write("EGRESS_SECRET_a", "charset=utf-16 "), write("EGRESS_SECRET_b", "B")];
        assert_eq!(substitute(b"EGRESS_SECRET_a EGRESS_SECRET_b", &kept).unwrap(), b"charset=utf-16  B");
    }

    #[test]
    fn kept_and_refused_placeholders() {
        let swaps = [
            write("EGRESS_SECRET_a", "A"),
            Swap { placeholder: b"EGRESS_SECRET_k".to_vec(), then: Then::Keep },
            Swap { placeholder: b"EGRESS_SECRET_r".to_vec(), then: Then::Refuse },
        ];
        assert_eq!(substitute(b"EGRESS_SECRET_k EGRESS_SECRET_a", &swaps).unwrap(), b"EGRESS_SECRET_k A");
        assert_eq!(substitute(b"EGRESS_SECRET_a EGRESS_SECRET_r", &swaps), Err(Stop::Refused(2)));
        assert_eq!(substitute(b"EGRESS_SECRET_unknown", &swaps).unwrap(), b"EGRESS_SECRET_unknown");
    }

    async fn streamed(input: &[u8], cuts: &[usize], swaps: &[Swap]) -> Result<Vec<u8>, String> {
        use http_body_util::BodyExt;
        let mut chunks = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([&input.len()]) {
            chunks.push(Frame::data(Bytes::copy_from_slice(&input[from..cut])));
            from = cut;
        }
        chunks.reverse();
        let refused = Arc::new(OnceLock::new());
        let body = body(Frames(chunks), swaps.to_vec(), Charset::default(), refused.clone());
        let got = body.collect().await.map(|c| c.to_bytes().to_vec()).map_err(|e| e.to_string());
        // The reason left for the answer is the body's error.
        assert_eq!(got.as_ref().err(), refused.get());
        got
    }

    #[tokio::test]
    async fn a_streamed_body_gets_what_one_pass_gives_wherever_it_is_cut() {
        let swaps = [
            write("EGRESS_SECRET_OPENAI", "sk-a"),
            write("EGRESS_SECRET_OPENAI_ORG", "org-b"),
            Swap { placeholder: b"EGRESS_SECRET_k".to_vec(), then: Then::Keep },
        ];
        for input in [
            &b"{\"k\":\"EGRESS_SECRET_OPENAI\",\"o\":\"EGRESS_SECRET_OPENAI_ORG\"} EGRESS_SECRET_k"[..],
            b"EGRESS_SECRET_OPENAIEGRESS_SECRET_OPENAI",
            b"tail EGRESS_SECRET_OPENAI",
            b"EGRESS_SECRET_OPENAI_OR",
            b"%EGRESS_SECRET_OPENAI",
            b"%2EGRESS_SECRET_OPENAI_ORG",
            b"x=000000000000EGRESS_SECRET_OPENAI",
            b"charset=utf-16 EGRESS_SECRET_OPENAI",
            b"\0EGRESS_SECRET_OPENAI",
        ] {
            let whole = substitute(input, &swaps);
            for a in 0..=input.len() {
                for b in a..=input.len() {
                    let got = streamed(input, &[a, b], &swaps).await;
                    match &whole {
                        Ok(w) => assert_eq!(
                            got.as_deref(),
                            Ok(&w[..]),
                            "{:?} cut at {a}, {b}",
                            String::from_utf8_lossy(input)
                        ),
                        Err(_) => assert!(got.is_err(), "{:?} cut at {a}, {b}", String::from_utf8_lossy(input)),
                    }
                }
            }
        }
    }
}
