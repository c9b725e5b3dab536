//! A method named in a form body. Rails (`Rack::MethodOverride`), Laravel and Symfony
//! run a POST whose form carries `_method=DELETE` as a DELETE, and read the field from
//! the body (the query's is judged by `Policy::decide_request`); Laravel reads a JSON
//! body's top-level `_method` key the same way ([`json`]). Where the request
//! rules treat some other method differently from this POST ([`plan`]), the body is
//! watched as it streams ([`MethodFields`]): each method a field names is judged as the
//! request's own, and one the rules refuse ends the body with an error before its last
//! byte, so the upstream never runs it.
//!
//! Frameworks read field names leniently (PHP turns `.` and spaces into `_` and cuts
//! at a NUL, Rack drops leading `[`/`]` and reads `_method[]` as `_method`, multipart
//! names come quoted, escaped or as a `Content-ID`), so a name is reduced the same way
//! before it is compared (`policy::requests::is_method_name`).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{HeaderMap, Method};

use crate::addr::Target;
use crate::policy::requests::{is_method_name, named_method};
use crate::policy::{self, Policy, Subject};
use crate::redact::{Rewrite, Rewritten};

mod json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The longest method name read; a longer `_method` value is refused.
const VALUE_MAX: usize = 256;
/// The longest part-header line read whole; a longer `Content-Disposition` is refused.
const LINE_MAX: usize = 8192;
/// Methods a `_method` field may name, besides the request's own POST and those the
/// policy's request rules name; `UNLISTED` stands for any other (Symfony takes any
/// upper-case word).
const OTHERS: [&str; 11] =
    ["GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "LINK", "UNLINK", "TRACE", "PURGE", "UNLISTED"];

/// The forms a body is read as by the frameworks that honour `_method`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Form {
    /// Read as form fields.
    pub fields: Option<Fields>,
    /// Read as JSON: the `Content-Type` names `/json` or `+json` anywhere, as Laravel
    /// tests it (so a form's type can make it both).
    pub json: bool,
}

impl Form {
    pub const URLENCODED: Form = Form { fields: Some(Fields::UrlEncoded), json: false };
    pub const MULTIPART: Form = Form { fields: Some(Fields::Multipart), json: false };
    pub const JSON: Form = Form { fields: None, json: true };
}

/// How form fields are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fields {
    /// `application/x-www-form-urlencoded`, or no media type (Rack parses a POST
    /// without one as a form).
    UrlEncoded,
    /// `multipart/*` (Rack parses `multipart/mixed` and `related` as forms too).
    Multipart,
}

/// Says why a method a field names is refused, if the rules refuse it.
pub type Judge = Box<dyn FnMut(&str) -> Option<String> + Send>;

/// A [`Judge`], and the methods worth asking it about before a body is watched.
pub struct Judging {
    pub judge: Judge,
    pub methods: Vec<String>,
}

/// A request body watched for `_method` fields.
pub type Watched<B> = Rewritten<B, MethodFields>;

/// What to do about `_method` fields in a request's body.
pub enum Plan {
    /// Nothing could change what the rules decide.
    Pass,
    /// The body cannot be watched (encoded, or two media types), and the rules refuse
    /// a method it could name.
    Refuse(String),
    /// Watch the body as this form.
    Watch(Form, Judge),
}

/// The [`Judge`] of a request to `target` at `path` (with its query) under `policy`:
/// each method is decided as the request's own would be, with the same headers.
/// Report mode refuses nothing.
pub fn judge(policy: Arc<Policy>, target: Target, path: String, headers: Vec<(String, String)>) -> Judging {
    judging(policy, move |m| Subject::Request {
        target: target.clone(),
        method: m.to_string(),
        path: path.clone(),
        headers: headers.clone(),
    })
}

/// The [`Judge`] of a request on API route `route` at `path` (with its query): each
/// method is decided as the route's entry decides the request's own. Routes are
/// always enforced.
pub fn judge_route(policy: Arc<Policy>, route: String, path: String) -> Judging {
    judging(policy, move |m| Subject::Route { route: route.clone(), method: m.to_string(), path: path.clone() })
}

