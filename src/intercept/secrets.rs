//! Placeholder credentials: the sandbox holds `EGRESS_SECRET_NAME`; on a request to a
//! host the secret is bound to, the gateway writes the value in its place (headers
//! always, the query and the body where the secret says so). A placeholder on its way
//! to any other host refuses the request, so that an agent talked into sending its key
//! elsewhere sends nothing.

use std::collections::HashMap;

use base64::Engine;
use http::HeaderValue;

use crate::addr::Target;
use crate::config::{PLACEHOLDER_PREFIX, SecretConfig};
use crate::secret::Secret;

use super::charset::{self, Charset};
use super::placeholders::{Output, Stop, Swap, Swaps, Then, why};

/// What was put in place of placeholders, and what every response from the host is
/// redacted of: every value bound to it for this sandbox (a value swapped in by one
/// request and stored upstream must not come back in another's response).
#[derive(Default)]
pub struct Swapped {
    /// Redacted from the response: each bound value, and the escaped forms used.
    pub values: Vec<String>,
    /// What to replace in the request body, for [`SubstituteBody`](super::placeholders::SubstituteBody):
    /// empty unless a secret bound here has `body = true`; then every configured
    /// placeholder, the others kept as they are.
    pub body: Vec<Swap>,
    /// What the head says of the body's charset (its `Content-Type`), when `body` is set.
    pub declared: Charset,
    /// A placeholder was replaced in the head (headers or query).
    pub used: bool,
}

impl Swapped {
    /// The response must be redacted (and asked for unencoded).
    pub fn any(&self) -> bool {
        !self.values.is_empty() || !self.body.is_empty()
    }

    /// A value travels in this request (its head, or possibly its body).
    pub fn lends(&self) -> bool {
        self.used || !self.body.is_empty()
    }

    fn redact(&mut self, v: &str) {
        if !self.values.iter().any(|x| x == v) {
            self.values.push(v.to_string());
        }
    }
}

/// A placeholder where its secret may not go.
#[derive(Debug)]
pub struct Misuse {
    pub hint: String,
    /// For the log: the placeholder was headed elsewhere, or refused where it stood.
    pub elsewhere: bool,
}

fn misuse(s: &SecretConfig, host: &Target, place: &str) -> Misuse {
    Misuse {
        hint: format!(
            "{} in the {place} is bound to other hosts (secrets name={:?}), not {host}; the request was not sent",
            s.placeholder(),
            s.name
        ),
        elsewhere: true,
    }
}

/// A placeholder on its own host, refused where it stands.
fn here(hint: String) -> Misuse {
    Misuse { hint, elsewhere: false }
}

/// The longest decoded `user:password` a placeholder is written into.
const BASIC_MAX: usize = 1024;

