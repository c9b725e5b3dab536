//! Every live connection the gateway carries for a sandbox (CONNECT tunnels, upgraded
//! connections, forwarded exchanges, git and API-route streams), with the credential
//! that authenticated it and what it was allowed to reach. A reload ends those the new
//! state refuses (a revoked sandbox or `jti`, a rotated static token, a removed signing
//! key, a narrowed policy, a changed egress budget); an expiry sweep ends those whose
//! signed token has expired.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::auth::{Credential, Identity};
use crate::policy::{self, Policy, Subject};
use crate::reload::State;

struct Entry {
    sandbox: std::sync::Arc<str>,
    /// The policy the credential named (a signed token's `pol`); static tokens take
    /// their sandbox's policy from the state.
    policy: std::sync::Arc<str>,
    credential: Credential,
    repos: Option<Vec<String>>,
    /// What authorized it.
    held: Subject,
    /// What it was held to since: a push's ref updates, once read.
    also: Vec<Subject>,
    /// The VPC endpoint its client connection came through (PROXY protocol v2), held
    /// to the sandbox's binding under each new state.
    via: Option<String>,
    /// The policy's egress budget it was admitted under, and is counted against: a
    /// reload that changes it ends the connection, which would go on counting against
    /// the old one (or none).
    budget: Option<Arc<crate::policy::budget::BudgetSpec>>,
    cancel: CancellationToken,
    /// The end of the client connection that carries it (`door::watch::Watch::end`),
    /// cancelled with it by a sweep: a body nobody polls cannot notice its own.
    carrier: Option<CancellationToken>,
}

/// A slab, not a map: entries lie densely in one growing table (a map of 9,000 open
/// tunnels spread them over 16,384 buckets, about 540 bytes each), and a freed key is
/// reused by the next registration.
type Open = Mutex<slab::Slab<Entry>>;

/// The key of a registration that never entered the table (registered after
/// [`Registry::end_all`]): it finds and removes nothing.
const NOT_HELD: usize = usize::MAX;

/// The table, locked. A panic while it was held leaves entries that are still true:
/// ending, sweeping and removing go on.
fn table(open: &Open) -> std::sync::MutexGuard<'_, slab::Slab<Entry>> {
    open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Default)]
pub struct Registry {
    open: Arc<Open>,
    /// Set by [`Registry::end_all`]: what registers after it is ended at once.
    ended: std::sync::atomic::AtomicBool,
}

/// Removes its connection from the registry when dropped; [`Registration::cancelled`]
/// fires when a sweep ends it.
pub struct Registration {
    open: Arc<Open>,
    id: usize,
    cancel: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        table(&self.open).try_remove(self.id);
    }
}

impl Registration {
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Adds to what the connection is held to (a push's refs, once read), so that a
    /// later sweep judges them too.
    pub fn hold_also(&self, more: impl IntoIterator<Item = Subject>) {
        if let Some(e) = table(&self.open).get_mut(self.id) {
            e.also.extend(more);
        }
    }

    /// True once a sweep has ended the connection.
    pub fn is_ended(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Runs `fut` unless the connection is ended first (`None`).
    pub fn unless_ended<F: Future>(&self, fut: F) -> UnlessEnded<'_, F> {
        UnlessEnded::new(&self.cancel, fut)
    }
}

pin_project_lite::pin_project! {
    /// `fut`, unless `token` is cancelled first (`None`). A struct rather than an
    /// `async fn`: an `async fn` would hold `fut` twice (as its argument, then inside
    /// its `select!`), and `fut` is a dial or an upstream exchange of a kilobyte or
    /// more. The cancellation future is polled only to register the task's waker;
    /// later polls read the token's flag (polling it on each of the several wakes a
    /// keep-alive request makes cost about 150 instructions each).
    pub struct UnlessEnded<'a, F> {
        token: &'a CancellationToken,
        #[pin]
        ended: tokio_util::sync::WaitForCancellationFuture<'a>,
        // The waker the cancellation future was last polled with.
        registered: Option<std::task::Waker>,
        #[pin]
        fut: F,
    }
}

impl<'a, F: Future> UnlessEnded<'a, F> {
    pub fn new(token: &'a CancellationToken, fut: F) -> Self {
        UnlessEnded { token, ended: token.cancelled(), registered: None, fut }
    }
}

impl<F: Future> Future for UnlessEnded<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Ended first: a connection ended while its future was ready is still ended.
        if this.token.is_cancelled() {
            return Poll::Ready(None);
        }
        if this.registered.as_ref().is_none_or(|w| !w.will_wake(cx.waker())) {
            if this.ended.poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            *this.registered = Some(cx.waker().clone());
        }
        this.fut.poll(cx).map(Some)
    }
}

