//! The offline commands (`check`, `policy test|lint|replay|diff`): each writes its report
//! to a writer and returns the process exit code (0 ok/allow, 1 deny/failures); errors
//! (unreadable files, bad input) are returned and become exit code 2.

pub mod ca;
pub mod check;
pub mod diff;
pub mod health;
pub mod lint;
pub mod mint;
pub mod replay;
pub mod suggest;
pub mod test_file;
pub mod usage;

use std::path::PathBuf;

use crate::config::{self, Config};

/// The config from `path`, or the built-in demo's.
pub fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(config::load(p)?),
        None => Ok(crate::demo::config()?.0),
    }
}