/// A [`Judging`] that decides `subject(method)` under `policy`, asking about the
/// methods any rule names and [`OTHERS`].
fn judging(policy: Arc<Policy>, subject: impl Fn(&str) -> Subject + Send + 'static) -> Judging {
    let named = policy.request_rules().iter().flat_map(|r| r.methods.iter().cloned());
    let routes = policy.route_methods().map(str::to_string);
    let methods = OTHERS.iter().map(|m| m.to_string()).chain(named).chain(routes).collect();
    let judge = Box::new(move |m: &str| {
        let d = policy::decide(&policy, &subject(m), None);
        (d.reason().is_some() && !d.report_only).then(|| {
            format!(
                "the body field _method={m} asks the upstream to run this POST as {m}, which the rules refuse; the \
                 request was not sent"
            )
        })
    });
    Judging { judge, methods }
}

/// What to do about a request with this head: only a POST with a body, and only where
/// the rules refuse some other method ([`Judging::methods`]), is watched. `post` in any
/// case counts: the rules judge it as POST, and PHP under Apache upper-cases it.
pub fn plan(method: &Method, headers: &HeaderMap, has_body: bool, judging: impl FnOnce() -> Judging) -> Plan {
    if !method.as_str().eq_ignore_ascii_case("POST") || !has_body {
        return Plan::Pass;
    }
    let Judging { mut judge, methods } = judging();
    let Some(refused) = methods.iter().find(|m| *m != "POST" && judge(m).is_some()) else { return Plan::Pass };
    // PHP's built-in server (and CGI) reads `Content_Type` and `Content.Type` as the
    // type too, the last one sent winning.
    let mut types = headers.iter().filter(|(k, _)| folds_to(k.as_str().as_bytes(), b"content-type")).map(|(_, v)| v);
    let (first, second) = (types.next(), types.next());
    if second.is_some() {
        return Plan::Refuse(format!(
            "the rules refuse {refused} here, and a POST with two Content-Type fields cannot be read for a _method \
             field that would make it one"
        ));
    }
    // The media type as Rack and PHP cut it: at `;`, `,` or white space.
    let media = first.map_or(&b""[..], |v| {
        let v = v.as_bytes().trim_ascii();
        v.split(|&b| matches!(b, b';' | b',' | b' ' | b'\t')).next().unwrap_or_default()
    });
    let fields = if media.is_empty() || media.eq_ignore_ascii_case(b"application/x-www-form-urlencoded") {
        Some(Fields::UrlEncoded)
    } else if media.len() > 10 && media[..10].eq_ignore_ascii_case(b"multipart/") {
        Some(Fields::Multipart)
    } else {
        None
    };
    let lower = first.map(|v| v.as_bytes().to_ascii_lowercase()).unwrap_or_default();
    let json = find(&lower, b"/json").is_some() || find(&lower, b"+json").is_some();
    if fields.is_none() && !json {
        return Plan::Pass;
    }
    if fields.is_some() && !charsets(&lower).all(|c| ascii_compatible(&c)) {
        return Plan::Refuse(format!(
            "the rules refuse {refused} here, and a form in a charset that is not ASCII-compatible cannot be read for \
             a _method field that would make it one; send it as UTF-8"
        ));
    }
    if json && names_another_utf(&lower) {
        return Plan::Refuse(format!(
            "the rules refuse {refused} here, and a JSON POST body in a charset other than UTF-8 cannot be read for a \
             _method key that would make it one; send it as UTF-8"
        ));
    }
    let encoded = headers.iter().filter(|(k, _)| folds_to(k.as_str().as_bytes(), b"content-encoding")).any(|(_, v)| {
        let v = v.as_bytes().trim_ascii();
        !v.is_empty() && !v.eq_ignore_ascii_case(b"identity")
    });
    if encoded {
        return Plan::Refuse(format!(
            "the rules refuse {refused} here, and a POST body under Content-Encoding cannot be read for a _method \
             field that would make it one; send the body unencoded"
        ));
    }
    Plan::Watch(Form { fields, json }, judge)
}

/// Whether a field name is `name` (lower case) with `_` or `.` for `-`, in any case.
fn folds_to(field: &[u8], name: &[u8]) -> bool {
    let fold = |c: u8| if c == b'_' || c == b'.' { b'-' } else { c.to_ascii_lowercase() };
    field.len() == name.len() && field.iter().zip(name).all(|(&a, &b)| fold(a) == b)
}

