//! Raw gateway config -> typed, validated [`Config`]. Nothing downstream re-parses.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

/// The most threads `proxy.threads` may ask for.
const MAX_PROXY_THREADS: usize = 256;

mod admin;
mod dns;
mod github;
mod intercept;
mod limits;
mod routes;
mod tokens;
mod transparent;

pub use admin::AdminConfig;
pub use dns::{BlockMode, DnsAnswer, DnsConfig, RateLimitAction};
pub use github::GithubConfig;
pub use intercept::{InterceptConfig, PLACEHOLDER_PREFIX, SecretConfig};
pub use limits::{LimitStore, LimitsConfig};
pub use routes::RouteConfig;
pub use tokens::{KeyAlg, KeySource, TokensConfig};
pub use transparent::TransparentConfig;

use super::error::{ConfigError, DisplayPath};
use super::raw::RawConfig;
use crate::addr;
use crate::policy::Mode;
use crate::policy::net::{EgressFilter, builtin_deny};

/// The most connections a count may allow (`proxy.max_connections`,
/// `dns.tcp_max_connections`): each takes descriptors, and no process gets more than
/// a few million of those.
pub const MAX_CONNECTIONS: usize = 1_000_000;

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from, for messages and relative paths.
    pub file: DisplayPath,
    pub proxy: ProxyConfig,
    pub log: LogConfig,
    pub resolver: ResolverConfig,
    pub egress: EgressConfig,
    pub policy: PolicyConfig,
    pub dns: Option<DnsConfig>,
    pub transparent: Option<TransparentConfig>,
    pub admin: AdminConfig,
    pub drain: DrainConfig,
    pub tokens: TokensConfig,
    pub github: GithubConfig,
    pub routes: Vec<RouteConfig>,
    pub limits: LimitsConfig,
    /// TLS inspection; `None`: every CONNECT is an opaque tunnel.
    pub intercept: Option<InterceptConfig>,
    /// Placeholder credentials (`[[secrets]]`).
    pub secrets: Vec<SecretConfig>,
    /// The file as read at start-up, to say on reload what an edit to it changed
    /// (it takes effect on restart); `None` for the demo and configs not from a file.
    pub baseline: Option<super::drift::Baseline>,
}

#[derive(Debug, Clone)]
pub enum SecretSource {
    File(PathBuf),
    Env(String),
}

/// On SIGTERM: not ready at once, keep accepting for `delay` (while the load balancer
/// deregisters the instance), then stop accepting and give in-flight work `timeout`.
#[derive(Debug, Clone, Copy)]
pub struct DrainConfig {
    pub delay: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub header_read_timeout: Duration,
    pub connect_timeout: Duration,
    pub response_header_timeout: Duration,
    pub tunnel_idle_timeout: Duration,
    pub max_connections: usize,
    /// Connections one client address may hold before authenticating (0: no cap).
    pub max_unauthenticated_per_client: usize,
    /// Failed authentications per second per client address (0: no limit).
    pub auth_failures_per_second: u32,
    /// Connections one sandbox may hold once authorized (0: no cap).
    pub sandbox_max_connections: usize,
    /// Threads serving the proxy port, each running its own single-threaded runtime.
    pub threads: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub proxy_protocol: ProxyProtocol,
    /// On reload, close open tunnels the new policies no longer allow.
    pub close_revoked_tunnels: bool,
    /// Per sandbox: open tunnels plus in-flight requests (0: unlimited).
    pub sandbox_max_concurrent: usize,
    /// Per sandbox: new tunnels and requests per second, bursts of twice that (0: unlimited).
    pub sandbox_max_per_second: u32,
    /// TCP keepalive idle time on both legs (the NLB idle timeout is 350 s).
    pub tcp_keepalive: Duration,
    /// (certificate chain, key) PEM files when the proxy port speaks TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// CA certificates (PEM) client certificates must chain to (mTLS).
    pub tls_client_ca: Option<PathBuf>,
    pub tls_client_cn_is_sandbox: bool,
    /// Clients admitted; empty: everyone.
    pub allowed_clients: Vec<IpNet>,
    /// Peers whose PROXY protocol headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Names clients reach the gateway by (normalised): an absolute-form request for
    /// a route or git URL at one of them, on a port the gateway listens on, is served
    /// as that route (a client with `HTTP_PROXY` set sends it so).
    pub names: Vec<String>,
}

