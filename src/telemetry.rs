//! Logging: one JSON object per line (or human-readable text on a terminal), on stderr.
//!
//! Access-log events (target [`ACCESS_TARGET`]) carry `"log":"access"` and
//! their fields; diagnostics carry `level`, `target` and `msg`. Both carry `ts`. Lines
//! are written in batches off the request path ([`batch`]); [`flush`] writes what is
//! pending, and runs before the process exits or panics.

pub mod batch;
pub mod json;

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// The `tracing` target of access-log events.
pub const ACCESS_TARGET: &str = "access";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Connect,
    Forward,
    Git,
    /// A request the HTTP parser refused before the gateway saw it: no method, target
    /// or sandbox is known.
    Unparsed,
    /// A transparent listener's connection (SNI or `Host`, no proxy settings).
    Transparent,
    /// A request inside an inspected connection (TLS terminated by the gateway).
    Inspect,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Forward => "forward",
            Kind::Git => "git",
            Kind::Unparsed => "unparsed",
            Kind::Transparent => "transparent",
            Kind::Inspect => "inspect",
        }
    }
}

/// The installed output, and whether its lines are JSON (access records are then
/// written by [`write_access_json`]).
static OUTPUT: OnceLock<(batch::Batch, bool)> = OnceLock::new();

/// Installs the global subscriber. Returns an error if one is already installed.
pub fn init(cfg: &LogConfig) -> Result<(), String> {
    // hickory logs every query at info; the gateway does its own logging.
    // rustls warns about every malformed ClientHello with the client's bytes in it: a
    // transparent listener would let any client write the log; its refusals are in
    // the access log instead.
    let directives = format!("{},hickory_proto=warn,hickory_resolver=warn,hickory_server=warn,rustls=error", cfg.level);
    let filter = EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
    let json = match cfg.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let out = batch::Batch::new(Box::new(std::io::stderr()), cfg.flush_interval).map_err(|e| e.to_string())?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(out.clone());
    let res = if json {
        builder.event_format(json::JsonFormat).try_init()
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    res.map_err(|e| e.to_string())?;
    if OUTPUT.set((out, json)).is_ok() {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            flush();
            previous(info);
        }));
    }
    Ok(())
}

/// Writes one access-log line straight to the batch, without a tracing event: `ts`,
/// `"log":"access"`, then what `fields` writes. Returns `false` (and writes nothing)
/// when logs are not JSON or no batch is installed; the caller then emits a tracing
/// event. When the log filter drops access records, writes nothing and returns `true`.
pub fn write_access_json(fields: impl FnOnce(&mut String) -> std::fmt::Result) -> bool {
    use std::fmt::Write;
    let Some((out, true)) = OUTPUT.get() else { return false };
    if !tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO) {
        return true;
    }
    thread_local! {
        static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    LINE.with(|line| {
        let Ok(mut line) = line.try_borrow_mut() else { return false };
        line.clear();
        let written = json::access_head(&mut *line, std::time::SystemTime::now())
            .and_then(|()| fields(&mut line))
            .and_then(|()| line.write_str("}\n"));
        if written.is_ok() {
            out.append_line(line.as_bytes());
        }
        written.is_ok()
    })
}

/// Writes every pending log line.
pub fn flush() {
    if let Some((out, _)) = OUTPUT.get() {
        out.flush();
    }
}
