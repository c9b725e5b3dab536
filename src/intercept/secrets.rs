//! Placeholder credentials: the sandbox holds `EGRESS_SECRET_NAME`; on a request to a
//! host the secret is bound to, the gateway writes the value in its place (headers
//! always, the query and the body where the secret says so). A placeholder on its way
//! to any other host refuses the request, so that an agent talked into sending its key
//! elsewhere sends nothing.

use std::collections::HashMap;

use http::HeaderValue;

use crate::addr::Target;
use crate::config::{PLACEHOLDER_PREFIX, SecretConfig};
use crate::secret::Secret;

/// What was put in place of placeholders, and what every response from the host is
/// redacted of: every value bound to it for this sandbox (a value swapped in by one
/// request and stored upstream must not come back in another's response).
#[derive(Default)]
pub struct Swapped {
    /// Redacted from the response: each bound value, and the escaped forms used.
    pub values: Vec<String>,
    /// `(placeholder, value)` pairs to replace in the request body.
    pub body: Vec<(String, String)>,
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
}

use crate::redact::any_glued;

/// A placeholder where its secret may not go.
#[derive(Debug)]
pub struct Misuse {
    pub hint: String,
}

fn misuse(s: &SecretConfig, host: &Target, place: &str) -> Misuse {
    Misuse {
        hint: format!(
            "{} in the {place} is bound to other hosts (secrets name={:?}), not {host}; the request was not sent",
            s.placeholder(),
            s.name
        ),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn replace(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len() + with.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// Replaces the placeholders in `parts` (headers, and the query where allowed) for a
/// request to `host` by a sandbox under `policy`. `body`: whether the request may have
/// a body (bound secrets with `body = true` are then streamed through it).
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
    let bound: Vec<(&SecretConfig, &str)> = secrets
        .iter()
        .filter(|s| s.bound_to(host, policy))
        .filter_map(|s| values.get(&s.name).map(|v| (s, v.expose())))
        .collect();
    let used = |v: &str, out: &mut Swapped| {
        if !out.values.iter().any(|x| x == v) {
            out.values.push(v.to_string());
        }
    };
    // Every value bound to the host is redacted from its answers, whichever policies
    // may lend it: a value one sandbox stored upstream must not come back to another.
    for s in secrets.iter().filter(|s| s.on_host(host)) {
        if let Some(v) = values.get(&s.name) {
            used(v.expose(), &mut out);
        }
    }
    let glued = |ph: &str| Misuse {
        hint: format!(
            "{ph} follows an unfinished escape (%, \\u, \\x, &#): an upstream that decodes it would alter the value; \
             the request was not sent"
        ),
    };

    for (_, v) in parts.headers.iter_mut() {
        if !find(v.as_bytes(), prefix) {
            continue;
        }
        let mut bytes = v.as_bytes().to_vec();
        for s in secrets {
            let ph = s.placeholder();
            if !find(&bytes, ph.as_bytes()) {
                continue;
            }
            match bound.iter().find(|(b, _)| b.name == s.name) {
                Some(_) if any_glued(&bytes, ph.as_bytes()) => return Err(glued(&ph)),
                Some((_, value)) => {
                    bytes = replace(&bytes, ph.as_bytes(), value.as_bytes());
                    out.used = true;
                }
                None => return Err(misuse(s, host, "headers")),
            }
        }
        let Ok(mut nv) = HeaderValue::from_bytes(&bytes) else {
            return Err(Misuse { hint: "a header with a placeholder could not be rebuilt".into() });
        };
        nv.set_sensitive(true);
        *v = nv;
    }

    let pq = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    if find(pq.as_bytes(), prefix) {
        let (path, query) = pq.split_once('?').map_or((pq.as_str(), None), |(p, q)| (p, Some(q)));
        let mut query = query.map(str::to_string);
        for s in secrets {
            let ph = s.placeholder();
            let in_path = path.contains(&ph);
            let in_query = query.as_deref().is_some_and(|q| q.contains(&ph));
            if !in_path && !in_query {
                continue;
            }
            let value = bound.iter().find(|(b, _)| b.name == s.name).map(|(_, v)| *v);
            match value {
                None => return Err(misuse(s, host, if in_path { "path" } else { "query" })),
                Some(_) if in_path => {
                    return Err(Misuse {
                        hint: format!(
                            "{ph} is replaced in headers, and in the query or body where configured, never in the path"
                        ),
                    });
                }
                Some(_) if !s.query => {
                    return Err(Misuse {
                        hint: format!("{ph} is in the query, but secrets name={:?} does not set query = true", s.name),
                    });
                }
                Some(_) if query.as_deref().is_some_and(|q| any_glued(q.as_bytes(), ph.as_bytes())) => {
                    return Err(glued(&ph));
                }
                Some(v) => {
                    out.used = true;
                    let escaped = crate::redact::percent_escape(v, true);
                    query = query.map(|q| q.replace(&ph, &escaped));
                    used(v, &mut out);
                    // An upstream that echoes its URL (a redirect, a next-page link)
                    // echoes the value as it was sent.
                    used(&escaped, &mut out);
                }
            }
        }
        let rebuilt = match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        let mut uri = std::mem::take(&mut parts.uri).into_parts();
        uri.path_and_query = rebuilt.parse().ok();
        parts.uri = http::Uri::from_parts(uri).map_err(|_| Misuse { hint: "the URI could not be rebuilt".into() })?;
    }

    for (s, v) in bound.iter().filter(|_| has_body) {
        if s.body {
            out.body.push((s.placeholder(), v.to_string()));
            used(v, &mut out);
        }
    }
    // JSON may escape `/` in what it echoes.
    for v in out.values.clone() {
        if v.contains('/') {
            used(&v.replace('/', "\\/"), &mut out);
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
        // Unknown placeholder text passes untouched.
        let mut p = parts("/", "EGRESS_SECRET_unknown");
        assert!(!swap(&mut p, &evil, "p", &secrets, &values, false).unwrap().any());
    }
}
