//! The `_method` key of a JSON body. Laravel reads a body whose `Content-Type` names
//! `/json` or `+json` as its request's input, and Symfony's method override then runs
//! a POST whose top-level object holds `"_method": "DELETE"` as a DELETE; Express's
//! `method-override`, given a getter on `req.body._method`, takes an array's first
//! element too. [`JsonFields`] reads a body byte by byte, keeping only the string it
//! is in, and hands back each method such a key names, decoded.
//!
//! It is not a validator: a body PHP or Node would reject as JSON is read all the
//! same, which can only judge more, never less.

use crate::policy::requests::is_method_name;

/// The most raw bytes of a key or a method value kept: [`super::VALUE_MAX`]
/// characters, each as a `\uXXXX` escape.
const TEXT_MAX: usize = 6 * super::VALUE_MAX;

/// A method a `_method` key names.
#[derive(Debug, PartialEq, Eq)]
pub enum Named {
    /// The value, decoded.
    Method(Vec<u8>),
    /// The value was longer than [`TEXT_MAX`] raw bytes.
    TooLong,
}

/// What the string being read is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A key of the top-level object.
    Key,
    /// A `_method` key's value, or an element of its array value.
    Method,
    /// Anything else: skipped.
    Other,
}

/// Where a JSON body is.
#[derive(Default)]
pub struct JsonFields {
    /// Open objects and arrays.
    depth: usize,
    /// The outermost value is an object.
    top_object: bool,
    /// At the top level, the next string is a key.
    want_key: bool,
    /// The current top-level member's key is `_method`.
    method_key: bool,
    /// Inside that member's array value.
    method_array: bool,
    /// Inside a string, read as this.
    string: Option<Role>,
    /// The last byte in the string was an unescaped backslash.
    escaped: bool,
    /// The string's raw bytes so far, when its role is not `Other` (bounded).
    text: Vec<u8>,
    long: bool,
}

impl JsonFields {
    /// Reads one byte; a `_method` value that ends with it comes back.
    pub fn byte(&mut self, b: u8) -> Option<Named> {
        if let Some(role) = self.string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.string = None;
                return self.end(role);
            }
            if role != Role::Other {
                if self.text.len() < TEXT_MAX {
                    self.text.push(b);
                } else {
                    self.long = true;
                }
            }
            return None;
        }
        match b {
            b'"' => {
                let role = match self.depth {
                    1 if self.top_object && self.want_key => {
                        self.want_key = false;
                        Role::Key
                    }
                    1 if self.method_key => Role::Method,
                    2 if self.method_array => Role::Method,
                    _ => Role::Other,
                };
                self.string = Some(role);
                self.text.clear();
                self.long = false;
            }
            b'{' | b'[' => {
                self.depth += 1;
                match self.depth {
                    1 => {
                        self.top_object = b == b'{';
                        self.want_key = self.top_object;
                        self.method_key = false;
                    }
                    2 => self.method_array = self.method_key && b == b'[',
                    _ => {}
                }
            }
            b'}' | b']' => {
                if self.depth == 2 {
                    self.method_array = false;
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 && self.top_object => {
                self.want_key = true;
                self.method_key = false;
            }
            _ => {}
        }
        None
    }

    fn end(&mut self, role: Role) -> Option<Named> {
        let long = std::mem::take(&mut self.long);
        match role {
            Role::Key => {
                self.method_key = !long && is_method_name(&unescape(&self.text));
                None
            }
            Role::Method if long => Some(Named::TooLong),
            Role::Method => Some(Named::Method(unescape(&self.text))),
            Role::Other => None,
        }
    }
}

