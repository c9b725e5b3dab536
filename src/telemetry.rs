//! Logging: one JSON object per line (or human-readable text on a terminal), on stderr.
//!
//! Access-log events (target [`crate::access_log::TARGET`]) carry `"log":"access"` and
//! their fields; diagnostics carry `level`, `target` and `msg`. Both carry `ts`. Lines
//! are written in batches off the request path ([`batch`]); [`flush`] writes what is
//! pending, and runs before the process exits or panics.

pub mod batch;
pub mod json;

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

static OUTPUT: OnceLock<batch::Batch> = OnceLock::new();

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
    let out = batch::Batch::new(Box::new(std::io::stderr()), cfg.flush_interval).map_err(|e| e.to_string())?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(out.clone());
    let res = if json {
        builder.event_format(json::JsonFormat).try_init()
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    res.map_err(|e| e.to_string())?;
    if OUTPUT.set(out).is_ok() {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            flush();
            previous(info);
        }));
    }
    Ok(())
}

/// Writes every pending log line.
pub fn flush() {
    if let Some(out) = OUTPUT.get() {
        out.flush();
    }
}
