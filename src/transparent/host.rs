//! The host a plain-HTTP transparent request asks for: its `Host` header, at the port
//! the client dialled, with a request line that names no other host.

use http::{HeaderMap, Method, Uri};

use crate::addr::{self, Host, Target};

/// The host `Host` names, at `port` (a port in `Host` is the client's claim; the
/// port the client dialled is the one used), once the request line is shown to name
/// no other ([`names_only`]). Else the text to log as the target, and why.
pub fn named(method: &Method, uri: &Uri, headers: &HeaderMap, port: u16) -> Result<Target, (String, String)> {
    // Logged as the target of a refusal: the host asked for, else the request line's.
    let first_host = headers.get(http::header::HOST).and_then(|h| h.to_str().ok());
    let raw = first_host.map_or_else(|| uri.to_string(), str::to_string);
    let fail = |why: &str| Err((raw.clone(), why.to_string()));
    if method == Method::CONNECT {
        return fail("CONNECT is for the proxy port, not a transparent listener");
    }
    let mut hosts = headers.get_all(http::header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => match h.to_str() {
            Ok(h) => h.trim(),
            Err(_) => return fail("the Host header is not text"),
        },
        (None, _) => return fail("the request has no Host header"),
        (Some(_), Some(_)) => return fail("the request has two Host headers"),
    };
    if let Err(why) = names_only(&uri.to_string(), host) {
        return fail(why);
    }
    let name = match addr::parse_authority(host, Some(port)) {
        Ok(t) => t.host.to_string(),
        Err(_) => host.to_string(),
    };
    match addr::parse_authority(&format!("{name}:{port}"), None) {
        Ok(t @ Target { host: Host::Name(_), .. }) => Ok(t),
        Ok(_) => Err((
            host.to_string(),
            "the client named an IP address, not a host: transparent mode decides host names".into(),
        )),
        Err(e) => Err((host.to_string(), format!("the client named an invalid host: {e}"))),
    }
}

/// A request's target must name no host but `host`: origin-form (`/...`), `*`,
/// or an `http://` URL whose authority, parsed as strictly as a CONNECT target (no
/// userinfo, no `%`), is the same host. Any other spelling could be read by the
/// origin (or a proxy or CDN behind it) as another host than the one decided.
fn names_only(target: &str, host: &str) -> Result<(), &'static str> {
    if target.starts_with('/') || target == "*" {
        return Ok(());
    }
    const OTHER: &str = "the request line names another host than the Host header";
    let rest = target
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
        .and_then(|_| target.get(7..))
        .ok_or("the request target is neither a path nor an http:// URL")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    match (crate::addr::parse_authority(authority, Some(80)), crate::addr::parse_authority(host, Some(80))) {
        (Ok(named), Ok(decided)) if named.host == decided.host => Ok(()),
        _ => Err(OTHER),
    }
}

#[cfg(test)]
mod tests {
    use super::names_only;

    #[test]
    fn the_request_line_names_only_the_decided_host() {
        for ok in ["/x", "*", "http://origin.test/x", "HTTP://ORIGIN.test.:8080/x?y", "http://origin.test"] {
            assert_eq!(names_only(ok, "origin.test"), Ok(()), "{ok}");
        }
        for bad in [
            "http://origin.test:80@evil.test/x",
            "http://origin.test:@evil.test/x",
            "http://evil.test@origin.test/x",
            "http://evil.test/x",
            "http://origin.test%2eevil.test/",
            "https://origin.test/x",
            "origin.test/x",
            "http:/origin.test/x",
            "http://",
        ] {
            assert!(names_only(bad, "origin.test").is_err(), "{bad}");
        }
    }
}
