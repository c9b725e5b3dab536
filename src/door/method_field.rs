//! A method named in a form body. Rails (`Rack::MethodOverride`), Laravel and Symfony
//! run a POST whose form carries `_method=DELETE` as a DELETE, and read the field from
//! the body first (the query's is judged by `Policy::decide_request`). [`MethodFields`]
//! watches a POST's form body as it streams: each method a field names is judged as
//! the request's own, and one the rules refuse ends the body with an error before the
//! body is whole, so the upstream never runs it.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{HeaderMap, Method, header};

use crate::addr::Target;
use crate::policy::{self, Policy, Subject};
use crate::redact::{Rewrite, Rewritten};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The longest key held back while it may still become `_method` (`%5Fmethod` and
/// friends fit).
const KEY_MAX: usize = 32;
/// The longest method name read; a longer `_method` value is refused.
const VALUE_MAX: usize = 256;
/// How much of a multipart body is held back while a `_method` part may be completing.
const PART_MAX: usize = 2048;

/// The form a body is read as by the frameworks that honour `_method`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `application/x-www-form-urlencoded`, or no `Content-Type` (Rack parses a POST
    /// without one as a form).
    UrlEncoded,
    /// `multipart/form-data`.
    Multipart,
}

/// The form a request's body would be parsed as, if it is a POST such a framework
/// would read a `_method` from.
pub fn form_of(method: &Method, headers: &HeaderMap) -> Option<Form> {
    if method != Method::POST {
        return None;
    }
    let Some(ct) = headers.get(header::CONTENT_TYPE) else { return Some(Form::UrlEncoded) };
    let media = ct.as_bytes().split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
    if media.eq_ignore_ascii_case(b"application/x-www-form-urlencoded") || media.is_empty() {
        Some(Form::UrlEncoded)
    } else if media.eq_ignore_ascii_case(b"multipart/form-data") {
        Some(Form::Multipart)
    } else {
        None
    }
}

/// Says why a method a field names is refused, if the rules refuse it.
pub type Judge = Box<dyn FnMut(&str) -> Option<String> + Send>;

/// A request body watched for `_method` fields.
pub type Watched<B> = Rewritten<B, MethodFields<Judge>>;

/// The [`Judge`] of a request to `target` at `path` (with its query) under `policy`:
/// each method is decided as the request's own would be, with the same headers.
/// Report mode refuses nothing.
pub fn judge(policy: Arc<Policy>, target: Target, path: String, headers: Vec<(String, String)>) -> Judge {
    Box::new(move |m: &str| {
        let subject = Subject::Request {
            target: target.clone(),
            method: m.to_string(),
            path: path.clone(),
            headers: headers.clone(),
        };
        let d = policy::decide(&policy, &subject, None);
        (d.reason().is_some() && !d.report_only).then(|| {
            format!(
                "the form field _method={m} asks the upstream to run this POST as {m}, which the request rules \
                 refuse; the request was not sent"
            )
        })
    })
}

/// `body` watched for `_method` fields of `form`; why one was refused goes in `refused`.
pub fn watch<B>(body: B, form: Form, judge: Judge, refused: Arc<OnceLock<String>>) -> Watched<B> {
    Rewritten::new(body, MethodFields::new(form, judge, refused))
}

/// Whether a form key, decoded, is `_method`.
fn is_method_key(raw: &[u8]) -> bool {
    let key = crate::policy::requests::percent_decode(raw, true);
    key.trim_ascii().eq_ignore_ascii_case(b"_method")
}

/// Watches a form body for `_method` fields; `judge` says why a method is refused.
pub struct MethodFields<J> {
    form: Form,
    judge: J,
    /// In a urlencoded body: inside a pair that is not `_method`, up to the next `&`.
    skip: bool,
    refused: Arc<OnceLock<String>>,
}

impl<J: FnMut(&str) -> Option<String>> MethodFields<J> {
    pub fn new(form: Form, judge: J, refused: Arc<OnceLock<String>>) -> Self {
        MethodFields { form, judge, skip: false, refused }
    }

    fn refuse(&mut self, why: String) -> BoxError {
        let _ = self.refused.set(why.clone());
        BoxError::from(why)
    }

    /// Judges a method named by a field.
    fn check(&mut self, value: &[u8]) -> Result<(), BoxError> {
        if value.len() > VALUE_MAX {
            return Err(self.refuse(format!("a _method form field longer than {VALUE_MAX} bytes")));
        }
        let m = String::from_utf8_lossy(value).trim().to_ascii_uppercase();
        if m.is_empty() || m == "POST" {
            return Ok(());
        }
        match (self.judge)(&m) {
            Some(why) => Err(self.refuse(why)),
            None => Ok(()),
        }
    }