/// Whether a (lower-cased) `Content-Type` names, anywhere, a `charset` that is a UTF
/// other than UTF-8. Express's body parser decodes any `utf-*` it names (UTF-16, -32,
/// -7), whose bytes this reader would not see as names; PHP reads the bytes as UTF-8
/// whatever the type says. Every `charset=` counts, quoted or not, first or last, so
/// no reading of the parameters hides one.
fn names_another_utf(content_type: &[u8]) -> bool {
    charsets(content_type).any(|name| name.starts_with(b"utf") && name != b"utf-8" && name != b"utf8")
}

/// Every `charset` a (lower-cased) `Content-Type` names, quoted or not, first or last,
/// with quoted-pair backslashes dropped (`utf\-16` is `utf-16`).
fn charsets(content_type: &[u8]) -> impl Iterator<Item = Vec<u8>> {
    let mut rest = content_type;
    std::iter::from_fn(move || {
        loop {
            let at = find(rest, b"charset")?;
            rest = &rest[at + 7..];
            let Some(value) = rest.trim_ascii_start().strip_prefix(b"=") else { continue };
            let value = value.trim_ascii_start();
            let value = value.strip_prefix(b"\"").unwrap_or(value);
            let name = value
                .iter()
                .copied()
                .filter(|&b| b != b'\\')
                .take_while(|&b| !matches!(b, b';' | b',' | b'"' | b' ' | b'\t'))
                .collect();
            return Some(name);
        }
    })
}

/// Whether a (lower-case) charset name reads ASCII bytes as ASCII, so that a name or
/// value read as bytes here is what a server decoding the charset reads; empty (none
/// named) is.
fn ascii_compatible(charset: &[u8]) -> bool {
    let known: [&[u8]; 10] = [
        b"",
        b"utf-8",
        b"utf8",
        b"us-ascii",
        b"ascii",
        b"iso-8859-1",
        b"latin1",
        b"iso-8859-15",
        b"windows-1252",
        b"cp1252",
    ];
    known.contains(&charset)
}

/// `body` watched for `_method` fields of `form`; why one was refused goes in `refused`.
pub fn watch<B>(body: B, form: Form, judge: Judge, refused: Arc<OnceLock<String>>) -> Watched<B> {
    Rewritten::new(body, MethodFields::new(form, judge, refused))
}

/// Where a urlencoded body is.
enum Pair {
    /// In a key: its raw bytes so far, padding before the name dropped.
    Key(Vec<u8>),
    /// In the value of a `_method` key: its raw bytes so far (bounded).
    Method(Vec<u8>),
    /// In a key already read as `_method` (a name cut at a NUL or `[`, as PHP and
    /// Rack cut it), too long to keep.
    Named,
    /// In another key's value, or a key too long to be `_method`.
    Other,
}

impl Default for Pair {
    fn default() -> Self {
        Pair::Key(Vec::new())
    }
}

/// Where a multipart body is, by lines.
#[derive(Default)]
struct Lines {
    /// Between a boundary (`--`) line and the blank line after it: a part's headers.
    in_headers: bool,
    /// The current line so far (bounded).
    line: Vec<u8>,
    /// The current line is longer than its bound.
    long: bool,
    /// The last byte was a CR (a LF after it ends no second line).
    after_cr: bool,
    /// A line named `_method` since the last boundary.
    named: bool,
    /// The next line is a value to judge.
    value: bool,
}

/// Watches a form body for `_method` fields; the [`Judge`] says why a method is refused.
pub struct MethodFields {
    fields: Option<Fields>,
    json: Option<json::JsonFields>,
    judge: Judge,
    pair: Pair,
    lines: Lines,
    refused: Arc<OnceLock<String>>,
}

impl MethodFields {
    pub fn new(form: Form, judge: Judge, refused: Arc<OnceLock<String>>) -> Self {
        MethodFields {
            fields: form.fields,
            json: form.json.then(json::JsonFields::default),
            judge,
            pair: Pair::default(),
            lines: Lines::default(),
            refused,
        }
    }

    fn refuse(&mut self, why: String) -> BoxError {
        let _ = self.refused.set(why.clone());
        BoxError::from(why)
    }

