//! `egress-gateway check`: may sandbox S reach TARGET, and by which rule?

use std::io::Write;

use crate::auth::{self, Credentials};
use crate::cli::CheckArgs;
use crate::config::Config;
use crate::policy::DenyReason;
use crate::policy::{self, Answer, Outcome, Subject};
use crate::resolve::{DialError, Resolver};

/// One resolved address and what vetting says about it.
#[derive(Debug, serde::Serialize)]
pub struct AddressVerdict {
    pub address: String,
    pub allowed: bool,
    pub denied_by: Option<String>,
}

pub fn run(args: &CheckArgs, out: &mut dyn Write) -> anyhow::Result<u8> {
    let cfg = super::load_config(args.config.as_ref())?;
    let loaded = crate::reload::load(&cfg)?;
    let set = loaded.policies;
    let subject = policy::parse_subject(&args.target, args.push.as_deref(), args.method.as_deref())
        .map_err(anyhow::Error::msg)?;
    let signed = args.token.as_deref().is_some_and(crate::tokens::looks_signed) && loaded.tokens.has_keys();
    anyhow::ensure!(
        signed || set.sandbox(&args.sandbox).is_some(),
        "unknown sandbox {:?} (defined: {})",
        args.sandbox,
        known_sandboxes(&set)
    );
    let mut answer = policy::evaluate(&set, &args.sandbox, &subject);

    let mut token_ok = None;
    if let Some(token) = &args.token {
        match auth::authenticate(&set, &loaded.tokens, &Credentials::new(&args.sandbox, token), crate::tokens::now()) {
            Ok(identity) => {
                token_ok = Some(true);
                // A signed token names its policy and may narrow git repositories.
                answer = policy::explain(&identity.sandbox, &identity.policy, identity.repos.as_deref(), &subject);
            }
            Err(e) => {
                token_ok = Some(false);
                deny(&mut answer, e.reason(), format!("the token does not authenticate this sandbox: {e}"));
            }
        }
    }

    let notes = notes(&cfg, &set, &args.sandbox, &answer, &subject);

    let mut addresses = None;
    if args.resolve
        && let Some(target) = subject.target()
    {
        // A peer is never looked up in DNS: it is the address its sandbox claims.
        let verdicts = match crate::policy::peer_id(target, &set.peer_suffix) {
            Some(id) => Ok(match set.peer_address(id) {
                Some(ip) => Ok(vec![AddressVerdict { address: ip.to_string(), allowed: true, denied_by: None }]),
                None => Err(format!("no sandbox {id:?} with a single address")),
            }),
            None => resolve(&cfg, target),
        }?;
        match &verdicts {
            Err(e) if answer.permits() => deny(&mut answer, DenyReason::ResolveFailed, e.clone()),
            Ok(list) if answer.permits() && !list.iter().any(|a| a.allowed) => {
                deny(&mut answer, DenyReason::AddressDenied, "every address is in egress.deny".into())
            }
            _ => {}
        }
        addresses = Some(verdicts);
    } else if let Some(target) = subject.target()
        && let crate::addr::Host::Ip(ip) = target.host
    {
        // An IP literal needs no lookup: vetted as serving vets it, `--resolve` or not.
        let verdict = match cfg.egress.filter.vet(ip) {
            Ok(c) => AddressVerdict { address: c.to_string(), allowed: true, denied_by: None },
            Err(d) => {
                AddressVerdict { address: d.addr.to_string(), allowed: false, denied_by: Some(d.net.to_string()) }
            }
        };
        if answer.permits() && !verdict.allowed {
            deny(&mut answer, DenyReason::AddressDenied, "the address is in egress.deny".into());
        }
        addresses = Some(Ok(vec![verdict]));
    }

    if args.json {
        let mut v = serde_json::to_value(&answer)?;
        if let Some(ok) = token_ok {
            v["token_valid"] = ok.into();
        }
        if !notes.is_empty() {
            v["notes"] = serde_json::to_value(&notes)?;
        }
        match &addresses {
            Some(Ok(list)) => v["addresses"] = serde_json::to_value(list)?,
            Some(Err(e)) => v["resolve_error"] = e.clone().into(),
            None => {}
        }
        writeln!(out, "{v}")?;
    } else {
        print_human(out, &answer, token_ok, addresses.as_ref())?;
        for note in &notes {
            writeln!(out, "  note:    {note}")?;
        }
    }
    Ok(if answer.permits() { 0 } else { 1 })
}