    /// One urlencoded pair, whole.
    fn pair(&mut self, pair: &[u8]) -> Result<(), BoxError> {
        let (key, value) = match pair.iter().position(|&b| b == b'=') {
            Some(q) => (&pair[..q], &pair[q + 1..]),
            None => (pair, &b""[..]),
        };
        if is_method_key(key) { self.check(&crate::policy::requests::percent_decode(value, true)) } else { Ok(()) }
    }

    /// How much of `input` may go now (the rest is held back); judges every field whole.
    fn urlencoded(&mut self, input: &[u8], more: bool) -> Result<usize, BoxError> {
        let sep = |b: &u8| matches!(b, b'&' | b';');
        let mut at = 0;
        if self.skip {
            match input.iter().position(sep) {
                Some(p) => {
                    at = p + 1;
                    self.skip = false;
                }
                None => return Ok(input.len()),
            }
        }
        loop {
            let rest = &input[at..];
            if let Some(end) = rest.iter().position(sep) {
                self.pair(&rest[..end])?;
                at += end + 1;
                continue;
            }
            if !more {
                self.pair(rest)?;
                return Ok(input.len());
            }
            // The last pair may go on in the next chunk.
            let held = match rest.iter().position(|&b| b == b'=') {
                None => rest.len() <= KEY_MAX,
                Some(q) if is_method_key(&rest[..q]) => {
                    if rest.len() - q - 1 > VALUE_MAX {
                        return Err(self.refuse(format!("a _method form field longer than {VALUE_MAX} bytes")));
                    }
                    true
                }
                Some(_) => false,
            };
            if held {
                return Ok(at);
            }
            self.skip = true;
            return Ok(input.len());
        }
    }

    /// How much of `input` may go now; judges every `_method` part whose value is whole.
    fn multipart(&mut self, input: &[u8], more: bool) -> Result<usize, BoxError> {
        let lower = input.to_ascii_lowercase();
        let mut from = 0;
        while let Some(found) = find(&lower[from..], b"_method").map(|p| p + from) {
            from = found + b"_method".len();
            // A part named `_method`: `name="_method"` or `name=_method`.
            let before = &lower[..found];
            let before = before.strip_suffix(b"\"").unwrap_or(before);
            if !before.trim_ascii_end().strip_suffix(b"=").is_some_and(|b| b.trim_ascii_end().ends_with(b"name")) {
                continue;
            }
            let after = &lower[from..];
            if !matches!(after.first(), None | Some(b'"' | b';' | b'\r' | b'\n' | b' ')) {
                continue;
            }
            // The value: after the part's headers (a blank line, CRLF or LF alone, as
            // lenient parsers take it), up to the line's end.
            let value = headers_end(after).map(|h| from + h).and_then(|start| {
                input[start..].iter().position(|&b| b == b'\n').map(|end| &input[start..start + end])
            });
            match value {
                Some(v) => self.check(v.strip_suffix(b"\r").unwrap_or(v))?,
                None if !more => {
                    let rest = &input[from..];
                    self.check(headers_end(rest).map_or(&b""[..], |h| &rest[h..]))?;
                }
                None if input.len() - found > PART_MAX => {
                    return Err(self.refuse("a _method form part whose value could not be read".into()));
                }
                // Hold back from the part's name until its value is whole.
                None => return Ok(found.saturating_sub(16)),
            }
        }
        // A name cut at the chunk's end: hold back what could still become one.
        Ok(if more { input.len().saturating_sub(24) } else { input.len() })
    }
}

