//! Which sandbox is asking: the one place credentials are read and checked.

use http::HeaderMap;
use http::header::{self, HeaderName};

use super::{ConnInfo, Door, Entry};
use crate::auth::{self, AuthError, Credentials, Identity};
use crate::reload::State;

/// What a sandbox is told when its proxy credentials are missing or wrong.
pub const AUTH_HINT: &str = "use http://SANDBOX_ID:TOKEN@gateway:4002 as the proxy URL (Basic proxy credentials)";

/// Where a request's credentials may be.
#[derive(Debug, Clone, Copy)]
pub struct Presented<'a> {
    /// The first `Proxy-Authorization` value (what `HeaderMap::get` gives).
    pub proxy_authorization: Option<&'a [u8]>,
    /// The request's other headers, looked at on the origin-form entry only; `None`
    /// for a CONNECT head the fast path parsed in place.
    pub headers: Option<&'a HeaderMap>,
    pub entry: Entry,
    /// An API route's key header and its value prefix: on the origin-form entry an SDK
    /// sends `ID:TOKEN` there as its API key.
    pub api_key: Option<(&'a HeaderName, &'a str)>,
}

impl<'a> Presented<'a> {
    /// Credentials in `Proxy-Authorization` only: CONNECT and absolute-form requests.
    pub fn proxy(headers: &'a HeaderMap) -> Self {
        Presented::of(headers, Entry::Absolute, None)
    }

    /// Like [`Presented::proxy`], from the first `Proxy-Authorization` value alone.
    pub fn proxy_value(value: Option<&'a [u8]>) -> Self {
        Presented { proxy_authorization: value, headers: None, entry: Entry::Absolute, api_key: None }
    }

    /// Any request's credentials, wherever `entry` lets them be.
    pub fn of(headers: &'a HeaderMap, entry: Entry, api_key: Option<(&'a HeaderName, &'a str)>) -> Self {
        let proxy_authorization = headers.get(header::PROXY_AUTHORIZATION).map(|v| v.as_bytes());
        Presented { proxy_authorization, headers: Some(headers), entry, api_key }
    }

    /// The credentials, from the first place that has any: `Proxy-Authorization`;
    /// on the origin-form entry, `Authorization` (`Basic`, or `Bearer ID:TOKEN`), then
    /// the API key header.
    fn credentials(&self) -> Result<Credentials, AuthError> {
        if let Some(v) = self.proxy_authorization {
            return auth::parse_basic(v);
        }
        let Some(h) = self.headers.filter(|_| self.entry != Entry::Absolute) else {
            return Err(AuthError::Missing);
        };
        let authorization = h.get(header::AUTHORIZATION).map(|v| v.to_str().map_err(|_| AuthError::Malformed));
        match authorization {
            Some(Ok(v)) if scheme(v, "basic").is_some() => return auth::parse_basic(v.as_bytes()),
            Some(Ok(v)) if let Some(rest) = scheme(v, "bearer") => return pair(rest.trim()),
            _ => {}
        }
        // An `Authorization` of another scheme (an SDK's own) leaves the API key header
        // to carry the credential.
        if let Some((name, prefix)) = self.api_key
            && let Some(v) = h.get(name).and_then(|v| v.to_str().ok())
        {
            return pair(v.trim().strip_prefix(prefix).unwrap_or(v.trim()));
        }
        match authorization {
            Some(_) => Err(AuthError::Malformed),
            None => Err(AuthError::Missing),
        }
    }
}

/// The credentials after `scheme ` in an `Authorization` value, when it is that scheme.
fn scheme<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    value.split_once(' ').filter(|(x, _)| x.eq_ignore_ascii_case(scheme)).map(|(_, rest)| rest)
}

fn pair(s: &str) -> Result<Credentials, AuthError> {
    let (id, token) = s.split_once(':').ok_or(AuthError::Malformed)?;
    if id.is_empty() || token.is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(Credentials::new(id, token))
}

