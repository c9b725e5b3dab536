//! `egress-gateway policy suggest --log ACCESS.jsonl`: from what was denied (or would
//! have been, in report mode), the smallest set of allow rules, git repositories, push
//! refs and API routes that would have let it through, grouped by policy, with counts,
//! in the policy file's syntax. `--write DIR` writes a copy of the policy directory
//! with them added, for `policy diff` and `policy test`. How an operator turns a day of
//! report mode into an allowlist.
//!
//! Never suggested: what a deny rule refused (`host_denied`: someone wrote that rule),
//! and refusals outside the policy (authentication, address vetting, limits).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::config::{self, PolicySource};
use crate::policy::PolicySet;

/// What one policy would need, each with the number of requests it would have let in.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Needs {
    pub allow: BTreeMap<String, u64>,
    pub repos: BTreeMap<String, u64>,
    pub push: BTreeMap<String, u64>,
    pub routes: BTreeMap<String, u64>,
    /// Request rules inside inspected hosts, as `HOST METHOD PATH`.
    pub requests: BTreeMap<String, u64>,
}

impl Needs {
    fn is_empty(&self) -> bool {
        self.allow.is_empty()
            && self.repos.is_empty()
            && self.push.is_empty()
            && self.routes.is_empty()
            && self.requests.is_empty()
    }
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Suggestion {
    pub records: u64,
    /// Denied by a deny rule: never turned into an allow rule.
    pub denied_by_rule: u64,
    pub policies: BTreeMap<String, Needs>,
}

pub struct Filter<'a> {
    pub sandbox: Option<&'a str>,
    pub policy: Option<&'a str>,
}

pub fn run(
    log: &Path,
    config_path: Option<&PathBuf>,
    filter: &Filter<'_>,
    write: Option<&Path>,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let cfg = super::load_config(config_path)?;
    let set = config::load_policies(&cfg)?;
    let file = std::fs::File::open(log).map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", log.display()))?;
    let suggestion = suggest(BufReader::new(file), &set, filter, &cfg.github.web_host)?;
    print(out, &suggestion)?;
    if let Some(dir) = write {
        let PolicySource::Dir(src) = &cfg.policy.source else {
            anyhow::bail!("--write needs a config whose policy.dir is a directory");
        };
        write_dir(src, dir, &suggestion)?;
        writeln!(
            out,
            "wrote {} (check it with: egress-gateway policy diff {} {})",
            dir.display(),
            src.display(),
            dir.display()
        )?;
    }
    Ok(0)
}

/// Reads access-log lines and collects what each policy would need.
pub fn suggest(
    lines: impl BufRead,
    set: &PolicySet,
    filter: &Filter<'_>,
    git_host: &str,
) -> anyhow::Result<Suggestion> {
    let mut s = Suggestion::default();
    for line in lines.lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if v.get("log").is_some_and(|l| l != "access") {
            continue;
        }
        let (Some(sandbox), Some(target), Some(reason)) =
            (v["sandbox"].as_str(), v["target"].as_str(), v["reason"].as_str())
        else {
            continue;
        };
        if !matches!(v["decision"].as_str(), Some("deny" | "would_deny")) {
            continue;
        }
        if filter.sandbox.is_some_and(|f| f != sandbox) {
            continue;
        }
        // The policy the record names (a signed token's), else the sandbox's.
        let Some(policy_name) = v["policy"]
            .as_str()
            .map(str::to_string)
            .or_else(|| set.sandbox(sandbox).map(|sb| sb.policy.name().to_string()))
        else {
            continue;
        };
        if filter.policy.is_some_and(|f| f != policy_name) {
            continue;
        }
        let Some(policy) = set.policies.get(&policy_name) else { continue };
        s.records += 1;
        let needs = s.policies.entry(policy_name.clone()).or_default();
        match reason {
            "host_not_allowed" | "port_not_allowed" => {
                let Ok(t) = crate::addr::parse_authority(target, None) else { continue };
                let rule = if reason == "host_not_allowed" && policy.default_ports().contains(&t.port) {
                    t.host.to_string()
                } else {
                    t.to_string()
                };
                *needs.allow.entry(rule).or_default() += 1;
            }
            "repo_not_connected" => {
                let repo = target.strip_prefix(git_host).and_then(|r| r.strip_prefix('/')).unwrap_or(target);
                *needs.repos.entry(repo.to_string()).or_default() += 1;
            }
            "git_ref_denied" | "git_write_denied" => {
                // A refused ref is logged as the rule; a write refused before its refs
                // were read names none.
                if let Some(refname) = v["rule"].as_str().filter(|r| r.starts_with("refs/")) {
                    *needs.push.entry(refname.to_string()).or_default() += 1;
                }
            }
            "route_not_allowed" => {
                if let Some(route) = target.strip_prefix("route:")
                    && !policy.lists_route(route)
                {
                    *needs.routes.entry(route.to_string()).or_default() += 1;
                }
            }
            // Refused by no rule at all (a deny rule is named): an exact-path allow rule.
            "request_not_allowed" if v["rule"].is_null() => {
                let url = target.split('?').next().unwrap_or(target);
                let (Some(method), Some(rest)) = (v["method"].as_str(), url.strip_prefix("https://")) else { continue };
                let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let Ok(t) = crate::addr::parse_authority(authority, Some(443)) else { continue };
                let path = if path.is_empty() { "/" } else { path };
                let key = format!("{} {method} {path}", t.host);
                *needs.requests.entry(key).or_default() += 1;
            }
            "host_denied" | "request_not_allowed" => s.denied_by_rule += 1,
            _ => s.records -= 1,
        }
    }
    s.policies.retain(|_, n| !n.is_empty());
    Ok(s)
}