/// What an operator should know beside the decision: the git route ignores report
/// mode, and a tunnel to GitHub beside git rules goes around them.
fn notes(
    cfg: &Config,
    set: &crate::policy::PolicySet,
    sandbox: &str,
    answer: &Answer,
    subject: &Subject,
) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(policy) =
        answer.policy.as_deref().and_then(|p| set.policies.get(p)).or_else(|| set.sandbox(sandbox).map(|s| &s.policy))
    else {
        return notes;
    };
    if let Some(target) = subject.target() {
        inspection_notes(cfg, policy, target, &mut notes);
        return notes;
    }
    let Subject::Git { .. } = subject else { return notes };
    if policy.mode() == crate::policy::Mode::Report {
        notes.push(
            "policy is in report mode, but git rules are always enforced: the git route adds the gateway's \
             own credential"
                .into(),
        );
    }
    for rule in super::lint::github_tunnel_rules(cfg, policy) {
        let at = if rule.location.is_empty() { String::new() } else { format!(" at {}", rule.location) };
        notes.push(format!(
            "{rule}{at} also allows an opaque tunnel to GitHub: a sandbox can push there with credentials of \
             its own, around these git rules"
        ));
    }
    notes
}

/// Whether the host is inspected (and by which rule), and the placeholders a sandbox
/// under `policy` may send it.
fn inspection_notes(
    cfg: &Config,
    policy: &crate::policy::Policy,
    target: &crate::addr::Target,
    notes: &mut Vec<String>,
) {
    match (policy.inspects(target), &cfg.intercept) {
        (Some(rule), Some(i)) if i.never_inspects(&target.host) => {
            notes.push(format!("{rule} at {} is overridden by intercept.never: an opaque tunnel", rule.location));
        }
        (Some(rule), Some(_)) => notes.push(format!(
            "inspected ({rule} at {}): each request is decided by policies.{}.requests",
            rule.location,
            policy.name()
        )),
        _ => {}
    }
    for s in cfg.secrets.iter().filter(|s| s.bound_to(target, policy.name())) {
        notes.push(format!("placeholder {} is replaced by secret {:?} on this host", s.placeholder(), s.name));
    }
}

fn deny(answer: &mut Answer, reason: DenyReason, hint: String) {
    answer.decision = Outcome::Deny;
    answer.reason = Some(reason.code());
    answer.hint = Some(hint);
}

fn known_sandboxes(set: &crate::policy::PolicySet) -> String {
    let mut ids: Vec<&str> = set.sandboxes.keys().map(String::as_str).collect();
    ids.sort_unstable();
    ids.truncate(10);
    if ids.is_empty() { "none".into() } else { ids.join(", ") }
}

fn resolve(cfg: &Config, target: &crate::addr::Target) -> anyhow::Result<Result<Vec<AddressVerdict>, String>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let resolver = Resolver::new(&cfg.resolver, cfg.egress.filter.clone(), cfg.proxy.connect_timeout)?;
        let ips = match resolver.resolve(&target.host).await {
            Ok(ips) => ips,
            Err(DialError::ResolveFailed(e)) => return Ok(Err(e)),
            Err(e) => return Ok(Err(e.to_string())),
        };
        Ok(Ok(ips
            .into_iter()
            .map(|ip| match resolver.filter().vet(ip) {
                Ok(c) => AddressVerdict { address: c.to_string(), allowed: true, denied_by: None },
                Err(d) => {
                    AddressVerdict { address: d.addr.to_string(), allowed: false, denied_by: Some(d.net.to_string()) }
                }
            })
            .collect()))
    })
}

fn print_human(
    out: &mut dyn Write,
    a: &Answer,
    token_ok: Option<bool>,
    addresses: Option<&Result<Vec<AddressVerdict>, String>>,
) -> std::io::Result<()> {
    let head = if a.permits() { "ALLOW" } else { "DENY " };
    let policy = a.policy.as_deref().unwrap_or("-");
    write!(out, "{head}  {} -> {}  (policy {policy})", a.sandbox, a.target)?;
    if a.decision == Outcome::WouldDeny {
        write!(out, "  report mode: enforce would deny")?;
    }
    writeln!(out)?;
    if let Some(reason) = a.reason {
        let message = DenyReason::ALL.iter().find(|r| r.code() == reason).map_or("", |r| r.message());
        writeln!(out, "  reason:  {reason}: {message}")?;
    }
    if let Some(rule) = &a.rule {
        let list = a.rule_list.unwrap_or("");
        match &a.rule_location {
            Some(at) => writeln!(out, "  rule:    {list} {rule:?} at {at}")?,
            None => writeln!(out, "  rule:    {list} {rule:?}")?,
        }
    }
    if let Some(hint) = &a.hint {
        writeln!(out, "  hint:    {hint}")?;
    }
    if let Some(ok) = token_ok {
        writeln!(out, "  token:   {}", if ok { "valid for this sandbox" } else { "NOT valid for this sandbox" })?;
    }
    match addresses {
        Some(Ok(list)) => {
            for v in list {
                match &v.denied_by {
                    None => writeln!(out, "  address: {:<40} ok", v.address)?,
                    Some(net) => writeln!(out, "  address: {:<40} denied (in {net})", v.address)?,
                }
            }
        }
        Some(Err(e)) => writeln!(out, "  resolve: failed: {e}")?,
        None => {}
    }
    Ok(())
}
