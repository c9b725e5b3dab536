//! Configuration errors: every one names the file, the key and what was expected.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {error}")]
    Read { file: DisplayPath, error: std::io::Error },
    #[error("{file}: {error}")]
    Toml { file: DisplayPath, error: Box<toml::de::Error> },
    #[error("{file}: {key}: {message}")]
    Invalid { file: DisplayPath, key: String, message: String },
}

impl ConfigError {
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
