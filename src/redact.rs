//! Removes a secret from a response as it streams: an upstream that echoes the injected
//! key (in an error message, say) must not hand it to the sandbox. Only a tail that
//! could be the start of the secret is held back between chunks, so server-sent events
//! still arrive as they are produced. [`Rewritten`] is that streaming, for any
//! [`Rewrite`]: `intercept::placeholders` writes placeholder values into request
//! bodies with it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const MARK: &str = "[REDACTED]";

/// The shortest run of base64 redacted as a value's (shorter would match by chance).
const BASE64_CORE_MIN: usize = 12;

/// Replaces the secret in every header value that contains it, as bytes: values that
/// are not visible ASCII (obs-text) are redacted too. A value that cannot be rebuilt is
/// dropped whole rather than passed on.
pub fn headers(h: &mut HeaderMap, secret: &str) {
    if secret.is_empty() {
        return;
    }
    // A header whose name holds the key (names are lowercase) goes whole.
    let lower = secret.to_ascii_lowercase();
    let named: Vec<http::HeaderName> = h.keys().filter(|n| n.as_str().contains(&lower)).cloned().collect();
    for name in named {
        h.remove(name);
    }
    let mut unbuildable = Vec::new();
    for (name, v) in h.iter_mut() {
        let bytes = v.as_bytes();
        if !contains(bytes, secret.as_bytes()) {
            continue;
        }
        let (mut clean, tail) = scrub(bytes, secret.as_bytes());
        clean.extend_from_slice(&tail);
        match http::HeaderValue::from_bytes(&clean) {
            Ok(nv) => *v = nv,
            Err(_) => unbuildable.push(name.clone()),
        }
    }
    for name in unbuildable {
        h.remove(name);
    }
}

