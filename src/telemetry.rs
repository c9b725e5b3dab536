//! Logging: one JSON object per line (or human-readable text on a terminal), on stderr.
//!
//! Access-log events (target [`crate::access_log::TARGET`]) carry `"log":"access"` and
//! their fields; diagnostics carry `level`, `target` and `msg`. Both carry `ts`.

use std::fmt;
use std::io::IsTerminal;
use std::time::SystemTime;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::access_log;
use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. Returns an error if one is already installed.
pub fn init(cfg: &LogConfig) -> Result<(), String> {
    // hickory logs every query at info; the gateway does its own logging.
    let directives = format!("{},hickory_proto=warn,hickory_resolver=warn,hickory_server=warn", cfg.level);
    let filter = EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
    let json = match cfg.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let res = if json {
        builder.event_format(JsonFormat).try_init()
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    res.map_err(|e| e.to_string())
}

struct JsonFormat;

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut map = Map::new();
        map.insert("ts".into(), Value::String(humantime::format_rfc3339_millis(SystemTime::now()).to_string()));
        let meta = event.metadata();
        if meta.target() == access_log::TARGET {
            map.insert("log".into(), Value::String("access".into()));
        } else {
            map.insert("level".into(), Value::String(meta.level().as_str().to_ascii_lowercase()));
            map.insert("target".into(), Value::String(meta.target().into()));
        }
        event.record(&mut JsonVisitor(&mut map));
        let line = serde_json::to_string(&map).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl JsonVisitor<'_> {
    fn key(field: &Field) -> String {
        match field.name() {
            "message" => "msg".to_string(),
            // `r#type` and friends: strip the raw-identifier prefix.
            n => n.trim_start_matches("r#").to_string(),
        }
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(Self::key(field), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(Self::key(field), Value::String(value.into()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(Self::key(field), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(Self::key(field), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(Self::key(field), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(Self::key(field), Value::from(value));
    }
}
