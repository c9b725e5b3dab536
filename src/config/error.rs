//! Configuration errors: every one names the file, the key and what was expected.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {error}")]
    Read { file: DisplayPath, error: std::io::Error },
    /// Where the TOML went wrong and why, never the text around it: a secret pasted
    /// into the wrong file or key must not reach a log or an admin answer.
    #[error("{file}: line {line}, column {column}: {message}")]
    Toml { file: DisplayPath, line: usize, column: usize, message: String },
    #[error("{file}: {key}: {message}")]
    Invalid { file: DisplayPath, key: String, message: String },
}

/// The longest TOML error message shown (what serde quotes of the input is cut).
const MAX_MESSAGE: usize = 300;

impl ConfigError {
    /// A TOML syntax or type error in `text` (read from `file`): its position and
    /// message, with any string value it quotes left out.
    pub fn toml(file: &DisplayPath, text: &str, e: &toml::de::Error) -> Self {
        let at = e.span().map_or(0, |s| s.start).min(text.len());
        let before = text.get(..at).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        let mut message = in_toml_words(without_strings(e.message().trim()));
        if let Some(key) = key_at(text, line) {
            message = format!("{key}: {message}");
        }
        if message.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("...");
        }
        ConfigError::Toml { file: file.clone(), line, column, message }
    }

    pub fn invalid(file: &DisplayPath, key: impl Into<String>, message: impl fmt::Display) -> Self {
        ConfigError::Invalid { file: file.clone(), key: key.into(), message: message.to_string() }
    }
}

/// A file name as shown in messages (`<built-in>` for compiled-in defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisplayPath(pub String);

impl From<&std::path::Path> for DisplayPath {
    fn from(p: &std::path::Path) -> Self {
        DisplayPath(p.display().to_string())
    }
}

impl From<&PathBuf> for DisplayPath {
    fn from(p: &PathBuf) -> Self {
        DisplayPath(p.display().to_string())
    }
}

impl fmt::Display for DisplayPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key whose value holds line `line` (1-based) of `text`, as `table.key`: the
/// nearest `key =` at or above it (a value may span lines), under the nearest table
/// header above that. Only bare keys are named; a quoted one is the user's text.
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().take(line).collect();
    let bare = |k: &str| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    let (at, key) = lines.iter().enumerate().rev().find_map(|(i, l)| {
        let l = l.trim();
        if l.starts_with('[') {
            return Some((i, None));
        }
        let (k, _) = l.split_once('=')?;
        Some((i, Some(k.trim())))
    })?;
    let key = key.filter(|k| bare(k))?;
    let table = lines[..at].iter().rev().map(|l| l.trim()).find(|l| l.starts_with('['));
    let table = table.map(|t| t.trim_matches(|c| c == '[' || c == ']').trim()).filter(|t| bare(t));
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// serde's names for the Rust types a value must fit, at the end of its messages
/// (`invalid value: integer `-1`, expected u16`), in the words of a TOML file.
const TOML_WORDS: &[(&str, &str)] = &[
    ("u8", "a whole number from 0 to 255"),
    ("u16", "a whole number from 0 to 65535"),
    ("u32", "a whole number from 0 to 4294967295"),
    ("u64", "a whole number, 0 or more"),
    ("usize", "a whole number, 0 or more"),
    ("i32", "a whole number"),
    ("i64", "a whole number"),
    ("f32", "a number"),
    ("f64", "a number"),
    ("a sequence", "an array"),
    ("a map", "a table"),
];

/// `msg` with a Rust type it ends on ([`TOML_WORDS`], `struct RawProxy`) said as
/// TOML would say it.
fn in_toml_words(msg: String) -> String {
    let (head, expected) = match msg.rsplit_once(", expected ") {
        Some((head, expected)) => (format!("{head}, "), expected),
        None => match msg.strip_prefix("expected ") {
            Some(expected) => (String::new(), expected),
            None => return msg,
        },
    };
    let plain = match TOML_WORDS.iter().find(|(rust, _)| *rust == expected) {
        Some((_, words)) => words,
        None if expected.starts_with("struct ") => "a table",
        None => return msg,
    };
    format!("{head}expected {plain}")
}

/// `msg` with the string values serde quotes (`invalid type: string "...", expected
/// ...`) replaced by `"..."`.
fn without_strings(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(at) = rest.find("string \"") {
        let (head, tail) = rest.split_at(at + "string \"".len());
        out.push_str(head);
        // The value ends at the last quote before serde's ", expected" (values may
        // hold quotes of their own); with none, at the end.
        match tail.rfind("\", expected") {
            Some(end) => {
                out.push_str("...\"");
                rest = &tail[end + 1..];
            }
            None => {
                out.push_str("...\"");
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code, reason = "only parsed")]
        struct T {
            port: Option<u16>,
            on: Option<bool>,
        }
        let e = toml::from_str::<T>(text).unwrap_err();
        ConfigError::toml(&DisplayPath("f.toml".into()), text, &e).to_string()
    }

    #[test]
    fn toml_errors_name_the_key_under_its_table() {
        let text = "[proxy]\nlisten = \"x\"\n[log]\nlevels = [\n  \"a\",\n  7,\n]\n";
        assert_eq!(key_at(text, 2).as_deref(), Some("proxy.listen"));
        assert_eq!(key_at(text, 7).as_deref(), Some("log.levels"), "a value over several lines");
        assert_eq!(key_at(text, 3), None, "a table header is no key");
        assert_eq!(key_at("\"odd key\" = 1\n", 1), None, "quoted keys are not repeated");
    }

    #[test]
    fn toml_errors_give_the_place_and_never_the_text() {
        let e = error("SUPERSECRET-aaaa-bbbb\n");
        assert!(e.starts_with("f.toml: line 1, column "), "{e}");
        assert!(!e.contains("SUPERSECRET"), "{e}");
        let e = error("port = 80\ntoken = \"ghp_SECRET\"\n");
        assert!(e.starts_with("f.toml: line 2, column 1: token: unknown field `token`"), "{e}");
        assert!(!e.contains("ghp_SECRET"), "{e}");
        let e = error("on = \"sk-\\\"SECRET\"\n");
        assert!(e.contains(": on: invalid type: string \"...\", expected a boolean"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
        let long = format!("{} = 1\n", "k".repeat(5000));
        assert!(error(&long).len() < 400, "long messages are cut");
        assert_eq!(error("port = 80\n  on = 7\n").matches("line 2, column 8").count(), 1);
    }

    #[test]
    fn toml_errors_say_what_a_value_must_be_in_toml_words() {
        let e = error("port = -1\n");
        assert!(e.ends_with("port: invalid value: integer `-1`, expected a whole number from 0 to 65535"), "{e}");
        let e = error("port = \"80\"\n");
        assert!(e.ends_with("expected a whole number from 0 to 65535"), "{e}");
        assert!(!e.contains("u16"), "{e}");
        assert_eq!(
            in_toml_words("invalid type: integer `5`, expected struct RawProxy".into()),
            "invalid type: integer `5`, expected a table"
        );
        assert_eq!(
            in_toml_words("invalid type: string \"...\", expected a sequence".into()),
            "invalid type: string \"...\", expected an array"
        );
        assert_eq!(in_toml_words("expected usize".into()), "expected a whole number, 0 or more");
        let other = "unknown field `x`, expected one of `a`, `b`";
        assert_eq!(in_toml_words(other.into()), other, "anything else is left as it was");
    }
}
