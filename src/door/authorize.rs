//! The one authorization every entry path takes: identify, decide the subject (and
//! under shadow policies), report mode, limits, and the registration that lets reload
//! and expiry sweeps end what the new state refuses.

use super::identify::{AUTH_HINT, Presented, identify};
use super::record::Refusal;
use super::registry::Hold;
use super::{ConnInfo, Door};
use crate::access_log::AccessRecord;
use crate::auth::{AuthError, Identity};
use crate::policy::{self, Decision, DenyReason, Outcome, Subject};
use crate::reload::State;
use crate::tokens::TokenError;

/// The hint of a request refused because its sandbox holds its share of connections.
pub const SANDBOX_CONNECTIONS_HINT: &str = "this sandbox holds proxy.sandbox_max_connections open connections; \
                                            reuse them, or close some";

/// A request that passed identification, policy and limits.
pub struct Authorized {
    pub identity: Identity,
    /// Its registration and concurrency slot, held by whatever carries the request on
    /// (a tunnel task, request and response bodies) for as long as it lives.
    pub hold: Hold,
    /// Allowed only because the policy inspects the host: an entry path that does not
    /// inspect it must refuse it ([`Authorized::opaque_refusal`]).
    pub by_inspect: bool,
}

impl Authorized {
    /// The refusal of a host the policy allows only for inspection, on a path that
    /// would tunnel it opaquely (`intercept.never`, transparent listeners).
    pub fn opaque_refusal(&self, why: &str) -> Option<Refusal> {
        self.by_inspect.then(|| {
            Refusal::new(
                DenyReason::HostNotAllowed,
                format!(
                    "the host is in policies.{}.inspect, so only its inspected requests are allowed, and {why}; \
                     add it to allow to tunnel it",
                    self.identity.policy.name()
                ),
            )
        })
    }
}

/// Authorizes `subject` for the sandbox the request's credentials name. Fills the
/// access record's identity and decision fields; a refusal is returned for the
/// handler to answer in its own terms (most use [`super::refuse`]).
pub fn authorize(
    door: &Door,
    state: &State,
    rec: &mut AccessRecord,
    conn: &ConnInfo,
    presented: Presented<'_>,
    subject: Subject,
) -> Result<Authorized, Refusal> {
    let identity = identified(door, state, conn, presented)?;
    authorize_as(door, state, rec, conn, identity, subject)
}

/// [`identify`], with a failure as the refusal to answer.
pub fn identified(door: &Door, state: &State, conn: &ConnInfo, presented: Presented<'_>) -> Result<Identity, Refusal> {
    match identify(door, state, conn, presented) {
        Ok(i) => Ok(i),
        Err(e @ (AuthError::WrongNetwork | AuthError::WrongCertificate | AuthError::TooManyFailures)) => {
            Err(Refusal::new(e.reason(), e.to_string()))
        }
        Err(e @ AuthError::Scheme(_)) => Err(Refusal::new(e.reason(), format!("{e}; {AUTH_HINT}"))),
        // A signed token whose signature holds is told what else is wrong with it
        // (expired, revoked, not yet valid): its holder gets nothing from that but the
        // cause to fix. Before the signature holds, nothing is told (which key ids and
        // algorithms exist is no business of whoever sends a forged one).
        Err(
            e @ AuthError::Token(
                TokenError::Expired
                | TokenError::NotYetValid
                | TokenError::TtlTooLong
                | TokenError::WrongSubject
                | TokenError::Revoked,
            ),
        ) => Err(Refusal::new(e.reason(), format!("{e}; {AUTH_HINT}"))),
        Err(e) => Err(Refusal::new(e.reason(), AUTH_HINT)),
    }
}

