//! Policy files (`policy/*.toml`) -> a compiled [`PolicySet`].
//!
//! Policies and sandboxes may be spread over several files; a name defined twice is an
//! error. Every error names the file, the key (with line) and what was expected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::Spanned;

use super::error::{ConfigError, DisplayPath};
use super::raw::{RawBudget, RawPolicyFile, RawSandbox, RawSize};
use super::validate::{Config, PolicySource, RouteConfig};
use crate::policy::budget::{self, BudgetSpec};
use crate::policy::claims::{Claim, Claims};
use crate::policy::{Mode, Policy, PolicySet, RuleList, Sandbox};

/// One policy file's text, as read.
struct Source {
    file: DisplayPath,
    text: String,
    /// Byte offset of the start of every line after the first, ascending: a line
    /// number is one binary search, so locating every rule is linear in the file.
    line_starts: Vec<usize>,
}

impl Source {
    fn new(file: DisplayPath, text: String) -> Source {
        let line_starts = text.bytes().enumerate().filter(|&(_, b)| b == b'\n').map(|(i, _)| i + 1).collect();
        Source { file, text, line_starts }
    }

    /// The 1-based line that holds byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= offset) + 1
    }
}

/// Loads and compiles the policies named by `config`.
pub fn load_policies(config: &Config) -> Result<PolicySet, ConfigError> {
    let sources = match &config.policy.source {
        PolicySource::Dir(dir) => {
            if !dir.is_dir() {
                return Err(ConfigError::invalid(
                    &config.file,
                    "policy.dir",
                    format!("expected a directory of policy files, {} is not one", dir.display()),
                ));
            }
            read_dir(dir)?
        }
        PolicySource::Inline { label, text } => {
            vec![Source::new(DisplayPath(label.clone()), text.clone())]
        }
    };
    let mut set =
        compile(&sources, config.policy.mode, &config.egress.ports, &config.routes, config.intercept.is_some())?;
    set.peer_suffix = config.egress.peer_suffix.clone();
    // A sidecar's one sandbox must exist: on a reload too (the old state stays).
    if let Some(id) = config.transparent.as_ref().and_then(|t| t.sandbox.as_ref())
        && set.sandbox(id).is_none()
    {
        return Err(ConfigError::invalid(
            &config.file,
            "transparent.sandbox",
            format!("no sandbox {id:?} is defined in the policy files"),
        ));
    }
    Ok(set)
}

/// Loads the shadow policies, if `policy.shadow_dir` is set.
pub fn load_shadow(config: &Config) -> Result<Option<PolicySet>, ConfigError> {
    let Some(dir) = &config.policy.shadow else { return Ok(None) };
    if !dir.is_dir() {
        return Err(ConfigError::invalid(
            &config.file,
            "policy.shadow_dir",
            format!("expected a directory of policy files, {} is not one", dir.display()),
        ));
    }
    let mut set =
        compile(&read_dir(dir)?, config.policy.mode, &config.egress.ports, &config.routes, config.intercept.is_some())?;
    set.peer_suffix = config.egress.peer_suffix.clone();
    Ok(Some(set))
}

