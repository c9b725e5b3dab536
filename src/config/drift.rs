//! The main config file against what the gateway started with. Only policy, key and
//! secret files reload; an edit to the main file takes effect on restart. So that an
//! operator is not left believing an edit applied, every reload compares the file with
//! the one the gateway started from and says which keys changed, and whether the file
//! would still load (a restart on a broken file would not come back).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The main config file as the gateway read it at start-up.
#[derive(Debug, Clone)]
pub struct Baseline {
    path: PathBuf,
    table: toml::Table,
}

/// How the file on disk differs from the baseline.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Drift {
    /// Dotted keys whose values differ (added, removed or changed), sorted; an array of
    /// tables (`routes`) counts as one key.
    pub keys: Vec<String>,
    /// Why the file as it is now would not load, if it would not.
    pub error: Option<String>,
}

impl Baseline {
    /// From the text the config was loaded from; `None` if it is not a TOML table
    /// (it was just parsed, so that does not happen).
    pub fn new(path: &Path, text: &str) -> Option<Baseline> {
        Some(Baseline { path: path.to_path_buf(), table: text.parse().ok()? })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file now against the baseline: `None` when it means the same (comments and
    /// layout do not count).
    pub fn drift(&self) -> Option<Drift> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) => {
                let error = format!("{}: cannot be read: {e}", self.path.display());
                return Some(Drift { keys: Vec::new(), error: Some(error) });
            }
        };
        let keys = match text.parse::<toml::Table>() {
            Ok(now) => {
                let mut keys = BTreeSet::new();
                differences("", &self.table, &now, &mut keys);
                if keys.is_empty() {
                    return None;
                }
                keys.into_iter().collect()
            }
            Err(_) => Vec::new(),
        };
        // The full load, as a restart would do it: the same messages, file and key.
        let error = super::load(&self.path).err().map(|e| e.to_string());
        Some(Drift { keys, error })
    }
}

/// Adds to `out` every dotted key under `prefix` whose value differs between `a` and
/// `b`, descending into tables (not into arrays).
fn differences(prefix: &str, a: &toml::Table, b: &toml::Table, out: &mut BTreeSet<String>) {
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for name in names {
        let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        match (a.get(name), b.get(name)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => differences(&key, x, y, out),
            (x, y) if x == y => {}
            _ => {
                out.insert(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift_after(before: &str, after: &str) -> Option<Drift> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, before).unwrap_or_else(|e| panic!("{e}"));
        let base = Baseline::new(&path, before).unwrap_or_else(|| panic!("not a table"));
        std::fs::write(&path, after).unwrap_or_else(|e| panic!("{e}"));
        base.drift()
    }

    #[test]
    fn comments_and_layout_are_no_change() {
        let before = "[proxy]\nmax_connections = 10\n";
        let after = "# tuned\n[proxy]\nmax_connections   =   10 # same\n";
        assert_eq!(drift_after(before, after), None);
    }

    #[test]
    fn changed_added_and_removed_keys_are_named() {
        let before = "[proxy]\nmax_connections = 10\nthreads = 2\n[[routes]]\nname = \"a\"\n";
        let after = "[proxy]\nmax_connections = 20\n[log]\nlevel = \"debug\"\n[[routes]]\nname = \"b\"\n";
        let d = drift_after(before, after).unwrap_or_else(|| panic!("no drift"));
        assert_eq!(d.keys, ["log", "proxy.max_connections", "proxy.threads", "routes"]);
    }

    #[test]
    fn a_file_that_would_not_load_says_why() {
        let d = drift_after("[proxy]\n", "[proxy]\nmax_connections = \"many\"\n").unwrap_or_else(|| panic!("none"));
        assert_eq!(d.keys, ["proxy.max_connections"]);
        let error = d.error.unwrap_or_default();
        assert!(error.contains("gateway.toml") && error.contains("max_connections"), "{error}");
        let d = drift_after("[proxy]\n", "[proxy\n").unwrap_or_else(|| panic!("none"));
        assert!(d.keys.is_empty() && d.error.is_some(), "{d:?}");
    }
}