/// The hint of a request refused because a sweep ended it while it waited upstream.
pub const ENDED_HINT: &str =
    "the credential or policy changed while this request was being set up, and no longer allows it";

impl Registry {
    /// Records a live connection authorized for `identity` to reach `subject`, carried
    /// on a client connection that `carrier` ends. Its token is its own, not a child of
    /// a shared one: registering takes no lock but the registry's, and
    /// [`Registry::end_all`] reaches every connection through the table.
    pub fn register(
        &self,
        identity: &Identity,
        subject: Subject,
        via: Option<&str>,
        carrier: Option<CancellationToken>,
    ) -> Registration {
        let cancel = CancellationToken::new();
        let entry = Entry {
            sandbox: identity.sandbox.clone(),
            policy: identity.policy.shared_name(),
            credential: identity.credential.clone(),
            repos: identity.repos.clone(),
            held: subject,
            also: Vec::new(),
            via: via.map(str::to_string),
            budget: identity.policy.budget().cloned(),
            cancel: cancel.clone(),
            carrier,
        };
        let mut open = table(&self.open);
        // Checked under the lock `end_all` takes after setting it: either this sees it
        // set, or `end_all` sees this entry.
        let id = if self.ended.load(Ordering::SeqCst) {
            cancel.cancel();
            NOT_HELD
        } else {
            open.insert(entry)
        };
        drop(open);
        Registration { open: self.open.clone(), id, cancel }
    }

    /// Ends every live connection, and any registered from now on: in-flight work must
    /// stop (the drain's grace period is over).
    pub fn end_all(&self) -> usize {
        self.ended.store(true, Ordering::SeqCst);
        // A poisoned table still holds every entry: end them all anyway.
        let open = table(&self.open);
        open.iter().map(|(_, e)| e).filter(|e| !e.cancel.is_cancelled()).inspect(|e| e.end()).count()
    }

    pub fn len(&self) -> usize {
        table(&self.open).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `sandbox`'s live connections: what each was authorized to reach.
    pub fn open_for(&self, sandbox: &str) -> Vec<String> {
        table(&self.open)
            .iter()
            .map(|(_, e)| e)
            .filter(|e| *e.sandbox == *sandbox)
            .map(|e| e.held.to_string())
            .collect()
    }

    /// Ends every connection whose credential `state` refuses, or whose destination
    /// its policy no longer allows. Returns how many were ended.
    pub fn close_disallowed(&self, state: &State) -> usize {
        self.close_where(|e| refusal(state, e))
    }

    /// Judges one registration under `state`, as a sweep would, and ends it if
    /// refused; `true` when it may go on. For a request decided under an older state
    /// than `state`: a reload's sweep that ran between its decision and its
    /// registration did not see it.
    pub fn recheck(&self, registration: &Registration, state: &State) -> bool {
        let open = table(&self.open);
        let Some(e) = open.get(registration.id) else { return false };
        if refusal(state, e).is_none() {
            return true;
        }
        e.cancel.cancel();
        false
    }

    /// Ends every connection authenticated by a signed token that expired more than
    /// `grace_secs` before `now` (unix seconds).
    pub fn close_expired(&self, now: u64, grace_secs: u64) -> usize {
        self.close_where(|e| match e.credential {
            Credential::Signed { expires, .. } if expires.saturating_add(grace_secs) < now => {
                Some("its signed token has expired")
            }
            _ => None,
        })
    }

    fn close_where(&self, why: impl Fn(&Entry) -> Option<&'static str>) -> usize {
        let open = table(&self.open);
        let mut closed = 0;
        for (_, e) in open.iter() {
            if e.cancel.is_cancelled() {
                continue;
            }
            if let Some(reason) = why(e) {
                tracing::info!(sandbox = %e.sandbox, target = %e.held, reason, "closing a connection");
                e.end();
                closed += 1;
            }
        }
        closed
    }
}

impl Entry {
    /// Ends the connection, and the client connection that carries it.
    fn end(&self) {
        self.cancel.cancel();
        if let Some(c) = &self.carrier {
            c.cancel();
        }
    }
}

/// Why `state` ends `e`, if it does: a credential or destination it refuses, or a
/// change to the egress budget `e` counts against.
fn refusal(state: &State, e: &Entry) -> Option<&'static str> {
    if !allowed(state, e) {
        return Some("the new policies or credentials no longer allow it");
    }
    let now = policy_for(state, e).and_then(|p| p.budget());
    (now.map(|b| &**b) != e.budget.as_deref()).then_some("its policy's egress budget changed")
}