/// Authenticates a request under its client address's budget of failures (over it,
/// only a value some request proved lately is checked; any other is `limit_exceeded`
/// unchecked), and holds the identity to
/// the connection: a sandbox bound to VPC endpoints must come through one of them, and
/// with mutual TLS the client certificate's CN (when required to) must be the sandbox.
/// A failure other than no credentials at all spends budget.
pub fn identify(door: &Door, state: &State, conn: &ConnInfo, presented: Presented<'_>) -> Result<Identity, AuthError> {
    // A request inside an inspected connection is the sandbox that opened it, under
    // the policies of now; its own headers name no one.
    if let Some(outer) = &conn.identity {
        let identity = super::registry::refreshed(state, outer, crate::tokens::now()).ok_or(AuthError::Invalid)?;
        return check_binding(&identity, conn).map(|()| identity);
    }
    let ip = conn.peer.ip();
    let now = crate::tokens::now();
    // A connection that already proved these credentials is not held to its address's
    // failure budget: another client failing from the same address (behind one NAT)
    // must not shut out a sandbox already in.
    let memo = conn.remembered.as_deref().zip(presented.proxy_authorization);
    if let Some((memo, value)) = memo
        && let Some(identity) = memo.recall(value, state.generation, now)
    {
        return Ok(identity);
    }
    let credentials = presented.credentials();
    // Past the address's failure budget, only credentials proved lately are checked.
    let pair = credentials.as_ref().ok().map(auth::Credentials::as_bytes);
    if !door.admission.may_try_credentials(ip, pair, now) {
        return Err(AuthError::TooManyFailures);
    }
    let result = credentials
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|c| auth::authenticate(&state.policies, &state.tokens, c, now))
        .and_then(|identity| check_binding(&identity, conn).map(|()| identity));
    match &result {
        Ok(identity) => {
            if let Some((memo, value)) = memo {
                memo.remember(value, state.generation, identity);
            }
            if let Some(pair) = pair {
                door.admission.proved(pair, now);
            }
        }
        Err(AuthError::Missing) => {}
        Err(_) => door.admission.failed(ip),
    }
    result
}

/// The `Proxy-Authorization` value a connection's last request proved, the state it
/// was proved under (its generation) and the identity it proved. What [`identify`]
/// decides is a function of that value, the state, the connection and the time: a
/// request on the same connection with the same bytes under the same generation is the
/// same identity, unless a signed token has expired since (then it is checked again,
/// and refused). A reload, another value or a failure never reuses it.
#[derive(Default)]
pub struct Remembered(std::sync::Mutex<Option<Proven>>);

struct Proven {
    value: Box<[u8]>,
    generation: u64,
    identity: Identity,
}

impl Remembered {
    fn recall(&self, value: &[u8], generation: u64, now: u64) -> Option<Identity> {
        let proven = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let p = proven.as_ref().filter(|p| p.generation == generation && *p.value == *value)?;
        if let auth::Credential::Signed { expires, .. } = p.identity.credential
            && expires < now
        {
            return None;
        }
        Some(p.identity.clone())
    }

    fn remember(&self, value: &[u8], generation: u64, identity: &Identity) {
        let proven = Proven { value: value.into(), generation, identity: identity.clone() };
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(proven);
    }
}

fn check_binding(identity: &Identity, conn: &ConnInfo) -> Result<(), AuthError> {
    if !identity.vpce.is_empty() && !conn.vpce.as_ref().is_some_and(|v| identity.vpce.contains(v)) {
        return Err(AuthError::WrongNetwork);
    }
    if let Some(cn) = &conn.client_cn
        && **cn != *identity.sandbox
    {
        return Err(AuthError::WrongCertificate);
    }
    Ok(())
}

/// Who a token-less client is (transparent listeners): `sidecar`, the one sandbox the
/// instance serves (`transparent.sandbox`), or else the sandbox whose `addresses` claim
/// the client's address (the TCP peer, or a trusted PROXY header's). Held to the
/// connection like a token: VPC endpoint binding applies.
pub fn identify_by_address(state: &State, conn: &ConnInfo, sidecar: Option<&str>) -> Result<Identity, AuthError> {
    let (sandbox, addr) = match sidecar {
        Some(id) => (state.policies.sandbox(id), None),
        None => (state.policies.sandbox_at(conn.peer.ip()), Some(conn.peer.ip())),
    };
    let sandbox = sandbox.ok_or(AuthError::UnknownAddress)?;
    let identity = Identity {
        sandbox: sandbox.id.clone(),
        policy: sandbox.policy.clone(),
        repos: None,
        vpce: state.policies.vpce_binding(&sandbox.id, &sandbox.policy).to_vec(),
        credential: auth::Credential::Network { addr },
    };
    check_binding(&identity, conn)?;
    Ok(identity)
}
