//! The last few refusals of each sandbox, for the admin listener's
//! `GET /v1/sandboxes/ID` (metrics carry no sandbox labels). Bounded: a few per
//! sandbox, and a cap on sandboxes past which the table starts over.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use super::AccessRecord;

/// Refusals kept per sandbox.
pub const PER_SANDBOX: usize = 10;
/// Sandboxes kept; signed tokens make their ids unbounded.
const MAX_SANDBOXES: usize = 10_000;

/// One refusal as `GET /v1/sandboxes/ID` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Refused {
    pub ts: String,
    pub kind: &'static str,
    pub target: String,
    pub reason: Option<&'static str>,
    pub rule: Option<std::sync::Arc<str>>,
    pub budget: Option<String>,
}

static RECENT: Mutex<Option<HashMap<String, VecDeque<Refused>>>> = Mutex::new(None);

pub(super) fn remember(sandbox: &str, rec: &AccessRecord) {
    let entry = Refused {
        ts: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        kind: rec.kind.as_str(),
        target: rec.target.to_string(),
        reason: rec.reason,
        rule: rec.rule.clone(),
        budget: rec.budget.clone(),
    };
    let mut guard = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    let table = guard.get_or_insert_with(HashMap::new);
    if table.len() >= MAX_SANDBOXES && !table.contains_key(sandbox) {
        table.clear();
    }
    let list = table.entry(sandbox.to_string()).or_default();
    if list.len() == PER_SANDBOX {
        list.pop_front();
    }
    list.push_back(entry);
}

/// `sandbox`'s last refusals, oldest first.
pub fn of(sandbox: &str) -> Vec<Refused> {
    let guard = RECENT.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().and_then(|t| t.get(sandbox)).map(|l| l.iter().cloned().collect()).unwrap_or_default()
}