/// The spellings of `secret` an upstream may echo besides the raw one: as JSON
/// encoders write it (`\"` and `\\`; with `\/`; with `<>&` as `\u003c`, as Go does;
/// the defaults of Python, PHP, .NET and Gson; every other byte but letters and digits
/// as `\u00XX`, in either case of hex), percent-encoded (every byte but the unreserved
/// ones, or also leaving raw what Python's, JavaScript's and Go's encoders leave raw,
/// or as Java's `URLEncoder` writes it; either case of hex), as HTML
/// character references (all, or what Go's and Python's escapers write), in upper or
/// lower case, and in base64 and base64url at any alignment (the groups of its own
/// bytes). Each is redacted like the raw value. Other re-encodings (hex, base64
/// wrapped across a line break, an encoder's own choice of escapes outside those
/// above) are not recognised.
pub fn echo_forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_string()];
    let mut add = |f: String| {
        if !forms.contains(&f) {
            forms.push(f);
        }
    };
    let json = |escape: &dyn Fn(char) -> Option<String>| {
        secret.chars().map(|c| escape(c).unwrap_or_else(|| c.to_string())).collect::<String>()
    };
    let quoted = |c: char| matches!(c, '"' | '\\').then(|| format!("\\{c}"));
    add(json(&quoted));
    add(json(&|c| if c == '/' { Some("\\/".into()) } else { quoted(c) }));
    add(json(&|c| if matches!(c, '<' | '>' | '&') { Some(format!("\\u{:04x}", c as u32)) } else { quoted(c) }));
    // `\uXXXX`, a surrogate pair beyond the first plane.
    let u = |c: char, upper: bool| -> String {
        let mut units = [0u16; 2];
        let hex = |unit: &u16| if upper { format!("\\u{unit:04X}") } else { format!("\\u{unit:04x}") };
        c.encode_utf16(&mut units).iter().map(hex).collect()
    };
    // Encoders' own choices: Python's `json.dumps` and PHP's `json_encode` escape only
    // what is not ASCII (PHP `/` too); .NET's System.Text.Json `"&'+<>` and a backtick
    // too, in upper-case hex; Gson `<>&='`.
    for slash in [false, true] {
        add(json(&|c| {
            if !c.is_ascii() {
                Some(u(c, false))
            } else if slash && c == '/' {
                Some("\\/".into())
            } else {
                quoted(c)
            }
        }));
    }
    add(json(&|c| match c {
        '\\' => Some("\\\\".into()),
        '"' | '&' | '\'' | '+' | '<' | '>' | '`' => Some(u(c, true)),
        c if !c.is_ascii() => Some(u(c, true)),
        _ => None,
    }));
    add(json(&|c| if matches!(c, '<' | '>' | '&' | '=' | '\'') { Some(u(c, false)) } else { quoted(c) }));
    // Java's URLEncoder: every byte but letters, digits and `.-*_`, upper-case hex,
    // a space as `+`.
    add(secret
        .bytes()
        .map(|b| match b {
            b' ' => "+".to_string(),
            b if b.is_ascii_alphanumeric() || b".-*_".contains(&b) => char::from(b).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect());
    for upper in [false, true] {
        add(json(&|c| (!c.is_ascii_alphanumeric()).then(|| u(c, upper))));
        add(percent_escape(secret, upper));
        // As common encoders leave some reserved bytes raw: Python's `quote` (`/`),
        // JavaScript's `encodeURIComponent` (`!'()*`), Go's `url.PathEscape`.
        for keep in [&b"/"[..], b"!'()*", b"$&+,/:;=@"] {
            add(percent_escape_keeping(secret, upper, keep));
        }
    }
    // HTML character references: every byte but letters, digits and `-_.` in decimal or
    // hex; what Go's html/template writes (`"'&+<>`) and what Python's html.escape does.
    // Escapers differ on `+`, `/` and `=` (ASP.NET's HtmlEncoder writes `&#x2B;` and
    // leaves `/` and `=`; Go's attribute escaper writes `&#43;` and `&#61;`): every
    // choice of them, in each style.
    let referenced = |c: char| !c.is_ascii_alphanumeric() && !"-_.".contains(c);
    let styles: [fn(char) -> String; 3] =
        [|c| format!("&#{};", c as u32), |c| format!("&#x{:x};", c as u32), |c| format!("&#x{:X};", c as u32)];
    for style in styles {
        add(json(&|c| referenced(c).then(|| style(c))));
        for chosen in 1..8u8 {
            let pick =
                |c: char| ["+", "/", "="].iter().position(|p| p.starts_with(c)).is_some_and(|i| chosen & (1 << i) != 0);
            add(json(&|c| pick(c).then(|| style(c))));
        }
    }
    let named = |c: char| match c {
        '&' => Some("&amp;".to_string()),
        '<' => Some("&lt;".into()),
        '>' => Some("&gt;".into()),
        _ => None,
    };
    add(json(&|c| match c {
        '"' => Some("&#34;".into()),
        '\'' => Some("&#39;".into()),
        '+' => Some("&#43;".into()),
        _ => named(c),
    }));
    // Python's html.escape (`&#x27;`), PHP's htmlspecialchars (`&#039;`, or `&apos;`
    // under ENT_HTML5).
    for apostrophe in ["&#x27;", "&#039;", "&apos;"] {
        add(json(&|c| match c {
            '"' => Some("&quot;".into()),
            '\'' => Some(apostrophe.into()),
            _ => named(c),
        }));
    }
    add(secret.to_ascii_uppercase());
    add(secret.to_ascii_lowercase());
    // In base64, wherever it starts (`user:` before it in Basic credentials): at each
    // of the three alignments, the groups made of the value's bytes alone.
    for lead in 0..3 {
        let bytes = [&[0u8; 2][..lead], secret.as_bytes()].concat();
        let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let first = lead.div_ceil(3);
        let last = bytes.len() / 3;
        if last > first && (last - first) * 4 >= BASE64_CORE_MIN {
            let core = &encoded[first * 4..last * 4];
            add(core.to_string());
            // base64url (a JWT's claims): `-` and `_` for `+` and `/`.
            add(core.replace('+', "-").replace('/', "_"));
        }
    }
    // Read as a form (`+` is a space) and echoed back.
    add(secret.replace('+', " "));
    forms
}

/// Percent-encodes every byte of `s` but the unreserved ones (RFC 3986), in upper- or
/// lower-case hex.
pub fn percent_escape(s: &str, upper: bool) -> String {
    percent_escape_keeping(s, upper, b"")
}

/// [`percent_escape`], leaving the bytes in `keep` raw too.
fn percent_escape_keeping(s: &str, upper: bool, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(b as char);
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// True when a response carries a content coding other than identity, or a transfer
/// coding other than chunked (which hyper decodes): its bytes cannot be redacted as
/// they stream. The value itself is never quoted: the upstream chose it, and it could
/// carry the secret.
pub fn is_encoded(h: &HeaderMap) -> bool {
    // Only `chunked`, once: hyper takes one chunked framing off, so `chunked, chunked`
    // (or two `chunked` lines) would leave the inner framing in the body, splitting a
    // value across chunks where the redactor would miss it.
    let mut codings =
        h.get_all(http::header::TRANSFER_ENCODING).iter().flat_map(|v| v.as_bytes().split(|b| *b == b','));
    let framed_only = match (codings.next(), codings.next()) {
        (None, _) => true,
        (Some(c), None) => c.trim_ascii().eq_ignore_ascii_case(b"chunked"),
        _ => false,
    };
    !framed_only
        || h.get_all(http::header::CONTENT_ENCODING).iter().any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Replaces every occurrence of `secret` in `buf`; returns the text to emit now and the
/// tail to hold back (a proper prefix of the secret at the end of `buf`).
pub fn scrub(buf: &[u8], secret: &[u8]) -> (Vec<u8>, Vec<u8>) {
    match Forms::new([secret]).scrub(buf, true) {
        Ok((out, took)) => (out, buf[took..].to_vec()),
        // Nothing of `buf` goes out unscrubbed.
        Err(_) => (MARK.as_bytes().to_vec(), Vec::new()),
    }
}

/// Byte strings looked for in one pass, leftmost and longest first (a secret's
/// spellings here; placeholders in `intercept::placeholders`).
pub struct Patterns {
    patterns: Vec<Vec<u8>>,
    /// The patterns by the byte they begin with.
    by_first: Vec<Vec<usize>>,
}

/// What [`Patterns::step`] found at the start of what is left.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// This many bytes belong to no pattern.
    Plain(usize),
    /// What is left could still become a pattern: wait for more.
    Wait,
    /// Pattern `i` (its index as given) begins here.
    Found(usize),
}

impl Patterns {
    /// Empty patterns are never found.
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let patterns: Vec<Vec<u8>> = patterns.into_iter().map(<[u8]>::to_vec).collect();
        let mut by_first = vec![Vec::new(); 256];
        for (i, p) in patterns.iter().enumerate() {
            if let Some(&b) = p.first() {
                by_first[usize::from(b)].push(i);
            }
        }
        Patterns { patterns, by_first }
    }

    pub fn len(&self, i: usize) -> usize {
        self.patterns.get(i).map_or(0, Vec::len)
    }

    /// What begins `rest` (not empty). With `more` (more bytes to come), a `rest`
    /// that is the start of a longer pattern is [`Step::Wait`].
    pub fn step(&self, rest: &[u8], more: bool) -> Step {
        let next = rest.iter().position(|&b| !self.by_first[usize::from(b)].is_empty()).unwrap_or(rest.len());
        if next > 0 {
            return Step::Plain(next);
        }
        let candidates = self.by_first[usize::from(rest[0])].iter().map(|&i| (i, &self.patterns[i]));
        if more && candidates.clone().any(|(_, p)| p.len() > rest.len() && p.starts_with(rest)) {
            return Step::Wait;
        }
        match candidates.filter(|(_, p)| rest.starts_with(p)).max_by_key(|(_, p)| p.len()) {
            Some((i, _)) => Step::Found(i),
            None => Step::Plain(1),
        }
    }
}

/// Spellings of secrets, each replaced by [`MARK`]: one automaton finds them all,
/// leftmost and longest first, in time linear in the text whatever it holds; the
/// spellings sorted say where a body's tail could still become one. A tail held back
/// is read again with the next chunk, so a chunk also costs up to the longest
/// spelling's length: values are the operator's, and what a sandbox adds around one
/// (Basic credentials) is bounded.
struct Forms {
    automaton: Result<AhoCorasick, aho_corasick::BuildError>,
    sorted: Vec<Vec<u8>>,
    /// The bytes some spelling begins with.
    starts: [bool; 256],
    longest: usize,
}

impl Forms {
    fn new<'a>(forms: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut sorted: Vec<Vec<u8>> = forms.into_iter().filter(|f| !f.is_empty()).map(<[u8]>::to_vec).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut starts = [false; 256];
        for f in &sorted {
            starts[usize::from(f[0])] = true;
        }
        let longest = sorted.iter().map(Vec::len).max().unwrap_or(0);
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
            .build(&sorted);
        Forms { automaton, sorted, starts, longest }
    }

    /// Whether `tail` is the start of a longer spelling.
    fn could_begin(&self, tail: &[u8]) -> bool {
        // Spellings that begin with `tail` sort together, `tail` itself first.
        let i = self.sorted.partition_point(|f| f.as_slice() < tail);
        self.sorted[i..].iter().take(2).any(|f| f.len() > tail.len() && f.starts_with(tail))
    }

    /// The first place at or after `from` where the rest of `buf` could still become a
    /// spelling (`buf.len()` if none).
    fn hold_from(&self, buf: &[u8], from: usize) -> usize {
        let first = from.max(buf.len().saturating_sub(self.longest.saturating_sub(1)));
        (first..buf.len())
            .find(|&t| self.starts[usize::from(buf[t])] && self.could_begin(&buf[t..]))
            .unwrap_or(buf.len())
    }

    /// `buf` with every form replaced, leftmost and longest first. With `more` (a
    /// body's chunk, more to come) it stops where the rest could still become a form:
    /// the output, and how much of `buf` it took.
    fn scrub(&self, buf: &[u8], more: bool) -> Result<(Vec<u8>, usize), BoxError> {
        let automaton = self.automaton.as_ref().map_err(|e| format!("the redactor could not be built: {e}"))?;
        let mut out = Vec::with_capacity(buf.len());
        let mut at = 0;
        let mut hold = if more { self.hold_from(buf, 0) } else { buf.len() };
        for m in automaton.find_iter(buf) {
            if m.start() >= hold {
                break;
            }
            out.extend_from_slice(&buf[at..m.start()]);
            out.extend_from_slice(MARK.as_bytes());
            at = m.end();
            if hold < at {
                hold = self.hold_from(buf, at);
            }
        }
        out.extend_from_slice(&buf[at..hold]);
        Ok((out, hold))
    }
}

