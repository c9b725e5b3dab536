//! The JSON line format, written straight into tracing-subscriber's line buffer with
//! no intermediate map. `ts` comes first; access events carry `"log":"access"`,
//! diagnostics `level` and `target`; then the event's fields in order, `message` as
//! `msg`. A field with the name of one of those keys replaces it.

use std::fmt::{self, Write};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

pub struct JsonFormat;

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        write_event(&mut writer, event, SystemTime::now())
    }
}

/// Writes one event as a JSON object and a newline.
pub fn write_event(w: &mut dyn Write, event: &Event<'_>, now: SystemTime) -> fmt::Result {
    let meta = event.metadata();
    if meta.target() == super::ACCESS_TARGET {
        // Access events name no field `log`.
        access_head(w, now)?;
    } else {
        write!(w, "{{\"ts\":\"{}\"", humantime::format_rfc3339_millis(now))?;
        let mut names = Names::default();
        event.record(&mut names);
        if !names.level {
            write!(w, ",\"level\":\"{}\"", Lower(meta.level().as_str()))?;
        }
        if !names.target {
            w.write_str(",\"target\":")?;
            string(w, meta.target())?;
        }
    }
    let mut fields = Fields { w, result: Ok(()) };
    event.record(&mut fields);
    fields.result?;
    w.write_str("}\n")
}

/// The start of an access-log line: `{"ts":"...","log":"access"`.
pub fn access_head(w: &mut (impl Write + ?Sized), now: SystemTime) -> fmt::Result {
    w.write_str("{\"ts\":\"")?;
    crate::digits::rfc3339_millis(w, now)?;
    w.write_str("\",\"log\":\"access\"")
}

/// Which reserved keys the event sets itself.
#[derive(Default)]
struct Names {
    level: bool,
    target: bool,
}

impl Visit for Names {
    fn record_debug(&mut self, field: &Field, _: &dyn fmt::Debug) {
        match key(field) {
            "level" => self.level = true,
            "target" => self.target = true,
            _ => {}
        }
    }
}

fn key(field: &Field) -> &'static str {
    match field.name() {
        "message" => "msg",
        // `r#type` and friends: strip the raw-identifier prefix.
        n => n.strip_prefix("r#").unwrap_or(n),
    }
}

struct Fields<'w> {
    w: &'w mut dyn Write,
    result: fmt::Result,
}

impl Fields<'_> {
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut dyn Write) -> fmt::Result) {
        let name = key(field);
        if self.result.is_err() || name == "ts" {
            return;
        }
        self.result = (|| {
            self.w.write_char(',')?;
            string(self.w, name)?;
            self.w.write_char(':')?;
            value(self.w)
        })();
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |w| {
            w.write_char('"')?;
            write!(Escaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |w| string(w, value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |w| write!(w, "{value}"));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |w| write!(w, "{value}"));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |w| write!(w, "{value}"));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity.
        self.field(field, |w| if value.is_finite() { write!(w, "{value}") } else { w.write_str("null") });
    }
}

/// What comes before a field's value, `,"name":`, put together at compile time by
/// [`json_key!`] (one write for it, not three).
#[derive(Clone, Copy)]
pub struct Key(pub &'static str);

/// The [`Key`] of a field named by a string literal that needs no escaping.
macro_rules! json_key {
    ($name:literal) => {
        $crate::telemetry::json::Key(concat!(",\"", $name, "\":"))
    };
}
pub(crate) use json_key;

/// `,"key":"value"` (escaped).
pub fn field_str(w: &mut String, key: Key, value: &str) -> fmt::Result {
    w.reserve(key.0.len() + value.len() + 2);
    w.push_str(key.0);
    string(w, value)
}

/// `,"key":value` for a number.
pub fn field_u64(w: &mut String, key: Key, value: u64) -> fmt::Result {
    w.push_str(key.0);
    crate::digits::u64(w, value)
}

/// `,"key":"address:port"`.
pub fn field_socket_addr(w: &mut String, key: Key, value: std::net::SocketAddr) -> fmt::Result {
    w.push_str(key.0);
    w.push('"');
    crate::digits::socket_addr(w, value)?;
    w.push('"');
    Ok(())
}

fn string(w: &mut (impl Write + ?Sized), s: &str) -> fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_str(s)?;
    w.write_char('"')
}

/// Escapes what it is given for the inside of a JSON string.
struct Escaped<'w, W: Write + ?Sized>(&'w mut W);

impl<W: Write + ?Sized> Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Nearly every value needs no escape: a branch-free pass (which the compiler
        // vectorises) says so, and the value is written whole.
        let clean = s.bytes().fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'));
        if clean {
            return self.0.write_str(s);
        }
        // Every byte to escape is ASCII, and no byte of a multi-byte character is: a
        // byte scan finds them, and each run between them is written whole.
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let esc = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                b if b < 0x20 => "",
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            if esc.is_empty() {
                write!(self.0, "\\u{:04x}", b)?;
            } else {
                self.0.write_str(esc)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

/// Lower-cases an ASCII level name as it is written.
struct Lower<'a>(&'a str);

impl fmt::Display for Lower<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            f.write_char(c.to_ascii_lowercase())?;
        }
        Ok(())
    }
}

/// Runs `f` under a subscriber with this format and returns the lines it wrote.
#[cfg(test)]
pub fn capture(f: impl FnOnce()) -> Vec<serde_json::Value> {
    tests::capture(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    pub(super) fn capture(f: impl FnOnce()) -> Vec<Value> {
        capture_text(f)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    fn capture_text(f: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let layer = tracing_subscriber::fmt::layer().event_format(JsonFormat).with_writer(move || out.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        let bytes = buf.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let text = String::from_utf8(bytes).unwrap_or_default();
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn access_events_carry_log_access_and_typed_fields() {
        let lines = capture(|| {
            tracing::info!(
                target: crate::telemetry::ACCESS_TARGET,
                sandbox = "sbx-1",
                target = "example.com:443",
                status = 200u16,
                bytes_up = 12u64,
                ok = true,
                ratio = 0.5,
                nan = f64::NAN,
                client_addr = %"127.0.0.1:5000",
            );
        });
        let v = &lines[0];
        assert_eq!(v["log"], "access");
        assert!(v.get("level").is_none());
        assert_eq!(v["sandbox"], "sbx-1");
        assert_eq!(v["target"], "example.com:443");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes_up"], 12);
        assert_eq!(v["ok"], true);
        assert_eq!(v["ratio"], 0.5);
        assert!(v["nan"].is_null());
        assert_eq!(v["client_addr"], "127.0.0.1:5000");
        assert!(v["ts"].as_str().is_some_and(|t| t.ends_with('Z')));
    }

    #[test]
    fn diagnostics_carry_level_target_and_msg() {
        let lines = capture(|| tracing::warn!(r#type = "x", "something \"odd\"\n\u{1}happened"));
        let v = &lines[0];
        assert_eq!(v["level"], "warn");
        assert_eq!(v["target"], module_path!());
        assert_eq!(v["msg"], "something \"odd\"\n\u{1}happened");
        assert_eq!(v["type"], "x");
    }

    #[test]
    fn a_field_named_like_a_reserved_key_replaces_it() {
        let text = capture_text(|| tracing::info!(target = "example.com:80", "would_deny")).remove(0);
        assert_eq!(text.matches("\"target\"").count(), 1, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["target"], "example.com:80");
    }

    #[test]
    fn debug_values_are_escaped() {
        let lines = capture(|| tracing::info!(path = ?"a\"b\\c", "m"));
        assert_eq!(lines[0]["path"], "\"a\\\"b\\\\c\"");
    }
}