/// The decoded `user:password` of `Basic` credentials.
fn basic_credentials(value: &[u8]) -> Option<Vec<u8>> {
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(rest.trim_ascii()).ok()
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// One pass of `swaps` over `input` ([`Output::push`]), or why not.
fn substitute(input: &[u8], swaps: &Swaps) -> Result<Output, Stop> {
    let mut out = Output::default();
    out.push(input, swaps, false)?;
    Ok(out)
}

/// Replaces the placeholders in `parts` (headers, and the query where allowed) for a
/// request to `host` by a sandbox under `policy`. `body`: whether the request may have
/// a body (bound secrets with `body = true` are then replaced in it as it streams).
pub fn swap(
    parts: &mut http::request::Parts,
    host: &Target,
    policy: &str,
    secrets: &[SecretConfig],
    values: &HashMap<String, Secret>,
    has_body: bool,
) -> Result<Swapped, Misuse> {
    let mut out = Swapped::default();
    if secrets.is_empty() {
        return Ok(out);
    }
    let prefix = PLACEHOLDER_PREFIX.as_bytes();
    // Each configured secret's value where it is bound here (same order as `secrets`).
    let bound: Vec<Option<&str>> = secrets
        .iter()
        .map(|s| s.bound_to(host, policy).then(|| values.get(&s.name).map(Secret::expose)).flatten())
        .collect();
    // Every value bound to the host is redacted from its answers, whichever policies
    // may lend it: a value one sandbox stored upstream must not come back to another.
    // On any port: a value stored through one port is read back through another.
    for s in secrets.iter().filter(|s| s.on_host_name(&host.host)) {
        if let Some(v) = values.get(&s.name) {
            out.redact(v.expose());
        }
    }
    let swaps = |then: &dyn Fn(usize) -> Then| -> Vec<Swap> {
        secrets
            .iter()
            .enumerate()
            .map(|(i, s)| Swap { placeholder: s.placeholder().into_bytes(), then: then(i) })
            .collect()
    };

    // In headers, Basic credentials included: each bound value, or a refusal.
    let heads = Swaps::new(swaps(&|i| bound[i].map_or(Then::Refuse, |v| Then::Write(v.as_bytes().to_vec()))));
    let in_headers = parts.headers.values().any(|v| find(v.as_bytes(), prefix));
    if in_headers {
        for (name, v) in parts.headers.iter_mut().filter(|(_, v)| find(v.as_bytes(), prefix)) {
            let done = substitute(v.as_bytes(), &heads).map_err(|stop| match stop {
                Stop::Refused(i) => misuse(&secrets[i], host, "headers"),
                other => here(why(&other, &heads.list, "headers")),
            })?;
            // `Basic` takes base64: an upstream would decode the value itself into
            // other bytes, which come back past the redactor.
            if let Some(&i) = done.written.first()
                && *name == http::header::AUTHORIZATION
                && v.as_bytes().trim_ascii().get(..6).is_some_and(|s| s.eq_ignore_ascii_case(b"basic "))
            {
                let ph = secrets[i].placeholder();
                return Err(here(format!(
                    "{ph} stands as Basic credentials, which an upstream decodes from base64 into other bytes; \
                     put it in user:password as curl -u user:{ph} does, the request was not sent"
                )));
            }
            out.used |= !done.written.is_empty();
            let Ok(mut nv) = HeaderValue::from_bytes(&done.bytes) else {
                return Err(here("a header with a placeholder could not be rebuilt".into()));
            };
            nv.set_sensitive(true);
            *v = nv;
        }
    }

    // `Basic` credentials are `user:password` in base64 (`curl -u user:EGRESS_SECRET_X`):
    // the placeholder is replaced inside, and the whole encoded again.
    for (_, v) in parts.headers.iter_mut().filter(|(k, _)| **k == http::header::AUTHORIZATION) {
        let Some(decoded) = basic_credentials(v.as_bytes()).filter(|d| find(d, prefix)) else { continue };
        // The credentials, encoded, are redacted from the answer in every spelling:
        // what the sandbox writes around the placeholder is bounded, or it would size
        // the redactor (and its cache) at will.
        if decoded.len() > BASIC_MAX {
            return Err(here(format!(
                "Basic credentials holding a placeholder may be at most {BASIC_MAX} bytes (user:password decoded); \
                 the request was not sent"
            )));
        }
        let done = substitute(&decoded, &heads).map_err(|stop| match stop {
            Stop::Refused(i) => misuse(&secrets[i], host, "Basic credentials"),
            other => here(why(&other, &heads.list, "Basic credentials")),
        })?;
        out.used |= !done.written.is_empty();
        let encoded = base64::engine::general_purpose::STANDARD.encode(&done.bytes);
        let Ok(mut nv) = HeaderValue::from_str(&format!("Basic {encoded}")) else {
            return Err(here("a header with a placeholder could not be rebuilt".into()));
        };
        nv.set_sensitive(true);
        *v = nv;
        // An upstream that echoes the header echoes the value in this form.
        out.redact(&encoded);
    }

    let pq = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    if find(pq.as_bytes(), prefix) {
        let (path, query) = pq.split_once('?').map_or((pq.as_str(), None), |(p, q)| (p, Some(q)));
        // The longest placeholder in the path names the secret (`_ORG` over its prefix).
        let named = secrets.iter().enumerate().filter(|(_, s)| path.contains(&s.placeholder()));
        if let Some((i, s)) = named.max_by_key(|(_, s)| s.name.len()) {
            return Err(match bound[i] {
                None => misuse(s, host, "path"),
                Some(_) => here(format!(
                    "{} is replaced in headers, and in the query or body where configured, never in the path",
                    s.placeholder()
                )),
            });
        }
        if let Some(query) = query {
            let escaped: Vec<Option<String>> =
                bound.iter().map(|v| v.map(|v| crate::redact::percent_escape(v, true))).collect();
            let queries = Swaps::new(swaps(&|i| match &escaped[i] {
                Some(e) if secrets[i].query => Then::Write(e.clone().into_bytes()),
                _ => Then::Refuse,
            }));
            let done = substitute(query.as_bytes(), &queries).map_err(|stop| match stop {
                Stop::Refused(i) if bound[i].is_none() => misuse(&secrets[i], host, "query"),
                Stop::Refused(i) => here(format!(
                    "{} is in the query, but secrets name={:?} does not set query = true",
                    secrets[i].placeholder(),
                    secrets[i].name
                )),
                other => here(why(&other, &queries.list, "query")),
            })?;
            for &i in &done.written {
                out.used = true;
                if let (Some(v), Some(e)) = (bound[i], &escaped[i]) {
                    out.redact(v);
                    // An upstream that echoes its URL (a redirect, a next-page link)
                    // echoes the value as it was sent.
                    out.redact(e);
                }
            }
            let query = String::from_utf8(done.bytes).map_err(|_| here("the URI could not be rebuilt".into()))?;
            let mut uri = std::mem::take(&mut parts.uri).into_parts();
            uri.path_and_query = format!("{path}?{query}").parse().ok();
            parts.uri = http::Uri::from_parts(uri).map_err(|_| here("the URI could not be rebuilt".into()))?;
        }
    }

    let lent_in_body = |i: usize| has_body && secrets[i].body && bound[i].is_some();
    if (0..secrets.len()).any(lent_in_body) {
        out.body = swaps(&|i| match bound[i] {
            Some(v) if lent_in_body(i) => Then::Write(v.as_bytes().to_vec()),
            _ => Then::Keep,
        });
        out.declared =
            charset::declared(parts.headers.get_all(http::header::CONTENT_TYPE).iter().map(HeaderValue::as_bytes));
        for v in (0..secrets.len()).filter(|&i| lent_in_body(i)).filter_map(|i| bound[i]) {
            out.redact(v);
        }
    }
    // JSON may escape `/` in what it echoes.
    for v in out.values.clone() {
        if v.contains('/') {
            out.redact(&v.replace('/', "\\/"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretSource;
    use crate::policy::{HostPattern, PortSpec};

    fn cfg(name: &str, host: &str, query: bool) -> SecretConfig {
        SecretConfig {
            name: name.into(),
            source: SecretSource::Env("X".into()),
            hosts: vec![(HostPattern::Exact(host.into()), PortSpec::Default)],
            policies: vec![],
            query,
            body: false,
        }
    }

    fn parts(uri: &str, header: &str) -> http::request::Parts {
        let (p, ()) = http::Request::builder().uri(uri).header("authorization", header).body(()).unwrap().into_parts();
        p
    }

    #[test]
    fn swaps_on_bound_hosts_and_refuses_elsewhere() {
        let secrets = vec![cfg("openai", "api.openai.com", true)];
        let values = HashMap::from([("openai".to_string(), Secret::new("sk-real"))]);
        let t = |h: &str| crate::addr::parse_authority(h, Some(443)).unwrap();
        let bound = t("api.openai.com");
        let mut p = parts("/v1/x?key=EGRESS_SECRET_openai", "Bearer EGRESS_SECRET_openai");
        let s = swap(&mut p, &bound, "p", &secrets, &values, false).unwrap();
        assert_eq!(p.headers["authorization"], "Bearer sk-real");
        assert_eq!(p.uri.to_string(), "/v1/x?key=sk-real");
        assert_eq!(s.values, vec!["sk-real".to_string()]);

        let evil = t("evil.example");
        // The same host on another port is not the bound host.
        let mut p = parts("/", "Bearer EGRESS_SECRET_openai");
        assert!(swap(&mut p, &t("api.openai.com:8443"), "p", &secrets, &values, false).is_err());
        let mut p = parts("/", "Bearer EGRESS_SECRET_openai");
        assert!(swap(&mut p, &evil, "p", &secrets, &values, false).is_err());
        let mut p = parts("/?k=EGRESS_SECRET_openai", "none");
        assert!(swap(&mut p, &evil, "p", &secrets, &values, false).is_err());

        // Not in the query unless configured; never in the path.
        let strict = vec![cfg("openai", "api.openai.com", false)];
        let mut p = parts("/?k=EGRESS_SECRET_openai", "none");
        assert!(swap(&mut p, &bound, "p", &strict, &values, false).is_err());
        let mut p = parts("/EGRESS_SECRET_openai", "none");
        assert!(swap(&mut p, &bound, "p", &secrets, &values, false).is_err());

        // Bound to a policy: another policy's sandbox cannot use it.
        let mut only = cfg("openai", "api.openai.com", false);
        only.policies = vec!["agents".into()];
        let mut p = parts("/", "Bearer EGRESS_SECRET_openai");
        assert!(swap(&mut p, &bound, "other", &[only], &values, false).is_err());
        // One name the prefix of another: the longer wins, adjacent placeholders both
        // swap, and a name bound elsewhere still refuses.
        let two = vec![cfg("openai", "api.openai.com", false), cfg("openai_org", "api.openai.com", false)];
        let both = HashMap::from([
            ("openai".to_string(), Secret::new("sk-real")),
            ("openai_org".to_string(), Secret::new("org-1")),
        ]);
        let mut p = parts("/", "EGRESS_SECRET_openai_orgEGRESS_SECRET_openai EGRESS_SECRET_openai");
        swap(&mut p, &bound, "p", &two, &both, false).unwrap();
        assert_eq!(p.headers["authorization"], "org-1sk-real sk-real");
        let mut p = parts("/", "EGRESS_SECRET_openai_org");
        let Err(e) = swap(&mut p, &evil, "p", &two, &both, false) else { panic!("sent to evil") };
        assert!(e.hint.contains("\"openai_org\""), "{}", e.hint);
        let mut p = parts("/EGRESS_SECRET_openai_org", "none");
        let Err(e) = swap(&mut p, &evil, "p", &two, &both, false) else { panic!("sent to evil") };
        assert!(e.hint.contains("\"openai_org\""), "{}", e.hint);
        // Inside Basic credentials (`curl -u user:EGRESS_SECRET_openai`), encoded again;
        // refused on the way elsewhere like any header.
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut p = parts("/", &format!("Basic {}", b64("user:EGRESS_SECRET_openai")));
        let s = swap(&mut p, &bound, "p", &secrets, &values, false).unwrap();
        assert_eq!(p.headers["authorization"], format!("Basic {}", b64("user:sk-real")).as_str());
        assert!(s.used && s.values.contains(&b64("user:sk-real")));
        let mut p = parts("/", &format!("basic  {}", b64("user:EGRESS_SECRET_openai")));
        assert!(swap(&mut p, &evil, "p", &secrets, &values, false).is_err());
        let mut p = parts("/", &format!("Basic {}", b64("user:%4EGRESS_SECRET_openai")));
        assert!(swap(&mut p, &bound, "p", &secrets, &values, false).is_err());
        // Not as the base64 itself, which an upstream would decode into other bytes.
        // The credentials around a placeholder are bounded (they size the redactor).
        let long = format!("{}:EGRESS_SECRET_openai", "u".repeat(BASIC_MAX));
        let mut p = parts("/", &format!("Basic {}", b64(&long)));
        let Err(e) = swap(&mut p, &bound, "p", &secrets, &values, false) else { panic!("long Basic user taken") };
        assert!(e.hint.contains("at most 1024 bytes"), "{}", e.hint);
        let mut p = parts("/", "Basic EGRESS_SECRET_openai");
        let Err(e) = swap(&mut p, &bound, "p", &secrets, &values, false) else { panic!("decoded upstream") };
        assert!(e.hint.contains("curl -u user:EGRESS_SECRET_openai"), "{}", e.hint);
        // Answers from the bound host on any port are redacted of its values: one
        // stored through a bound port is read back through another.
        let port443 = vec![cfg("openai", "api.openai.com", false)];
        let mut p = parts("/", "none");
        let s = swap(&mut p, &t("api.openai.com:8443"), "p", &port443, &values, false).unwrap();
        assert_eq!(s.values, vec!["sk-real".to_string()]);
        // Unknown placeholder text passes untouched.
        let mut p = parts("/", "EGRESS_SECRET_unknown");
        assert!(!swap(&mut p, &evil, "p", &secrets, &values, false).unwrap().any());
    }
}