/// What a [`Rewritten`] body does to its bytes as they stream.
pub trait Rewrite {
    /// Rewrites `input` (what was held back last time, then the new chunk): the bytes
    /// to send now, and those to hold back for the next call. With `more` false nothing
    /// comes after: nothing may be held back. An error ends the body.
    fn rewrite(&mut self, input: &[u8], more: bool) -> Result<(Bytes, Vec<u8>), BoxError>;

    /// Rewrites trailers, which end the body.
    fn trailers(&mut self, _trailers: &mut HeaderMap) {}
}

/// A body rewritten by `R` as it streams: only what `R` holds back (a tail that could
/// still become a match) waits for the next chunk, so server-sent events still arrive
/// as they are produced. Held bytes go out before trailers.
pub struct Rewritten<B, R> {
    inner: B,
    rewrite: R,
    carry: Vec<u8>,
    done: bool,
    /// Trailers that came while bytes were held back: the held bytes go out first.
    trailers: Option<Frame<Bytes>>,
}

impl<B, R: Rewrite> Rewritten<B, R> {
    pub fn new(inner: B, rewrite: R) -> Self {
        Rewritten { inner, rewrite, carry: Vec::new(), done: false, trailers: None }
    }

    /// The rewriter, for what it learnt.
    pub fn rewriter(&self) -> &R {
        &self.rewrite
    }

