//! `egress-gateway policy diff OLD_DIR NEW_DIR`: what each sandbox gains and loses,
//! not a text diff. Exit 0 when nothing changes, 1 when something does.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::{self, Config, PolicySource};
use crate::policy::{PolicySet, Sandbox};

pub fn run(config_path: Option<&PathBuf>, old: &Path, new: &Path, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(config_path)?;
    let old_set = load(&cfg, old)?;
    let new_set = load(&cfg, new)?;
    let lines = diff(&old_set, &new_set);
    for l in &lines {
        writeln!(out, "{l}")?;
    }
    if lines.is_empty() {
        writeln!(out, "no changes")?;
    }
    Ok(u8::from(!lines.is_empty()))
}

fn load(cfg: &Config, dir: &Path) -> anyhow::Result<PolicySet> {
    let mut cfg = cfg.clone();
    cfg.policy.source = PolicySource::Dir(dir.to_path_buf());
    Ok(config::load_policies(&cfg)?)
}

/// `list "text"` for every rule of a sandbox's policy, plus its mode.
fn grants(s: &Sandbox) -> BTreeSet<String> {
    let mut g: BTreeSet<String> = s.policy.rules().iter().map(|r| format!("{} {:?}", r.list.key(), r.text)).collect();
    if s.policy.allows_ref_deletion() {
        g.insert("git.allow_delete".into());
    }
    g.insert(format!("mode {:?}", s.policy.mode()).to_lowercase());
    g
}

/// The change lines, sandbox by sandbox in id order.
pub fn diff(old: &PolicySet, new: &PolicySet) -> Vec<String> {
    let ids: BTreeSet<&String> = old.sandboxes.keys().chain(new.sandboxes.keys()).collect();
    let mut lines = Vec::new();
    for id in ids {
        match (old.sandboxes.get(id), new.sandboxes.get(id)) {
            (None, Some(n)) => lines.push(format!("sandbox {id}: added (policy {})", n.policy.name())),
            (Some(o), None) => lines.push(format!("sandbox {id}: removed (was policy {})", o.policy.name())),
            (Some(o), Some(n)) => {
                let mut head = Vec::new();
                if o.policy.name() != n.policy.name() {
                    head.push(format!("policy {} -> {}", o.policy.name(), n.policy.name()));
                }
                if o.token_sha256 != n.token_sha256 {
                    head.push("token changed".to_string());
                }
                let (og, ng) = (grants(o), grants(n));
                let added: Vec<&String> = ng.difference(&og).collect();
                let removed: Vec<&String> = og.difference(&ng).collect();
                if head.is_empty() && added.is_empty() && removed.is_empty() {
                    continue;
                }
                let suffix = if head.is_empty() { String::new() } else { format!(" ({})", head.join(", ")) };
                lines.push(format!("sandbox {id}:{suffix}"));
                lines.extend(added.iter().map(|g| format!("  + {g}")));
                lines.extend(removed.iter().map(|g| format!("  - {g}")));
            }
            (None, None) => {}
        }
    }
    lines
}