fn print(out: &mut dyn Write, s: &Suggestion) -> std::io::Result<()> {
    writeln!(out, "# {} denied requests read; {} refused by a deny rule (not suggested)", s.records, s.denied_by_rule)?;
    if s.policies.is_empty() {
        writeln!(out, "# nothing to suggest")?;
    }
    for (name, n) in &s.policies {
        writeln!(out, "\n[policies.{name}]  # add to what is there")?;
        let list = |out: &mut dyn Write, key: &str, items: &BTreeMap<String, u64>| -> std::io::Result<()> {
            if items.is_empty() {
                return Ok(());
            }
            writeln!(out, "{key} = [")?;
            for (item, count) in items {
                writeln!(
                    out,
                    "  {:<40} # {count} request{}",
                    format!("{item:?},"),
                    if *count == 1 { "" } else { "s" }
                )?;
            }
            writeln!(out, "]")
        };
        list(out, "allow", &n.allow)?;
        list(out, "git.repos", &n.repos)?;
        list(out, "git.push", &n.push)?;
        list(out, "routes", &n.routes)?;
        for (key, count) in &n.requests {
            let Some((host, method, path)) = request_parts(key) else { continue };
            writeln!(out, "[[policies.{name}.requests]]  # {count} request{}", if *count == 1 { "" } else { "s" })?;
            writeln!(out, "host = {host:?}\nmethods = [{method:?}]\npaths = [{path:?}]\naction = \"allow\"")?;
        }
    }
    Ok(())
}

/// Copies the policy directory `src` to `dst` with the suggestions added to the files
/// that define each policy (comments are not kept: the files are re-serialised).
fn write_dir(src: &Path, dst: &Path, s: &Suggestion) -> anyhow::Result<()> {
    std::fs::create_dir_all(dst)?;
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    for path in config::policy_files::policy_files(src)? {
        let text = std::fs::read_to_string(&path)?;
        let mut doc: toml::Table =
            toml::from_str(&text).map_err(|e| crate::config::ConfigError::toml(&(&path).into(), &text, &e))?;
        let mut changed = false;
        if let Some(policies) = doc.get_mut("policies").and_then(toml::Value::as_table_mut) {
            for (name, needs) in &s.policies {
                let Some(p) = policies.get_mut(name).and_then(toml::Value::as_table_mut) else { continue };
                add(p, &["allow"], &needs.allow);
                add(p, &["git", "repos"], &needs.repos);
                add(p, &["git", "push"], &needs.push);
                add(p, &["routes"], &needs.routes);
                add_requests(p, &needs.requests);
                placed.insert(name);
                changed = true;
            }
        }
        let name = path.file_name().ok_or_else(|| anyhow::anyhow!("{}: no file name", path.display()))?;
        let out = if changed { toml::to_string(&doc)? } else { text };
        std::fs::write(dst.join(name), out)?;
    }
    if let Some(missing) = s.policies.keys().find(|n| !placed.contains(n.as_str())) {
        anyhow::bail!("policy {missing:?} is not defined in {}", src.display());
    }
    Ok(())
}

fn request_parts(key: &str) -> Option<(&str, &str, &str)> {
    let (host, rest) = key.split_once(' ')?;
    let (method, path) = rest.split_once(' ')?;
    Some((host, method, path))
}

/// Appends an allow request rule per `(host, method, path)` to `requests`.
fn add_requests(table: &mut toml::Table, items: &BTreeMap<String, u64>) {
    if items.is_empty() {
        return;
    }
    let entry = table.entry("requests".to_string()).or_insert_with(|| toml::Value::Array(Vec::new()));
    let Some(array) = entry.as_array_mut() else { return };
    for (host, method, path) in items.keys().filter_map(|k| request_parts(k)) {
        let mut t = toml::Table::new();
        t.insert("host".into(), toml::Value::String(host.into()));
        t.insert("methods".into(), toml::Value::Array(vec![toml::Value::String(method.into())]));
        t.insert("paths".into(), toml::Value::Array(vec![toml::Value::String(path.into())]));
        t.insert("action".into(), toml::Value::String("allow".into()));
        array.push(toml::Value::Table(t));
    }
}

/// Appends `items` to the array at `path` under `table`, creating it, without repeats.
fn add(table: &mut toml::Table, path: &[&str], items: &BTreeMap<String, u64>) {
    if items.is_empty() {
        return;
    }
    let mut t = table;
    for key in &path[..path.len() - 1] {
        let entry = t.entry(key.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(next) = entry.as_table_mut() else { return };
        t = next;
    }
    let last = path[path.len() - 1];
    let entry = t.entry(last.to_string()).or_insert_with(|| toml::Value::Array(Vec::new()));
    let Some(array) = entry.as_array_mut() else { return };
    for item in items.keys() {
        let v = toml::Value::String(item.clone());
        if !array.contains(&v) {
            array.push(v);
        }
    }
}