    fn take(&mut self, data: &[u8], more: bool) -> Result<Bytes, BoxError> {
        let mut input = std::mem::take(&mut self.carry);
        input.extend_from_slice(data);
        match self.rewrite.rewrite(&input, more) {
            Ok((now, held)) => {
                self.carry = held;
                Ok(now)
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }
}

impl<B, R> Body for Rewritten<B, R>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    R: Rewrite + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(trailers)));
        }
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(self.take(&data, true).map(Frame::data))),
                // Trailers end the body: the bytes held back go out first.
                Err(frame) => {
                    let frame = match frame.into_trailers() {
                        Ok(mut trailers) => {
                            self.rewrite.trailers(&mut trailers);
                            Frame::trailers(trailers)
                        }
                        Err(frame) => frame,
                    };
                    if self.carry.is_empty() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    let rest = self.take(&[], false);
                    if rest.is_ok() {
                        self.trailers = Some(frame);
                    }
                    Poll::Ready(Some(rest.map(Frame::data)))
                }
            },
            Poll::Ready(None) => {
                self.done = true;
                if self.carry.is_empty() {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(self.take(&[], false).map(Frame::data)))
                }
            }
        }
    }
}

/// The spellings of some values ([`echo_forms`]) and the automata that find them.
pub struct Redactor {
    text: Vec<String>,
    /// The spellings' bytes.
    bytes: usize,
    forms: Forms,
    /// The spellings in lower case, as header names hold them.
    names: Result<AhoCorasick, aho_corasick::BuildError>,
}