/// Where a part's value begins: after the first blank line (`\r\n\r\n` or `\n\n`).
fn headers_end(after: &[u8]) -> Option<usize> {
    let crlf = find(after, b"\r\n\r\n").map(|h| h + 4);
    let lf = find(after, b"\n\n").map(|h| h + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl<J: FnMut(&str) -> Option<String>> Rewrite for MethodFields<J> {
    fn rewrite(&mut self, input: &[u8], more: bool) -> Result<(Bytes, Vec<u8>), BoxError> {
        let go = match self.form {
            Form::UrlEncoded => self.urlencoded(input, more)?,
            Form::Multipart => self.multipart(input, more)?,
        };
        Ok((Bytes::copy_from_slice(&input[..go]), input[go..].to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The methods judged and whether the body went whole, for `input` cut at `cuts`.
    fn watch(form: Form, input: &[u8], cuts: &[usize]) -> (Vec<String>, Result<Vec<u8>, String>) {
        let seen = std::cell::RefCell::new(Vec::new());
        let judge = |m: &str| {
            seen.borrow_mut().push(m.to_string());
            (m == "DELETE").then(|| "no DELETE".to_string())
        };
        let mut w = MethodFields::new(form, judge, Arc::new(OnceLock::new()));
        // As `Rewritten` calls it: each chunk after what was held back, then what is
        // still held at the end.
        let mut out = Vec::new();
        let mut held = Vec::new();
        let mut from = 0;
        let mut result = Ok(());
        for &cut in cuts.iter().chain([&input.len()]) {
            let mut chunk = std::mem::take(&mut held);
            chunk.extend_from_slice(&input[from..cut]);
            from = cut;
            match w.rewrite(&chunk, true) {
                Ok((now, h)) => {
                    out.extend_from_slice(&now);
                    held = h;
                }
                Err(e) => {
                    result = Err(e.to_string());
                    break;
                }
            }
        }
        if result.is_ok() && !held.is_empty() {
            match w.rewrite(&held, false) {
                Ok((now, _)) => out.extend_from_slice(&now),
                Err(e) => result = Err(e.to_string()),
            }
        }
        let result = result.map(|()| out);
        drop(w);
        (seen.into_inner(), result)
    }

    #[test]
    fn urlencoded_method_fields_are_judged_wherever_the_body_is_cut() {
        for input in [&b"a=1&_method=DELETE&b=2"[..], b"_method=delete", b"x=1;%5Fmethod=DE%4CETE", b"_Method=+DELETE+"]
        {
            for cut in 0..=input.len() {
                let (seen, got) = watch(Form::UrlEncoded, input, &[cut]);
                assert_eq!(seen, ["DELETE"], "{:?} cut at {cut}", String::from_utf8_lossy(input));
                assert!(got.is_err(), "{:?} cut at {cut}", String::from_utf8_lossy(input));
            }
        }
        for input in [&b"a=1&_method=PUT"[..], b"_methods=DELETE", b"a=_method%3DDELETE", b"x_method=DELETE"] {
            for cut in 0..=input.len() {
                let (_, got) = watch(Form::UrlEncoded, input, &[cut]);
                assert_eq!(got.as_deref(), Ok(input), "{:?} cut at {cut}", String::from_utf8_lossy(input));
            }
        }
        // A long value of another field passes without being held whole.
        let long = [b"k=".as_slice(), &[b'v'; 10_000]].concat();
        let (seen, got) = watch(Form::UrlEncoded, &long, &[100, 5000]);
        assert!(seen.is_empty() && got.is_ok());
    }

    #[test]
    fn multipart_method_parts_are_judged_wherever_the_body_is_cut() {
        let body = b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n\
                     --b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--\r\n";
        for a in (0..=body.len()).step_by(3) {
            for b in (a..=body.len()).step_by(7) {
                let (seen, got) = watch(Form::Multipart, body, &[a, b]);
                assert_eq!(seen, ["DELETE"], "cut at {a}, {b}");
                assert!(got.is_err(), "cut at {a}, {b}");
            }
        }
        let lf = b"--b\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\n--b--\n";
        for cut in 0..=lf.len() {
            let (seen, got) = watch(Form::Multipart, lf, &[cut]);
            assert_eq!(seen, ["DELETE"], "bare LF, cut at {cut}");
            assert!(got.is_err(), "bare LF, cut at {cut}");
        }
        let put = b"--b\r\nContent-Disposition: form-data; name=_method\r\n\r\nPUT\r\n--b--\r\n";
        let (seen, got) = watch(Form::Multipart, put, &[20]);
        assert_eq!((seen, got.as_deref()), (vec!["PUT".to_string()], Ok(&put[..])));
        let other = b"--b\r\nContent-Disposition: form-data; name=\"not_method\"\r\n\r\nDELETE\r\n--b--\r\n";
        let (seen, got) = watch(Form::Multipart, other, &[30]);
        assert!(seen.is_empty() && got.is_ok());
    }

    #[test]
    fn only_a_post_form_is_watched() {
        let h = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            h
        };
        assert_eq!(form_of(&Method::POST, &HeaderMap::new()), Some(Form::UrlEncoded));
        assert_eq!(
            form_of(&Method::POST, &h("Application/X-WWW-Form-Urlencoded; charset=utf-8")),
            Some(Form::UrlEncoded)
        );
        assert_eq!(form_of(&Method::POST, &h("multipart/form-data; boundary=b")), Some(Form::Multipart));
        assert_eq!(form_of(&Method::POST, &h("application/json")), None);
        assert_eq!(form_of(&Method::PUT, &HeaderMap::new()), None);
    }
}