fn allowed(state: &State, e: &Entry) -> bool {
    policy_for(state, e).is_some_and(|p| {
        // Bound (now) to VPC endpoints: the one it came through must be among them.
        let binding = state.policies.vpce_binding(&e.sandbox, p);
        if !binding.is_empty() && !e.via.as_ref().is_some_and(|v| binding.contains(v)) {
            return false;
        }
        std::iter::once(&e.held).chain(&e.also).all(|s| {
            // A peer's half of the agreement is judged again under the new state.
            let fresh;
            let s = match s {
                Subject::Peer { sandbox, port, .. } => {
                    let name = format!("{sandbox}.{}", state.policies.peer_suffix);
                    match crate::addr::parse_authority(&format!("{name}:{port}"), None) {
                        Ok(t) => {
                            fresh = state.policies.subject_for(&e.sandbox, &t);
                            // Dialled at the address it had then: a peer that moved is
                            // not this connection's peer any more.
                            if fresh != *s {
                                return false;
                            }
                            &fresh
                        }
                        Err(_) => return false,
                    }
                }
                other => other,
            };
            policy::decide(p, s, e.repos.as_deref()).permits()
        })
    })
}

/// The policy that governs `e` under `state`, if its credential is still good there.
fn policy_for<'s>(state: &'s State, e: &Entry) -> Option<&'s Arc<Policy>> {
    governing(state, &e.sandbox, &e.policy, &e.credential)
}

/// The policy that governs `sandbox` (authenticated by `credential`, a signed token
/// naming `policy`) under `state`, if the credential is still good there.
fn governing<'s>(state: &'s State, sandbox: &str, policy: &str, credential: &Credential) -> Option<&'s Arc<Policy>> {
    if state.tokens.is_revoked(sandbox) {
        return None;
    }
    match credential {
        Credential::Static { token_sha256 } => {
            let sbx = state.policies.sandbox(sandbox)?;
            (sbx.token_sha256 == *token_sha256).then_some(&sbx.policy)
        }
        Credential::Network { addr: Some(ip) } => {
            let sbx = state.policies.sandbox_at(*ip).filter(|s| *s.id == *sandbox)?;
            Some(&sbx.policy)
        }
        Credential::Network { addr: None } => state.policies.sandbox(sandbox).map(|s| &s.policy),
        Credential::Signed { kid, key, jti, .. } => {
            if state.tokens.key_fingerprint(kid) != Some(*key)
                || jti.as_ref().is_some_and(|j| state.tokens.is_revoked(j))
            {
                return None;
            }
            state.policies.policies.get(policy)
        }
    }
}

/// `identity` (established when its connection opened) under `state`: the policy that
/// governs it now, or `None` when its credential no longer holds (rotated, revoked,
/// expired). Requests inside an inspected connection are identified this way.
pub fn refreshed(state: &State, identity: &Identity, now: u64) -> Option<Identity> {
    if let Credential::Signed { expires, .. } = identity.credential
        && expires < now
    {
        return None;
    }
    let policy = governing(state, &identity.sandbox, identity.policy.name(), &identity.credential)?;
    let vpce = state.policies.vpce_binding(&identity.sandbox, policy).to_vec();
    Some(Identity { policy: policy.clone(), vpce, ..identity.clone() })
}

/// What a request holds for as long as any of its bodies flows: its registration
/// (so a sweep can end it) and its place under the sandbox's concurrency limit. Shared
/// by the request body going up and the response body coming down, and released when
/// both are done: an upload that outlives its response still counts and can be ended.
pub struct Hold {
    registration: Registration,
    _permit: super::limits::Permit,
    meter: Option<Arc<crate::budget::Meter>>,
}

impl Hold {
    pub fn new(
        registration: Registration,
        permit: super::limits::Permit,
        meter: Option<Arc<crate::budget::Meter>>,
    ) -> Hold {
        Hold { registration, _permit: permit, meter }
    }

    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// Counts the request's bytes against its byte budgets, if it has any.
    pub fn meter(&self) -> Option<&Arc<crate::budget::Meter>> {
        self.meter.as_ref()
    }
}