impl Redactor {
    /// A redactor of exactly these spellings.
    pub fn from_forms(text: Vec<String>) -> Self {
        let forms = Forms::new(text.iter().map(String::as_bytes));
        let lower = text.iter().filter(|t| !t.is_empty()).map(|t| t.to_ascii_lowercase());
        let names = AhoCorasick::builder().kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA)).build(lower);
        let bytes = text.iter().map(String::len).sum();
        Redactor { text, bytes, forms, names }
    }

    /// The spellings.
    pub fn forms(&self) -> &[String] {
        &self.text
    }

    /// [`headers`] for every spelling at once: a field whose name holds one goes, and
    /// each value holding one is rewritten in one pass (or goes, if it cannot be).
    pub fn headers(&self, h: &mut HeaderMap) {
        let (Ok(names), Ok(values)) = (&self.names, &self.forms.automaton) else {
            for form in &self.text {
                headers(h, form);
            }
            return;
        };
        let named: Vec<http::HeaderName> = h.keys().filter(|n| names.is_match(n.as_str())).cloned().collect();
        for name in named {
            h.remove(name);
        }
        let mut unbuildable = Vec::new();
        for (name, v) in h.iter_mut() {
            if !values.is_match(v.as_bytes()) {
                continue;
            }
            let rebuilt = self
                .forms
                .scrub(v.as_bytes(), false)
                .ok()
                .and_then(|(clean, _)| http::HeaderValue::from_bytes(&clean).ok());
            match rebuilt {
                Some(nv) => *v = nv,
                None => unbuildable.push(name.clone()),
            }
        }
        for name in unbuildable {
            h.remove(name);
        }
    }
}

/// How many sets of values keep their redactor between responses, and the most bytes
/// of spellings they may hold together (a set's spellings are about 50 times its
/// values' length).
const RECENT_MAX: usize = 32;
const RECENT_BYTES: usize = 8 << 20;

/// The redactors of the last [`RECENT_MAX`] sets of values: a response from a host
/// with values bound uses the one built for the first response with the same values
/// (building the spellings and the automaton costs about 70 µs).
static RECENT: std::sync::Mutex<Vec<(Vec<String>, Arc<Redactor>)>> = std::sync::Mutex::new(Vec::new());

/// The redactor of every spelling of `values`, built once for each set of values.
pub fn redactor<S: AsRef<str>>(values: &[S]) -> Arc<Redactor> {
    let same = |key: &[String]| key.iter().map(String::as_str).eq(values.iter().map(AsRef::as_ref));
    if let Ok(recent) = RECENT.lock()
        && let Some((_, r)) = recent.iter().find(|(key, _)| same(key))
    {
        return r.clone();
    }
    let mut text: Vec<String> = Vec::new();
    for f in values.iter().flat_map(|v| echo_forms(v.as_ref())) {
        if !text.contains(&f) {
            text.push(f);
        }
    }
    let r = Arc::new(Redactor::from_forms(text));
    if r.bytes <= RECENT_BYTES
        && let Ok(mut recent) = RECENT.lock()
    {
        recent.push((values.iter().map(|v| v.as_ref().to_string()).collect(), r.clone()));
        let mut held: usize = recent.iter().map(|(_, r)| r.bytes).sum();
        while recent.len() > RECENT_MAX || held > RECENT_BYTES {
            held -= recent.remove(0).1.bytes;
        }
    }
    r
}

