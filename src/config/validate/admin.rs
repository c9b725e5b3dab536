//! The `[admin]` section: the admin listener and its token.

#[allow(clippy::wildcard_imports, reason = "a section of validate.rs: its helpers and imports")]
use super::*;

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token required by `POST /v1/reload`; None: loopback clients only.
    pub token: Option<String>,
}

pub(super) fn validate_admin(
    a: crate::config::raw::RawAdmin,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<AdminConfig, ConfigError> {
    let listen = a
        .listen
        .parse()
        .map_err(|_| ConfigError::invalid(file, "admin.listen", format!("expected IP:PORT, got {:?}", a.listen)))?;
    let token = if let Some(token_file) = &a.token_file {
        let path = base_dir.join(token_file);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::invalid(file, "admin.token_file", format!("cannot read {}: {e}", path.display()))
        })?;
        let token = text.trim().to_string();
        if token.len() < 16 {
            return Err(ConfigError::invalid(file, "admin.token_file", "expected a token of at least 16 characters"));
        }
        Some(token)
    } else {
        None
    };
    Ok(AdminConfig { listen, token })
}
