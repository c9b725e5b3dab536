//! Process setup that depends on the operating system.

/// Raises the soft limit on open descriptors to the hard limit (every tunnel needs two:
/// the client's socket and the upstream's). Returns the limit now in force, if known.
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            return Some(hard);
        }
        Some(soft)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}