/// Whether connections on the proxy port start with a PROXY protocol header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    Off,
    /// Parsed when a trusted proxy sends one; other clients connect directly.
    Optional,
    /// Every connection must come from a trusted proxy with a header.
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise.
    Auto,
    Json,
    Text,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    /// An `EnvFilter` directive such as `info` or `info,egress_gateway=debug`.
    pub level: String,
    /// How long log lines may wait in memory before they are written together; zero
    /// writes every line at once. Warnings and errors are always written at once.
    pub flush_interval: Duration,
}

#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Empty: use the system configuration (resolv.conf).
    pub nameservers: Vec<SocketAddr>,
    pub hosts: HashMap<String, Vec<IpAddr>>,
    pub hosts_file: bool,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct EgressConfig {
    pub filter: EgressFilter,
    pub ports: Vec<u16>,
    /// Normalised; sandboxes reach each other as `ID.SUFFIX`.
    pub peer_suffix: String,
}

#[derive(Debug, Clone)]
pub enum PolicySource {
    /// Every `*.toml` file in this directory.
    Dir(PathBuf),
    /// Policy text compiled into the binary or generated (the demo).
    Inline { label: String, text: String },
}

impl PolicySource {
    /// A short description for status output.
    pub fn describe(&self) -> String {
        match self {
            PolicySource::Dir(d) => d.display().to_string(),
            PolicySource::Inline { label, .. } => label.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub source: PolicySource,
    pub mode: Mode,
    /// Shadow policies: every request is also decided under them and disagreements are
    /// logged and counted, without affecting traffic.
    pub shadow: Option<PathBuf>,
    /// Poll interval for changed files that trigger a reload (None: no watching).
    pub watch_interval: Option<Duration>,
}

const MIN_HEADER_BYTES: usize = 1024;
const MAX_HEADER_BYTES: usize = 1024 * 1024;

/// Validates `raw`, read from `file`; relative paths are resolved against `base_dir`.
pub fn validate(raw: RawConfig, file: &DisplayPath, base_dir: &Path) -> Result<Config, ConfigError> {
    let err = |key: &str, msg: &dyn std::fmt::Display| ConfigError::invalid(file, key, msg);

    let p = raw.proxy;
    let listen: SocketAddr =
        p.listen.parse().map_err(|_| err("proxy.listen", &format!("expected IP:PORT, got {:?}", p.listen)))?;
    positive(file, "proxy.header_read_timeout", p.header_read_timeout)?;
    positive(file, "proxy.connect_timeout", p.connect_timeout)?;
    positive(file, "proxy.response_header_timeout", p.response_header_timeout)?;
    positive(file, "proxy.tunnel_idle_timeout", p.tunnel_idle_timeout)?;
    // The kernel takes whole seconds, at most 32767 (TCP_KEEPIDLE); outside that the
    // option was refused and connections went without keepalive.
    within(file, "proxy.tcp_keepalive", p.tcp_keepalive, Duration::from_secs(1), Duration::from_secs(9 * 3600))?;
    if !(1..=MAX_CONNECTIONS).contains(&p.max_connections) {
        return Err(err(
            "proxy.max_connections",
            &format!("expected 1 to {MAX_CONNECTIONS}, got {}", p.max_connections),
        ));
    }
    if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&p.max_header_bytes) {
        return Err(err(
            "proxy.max_header_bytes",
            &format!("expected {MIN_HEADER_BYTES} to {MAX_HEADER_BYTES}, got {}", p.max_header_bytes),
        ));
    }
    if !(8..=10_000).contains(&p.max_headers) {
        return Err(err("proxy.max_headers", &format!("expected 8 to 10000, got {}", p.max_headers)));
    }
    let proxy_protocol = match p.proxy_protocol.as_str() {
        "off" => ProxyProtocol::Off,
        "optional" => ProxyProtocol::Optional,
        "required" => ProxyProtocol::Required,
        other => {
            return Err(err(
                "proxy.proxy_protocol",
                &format!("expected \"off\", \"optional\" or \"required\", got {other:?}"),
            ));
        }
    };
    let mut trusted_proxies = Vec::new();
    for (i, t) in p.trusted_proxies.iter().enumerate() {
        trusted_proxies.push(parse_net(t).map_err(|m| err(&format!("proxy.trusted_proxies[{i}]"), &m))?);
    }
    if proxy_protocol != ProxyProtocol::Off && trusted_proxies.is_empty() {
        return Err(err("proxy.trusted_proxies", &"expected at least one CIDR when proxy_protocol is on"));
    }
    let tls = match (p.tls_cert_file.is_none(), p.tls_key_file.is_none()) {
        (true, true) => None,
        (false, false) => Some((
            clean_path(&base_dir.join(p.tls_cert_file.unwrap_or_default())),
            clean_path(&base_dir.join(p.tls_key_file.unwrap_or_default())),
        )),
        _ => return Err(err("proxy.tls_cert_file", &"expected both tls_cert_file and tls_key_file, or neither")),
    };
    let tls_client_ca = p.tls_client_ca.map(|ca| clean_path(&base_dir.join(ca)));
    if tls_client_ca.is_some() && tls.is_none() {
        return Err(err("proxy.tls_client_ca", &"mutual TLS needs tls_cert_file and tls_key_file"));
    }
    if p.tls_client_cn_is_sandbox && tls_client_ca.is_none() {
        return Err(err("proxy.tls_client_cn_is_sandbox", &"needs tls_client_ca"));
    }
    let mut allowed_clients = Vec::new();
    for (i, c) in p.allowed_clients.iter().enumerate() {
        allowed_clients.push(parse_net(c).map_err(|m| err(&format!("proxy.allowed_clients[{i}]"), &m))?);
    }
    let mut names = Vec::new();
    for (i, n) in p.names.iter().enumerate() {
        let name = crate::addr::normalize_hostname(n)
            .map_err(|e| err(&format!("proxy.names[{i}]"), &format!("expected a hostname, got {n:?}: {e}")))?;
        names.push(name);
    }
    let proxy = ProxyConfig {
        listen,
        header_read_timeout: p.header_read_timeout,
        connect_timeout: p.connect_timeout,
        response_header_timeout: p.response_header_timeout,
        tunnel_idle_timeout: p.tunnel_idle_timeout,
        max_connections: p.max_connections,
        max_unauthenticated_per_client: p
            .max_unauthenticated_per_client
            .unwrap_or_else(|| (p.max_connections / 4).clamp(4, 256)),
        auth_failures_per_second: p.auth_failures_per_second,
        sandbox_max_connections: p.sandbox_max_connections.unwrap_or_else(|| (p.max_connections / 16).max(16)),
        threads: match p.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n if n > MAX_PROXY_THREADS => {
                return Err(err("proxy.threads", &format!("expected 0 (one per CPU) to {MAX_PROXY_THREADS}, got {n}")));
            }
            n => n,
        },
        max_header_bytes: p.max_header_bytes,
        max_headers: p.max_headers,
        proxy_protocol,
        close_revoked_tunnels: p.close_revoked_tunnels,
        sandbox_max_concurrent: p.sandbox_max_concurrent,
        sandbox_max_per_second: p.sandbox_max_per_second,
        tcp_keepalive: p.tcp_keepalive,
        tls_client_ca,
        tls_client_cn_is_sandbox: p.tls_client_cn_is_sandbox,
        allowed_clients,
        tls,
        trusted_proxies,
        names,
    };