/// Writes [`MARK`] wherever a form of a secret streams past a [`Rewritten`] body, and
/// in its trailers: one pass for every form.
pub struct Redact(Arc<Redactor>);

impl Rewrite for Redact {
    fn rewrite(&mut self, input: &[u8], more: bool) -> Result<(Bytes, Vec<u8>), BoxError> {
        let (out, took) = self.0.forms.scrub(input, more)?;
        Ok((Bytes::from(out), input[took..].to_vec()))
    }

    fn trailers(&mut self, trailers: &mut HeaderMap) {
        self.0.headers(trailers);
    }
}

/// A body with secrets redacted as it streams.
pub type RedactBody<B> = Rewritten<B, Redact>;

/// Redacts every form `redactor` knows from `body` as it streams.
pub fn body<B>(body: B, redactor: Arc<Redactor>) -> RedactBody<B> {
    Rewritten::new(body, Redact(redactor))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The redactor's specification, one position at a time: at each place, wait if
    /// what is left could still become a longer form, else take the longest form that
    /// begins there, else pass one byte.
    fn scrub_by_steps(patterns: &Patterns, buf: &[u8], more: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            match patterns.step(&buf[at..], more) {
                Step::Plain(n) => {
                    out.extend_from_slice(&buf[at..at + n]);
                    at += n;
                }
                Step::Wait => return (out, at),
                Step::Found(i) => {
                    out.extend_from_slice(MARK.as_bytes());
                    at += patterns.len(i);
                }
            }
        }
        (out, buf.len())
    }

    #[test]
    fn the_automaton_redacts_as_the_step_by_step_specification_does() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let alphabet = b"ab/%";
        for _ in 0..3000 {
            let word = |next: &mut dyn FnMut(u64) -> u64, max: u64| -> Vec<u8> {
                (0..1 + next(max)).map(|_| alphabet[next(4) as usize]).collect()
            };
            let forms: Vec<Vec<u8>> = (0..1 + next(5)).map(|_| word(&mut next, 6)).collect();
            let buf = word(&mut next, 40);
            let patterns = Patterns::new(forms.iter().map(Vec::as_slice));
            let automaton = Forms::new(forms.iter().map(Vec::as_slice));
            for more in [false, true] {
                assert_eq!(
                    automaton.scrub(&buf, more).unwrap(),
                    scrub_by_steps(&patterns, &buf, more),
                    "forms {:?} in {:?}, more: {more}",
                    forms.iter().map(|f| String::from_utf8_lossy(f)).collect::<Vec<_>>(),
                    String::from_utf8_lossy(&buf)
                );
            }
        }
    }

    #[test]
    fn only_one_chunked_framing_is_plain() {
        let with = |fields: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in fields {
                h.append(*k, http::HeaderValue::from_static(v));
            }
            is_encoded(&h)
        };
        let te = "transfer-encoding";
        assert!(!with(&[]));
        assert!(!with(&[(te, "chunked")]));
        assert!(!with(&[(te, " Chunked "), ("content-encoding", "identity")]));
        // A second framing would stay in the body and split a value across chunks.
        assert!(with(&[(te, "chunked, chunked")]));
        assert!(with(&[(te, "chunked"), (te, "chunked")]));
        assert!(with(&[(te, "chunked,")]));
        assert!(with(&[(te, "gzip, chunked")]));
        assert!(with(&[("content-encoding", "gzip")]));
    }

    #[test]
    fn scrubs_across_chunks_and_holds_back_only_prefixes() {
        let s = b"sk-secret-123";
        let (out, tail) = scrub(b"echo sk-secret-123 done", s);
        assert_eq!((out.as_slice(), tail.as_slice()), (&b"echo [REDACTED] done"[..], &b""[..]));
        let (out, tail) = scrub(b"data: {}\n\n", s);
        assert_eq!((out.as_slice(), tail.len()), (&b"data: {}\n\n"[..], 0), "SSE events are not delayed");
        let (out, tail) = scrub(b"key=sk-sec", s);
        assert_eq!((out.as_slice(), tail.as_slice()), (&b"key="[..], &b"sk-sec"[..]));
        let mut joined = tail.clone();
        joined.extend_from_slice(b"ret-123!");
        let (out, tail) = scrub(&joined, s);
        assert_eq!((out.as_slice(), tail.len()), (&b"[REDACTED]!"[..], 0));
    }

    #[test]
    fn echo_forms_cover_json_and_percent_escapes_and_case() {
        assert_eq!(
            echo_forms("sk-plain_123")[..4],
            ["sk-plain_123", "sk\\u002dplain\\u005f123", "sk\\u002Dplain\\u005F123", "SK-PLAIN_123"],
            "unreserved bytes need no percent form"
        );
        // Then its base64 at three alignments.
        assert_eq!(echo_forms("sk-plain_123")[4..], ["c2stcGxhaW5fMTIz", "LXBsYWluXzEy", "ay1wbGFpbl8x"]);
        let forms = echo_forms("sk/a+b=");
        for form in [
            "sk/a+b=",
            "sk\\/a+b=",
            "sk\\u002fa\\u002bb\\u003d",
            "sk%2fa%2bb%3d",
            "sk\\u002Fa\\u002Bb\\u003D",
            "sk%2Fa%2Bb%3D",
            "SK/A+B=",
            // Python's quote, in either case of hex; Go's PathEscape leaves all three raw.
            "sk/a%2Bb%3D",
            "sk/a%2bb%3d",
            // A form body read back: `+` became a space.
            "sk/a b=",
            // HTML: every reference, and Go's html/template (`+` only).
            "sk&#47;a&#43;b&#61;",
            "sk&#x2f;a&#x2b;b&#x3d;",
            "sk&#x2F;a&#x2B;b&#x3D;",
            "sk/a&#43;b=",
            // ASP.NET's HtmlEncoder: `+` only, in hex; Go's attributes: `+` and `=`.
            "sk/a&#x2B;b=",
            "sk/a&#43;b&#61;",
        ] {
            assert!(forms.iter().any(|f| f == form), "{form} in {forms:?}");
        }
        // In base64 after any prefix: `user:` puts it at the third alignment.
        let basic = base64::engine::general_purpose::STANDARD.encode("user:sk-real+value/7d1e0c");
        let forms = echo_forms("sk-real+value/7d1e0c");
        assert!(forms.iter().any(|f| f.len() >= 12 && basic.contains(f.as_str())), "{basic} in {forms:?}");
        for lead in ["", "x", "xy"] {
            let e = base64::engine::general_purpose::STANDARD.encode(format!("{lead}sk-real+value/7d1e0cTAIL"));
            assert!(forms.iter().any(|f| f.len() >= 12 && e.contains(f.as_str())), "{e} in {forms:?}");
        }
        // base64url, as in a JWT's claims, at any alignment.
        let url = echo_forms("sk~>?live-0123456789");
        for lead in ["", "x", "xy"] {
            let e = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(format!("{{\"k\":\"{lead}sk~>?live-0123456789\"}}"));
            assert!(e.contains('-') || e.contains('_'), "{e}");
            assert!(url.iter().any(|f| f.len() >= 12 && e.contains(f.as_str())), "{e} in {url:?}");
        }
        // Encoders' own mixes of escapes.
        for (value, form) in [
            ("sk-real+value/7d1e0c", "sk-real\\u002Bvalue/7d1e0c"),
            ("pa$$w0rd-\u{fc}n/x", "pa$$w0rd-\\u00fcn/x"),
            ("pa$$w0rd-\u{fc}n/x", "pa$$w0rd-\\u00fcn\\/x"),
            ("abc=", "abc\\u003d"),
            ("a~b c", "a%7Eb+c"),
            ("k\u{1f600}", "k\\ud83d\\ude00"),
            ("k\u{1f600}", "k\\uD83D\\uDE00"),
        ] {
            let forms = echo_forms(value);
            assert!(forms.iter().any(|f| f == form), "{form} in {forms:?}");
        }
        let php = echo_forms("k'\"&");
        for form in ["k&#039;&quot;&amp;", "k&apos;&quot;&amp;", "k&#x27;&quot;&amp;"] {
            assert!(php.iter().any(|f| f == form), "{form} in {php:?}");
        }
        let go = echo_forms("k<&>\"\\");
        for form in ["k\\u003c\\u0026\\u003e\\\"\\\\", "k<&>\\\"\\\\", "K<&>\"\\", "k&lt;&amp;&gt;&quot;\\"] {
            assert!(go.iter().any(|f| f == form), "{form} in {go:?}");
        }
    }

    #[test]
    fn header_values_are_redacted_as_bytes() {
        let mut h = HeaderMap::new();
        let v = http::HeaderValue::from_bytes(b"\xe9 sk-secret-123 \xff").unwrap();
        assert!(v.to_str().is_err(), "not visible ASCII");
        h.insert("x-echo", v);
        h.insert("x-plain", http::HeaderValue::from_static("key=sk-secret-123"));
        h.insert("x-sk-secret-123", http::HeaderValue::from_static("1"));
        headers(&mut h, "sk-secret-123");
        assert!(!h.contains_key("x-sk-secret-123"), "a header named after the key goes");
        assert_eq!(h["x-echo"].as_bytes(), b"\xe9 [REDACTED] \xff");
        assert_eq!(h["x-plain"], "key=[REDACTED]");
    }

    /// A body that yields the given frames, last first.
    pub(crate) struct Frames(pub Vec<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop().map(Ok))
        }
    }

    #[test]
    fn a_redactor_rewrites_headers_as_each_form_would() {
        let r = redactor(&["sk-Secret/1", "tok-2"]);
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-echo", "key sk-Secret/1 and sk-Secret%2F1, tok-2"),
            ("location", "/cb?k=sk-Secret%2f1"),
            ("x-tok-2-id", "named too"),
            ("x-upper", "SK-SECRET/1"),
            ("accept", "*/*"),
        ] {
            h.append(http::HeaderName::from_static(k), http::HeaderValue::from_static(v));
        }
        let mut each = h.clone();
        for form in r.forms() {
            headers(&mut each, form);
        }
        r.headers(&mut h);
        assert_eq!(h, each);
        assert_eq!(h["x-echo"], "key [REDACTED] and [REDACTED], [REDACTED]");
        assert_eq!(h["location"], "/cb?k=[REDACTED]");
        assert!(!h.contains_key("x-tok-2-id") && h["x-upper"] == "[REDACTED]" && h["accept"] == "*/*");
    }

    #[tokio::test]
    async fn held_back_bytes_go_out_before_the_trailers() {
        use http_body_util::BodyExt;
        // A gRPC reply whose last bytes could begin the secret, then trailers.
        let mut t = HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        t.insert("x-key", http::HeaderValue::from_static("sk-secret-123"));
        let frames = Frames(vec![Frame::trailers(t), Frame::data(Bytes::from_static(b"reply: hi s"))]);
        let body = body(frames, redactor(&["sk-secret-123"]));
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers kept");
        assert_eq!(collected.to_bytes(), "reply: hi s", "no byte lost before the trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-key"], "[REDACTED]");
    }

    #[tokio::test]
    async fn every_form_goes_in_one_pass_wherever_the_body_is_cut() {
        use http_body_util::BodyExt;
        // One form begins another: the longer is waited for across a cut.
        let forms = ["abc".to_string(), "abcdef".to_string(), "xyz".to_string()];
        let input = b"1abcdef2abc3xyzabcde";
        for a in 0..=input.len() {
            for b in a..=input.len() {
                let chunks = [&input[b..], &input[a..b], &input[..a]];
                let frames = Frames(chunks.iter().map(|c| Frame::data(Bytes::copy_from_slice(c))).collect());
                let redactor = Arc::new(Redactor::from_forms(forms.to_vec()));
                let got = body(frames, redactor).collect().await.unwrap().to_bytes();
                assert_eq!(&got[..], b"1[REDACTED]2[REDACTED]3[REDACTED][REDACTED]de", "cut at {a}, {b}");
            }
        }
    }
}
