//! Every refusal, on every entry path, answered and recorded the same way: the deny
//! reason as a status, a reason phrase, `Proxy-Status`, `X-Egress-Deny-Reason` and a
//! JSON body, and one access record (log line and metrics) for it.

use http::header::{HeaderValue, PROXY_AUTHENTICATE, WWW_AUTHENTICATE};
use http::{Response, StatusCode};

use super::respond::{self, Denial};
use super::{Entry, ProxyBody};
use crate::access_log::AccessRecord;
use crate::policy::{DenyReason, Outcome};

/// Why a request is refused, and what to tell its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: DenyReason,
    /// What to do instead, or the specific detail.
    pub hint: Option<String>,
    /// The policy rule that refused it, as the access log names rules.
    pub rule: Option<std::sync::Arc<str>>,
    /// A status other than the reason's own (`403` for a refused route method, say).
    pub status: Option<StatusCode>,
    /// The budget or limit spent, and the seconds until it has room (`Retry-After`).
    pub budget: Option<(String, u64)>,
}

impl Refusal {
    pub fn new(reason: DenyReason, hint: impl Into<String>) -> Refusal {
        Refusal { reason, hint: Some(hint.into()), rule: None, status: None, budget: None }
    }

    /// `429 limit_exceeded` for a spent budget, with its name and `Retry-After`.
    pub fn budget(spent: crate::budget::Exhausted) -> Refusal {
        Refusal {
            reason: DenyReason::LimitExceeded,
            hint: Some(spent.hint),
            rule: None,
            status: None,
            budget: Some((spent.budget, spent.retry_after)),
        }
    }

    pub fn with_status(mut self, status: StatusCode) -> Refusal {
        self.status = Some(status);
        self
    }
}

/// Records and answers a refusal. On the origin-form entry a credentials refusal is
/// `401` with `WWW-Authenticate` instead of `407`, so clients that are not talking to a
/// proxy (git, SDKs) send credentials.
pub fn refuse(rec: &mut AccessRecord, refusal: Refusal, entry: Entry) -> Response<ProxyBody> {
    let Refusal { reason, hint, rule, status, budget } = refusal;
    let mut resp = respond::deny(
        reason,
        &Denial {
            target: Some(&*rec.target),
            sandbox: rec.sandbox.as_deref(),
            policy: rec.policy.as_deref(),
            rule: rule.as_deref(),
            hint: hint.clone(),
        },
    );
    if let Some(s) = status {
        *resp.status_mut() = s;
    }
    if entry == Entry::Origin && resp.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        resp.headers_mut().remove(PROXY_AUTHENTICATE);
        resp.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(respond::REALM));
    }
    let challenged = resp.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED;
    if entry == Entry::Identified && challenged {
        *resp.status_mut() = StatusCode::FORBIDDEN;
        resp.headers_mut().remove(PROXY_AUTHENTICATE);
    }
    if status.is_some() || entry == Entry::Origin || (entry == Entry::Identified && challenged) {
        respond::rephrase(&mut resp, reason, hint.as_deref());
    }
    if let Some((name, retry_after)) = budget {
        resp.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after));
        if let Ok(v) = HeaderValue::from_str(&name) {
            resp.headers_mut().insert(respond::BUDGET_HEADER, v);
        }
        rec.budget = Some(name);
    }
    recorded(rec, reason, rule, resp)
}

/// [`refuse`] with `status` instead of the reason's own, when given (`403` for a route
/// method, `502` for an upstream's refusal of the gateway's credential).
pub fn refuse_as(
    rec: &mut AccessRecord,
    reason: DenyReason,
    status: Option<StatusCode>,
    hint: &str,
    entry: Entry,
) -> Response<ProxyBody> {
    let mut refusal = Refusal::new(reason, hint);
    refusal.status = status;
    refuse(rec, refusal, entry)
}

/// Records a refusal answered in a handler's own terms (git's smart-HTTP refusals).
pub fn recorded(
    rec: &mut AccessRecord,
    reason: DenyReason,
    rule: Option<std::sync::Arc<str>>,
    resp: Response<ProxyBody>,
) -> Response<ProxyBody> {
    record_refusal(rec, reason, rule, resp.status().as_u16());
    resp
}