/// A JSON string's raw bytes (between its quotes) with escapes decoded; a lone
/// surrogate or a broken `\u` escape becomes U+FFFD.
fn unescape(raw: &[u8]) -> Vec<u8> {
    let hex4 = |at: usize| -> Option<u16> {
        let digits = std::str::from_utf8(raw.get(at..at + 4)?).ok()?;
        u16::from_str_radix(digits, 16).ok().filter(|_| digits.bytes().all(|d| d.is_ascii_hexdigit()))
    };
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let Some(&e) = raw.get(i + 1) else { break };
        i += 2;
        let c = match e {
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let Some(unit) = hex4(i) else {
                    out.extend_from_slice("\u{fffd}".as_bytes());
                    continue;
                };
                i += 4;
                let low = (raw.get(i..i + 2) == Some(b"\\u")).then(|| hex4(i + 2)).flatten();
                let pair = low.filter(|l| (0xd800..0xdc00).contains(&unit) && (0xdc00..0xe000).contains(l));
                if pair.is_some() {
                    i += 6;
                }
                let units = [unit].into_iter().chain(pair);
                let mut s = String::new();
                s.extend(char::decode_utf16(units).map(|r| r.unwrap_or('\u{fffd}')));
                out.extend_from_slice(s.as_bytes());
                continue;
            }
            other => other as char,
        };
        let mut buf = [0; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(input: &[u8]) -> Vec<Named> {
        let mut j = JsonFields::default();
        input.iter().filter_map(|&b| j.byte(b)).collect()
    }

    fn methods(input: &str) -> Vec<String> {
        named(input.as_bytes())
            .into_iter()
            .map(|n| match n {
                Named::Method(m) => String::from_utf8(m).unwrap(),
                Named::TooLong => "(too long)".into(),
            })
            .collect()
    }

    #[test]
    fn top_level_method_keys_are_read_however_spelt() {
        for (input, want) in [
            (r#"{"_method":"DELETE"}"#, vec!["DELETE"]),
            (r#" { "a" : 1 , "_method" : "delete" } "#, vec!["delete"]),
            (r#"{"\u005fmethod":"DEL\u0045TE"}"#, vec!["DELETE"]),
            (r#"{"_\u006D\u0065thod":"DELETE"}"#, vec!["DELETE"]),
            (r#"{"a":{"b":[1,"x\"y",{"c":"}"}]},"_method":"DELETE"}"#, vec!["DELETE"]),
            (r#"{"a":"\\","_method":"DELETE"}"#, vec!["DELETE"]),
            (r#"{"_method":"PUT","_method":"DELETE"}"#, vec!["PUT", "DELETE"]),
            // Express's method-override takes an array's first element.
            (r#"{"_method":["DELETE",["PUT"],{"x":"GET"}]}"#, vec!["DELETE"]),
            (r#"{"_method":["PUT"],"b":"DELETE"}"#, vec!["PUT"]),
            ("\u{feff}{\"_method\":\"DELETE\"}", vec!["DELETE"]),
            // Not JSON, read all the same.
            (r#"{"_method" "DELETE"}"#, vec!["DELETE"]),
            (r#"{}{"_method":"DELETE"}"#, vec!["DELETE"]),
        ] {
            assert_eq!(methods(input), want, "{input}");
        }
        for input in [
            r#"{"a":{"_method":"DELETE"}}"#,
            r#"[{"_method":"DELETE"}]"#,
            r#"["_method","DELETE"]"#,
            r#"{"a":"_method","b":"DELETE"}"#,
            r#"{"note":"\"_method\":\"DELETE\""}"#,
            r#"{"_methods":"DELETE"}"#,
            r#"{"payment_method":"DELETE"}"#,
            r#"{"_method":{"0":"DELETE"}}"#,
            r#"{"_method":1,"b":"DELETE"}"#,
        ] {
            assert_eq!(methods(input), Vec::<String>::new(), "{input}");
        }
    }

    #[test]
    fn long_values_are_reported_and_long_keys_are_not_method_keys() {
        let long = format!(r#"{{"_method":"{}"}}"#, "A".repeat(TEXT_MAX + 1));
        assert_eq!(named(long.as_bytes()), vec![Named::TooLong]);
        let key = format!(r#"{{"{}_method":"DELETE"}}"#, " ".repeat(TEXT_MAX));
        assert!(named(key.as_bytes()).is_empty());
        // The text kept is bounded whatever the body's length.
        let mut j = JsonFields::default();
        for &b in br#"{"_method":""# {
            j.byte(b);
        }
        for _ in 0..100_000 {
            j.byte(b'A');
        }
        assert!(j.text.len() <= TEXT_MAX);
    }

    #[test]
    fn escapes_decode_as_json_parsers_read_them() {
        for (raw, want) in [
            (&br#"a\/b\\c\"d"#[..], "a/b\\c\"d"),
            (br"\n\t\r\b\f", "\n\t\r\u{8}\u{c}"),
            (br"\u00e9\ud83d\ude00", "\u{e9}\u{1f600}"),
            (br"\ud83dx", "\u{fffd}x"),
            (br"\ude00", "\u{fffd}"),
            (br"\u12", "\u{fffd}12"),
            (br"\u+123x", "\u{fffd}+123x"),
            (br"end\", "end"),
        ] {
            assert_eq!(String::from_utf8(unescape(raw)).unwrap(), want, "{:?}", String::from_utf8_lossy(raw));
        }
    }
}