    /// Judges a method named by a field (its value, decoded).
    fn check(&mut self, value: &[u8]) -> Result<(), BoxError> {
        if value.len() > VALUE_MAX {
            return Err(self.refuse(format!("a _method form field longer than {VALUE_MAX} bytes")));
        }
        let m = named_method(&String::from_utf8_lossy(value));
        if m.is_empty() || m == "POST" {
            return Ok(());
        }
        match (self.judge)(&m) {
            Some(why) => Err(self.refuse(why)),
            None => Ok(()),
        }
    }

    /// One byte of a urlencoded body; `None` is its end.
    fn urlencoded(&mut self, b: Option<u8>) -> Result<(), BoxError> {
        let decode = |raw: &[u8]| crate::policy::requests::percent_decode(raw, true);
        match (b, &mut self.pair) {
            (None | Some(b'&' | b';'), _) => {
                if let Pair::Method(v) = std::mem::take(&mut self.pair) {
                    self.check(&decode(&v))?;
                }
            }
            (Some(b'='), Pair::Key(key)) => {
                self.pair = if is_method_name(&decode(key)) { Pair::Method(Vec::new()) } else { Pair::Other };
            }
            (Some(b'='), Pair::Named) => self.pair = Pair::Method(Vec::new()),
            (Some(b), Pair::Method(v)) => {
                if v.len() <= VALUE_MAX * 3 {
                    v.push(b);
                }
            }
            (Some(b), Pair::Key(key)) => {
                key.push(b);
                // Padding before the name (`+`, `%20`, `[`) is dropped as it comes, so
                // a long run of it cannot push the name out of sight.
                let open_escape = key.ends_with(b"%") || key.len() > 1 && key[key.len() - 2] == b'%';
                let padding = decode(key).iter().all(|c| matches!(c, b' ' | b'\t' | b'[' | b']' | b'"' | b'\'' | b'<'));
                if padding && !open_escape {
                    key.clear();
                } else if key.len() > 64 {
                    // What comes after a name the frameworks cut (`_method%00AAAA...`)
                    // does not count: decided by what was read.
                    self.pair = if is_method_name(&decode(key)) { Pair::Named } else { Pair::Other };
                }
            }
            (Some(_), Pair::Other | Pair::Named) => {}
        }
        Ok(())
    }

    /// One line of a multipart body, whole (without its line break); `last` if the
    /// body ended inside it. A line naming `_method` (a `name` parameter anywhere in
    /// it, a `Content-ID`, a continuation too) makes the line after every blank line a
    /// value to judge, until a boundary (`--`) line.
    fn line(&mut self, last: bool) -> Result<(), BoxError> {
        let line = std::mem::take(&mut self.lines.line);
        let long = std::mem::take(&mut self.lines.long);
        if self.lines.value {
            self.lines.value = false;
            if long {
                return Err(self.refuse(format!("a _method form part longer than {VALUE_MAX} bytes")));
            }
            self.check(&line)?;
        }
        if line.is_empty() {
            self.lines.value = self.lines.named && !last;
            self.lines.in_headers = false;
            return Ok(());
        }
        // A boundary begins a part's headers; a line beginning `--` inside them is a
        // header line to the frameworks (`--x: y`), which leaves the part's name as it is.
        if line.starts_with(b"--") && !self.lines.in_headers {
            self.lines.named = false;
            self.lines.in_headers = true;
            return Ok(());
        }
        if long {
            // A part's header line is short; one too long to read could name
            // `_method` past what was read.
            if self.lines.named || self.lines.in_headers {
                return Err(self.refuse("a multipart line too long to read for a _method name".into()));
            }
            return Ok(());
        }
        let lower = line.to_ascii_lowercase();
        if let Some(at) = find(&lower, b"content-id") {
            let value = lower[at + 10..].trim_ascii_start();
            let value = value.strip_prefix(b":").unwrap_or(value);
            self.lines.named |= is_method_name(value.trim_ascii());
        }
        for param in lower.split(|&b| b == b';') {
            let Some(eq) = param.iter().position(|&b| b == b'=') else { continue };
            let (key, value) = (param[..eq].trim_ascii(), &param[eq + 1..]);
            // `name`, as a parameter or at the end of a header (`: name=`).
            let key = key.rsplit(|&b| b == b' ' || b == b':').next().unwrap_or(key);
            if key == b"name" || key == b"name*" {
                // RFC 2231: `name*=utf-8''_method`, percent-encoded.
                let value = value.trim_ascii();
                let (charset, value) = value
                    .windows(2)
                    .rposition(|w| w == b"''")
                    .map_or((&b""[..], value), |at| (&value[..at], &value[at + 2..]));
                // Names in another charset (RFC 2231's `utf-16le''`) or as RFC 2047
                // encoded words (`=?utf-8?b?...?=`), which Tomcat decodes, cannot be read
                // here.
                if !ascii_compatible(charset.split(|&b| b == b'\'').next().unwrap_or_default())
                    || find(value, b"=?").is_some()
                {
                    return Err(self
                        .refuse("a multipart part name in an encoding that cannot be read for a _method name".into()));
                }
                let decoded = crate::policy::requests::percent_decode(value, false);
                self.lines.named |= is_method_name(&decoded);
            }
        }
        Ok(())
    }