/// Records a refusal answered outside HTTP (a transparent TLS client's alert), with
/// the HTTP status it stands for.
pub fn record_refusal(rec: &mut AccessRecord, reason: DenyReason, rule: Option<std::sync::Arc<str>>, status: u16) {
    rec.decision = Outcome::Deny;
    rec.reason = Some(reason.code());
    rec.rule = rule;
    rec.status = status;
    rec.emit();
}

/// A tunnel that a spent byte budget ended: its record says which budget, and a log
/// line says so.
pub fn budget_ended(rec: &mut AccessRecord, end: crate::relay::End, meter: Option<&crate::budget::Meter>) {
    if end != crate::relay::End::Budget {
        return;
    }
    let spent = meter.and_then(crate::budget::Meter::why);
    rec.reason = Some(DenyReason::LimitExceeded.code());
    rec.budget = spent.map(|s| s.budget.clone());
    tracing::info!(
        sandbox = rec.sandbox.as_deref(),
        target = %rec.target,
        budget = rec.budget.as_deref(),
        bytes_up = rec.bytes_up,
        bytes_down = rec.bytes_down,
        "tunnel closed: its sandbox spent a byte budget"
    );
}

/// The status an access record shows for a request whose client left first (nginx
/// logs the same case so): hyper drops a handler whose client closed or reset its
/// connection before the answer's head, when the request may already be upstream.
pub const CLIENT_CLOSED: u16 = 499;

/// A request whose client left while its body went upstream (the client's connection
/// closed or was reset mid-body): recorded as [`Abandoned`] records it, status
/// [`CLIENT_CLOSED`], not as a refusal. The answer goes out only if anyone still reads.
pub fn client_left(rec: &mut AccessRecord, hint: &str) -> Response<ProxyBody> {
    let denial = Denial {
        target: Some(&*rec.target),
        sandbox: rec.sandbox.as_deref(),
        policy: rec.policy.as_deref(),
        rule: None,
        hint: Some(hint.to_string()),
    };
    let resp = respond::deny(DenyReason::BadRequest, &denial);
    rec.status = CLIENT_CLOSED;
    rec.emit();
    resp
}

/// Held across the exchange with the upstream: if the handler is dropped before it is
/// disarmed (the client left), the request is still recorded, with status
/// [`CLIENT_CLOSED`] and the bytes that went up. Without it, a request that reached the
/// upstream left no log line and no metric.
pub struct Abandoned<'a> {
    rec: &'a mut AccessRecord,
    bytes_up: &'a std::sync::atomic::AtomicU64,
    armed: bool,
}

impl<'a> Abandoned<'a> {
    pub fn arm(rec: &'a mut AccessRecord, bytes_up: &'a std::sync::atomic::AtomicU64) -> Self {
        Abandoned { rec, bytes_up, armed: true }
    }

    /// The exchange ended (answered, failed or timed out): its handler records it.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.rec.status = CLIENT_CLOSED;
            self.rec.bytes_up = self.bytes_up.load(std::sync::atomic::Ordering::Relaxed);
            self.rec.emit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access_log::Kind;

    fn refused(reason: DenyReason, entry: Entry) -> Response<ProxyBody> {
        let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let mut rec = AccessRecord::new(Kind::Transparent, "GET", "x.test:80", peer, 1);
        refuse(&mut rec, Refusal::new(reason, "why"), entry)
    }

    #[test]
    fn a_request_identified_by_its_connection_is_never_challenged() {
        for reason in [DenyReason::AuthInvalid, DenyReason::AuthRequired] {
            let resp = refused(reason, Entry::Identified);
            assert_eq!(resp.status(), StatusCode::FORBIDDEN);
            assert!(!resp.headers().contains_key(PROXY_AUTHENTICATE));
            assert!(!resp.headers().contains_key(WWW_AUTHENTICATE));
            assert_eq!(refused(reason, Entry::Absolute).status(), StatusCode::PROXY_AUTHENTICATION_REQUIRED);
        }
        assert_eq!(refused(DenyReason::HostDenied, Entry::Identified).status(), StatusCode::FORBIDDEN);
    }
}