/// A body (or any stream) that ends with an error once its registration is cancelled:
/// how forwarded exchanges, git and API-route streams are cut by a sweep, both ways.
pub struct Revocable<B> {
    inner: B,
    /// Which way its bytes go, for the request's byte budgets.
    dir: crate::budget::Dir,
    /// Dropped with the last body of the request, which unregisters it.
    hold: Arc<Hold>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    /// A frame held back while this instance waits for the shared budget store (it
    /// spent its lease), and the wait: true once it may go on.
    held: Option<http_body::Frame<bytes::Bytes>>,
    waiting: Option<Pin<Box<dyn Future<Output = bool> + Send>>>,
}

impl<B> Revocable<B> {
    pub fn new(inner: B, hold: Arc<Hold>, dir: crate::budget::Dir) -> Self {
        let cancelled = Box::pin(hold.registration.cancel.clone().cancelled_owned());
        Revocable { inner, dir, hold, cancelled, held: None, waiting: None }
    }

    fn spent(&self) -> super::BoxError {
        let spent = self.hold.meter().and_then(|m| m.why()).map_or("a byte budget", |e| e.budget.as_str());
        format!("ended: the sandbox spent its budget {spent}").into()
    }
}

impl<B> http_body::Body for Revocable<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<super::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = super::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, super::BoxError>>> {
        if self.cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err("connection ended: its credential or policy no longer allows it".into())));
        }
        if let Some(waiting) = self.waiting.as_mut() {
            let go = std::task::ready!(waiting.as_mut().poll(cx));
            self.waiting = None;
            let frame = self.held.take();
            return Poll::Ready(if go { frame.map(Ok) } else { Some(Err(self.spent())) });
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into);
        let Poll::Ready(Some(Ok(frame))) = polled else { return polled };
        let Some(meter) = self.hold.meter() else { return Poll::Ready(Some(Ok(frame))) };
        match meter.add(self.dir, frame_bytes(&frame)) {
            crate::budget::Flow::Go => Poll::Ready(Some(Ok(frame))),
            crate::budget::Flow::Stop => Poll::Ready(Some(Err(self.spent()))),
            crate::budget::Flow::Wait => {
                let (meter, dir) = (meter.clone(), self.dir);
                self.held = Some(frame);
                self.waiting = Some(Box::pin(async move { meter.room(dir).await }));
                self.poll_frame(cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What a frame costs against a byte budget: a data frame its bytes, a trailers frame
/// its fields as a head counts them (trailers can carry as much as a body).
fn frame_bytes(frame: &http_body::Frame<bytes::Bytes>) -> u64 {
    if let Some(data) = frame.data_ref() {
        return data.len() as u64;
    }
    frame.trailers_ref().map_or(0, |t| super::bodies::fields_len(t) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;

    fn identity(sandbox: &str) -> Identity {
        Identity {
            sandbox: sandbox.into(),
            policy: Arc::new(Policy::builder("p", Mode::Enforce, &[443]).build()),
            repos: None,
            vpce: Vec::new(),
            credential: Credential::Static { token_sha256: [0; 32] },
        }
    }

    fn host(s: &str) -> Subject {
        Subject::Host(crate::addr::parse_authority(s, None).unwrap())
    }

    #[test]
    fn a_registration_after_end_all_is_ended_and_its_drop_removes_no_other_entry() {
        let r = Registry::default();
        let a = r.register(&identity("a"), host("a.test:443"), None, None);
        let b = r.register(&identity("b"), host("b.test:443"), None, None);
        drop(a);
        assert_eq!(r.open_for("a"), Vec::<String>::new());
        let c = r.register(&identity("c"), host("c.test:443"), None, None);
        assert_eq!(
            (r.len(), r.open_for("b"), r.open_for("c")),
            (2, vec!["b.test:443".into()], vec!["c.test:443".into()])
        );

        assert_eq!(r.end_all(), 2);
        assert!(b.is_ended() && c.is_ended());
        let late = r.register(&identity("d"), host("d.test:443"), None, None);
        assert!(late.is_ended(), "registered after end_all: ended at once");
        assert_eq!(r.len(), 2, "and never in the table");
        drop(late);
        assert_eq!(r.len(), 2, "dropping it removed no one else's entry");
        drop((b, c));
        assert!(r.is_empty());
    }

    #[test]
    fn trailers_cost_their_fields_against_a_byte_budget() {
        let data = http_body::Frame::data(bytes::Bytes::from_static(b"12345"));
        assert_eq!(frame_bytes(&data), 5);
        let mut t = http::HeaderMap::new();
        t.insert("x-big", http::HeaderValue::from_str(&"v".repeat(1000)).unwrap());
        // "x-big: " + value + CRLF, then the blank line that ends them.
        assert_eq!(frame_bytes(&http_body::Frame::trailers(t)), 5 + 1000 + 4 + 2);
    }
}