    let format = match raw.log.format.as_str() {
        "auto" => LogFormat::Auto,
        "json" => LogFormat::Json,
        "text" => LogFormat::Text,
        other => {
            return Err(err("log.format", &format!("expected \"auto\", \"json\" or \"text\", got {other:?}")));
        }
    };
    if !log_level_ok(&raw.log.level) {
        return Err(err(
            "log.level",
            &format!(
                "expected a level (trace, debug, info, warn, error, off) or TARGET=LEVEL directives such as \"info,egress_gateway::dns=debug\", got {:?}",
                raw.log.level
            ),
        ));
    }
    if raw.log.flush_interval > Duration::from_secs(1) {
        return Err(err(
            "log.flush_interval",
            &format!("expected at most 1s, got {}", humantime::format_duration(raw.log.flush_interval)),
        ));
    }
    let log = LogConfig { format, level: raw.log.level, flush_interval: raw.log.flush_interval };

    let r = raw.resolver;
    let mut nameservers = Vec::with_capacity(r.nameservers.len());
    for (i, ns) in r.nameservers.iter().enumerate() {
        let addr = ns
            .parse::<SocketAddr>()
            .or_else(|_| ns.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
            .map_err(|_| err(&format!("resolver.nameservers[{i}]"), &format!("expected IP or IP:PORT, got {ns:?}")))?;
        nameservers.push(addr);
    }
    let mut hosts = HashMap::new();
    for (name, addrs) in r.hosts {
        let key = format!("resolver.hosts.{name:?}");
        let norm = addr::normalize_hostname(&name).map_err(|e| err(&key, &format!("invalid hostname: {e}")))?;
        let mut ips = Vec::with_capacity(addrs.len());
        for a in &addrs {
            ips.push(a.parse::<IpAddr>().map_err(|_| err(&key, &format!("expected IP addresses, got {a:?}")))?);
        }
        if ips.is_empty() {
            return Err(err(&key, &"expected at least one address"));
        }
        // `Example.test` and `example.test.` are one name: which entry won was up to
        // the order the table was read in.
        if hosts.insert(norm, ips).is_some() {
            return Err(err(&key, &"names a host another entry names (names ignore case and a final dot)"));
        }
    }
    positive(file, "resolver.timeout", r.timeout)?;
    let resolver = ResolverConfig { nameservers, hosts, hosts_file: r.hosts_file, timeout: r.timeout };

    let mut deny = Vec::new();
    for (i, d) in raw.egress.deny.iter().enumerate() {
        if d == "builtin" {
            deny.extend(builtin_deny());
        } else {
            let m = |m: String| err(&format!("egress.deny[{i}]"), &m.replace("expected ", "expected \"builtin\", "));
            deny.push(parse_net(d).map_err(m)?);
        }
    }
    let mut allow = Vec::new();
    for (i, a) in raw.egress.allow.iter().enumerate() {
        allow.push(parse_net(a).map_err(|m| err(&format!("egress.allow[{i}]"), &m))?);
    }
    if raw.egress.ports.contains(&0) {
        return Err(err("egress.ports", &"expected ports 1-65535, got 0"));
    }
    let peer_suffix = addr::normalize_hostname(&raw.egress.peer_suffix)
        .map_err(|e| e.to_string())
        // One label (`com`) would make every `X.com` a peer name.
        .and_then(|s| if s.contains('.') { Ok(s) } else { Err("it has one label".into()) })
        .map_err(|e| {
            err(
                "egress.peer_suffix",
                &format!("expected a domain name of two labels or more, got {:?}: {e}", raw.egress.peer_suffix),
            )
        })?;
    let egress = EgressConfig { filter: EgressFilter::new(deny, allow), ports: raw.egress.ports, peer_suffix };

    let dir = PathBuf::from(&raw.policy.dir);
    let dir = if dir.is_absolute() { dir } else { clean_path(&base_dir.join(dir)) };
    let shadow = raw.policy.shadow_dir.map(|d| clean_path(&base_dir.join(d)));
    let watch_interval = (!raw.policy.watch_interval.is_zero()).then_some(raw.policy.watch_interval);
    if let Some(w) = watch_interval {
        // Below this the watcher would stat the policy files in a busy loop.
        within(file, "policy.watch_interval", w, Duration::from_millis(100), MAX_DURATION)?;
    }
    let policy = PolicyConfig { source: PolicySource::Dir(dir), mode: raw.policy.mode, shadow, watch_interval };

    let dns = raw.dns.map(|d| dns::validate_dns(d, file)).transpose()?;
    let admin = admin::validate_admin(raw.admin, file, base_dir)?;

    within(file, "drain.delay", raw.drain.delay, Duration::ZERO, MAX_DURATION)?;
    within(file, "drain.timeout", raw.drain.timeout, Duration::ZERO, MAX_DURATION)?;
    let drain = DrainConfig { delay: raw.drain.delay, timeout: raw.drain.timeout };
    let tokens = tokens::validate_tokens(raw.tokens, file, base_dir)?;
    let github = github::validate_github(raw.github, file, base_dir)?;
    let routes = routes::validate_routes(raw.routes, file, base_dir)?;
    let transparent = raw.transparent.map(|t| transparent::validate_transparent(t, file)).transpose()?;
    let intercept = raw.intercept.map(|i| intercept::validate_intercept(i, file, base_dir)).transpose()?;
    let secrets = intercept::validate_secrets(raw.secrets, file, base_dir)?;
    if !secrets.is_empty() && intercept.is_none() {
        return Err(ConfigError::invalid(file, "secrets", "placeholder secrets need an [intercept] section"));
    }
    let limits = limits::validate_limits(raw.limits, file, base_dir)?;
    Ok(Config {
        file: file.clone(),
        proxy,
        log,
        resolver,
        egress,
        policy,
        dns,
        transparent,
        admin,
        drain,
        tokens,
        github,
        routes,
        intercept,
        secrets,
        limits,
        baseline: None,
    })
}

/// The longest any duration key may be: longer than any timeout an operator means, and
/// short enough that a clock plus it cannot overflow (which would panic).
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A timeout: from 1ms to [`MAX_DURATION`].
fn positive(file: &DisplayPath, key: &str, d: Duration) -> Result<(), ConfigError> {
    within(file, key, d, Duration::from_millis(1), MAX_DURATION)
}

/// `d` from `min` to `max`, both included; otherwise an error naming the key, the range
/// and what was given.
fn within(file: &DisplayPath, key: &str, d: Duration, min: Duration, max: Duration) -> Result<(), ConfigError> {
    if d < min || d > max {
        return Err(ConfigError::invalid(
            file,
            key,
            format!("expected a duration from {} to {}, got {}", bound(min), bound(max), humantime::format_duration(d)),
        ));
    }
    Ok(())
}

/// A range end in the largest whole unit ("365d", not humantime's "11months 30days ...").
fn bound(d: Duration) -> String {
    let s = d.as_secs();
    match () {
        _ if d.is_zero() => "0s".into(),
        _ if d.subsec_nanos() != 0 => humantime::format_duration(d).to_string(),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("expected an IP address or a CIDR, got {s:?}"))
}

/// Removes `.` and resolvable `..` components lexically, so messages show
/// `policy/example.toml` rather than `config/../policy/example.toml`.
pub fn clean_path(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    if out.as_os_str().is_empty() { PathBuf::from(".") } else { out }
}

/// A `log.level` filter whose every directive sets a level: a bare word that is not a
/// level (`warning`) would parse as a target name and switch every log line off, the
/// access log's too.
fn log_level_ok(filter: &str) -> bool {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let level = |l: &str| LEVELS.iter().any(|v| v.eq_ignore_ascii_case(l.trim()));
    tracing_subscriber::EnvFilter::try_new(filter).is_ok()
        && filter.split(',').all(|d| match d.rsplit_once('=') {
            Some((target, l)) => !target.trim().is_empty() && level(l),
            None => level(d),
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_levels_must_set_a_level_in_every_directive() {
        for ok in ["info", "WARN", "off", "info,egress_gateway::dns=debug", "egress_gateway=trace"] {
            assert!(super::log_level_ok(ok), "{ok}");
        }
        for bad in ["warning", "verbose", "info,egress_gateway", "info,x=loud", "=info", ""] {
            assert!(!super::log_level_ok(bad), "{bad}");
        }
    }
}