/// A `[policies.NAME.budget]` table; an error names the key under `budget`.
fn compile_budget(raw: &RawBudget) -> Result<BudgetSpec, (String, String)> {
    let window = match &raw.window {
        None => std::time::Duration::from_secs(3600),
        Some(w) => humantime::parse_duration(w)
            .ok()
            .filter(|d| d.as_secs() >= 1 && d.subsec_nanos() == 0 && d.as_secs() <= 31 * 86_400)
            .ok_or_else(|| {
                ("window".to_string(), format!("expected whole seconds from 1s to 31d, such as \"1h\", got {w:?}"))
            })?,
    };
    let size = |key: String, v: &Option<RawSize>| -> Result<Option<u64>, (String, String)> {
        match v {
            None => Ok(None),
            Some(RawSize::Bytes(n)) => Ok(Some(*n)),
            Some(RawSize::Text(t)) => budget::parse_size(t).map(Some).map_err(|e| (key, e)),
        }
    };
    let limits = |prefix: &str, up: &Option<RawSize>, down: &Option<RawSize>, requests: Option<u64>| {
        Ok::<_, (String, String)>(budget::Limits {
            upload_bytes: size(format!("{prefix}upload_bytes"), up)?,
            download_bytes: size(format!("{prefix}download_bytes"), down)?,
            requests,
        })
    };
    if raw.new_hosts.is_some_and(|n| n > budget::MAX_NEW_HOSTS) {
        return Err(("new_hosts".into(), format!("expected at most {} distinct hosts", budget::MAX_NEW_HOSTS)));
    }
    if raw.hosts.len() > budget::MAX_HOST_OVERRIDES {
        return Err(("hosts".into(), format!("expected at most {} host overrides", budget::MAX_HOST_OVERRIDES)));
    }
    let mut hosts = Vec::with_capacity(raw.hosts.len());
    for (i, h) in raw.hosts.iter().enumerate() {
        budget::check_host_pattern(&h.host).map_err(|e| (format!("hosts[{i}].host"), e))?;
        let prefix = format!("hosts[{i}].");
        let host = h.host.trim_end_matches('.').to_ascii_lowercase();
        hosts.push(budget::HostBudget {
            host,
            limits: limits(&prefix, &h.upload_bytes, &h.download_bytes, h.requests)?,
        });
    }
    Ok(BudgetSpec {
        window,
        limits: limits("", &raw.upload_bytes, &raw.download_bytes, raw.requests)?,
        new_hosts: raw.new_hosts,
        hosts,
    })
}

/// The `*.toml` files of `dir`, sorted by name so that load order is stable.
pub fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    scan(dir).map(|(files, _)| files)
}

/// `dir`'s policy files, and the entries that look meant as policy files but are not
/// loaded: a `*.toml` that is not a regular file (a directory, a broken link) or an
/// extension in the wrong case (`p.TOML`). Other names (`README.md`, `p.toml.off`) are
/// neither. Both sorted by name.
fn scan(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ConfigError::Read { file: dir.into(), error: e })?;
    let (mut files, mut odd) = (Vec::new(), Vec::new());
    for p in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        match p.extension().and_then(|x| x.to_str()) {
            Some("toml") if p.is_file() => files.push(p),
            Some("toml") => odd.push(p),
            Some(x) if x.eq_ignore_ascii_case("toml") => odd.push(p),
            _ => {}
        }
    }
    files.sort();
    odd.sort();
    Ok((files, odd))
}

/// Loads `dir`'s policy files, warning about what an operator would not expect to be
/// skipped (every reload warns again, so the warning is seen).
fn read_dir(dir: &Path) -> Result<Vec<Source>, ConfigError> {
    let (files, odd) = scan(dir)?;
    for path in odd {
        tracing::warn!(file = %path.display(), "not loaded: policy files are regular files named *.toml");
    }
    if files.is_empty() {
        tracing::warn!(dir = %dir.display(), "no *.toml policy files: every sandbox is refused");
    }
    files
        .into_iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(&path).map_err(|e| ConfigError::Read { file: (&path).into(), error: e })?;
            Ok(Source::new((&path).into(), text))
        })
        .collect()
}

