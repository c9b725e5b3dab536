//! The `[transparent]` section: listeners for programs that ignore `HTTP_PROXY`.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

#[derive(Debug, Clone)]
pub struct TransparentConfig {
    /// Reads the TLS ClientHello's SNI name.
    pub https_listen: Option<SocketAddr>,
    /// Reads the HTTP request's `Host`.
    pub http_listen: Option<SocketAddr>,
    /// A sidecar's one sandbox; `None`: sandboxes by source address.
    pub sandbox: Option<String>,
    /// Ports dialled when a connection was not redirected.
    pub https_port: u16,
    pub http_port: u16,
}

pub(super) fn validate_transparent(
    t: crate::config::raw::RawTransparent,
    file: &DisplayPath,
) -> Result<TransparentConfig, ConfigError> {
    let listen = |key: &str, v: &Option<String>| -> Result<Option<SocketAddr>, ConfigError> {
        v.as_ref()
            .map(|s| s.parse().map_err(|_| ConfigError::invalid(file, key, format!("expected IP:PORT, got {s:?}"))))
            .transpose()
    };
    let https_listen = listen("transparent.https_listen", &t.https_listen)?;
    let http_listen = listen("transparent.http_listen", &t.http_listen)?;
    if https_listen.is_none() && http_listen.is_none() {
        return Err(ConfigError::invalid(file, "transparent", "expected https_listen, http_listen or both"));
    }
    // A sidecar instance names every client its one sandbox: only the sandbox's own
    // namespace (loopback) may reach it.
    if t.sandbox.is_some() {
        for (key, addr) in [("transparent.https_listen", https_listen), ("transparent.http_listen", http_listen)] {
            if addr.is_some_and(|a| !a.ip().is_loopback()) {
                return Err(ConfigError::invalid(
                    file,
                    key,
                    "with transparent.sandbox every client is that sandbox: listen on loopback (127.0.0.1)",
                ));
            }
        }
    }
    for (key, port) in [("transparent.https_port", t.https_port), ("transparent.http_port", t.http_port)] {
        if port == 0 {
            return Err(ConfigError::invalid(file, key, "expected a port from 1 to 65535"));
        }
    }
    Ok(TransparentConfig {
        https_listen,
        http_listen,
        sandbox: t.sandbox,
        https_port: t.https_port,
        http_port: t.http_port,
    })
}