    /// One byte of a multipart body; `None` is its end. A line ends at LF, CR or CRLF.
    fn multipart(&mut self, b: Option<u8>) -> Result<(), BoxError> {
        let after_cr = std::mem::take(&mut self.lines.after_cr);
        match b {
            None => {
                if !self.lines.line.is_empty() || self.lines.value {
                    self.line(true)?;
                }
            }
            Some(b'\n') if after_cr => {}
            Some(b'\n') => self.line(false)?,
            Some(b'\r') => {
                self.lines.after_cr = true;
                self.line(false)?;
            }
            Some(b) => {
                let cap = if self.lines.value { VALUE_MAX + 1 } else { LINE_MAX };
                if self.lines.line.len() < cap {
                    self.lines.line.push(b);
                } else {
                    self.lines.long = true;
                }
            }
        }
        Ok(())
    }

    fn byte(&mut self, b: Option<u8>) -> Result<(), BoxError> {
        if let (Some(reader), Some(b)) = (&mut self.json, b) {
            match reader.byte(b) {
                Some(json::Named::Method(m)) => self.check(&m)?,
                Some(json::Named::TooLong) => {
                    return Err(self.refuse(format!("a _method JSON value longer than {VALUE_MAX} bytes")));
                }
                None => {}
            }
        }
        match self.fields {
            // A multipart body is read as urlencoded too: Rack reads a multipart type
            // whose boundary it cannot find as urlencoded.
            Some(Fields::Multipart) => {
                self.multipart(b)?;
                self.urlencoded(b)
            }
            Some(Fields::UrlEncoded) => self.urlencoded(b),
            None => Ok(()),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Rewrite for MethodFields {
    /// Reads every byte but the last of each chunk (the last waits for the next, so
    /// the body's final byte goes only once every field in it was judged).
    fn rewrite(&mut self, input: &[u8], more: bool) -> Result<(Bytes, Vec<u8>), BoxError> {
        let upto = if more { input.len().saturating_sub(1) } else { input.len() };
        for &b in &input[..upto] {
            self.byte(Some(b))?;
        }
        if !more {
            self.byte(None)?;
        }
        Ok((Bytes::copy_from_slice(&input[..upto]), input[upto..].to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The methods judged and whether the body went whole, for `input` cut at `cuts`,
    /// fed as `Rewritten` feeds it.
    fn watch(form: Form, input: &[u8], cuts: &[usize]) -> (Vec<String>, Result<Vec<u8>, String>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let judge: Judge = Box::new(move |m: &str| {
            log.lock().unwrap().push(m.to_string());
            (m == "DELETE").then(|| "no DELETE".to_string())
        });
        let mut w = MethodFields::new(form, judge, Arc::new(OnceLock::new()));
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
        let seen = seen.lock().unwrap().clone();
        (seen, result.map(|()| out))
    }

    fn refused_wherever_cut(form: Form, input: &[u8]) {
        for a in 0..=input.len() {
            for b in (a..=input.len()).step_by(5) {
                let (seen, got) = watch(form, input, &[a, b]);
                assert!(
                    seen.contains(&"DELETE".to_string()) && got.is_err(),
                    "{:?} cut at {a}, {b}: {seen:?}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }

    fn passed_wherever_cut(form: Form, input: &[u8]) {
        for a in 0..=input.len() {
            let (_, got) = watch(form, input, &[a]);
            assert_eq!(got.as_deref(), Ok(input), "{:?} cut at {a}", String::from_utf8_lossy(input));
        }
    }

    #[test]
    fn urlencoded_method_fields_are_judged_however_spelt_and_cut() {
        for input in [
            &b"a=1&_method=DELETE&b=2"[..],
            b"_method=delete",
            b"x=1;%5Fmethod=DE%4CETE",
            b"_Method=+DELETE+",
            b".method=DELETE",
            b"[_method]=DELETE",
            b"_method]=DELETE",
            b"_method[]=DELETE",
            b"_method%00x=DELETE",
            b"a=1&++++++++++++++++++++++++++++++++++++++++_method=DELETE",
            b"%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20%20_method=DELETE",
        ] {
            refused_wherever_cut(Form::URLENCODED, input);
        }
        for input in [
            &b"a=1&_method=PUT"[..],
            b"_methods=DELETE",
            b"a=_method%3DDELETE",
            b"x_method=DELETE",
            b"payment_method=card",
        ] {
            passed_wherever_cut(Form::URLENCODED, input);
        }
        // A name cut at a NUL, however much follows it (PHP cuts it there).
        let padded = [b"_method%00".as_slice(), &[b'A'; 100], b"=DELETE"].concat();
        refused_wherever_cut(Form::URLENCODED, &padded);
        // A long value of another field passes.
        let long = [b"k=".as_slice(), &[b'v'; 10_000]].concat();
        let (seen, got) = watch(Form::URLENCODED, &long, &[100, 5000]);
        assert!(seen.is_empty() && got.is_ok());
    }

    #[test]
    fn multipart_method_parts_are_judged_however_named_and_cut() {
        for input in [
            &b"--b\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--\r\n"[..],
            b"--b\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\n--b--\n",
            b"--b\r\nContent-ID: _method\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\ncontent-disposition: form-data; name=_method,\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data; name=\"_meth\\od\"\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data; name='_method'\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data; name=\" .method\"\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data; name*=utf-8''%5Fmethod\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data;\r\n name=\"_method\"\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data; name=                    \"_method\"\r\n\r\nDELETE\r\n--b--\r\n",
            // Rack reads a multipart type without a boundary as urlencoded.
            b"_method=DELETE",
            // Not at a line's start, after a lone CR, a continuation without white
            // space, a leading `;`.
            b"--b\r\nX-A: Content-Disposition: form-data; name=_method\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nX-A: 1\rContent-Disposition: form-data; name=_method\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data;\r\nname=_method\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data\r\n; name=\"_method\"\r\n\r\nDELETE\r\n--b--\r\n",
            // A line beginning `--` inside the part's headers, on its own or after a
            // lone CR, is no boundary.
            b"--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n--x: y\r\n\r\nDELETE\r\n--b--\r\n",
            b"--b\r\nContent-Disposition: form-data; name=\"_method\"\r\nX-A: z\r--\r\n\r\nDELETE\r\n--b--\r\n",
            // A bare LF blank line inside what Rack reads as the part's head.
            b"--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\nX-Pad: 1\r\n\r\nDELETE\r\n--b--\r\n",
            // Bare LF after the name, CRLF later: the value is the line after the
            // first blank line.
            b"--b\r\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\r\n--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nPOST\r\n--b--\r\n",
        ] {
            refused_wherever_cut(Form::MULTIPART, input);
        }
        // A file whose text names `_method` passes unless a blank line and a refused
        // method follow within its part (boundaries are not tracked: read as a head).
        let html = b"--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"v.html\"\r\n\r\n<input name=\"_method\" value=\"delete\">\n<p>Delete it?</p>\r\n--b--\r\n";
        passed_wherever_cut(Form::MULTIPART, html);
        let put = b"--b\r\nContent-Disposition: form-data; name=_method\r\n\r\nPUT\r\n--b--\r\n";
        passed_wherever_cut(Form::MULTIPART, put);
        // Names that cannot be read here: in UTF-16 (RFC 2231), as encoded words (RFC
        // 2047, which Tomcat decodes), or on a part header line too long to read.
        for input in [
            &b"--b\r\nContent-Disposition: form-data; name*=UTF-16LE''%5F%00m%00e%00t%00h%00o%00d%00\r\n\r\nDELETE\r\n--b--\r\n"[..],
            b"--b\r\nContent-Disposition: form-data; name=\"=?UTF-8?B?X21ldGhvZA==?=\"\r\n\r\nDELETE\r\n--b--\r\n",
        ] {
            let (_, got) = watch(Form::MULTIPART, input, &[]);
            assert!(got.is_err(), "{}", String::from_utf8_lossy(input));
        }
        let long_head = [
            b"--b\r\nContent-Disposition: form-data; x=\"".as_slice(),
            &[b'A'; 9000],
            b"\"; name=\"_method\"\r\n\r\nDELETE\r\n--b--\r\n",
        ]
        .concat();
        let (_, got) = watch(Form::MULTIPART, &long_head, &[]);
        assert!(got.is_err());
        // A long line in a part's body is no part header.
        let long_file =
            [b"--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\n".as_slice(), &[b'A'; 9000], b"\r\n--b--\r\n"]
                .concat();
        passed_wherever_cut(Form::MULTIPART, &long_file);
    }

    #[test]
    fn json_method_keys_are_judged_however_cut() {
        for input in [
            &br#"{"a":1,"_method":"DELETE"}"#[..],
            br#"{"\u005fmethod":"del\u0065te"}"#,
            br#"{"_method":["DELETE"]}"#,
            br#"{"_method":" delete "}"#,
        ] {
            refused_wherever_cut(Form::JSON, input);
        }
        for input in [&br#"{"a":{"_method":"DELETE"}}"#[..], br#"{"_method":"PUT"}"#, br#"{"x":"_method=DELETE"}"#] {
            passed_wherever_cut(Form::JSON, input);
        }
        // Read as both, a form field inside a JSON string counts too.
        refused_wherever_cut(Form { json: true, ..Form::URLENCODED }, br#"{"x":"&_method=DELETE&"}"#);
        let long = format!(r#"{{"_method":"{}"}}"#, "A".repeat(VALUE_MAX * 6 + 1));
        let (seen, got) = watch(Form::JSON, long.as_bytes(), &[]);
        assert!(seen.is_empty() && got.unwrap_err().contains("longer than"));
    }

    #[test]
    fn only_a_post_form_where_another_method_is_refused_is_watched() {
        let h = |pairs: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            h
        };
        let judging = |judge: Judge| Judging { judge, methods: OTHERS.iter().map(|m| m.to_string()).collect() };
        let no_delete = || judging(Box::new(|m: &str| (m == "DELETE").then(|| "no".to_string())));
        let anything = || judging(Box::new(|_: &str| None));
        // A method only the policy names is asked about too.
        let no_move = || Judging {
            judge: Box::new(|m: &str| (m == "MOVE").then(|| "no".to_string())),
            methods: vec!["MOVE".into()],
        };
        assert!(matches!(plan(&Method::POST, &HeaderMap::new(), true, no_move), Plan::Watch(..)));
        let form = |p: Plan| match p {
            Plan::Watch(f, _) => Some(f),
            Plan::Pass => None,
            Plan::Refuse(why) => panic!("{why}"),
        };
        let post = Method::POST;
        assert_eq!(form(plan(&post, &HeaderMap::new(), true, no_delete)), Some(Form::URLENCODED));
        for ct in [
            "Application/X-WWW-Form-Urlencoded; charset=utf-8",
            "application/x-www-form-urlencoded,",
            "application/x-www-form-urlencoded x",
        ] {
            assert_eq!(form(plan(&post, &h(&[("content-type", ct)]), true, no_delete)), Some(Form::URLENCODED), "{ct}");
        }
        for ct in ["multipart/form-data; boundary=b", "multipart/mixed; boundary=b", "multipart/form-data,boundary=b"] {
            assert_eq!(form(plan(&post, &h(&[("content-type", ct)]), true, no_delete)), Some(Form::MULTIPART), "{ct}");
        }
        for ct in ["application/json", "Application/Vnd.Api+JSON; charset=UTF-8", "text/plain; x=/json"] {
            assert_eq!(form(plan(&post, &h(&[("content-type", ct)]), true, no_delete)), Some(Form::JSON), "{ct}");
        }
        // A form whose type names `/json` is read both ways (Laravel reads it as JSON).
        let both = h(&[("content-type", "application/x-www-form-urlencoded; profile=/json")]);
        assert_eq!(form(plan(&post, &both, true, no_delete)), Some(Form { json: true, ..Form::URLENCODED }));
        // A form in a charset that is not ASCII-compatible (Tomcat decodes it).
        for ct in
            ["application/x-www-form-urlencoded; charset=utf-16le", "multipart/form-data; boundary=b; charset=ibm037"]
        {
            assert!(matches!(plan(&post, &h(&[("content-type", ct)]), true, no_delete), Plan::Refuse(_)), "{ct}");
        }
        let latin = h(&[("content-type", "application/x-www-form-urlencoded; charset=ISO-8859-1")]);
        assert_eq!(form(plan(&post, &latin, true, no_delete)), Some(Form::URLENCODED));
        for ct in ["application/json; charset=utf-16", "application/json; Charset = \"UTF-32BE\""] {
            assert!(matches!(plan(&post, &h(&[("content-type", ct)]), true, no_delete), Plan::Refuse(_)), "{ct}");
        }
        assert!(matches!(
            plan(&post, &h(&[("content-type", "application/json; charset=\"utf-8\"")]), true, no_delete),
            Plan::Watch(..)
        ));
        assert_eq!(form(plan(&post, &h(&[("content-type", "text/plain")]), true, no_delete)), None);
        // `post` in any case is a POST; PHP's built-in server reads `Content_Type` and
        // `Content.Type` as the type.
        let lower_post = Method::from_bytes(b"post").unwrap();
        assert_eq!(form(plan(&lower_post, &HeaderMap::new(), true, no_delete)), Some(Form::URLENCODED));
        for name in ["content_type", "content.type"] {
            let only = h(&[(name, "application/json")]);
            assert_eq!(form(plan(&post, &only, true, no_delete)), Some(Form::JSON), "{name}");
            let beside = h(&[("content-type", "text/plain"), (name, "application/json")]);
            assert!(matches!(plan(&post, &beside, true, no_delete), Plan::Refuse(_)), "{name}");
        }
        // A UTF other than UTF-8 anywhere in the type (quoted, repeated, escaped) is
        // refused; other charsets are read as bytes, as PHP reads them.
        for ct in [
            "application/json; x=\"a; charset=utf-8; b\"; charset=utf-16le",
            "application/json; charset=utf-8; charset=utf-16le",
            "application/json;charset=\"utf-8\";charset=UTF-7",
            "application/json; charset=\"utf\\-32\"",
        ] {
            assert!(matches!(plan(&post, &h(&[("content-type", ct)]), true, no_delete), Plan::Refuse(_)), "{ct}");
        }
        for ct in
            ["application/json; charset=iso-8859-1", "application/json; charset = utf8", "application/json; x=charset"]
        {
            assert_eq!(form(plan(&post, &h(&[("content-type", ct)]), true, no_delete)), Some(Form::JSON), "{ct}");
        }
        let empty_coding = h(&[("content-type", "application/json"), ("content-encoding", "")]);
        assert_eq!(form(plan(&post, &empty_coding, true, no_delete)), Some(Form::JSON));
        let coded = h(&[("content-type", "application/json"), ("content_encoding", "gzip")]);
        assert!(matches!(plan(&post, &coded, true, no_delete), Plan::Refuse(_)));
        assert_eq!(form(plan(&post, &HeaderMap::new(), true, anything)), None, "nothing else is refused");
        assert_eq!(form(plan(&Method::PUT, &HeaderMap::new(), true, no_delete)), None);
        assert_eq!(form(plan(&post, &HeaderMap::new(), false, no_delete)), None);
        let gz = h(&[("content-type", "application/x-www-form-urlencoded"), ("content-encoding", "gzip")]);
        assert!(matches!(plan(&post, &gz, true, no_delete), Plan::Refuse(_)));
        assert!(matches!(plan(&post, &gz, true, anything), Plan::Pass));
        let two = h(&[("content-type", "application/json"), ("content-type", "application/x-www-form-urlencoded")]);
        assert!(matches!(plan(&post, &two, true, no_delete), Plan::Refuse(_)));
    }
}