/// [`authorize`] for an identity already established (a handler that needed the
/// sandbox's policy to know what the subject is).
pub fn authorize_as(
    door: &Door,
    state: &State,
    rec: &mut AccessRecord,
    conn: &ConnInfo,
    identity: Identity,
    subject: Subject,
) -> Result<Authorized, Refusal> {
    rec.sandbox = Some(identity.sandbox.clone());
    rec.policy = Some(identity.policy.shared_name());
    // `ID.sandboxes.internal`: another sandbox, whose policy has a say too.
    let subject = match subject {
        Subject::Host(t) | Subject::Request { target: t, .. }
            if policy::peer_id(&t, &state.policies.peer_suffix).is_some() =>
        {
            state.policies.subject_for(&identity.sandbox, &t)
        }
        other => other,
    };

    let decision = policy::decide(&identity.policy, &subject, identity.repos.as_deref());
    let by_inspect = decision.rule().is_some_and(|r| r.list == policy::RuleList::Inspect);
    record_decision(rec, &identity, &decision);
    shadow_compare(rec, state, &identity.sandbox, &subject);
    if let Some(reason) = decision.reason()
        && !decision.permits()
    {
        let hint = policy::hint(&identity.policy, reason, &subject, &decision);
        return Err(Refusal { reason, hint, rule: decision.rule().map(|r| r.logged()), status: None, budget: None });
    }

    if let Subject::Route { route, .. } = &subject
        && let Some(budget) = door.route_budgets.get(route)
        && budget.acquire(&identity.sandbox).is_err()
    {
        return Err(Refusal::new(DenyReason::LimitExceeded, format!("request budget of route {route} exceeded")));
    }
    let elsewhere = door.budgets.others_active(&identity.sandbox);
    let permit = match door.limits.acquire_in_fleet(&identity.sandbox, elsewhere) {
        Ok(p) => p,
        Err(e) => return Err(Refusal::new(DenyReason::LimitExceeded, e.to_string())),
    };
    if !conn.authorized(&identity.sandbox) {
        return Err(Refusal::new(DenyReason::LimitExceeded, SANDBOX_CONNECTIONS_HINT));
    }
    // Budgets count what is dialled: a refusal above spends nothing. Hosts by name: an
    // IP literal as written, a peer as `ID.SUFFIX` (what per-host overrides match).
    // Only a policy with a budget counts hosts: no string is made for one without.
    let host = match &subject {
        _ if identity.policy.budget().is_none() => None,
        Subject::Host(t) | Subject::Request { target: t, .. } if t.host.as_name().is_none() => Some(t.host.to_string()),
        Subject::Peer { sandbox, .. } => Some(format!("{sandbox}.{}", state.policies.peer_suffix)),
        _ => None,
    };
    let meter = match door.budgets.admit(budget_ask(&identity, &subject, host.as_deref())) {
        Ok(m) => m,
        Err(spent) => return Err(Refusal::budget(spent)),
    };
    // Registered before any I/O on its behalf (a dial, a body read): a sweep while the
    // client stretches those ends it like any open connection.
    let carrier = conn.watch.as_ref().map(|w| w.end().clone());
    let registration = door.registry.register(&identity, subject, conn.vpce.as_deref(), carrier);
    // A reload that swapped in a newer state after this request took its snapshot has
    // swept without seeing it: judge it under the newest state now. (A reload after
    // the registration sees it in its sweep.)
    let now = door.store.snapshot();
    if now.generation != state.generation && !door.registry.recheck(&registration, &now) {
        return Err(Refusal::new(DenyReason::Revoked, super::registry::ENDED_HINT));
    }
    Ok(Authorized { identity, hold: Hold::new(registration, permit, meter), by_inspect })
}

/// What a request asks of its sandbox's budgets: the host it contacts (a peer by its
/// name), or the route it uses.
fn budget_ask<'a>(identity: &'a Identity, subject: &'a Subject, named: Option<&'a str>) -> crate::budget::Ask<'a> {
    let (host, route) = match subject {
        Subject::Host(t) | Subject::Request { target: t, .. } => (t.host.as_name().or(named), None),
        Subject::Peer { .. } => (named, None),
        Subject::Route { route, .. } => (None, Some(route.as_str())),
        Subject::Git { .. } => (None, None),
    };
    crate::budget::Ask { sandbox: &identity.sandbox, spec: identity.policy.budget(), host, route }
}

/// Fills the decision fields of a record; logs a report-mode `would_deny`.
fn record_decision(rec: &mut AccessRecord, identity: &Identity, decision: &Decision<'_>) {
    rec.decision = decision.outcome();
    rec.reason = decision.reason().map(DenyReason::code);
    rec.rule = decision.rule().map(|r| r.logged());
    if decision.outcome() == Outcome::WouldDeny {
        tracing::info!(
            sandbox = %identity.sandbox,
            policy = identity.policy.name(),
            target = %rec.target,
            reason = decision.reason().map(DenyReason::code),
            "would_deny: policy in report mode let a denied request through"
        );
    }
}

/// Decides `subject` under the shadow policies too; a disagreement is recorded on the
/// access record and counted. Never changes what happens to the request.
fn shadow_compare(rec: &mut AccessRecord, state: &State, sandbox: &str, subject: &Subject) {
    let Some(shadow) = &state.shadow else { return };
    let shadow_outcome = match shadow.sandbox(sandbox) {
        Some(s) => policy::decide(&s.policy, subject, None).outcome(),
        None => Outcome::Deny,
    };
    if shadow_outcome != rec.decision {
        rec.shadow_decision = Some(shadow_outcome);
        ::metrics::counter!(
            crate::metrics::POLICY_SHADOW_DISAGREEMENTS,
            "live" => rec.decision.as_str(),
            "shadow" => shadow_outcome.as_str()
        )
        .increment(1);
    }
}