fn compile(
    sources: &[Source],
    default_mode: Mode,
    ports: &[u16],
    routes: &[RouteConfig],
    inspection_on: bool,
) -> Result<PolicySet, ConfigError> {
    let mut policies: HashMap<String, Arc<Policy>> = HashMap::new();
    let mut defined_in: HashMap<String, DisplayPath> = HashMap::new();
    let mut pending_sandboxes: Vec<(&Source, Spanned<RawSandbox>)> = Vec::new();

    for src in sources {
        let raw: RawPolicyFile = toml::from_str(&src.text).map_err(|e| ConfigError::toml(&src.file, &src.text, &e))?;
        for (name, def) in raw.policies {
            if !valid_name(&name) {
                return Err(ConfigError::invalid(
                    &src.file,
                    format!("policies.{name}"),
                    "expected a policy name of letters, digits, '.', '_' or '-'",
                ));
            }
            if let Some(first) = defined_in.get(&name) {
                return Err(ConfigError::invalid(
                    &src.file,
                    format!("policies.{name}"),
                    format!("policy already defined in {first}"),
                ));
            }
            let mut b = Policy::builder(&name, def.mode.unwrap_or(default_mode), ports);
            for (list, key, rules) in [(RuleList::Deny, "deny", &def.deny), (RuleList::Allow, "allow", &def.allow)] {
                for (i, rule) in rules.iter().enumerate() {
                    let line = src.line_of(rule.span().start);
                    let location = format!("{}:{line}", src.file);
                    b.add(list, rule.get_ref(), &location).map_err(|e| {
                        ConfigError::invalid(&src.file, format!("policies.{name}.{key}[{i}] (line {line})"), e)
                    })?;
                }
            }
            if let Some(git) = &def.git {
                for (list, rules) in [(RuleList::GitRepos, &git.repos), (RuleList::GitPush, &git.push)] {
                    for (i, rule) in rules.iter().enumerate() {
                        let line = src.line_of(rule.span().start);
                        let location = format!("{}:{line}", src.file);
                        b.add_git(list, rule.get_ref(), &location).map_err(|e| {
                            ConfigError::invalid(
                                &src.file,
                                format!("policies.{name}.{}[{i}] (line {line})", list.key()),
                                e,
                            )
                        })?;
                    }
                }
                b.allow_ref_deletion(git.allow_delete);
            }
            if let Some(all) = &def.allow_all
                && *all.get_ref()
            {
                b.allow_all(&format!("{}:{}", src.file, src.line_of(all.span().start)));
            }
            for (list, rules) in [(RuleList::Peers, &def.peers), (RuleList::AcceptFrom, &def.accept_from)] {
                for (i, rule) in rules.iter().enumerate() {
                    let line = src.line_of(rule.span().start);
                    b.add_peer(list, rule.get_ref(), &format!("{}:{line}", src.file)).map_err(|e| {
                        ConfigError::invalid(&src.file, format!("policies.{name}.{}[{i}] (line {line})", list.key()), e)
                    })?;
                }
            }
            if let Some(budget) = &def.budget {
                let line = src.line_of(budget.span().start);
                b.budget(compile_budget(budget.get_ref()).map_err(|(k, e)| {
                    ConfigError::invalid(&src.file, format!("policies.{name}.budget.{k} (line {line})"), e)
                })?);
            }
            for (i, rule) in def.inspect.iter().enumerate() {
                let line = src.line_of(rule.span().start);
                let key = format!("policies.{name}.inspect[{i}] (line {line})");
                if !inspection_on {
                    return Err(ConfigError::invalid(
                        &src.file,
                        key,
                        "inspect needs an [intercept] section in the gateway config",
                    ));
                }
                b.add_inspect(rule.get_ref(), &format!("{}:{line}", src.file))
                    .map_err(|e| ConfigError::invalid(&src.file, key, e))?;
            }
            for (i, spanned) in def.requests.iter().enumerate() {
                let line = src.line_of(spanned.span().start);
                let r = spanned.get_ref();
                let spec = crate::policy::requests::RequestSpec {
                    host: &r.host,
                    methods: &r.methods,
                    paths: &r.paths,
                    query: r.query.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
                    headers: r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
                    action: &r.action,
                };
                b.add_request(&spec, &format!("{}:{line}", src.file)).map_err(|(k, e)| {
                    ConfigError::invalid(&src.file, format!("policies.{name}.requests[{i}].{k} (line {line})"), e)
                })?;
            }
            b.require_vpce(def.vpce.clone());
            for (i, listed) in def.routes.iter().enumerate() {
                let line = src.line_of(listed.span().start);
                let Some(route) = routes.iter().find(|r| &r.name == listed.get_ref()) else {
                    let defined: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
                    return Err(ConfigError::invalid(
                        &src.file,
                        format!("policies.{name}.routes[{i}] (line {line})"),
                        format!(
                            "no [[routes]] entry named {:?} in the gateway config (defined: {})",
                            listed.get_ref(),
                            if defined.is_empty() { "none".to_string() } else { defined.join(", ") }
                        ),
                    ));
                };
                b.add_route(&route.name, &route.methods, &route.paths, &format!("{}:{line}", src.file));
            }
            defined_in.insert(name.clone(), src.file.clone());
            policies.insert(name, Arc::new(b.build()));
        }
        pending_sandboxes.extend(raw.sandboxes.into_iter().map(|s| (src, s)));
    }

    let mut sandboxes = HashMap::new();
    let mut claims = Vec::new();
    let mut seen_lower: HashMap<String, String> = HashMap::new();
    for (src, spanned) in pending_sandboxes {
        let line = src.line_of(spanned.span().start);
        let s = spanned.into_inner();
        let key = |k: &str| format!("sandboxes[id={:?}].{k} (line {line})", s.id);
        if !valid_name(&s.id) {
            return Err(ConfigError::invalid(
                &src.file,
                key("id"),
                "expected 1-128 letters, digits, '.', '_' or '-' (no ':')",
            ));
        }
        let hash = parse_sha256(&s.token_sha256).ok_or_else(|| {
            ConfigError::invalid(&src.file, key("token_sha256"), "expected 64 hex digits (egress-gateway token hash)")
        })?;
        let policy = policies.get(&s.policy).cloned().ok_or_else(|| {
            ConfigError::invalid(&src.file, key("policy"), format!("no policy named {:?} is defined", s.policy))
        })?;
        if sandboxes.contains_key(&s.id) {
            return Err(ConfigError::invalid(&src.file, key("id"), "sandbox id defined twice"));
        }
        // Peers are named in lowercase DNS names: ids must be unique regardless of case.
        if let Some(other) = seen_lower.insert(s.id.to_ascii_lowercase(), s.id.clone()) {
            return Err(ConfigError::invalid(
                &src.file,
                key("id"),
                format!("differs only in case from sandbox id {other:?}: ids must be unique regardless of case"),
            ));
        }
        let mut addresses = Vec::with_capacity(s.addresses.len());
        for (i, a) in s.addresses.iter().enumerate() {
            let at = src.line_of(a.span().start);
            let net = parse_claim(a.get_ref()).map_err(|e| {
                ConfigError::invalid(&src.file, format!("sandboxes[id={:?}].addresses[{i}] (line {at})", s.id), e)
            })?;
            claims.push(Claim { net, sandbox: s.id.clone(), location: format!("{}:{at}", src.file) });
            addresses.push(net);
        }
        for (i, label) in s.labels.iter().enumerate() {
            let ok = !label.is_empty()
                && label.len() <= 128
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/=".contains(&b));
            if !ok {
                return Err(ConfigError::invalid(
                    &src.file,
                    key(&format!("labels[{i}]")),
                    format!("expected letters, digits, '.', '_', '-', '/' or '=', got {label:?}"),
                ));
            }
        }
        let labels = s.labels;
        sandboxes.insert(
            s.id.clone(),
            Sandbox { id: s.id.into(), token_sha256: hash, policy, vpce: s.vpce, addresses, labels },
        );
    }
    let claims = Claims::build(claims).map_err(|pair| {
        let (a, b) = *pair;
        let file = DisplayPath(b.location.rsplit_once(':').map_or(b.location.as_str(), |(f, _)| f).into());
        ConfigError::invalid(
            &file,
            format!("sandboxes[id={:?}].addresses", b.sandbox),
            format!(
                "{} (at {}) overlaps {} claimed by sandbox {:?} at {}: an address identifies one sandbox",
                b.net, b.location, a.net, a.sandbox, a.location
            ),
        )
    })?;
    let ids_by_lowercase = seen_lower.into_iter().filter(|(lower, id)| lower != id).collect();
    Ok(PolicySet { policies, sandboxes, claims, peer_suffix: String::new(), ids_by_lowercase })
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// A sandbox's address claim: an IP address or a CIDR without host bits.
fn parse_claim(s: &str) -> Result<ipnet::IpNet, String> {
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(ipnet::IpNet::from(ip.to_canonical()));
    }
    let net: ipnet::IpNet = s.parse().map_err(|_| format!("expected an IP address or a CIDR, got {s:?}"))?;
    if net.trunc() != net {
        return Err(format!("{s} has host bits set; did you mean {}?", net.trunc()));
    }
    // An IPv4-mapped network is the IPv4 network it maps: addresses are looked up (and
    // overlaps found) as IPv4.
    if let ipnet::IpNet::V6(v6) = net
        && let Some(v4) = v6.network().to_ipv4_mapped()
    {
        return match v6.prefix_len().checked_sub(96) {
            Some(len) => ipnet::Ipv4Net::new(v4, len).map(ipnet::IpNet::V4).map_err(|e| e.to_string()),
            None => Err(format!("{s} covers more than the IPv4-mapped range; claim IPv4 networks as IPv4")),
        };
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<PolicySet, ConfigError> {
        compile(&[Source::new(DisplayPath("p.toml".into()), text.into())], Mode::Enforce, &[80, 443], &[], true)
    }

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn files_that_look_like_policies_but_are_skipped_are_named() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a.toml", "b.TOML", "README.md", "c.toml.off"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("d.toml")).unwrap();
        let names = |v: Vec<PathBuf>| {
            v.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect::<Vec<_>>()
        };
        let (files, odd) = scan(dir.path()).unwrap();
        assert_eq!(names(files), ["a.toml"]);
        assert_eq!(names(odd), ["b.TOML", "d.toml"]);
    }

    #[test]
    fn loads_and_links_sandboxes() {
        let set = load(&format!(
            "[policies.python]\nallow = [\"pypi.org\"]\n[[sandboxes]]\nid = \"sbx-1\"\ntoken_sha256 = \"{HASH}\"\npolicy = \"python\"\n"
        ))
        .unwrap();
        let sbx = set.sandbox("sbx-1").unwrap();
        assert_eq!(sbx.policy.name(), "python");
        assert_eq!(sbx.policy.rules()[0].location, "p.toml:2");
    }

    #[test]
    fn peers_are_found_by_lowercase_name_and_carry_their_one_address() {
        let mut set = load(&format!(
            "[policies.db]\nallow = []\naccept_from = [\"runner\"]\n[policies.runner]\nallow = []\npeers = [\"*\"]\n\
             [[sandboxes]]\nid = \"Sbx-DB\"\ntoken_sha256 = \"{HASH}\"\npolicy = \"db\"\naddresses = [\"10.1.2.3\"]\n\
             [[sandboxes]]\nid = \"runner\"\ntoken_sha256 = \"{HASH}\"\npolicy = \"runner\"\n"
        ))
        .unwrap();
        set.peer_suffix = "sandboxes.internal".into();
        let target = crate::addr::parse_authority("sbx-db.sandboxes.internal:5432", None).unwrap();
        let subject = set.subject_for("runner", &target);
        let crate::policy::Subject::Peer { sandbox, accepted, address, .. } = &subject else { panic!("{subject:?}") };
        assert_eq!((sandbox.as_str(), *accepted, *address), ("sbx-db", true, Some("10.1.2.3".parse().unwrap())));
        let runner = set.sandbox("runner").unwrap();
        assert!(crate::policy::decide(&runner.policy, &subject, None).permits());
    }

    #[test]
    fn line_numbers_count_every_newline() {
        let src = Source::new(DisplayPath("p.toml".into()), "a\nbb\n\nc".into());
        let lines: Vec<usize> = (0..src.text.len()).map(|o| src.line_of(o)).collect();
        assert_eq!(lines, [1, 1, 2, 2, 2, 3, 4]);
    }

    #[test]
    fn errors_name_file_key_and_expectation() {
        let e = load("[policies.p]\nallow = [\"ok.com\",\n  \"*\"]\n").unwrap_err().to_string();
        assert!(e.starts_with("p.toml: policies.p.allow[1] (line 3):"), "{e}");
        let e = load("[policies.p]\nalow = []\n").unwrap_err().to_string();
        assert!(e.contains("p.toml") && e.contains("unknown field `alow`"), "{e}");
        let e = load(&format!("[[sandboxes]]\nid = \"s\"\ntoken_sha256 = \"{HASH}\"\npolicy = \"nope\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("sandboxes[id=\"s\"].policy") && e.contains("no policy named \"nope\""), "{e}");
        let e = load("[policies.p]\n[[sandboxes]]\nid = \"s\"\ntoken_sha256 = \"xyz\"\npolicy = \"p\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("token_sha256") && e.contains("64 hex digits"), "{e}");
    }
}
