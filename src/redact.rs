//! Removes a secret from a response as it streams: an upstream that echoes the injected
//! key (in an error message, say) must not hand it to the sandbox. Only a tail that
//! could be the start of the secret is held back between chunks, so server-sent events
//! still arrive as they are produced. [`Rewritten`] is that streaming, for any
//! [`Rewrite`]: `intercept::placeholders` writes placeholder values into request
//! bodies with it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const MARK: &str = "[REDACTED]";

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
/// every other byte but letters and digits as `\u00XX`, in either case of hex),
/// percent-encoded (every byte but the unreserved ones, or also leaving raw what
/// Python's, JavaScript's and Go's encoders leave raw; either case of hex), as HTML
/// character references (all, or what Go's and Python's escapers write), and in
/// upper or lower case. Each is redacted like the raw value. Other re-encodings
/// (base64, hex of the whole value) are not recognised.
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
    for upper in [false, true] {
        add(json(&|c| {
            (!c.is_ascii_alphanumeric()).then(|| {
                let u = format!("{:04x}", c as u32);
                format!("\\u{}", if upper { u.to_ascii_uppercase() } else { u })
            })
        }));
        add(percent_escape(secret, upper));
        // As common encoders leave some reserved bytes raw: Python's `quote` (`/`),
        // JavaScript's `encodeURIComponent` (`!'()*`), Go's `url.PathEscape`.
        for keep in [&b"/"[..], b"!'()*", b"$&+,/:;=@"] {
            add(percent_escape_keeping(secret, upper, keep));
        }
    }
    // HTML character references: every byte but letters, digits and `-_.` in decimal or
    // hex; what Go's html/template writes (`"'&+<>`) and what Python's html.escape does.
    let referenced = |c: char| !c.is_ascii_alphanumeric() && !"-_.".contains(c);
    add(json(&|c| referenced(c).then(|| format!("&#{};", c as u32))));
    add(json(&|c| referenced(c).then(|| format!("&#x{:x};", c as u32))));
    add(json(&|c| referenced(c).then(|| format!("&#x{:X};", c as u32))));
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
    add(json(&|c| match c {
        '"' => Some("&quot;".into()),
        '\'' => Some("&#x27;".into()),
        _ => named(c),
    }));
    add(secret.to_ascii_uppercase());
    add(secret.to_ascii_lowercase());
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
    let mut out = Vec::with_capacity(buf.len());
    let mut i = 0;
    while i < buf.len() {
        if !secret.is_empty() && buf[i..].starts_with(secret) {
            out.extend_from_slice(MARK.as_bytes());
            i += secret.len();
        } else {
            out.push(buf[i]);
            i += 1;
        }
    }
    // Hold back the longest suffix that is a proper prefix of the secret.
    let max = secret.len().saturating_sub(1).min(out.len());
    let hold = (1..=max).rev().find(|&n| out.ends_with(&secret[..n])).unwrap_or(0);
    let tail = out.split_off(out.len() - hold);
    (out, tail)
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

/// Writes [`MARK`] wherever a secret streams past a [`Rewritten`] body, and in its
/// trailers.
pub struct Redact {
    secret: Vec<u8>,
}

impl Redact {
    pub fn new(secret: &str) -> Self {
        Redact { secret: secret.as_bytes().to_vec() }
    }
}

impl Rewrite for Redact {
    fn rewrite(&mut self, input: &[u8], more: bool) -> Result<(Bytes, Vec<u8>), BoxError> {
        if !more {
            // What was held back is a proper prefix of the secret: not the secret.
            return Ok((Bytes::copy_from_slice(input), Vec::new()));
        }
        let (out, tail) = scrub(input, &self.secret);
        Ok((Bytes::from(out), tail))
    }

    fn trailers(&mut self, trailers: &mut HeaderMap) {
        headers(trailers, &String::from_utf8_lossy(&self.secret));
    }
}

/// A body with `secret` redacted as it streams.
pub type RedactBody<B> = Rewritten<B, Redact>;

/// Redacts `secret` from `body` as it streams.
pub fn body<B>(body: B, secret: &str) -> RedactBody<B> {
    Rewritten::new(body, Redact::new(secret))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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
            echo_forms("sk-plain_123"),
            vec!["sk-plain_123", "sk\\u002dplain\\u005f123", "sk\\u002Dplain\\u005F123", "SK-PLAIN_123"],
            "unreserved bytes need no percent form"
        );
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
        ] {
            assert!(forms.iter().any(|f| f == form), "{form} in {forms:?}");
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

    #[tokio::test]
    async fn held_back_bytes_go_out_before_the_trailers() {
        use http_body_util::BodyExt;
        // A gRPC reply whose last bytes could begin the secret, then trailers.
        let mut t = HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        t.insert("x-key", http::HeaderValue::from_static("sk-secret-123"));
        let frames = Frames(vec![Frame::trailers(t), Frame::data(Bytes::from_static(b"reply: hi s"))]);
        let body = body(frames, "sk-secret-123");
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers kept");
        assert_eq!(collected.to_bytes(), "reply: hi s", "no byte lost before the trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-key"], "[REDACTED]");
    }
}
