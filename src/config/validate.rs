//! Raw gateway config -> typed, validated [`Config`]. Nothing downstream re-parses.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

/// The most threads `proxy.threads` may ask for.
const MAX_PROXY_THREADS: usize = 256;

use super::error::{ConfigError, DisplayPath};
use super::raw::RawConfig;
use crate::addr;
use crate::policy::Mode;
use crate::policy::net::{EgressFilter, builtin_deny};

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
    pub admin: AdminConfig,
    pub drain: DrainConfig,
    pub tokens: TokensConfig,
    pub github: GithubConfig,
    pub routes: Vec<RouteConfig>,
}

/// A credential-injecting API route (`[[routes]]`).
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// `https://HOST[:PORT]`, no path.
    pub upstream: http::Uri,
    /// The upstream host, as absolute-form requests name it.
    pub host: String,
    pub header: http::HeaderName,
    pub prefix: String,
    pub secret: SecretSource,
    /// Upper-case methods allowed; empty: any.
    pub methods: Vec<String>,
    /// Path prefixes allowed; empty: any.
    pub paths: Vec<String>,
    pub sandbox_requests_per_minute: u32,
}

#[derive(Debug, Clone)]
pub struct GithubConfig {
    /// `https://github.com` (or a GitHub Enterprise URL), without a trailing slash.
    pub web_url: http::Uri,
    /// The web host as the git route matches it (`github.com`).
    pub web_host: String,
    pub api_url: http::Uri,
    pub ca_file: Option<PathBuf>,
    pub app: Option<(u64, PathBuf)>,
    /// Lowercase owner -> static token file.
    pub token_files: HashMap<String, PathBuf>,
    pub refresh_before: Duration,
    pub idle_timeout: Duration,
}

/// Where signed-token keys come from; read at start-up and on every reload.
#[derive(Debug, Clone)]
pub struct TokensConfig {
    pub max_ttl: Duration,
    pub leeway: Duration,
    pub revocation_file: Option<PathBuf>,
    pub keys: Vec<KeySource>,
    /// Connections authenticated by a signed token end this long after its `exp`;
    /// `None` ("off"): they end only when they close or a reload refuses them.
    pub expiry_grace: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlg {
    Hs256,
    EdDsa,
}

#[derive(Debug, Clone)]
pub enum SecretSource {
    File(PathBuf),
    Env(String),
}

#[derive(Debug, Clone)]
pub struct KeySource {
    pub kid: String,
    pub alg: KeyAlg,
    /// HS256: the shared secret.
    pub secret: Option<SecretSource>,
    /// EdDSA: the public key (PEM) that verifies.
    pub public_key_file: Option<PathBuf>,
    /// EdDSA: the private key (PEM), only where tokens are minted.
    pub private_key_file: Option<PathBuf>,
}

/// On SIGTERM: not ready at once, keep accepting for `delay` (while the load balancer
/// deregisters the instance), then stop accepting and give in-flight work `timeout`.
#[derive(Debug, Clone, Copy)]
pub struct DrainConfig {
    pub delay: Duration,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Bearer token required by `POST /v1/reload`; None: loopback clients only.
    pub token: Option<String>,
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

/// What the DNS firewall answers for names that are not the gateway's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockMode {
    NxDomain,
    NoData,
    Refused,
}

/// Over the per-source rate: drop the query silently, or answer REFUSED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitAction {
    Drop,
    Refused,
}

#[derive(Debug, Clone)]
pub struct DnsConfig {
    pub listen: SocketAddr,
    /// Normalised (lowercase A-label, no trailing dot).
    pub hostnames: Vec<String>,
    pub addresses: Vec<IpAddr>,
    pub blocked: BlockMode,
    pub ttl: u32,
    pub negative_ttl: u32,
    /// 0 disables rate limiting.
    pub rate_limit_qps: u32,
    pub rate_limit_burst: u32,
    pub rate_limit_action: RateLimitAction,
    pub tcp_max_connections: usize,
    pub tcp_max_per_client: usize,
    pub tcp_idle_timeout: Duration,
    /// 0: one per core.
    pub udp_sockets: usize,
    pub log_blocked_per_second: u32,
}

#[derive(Debug, Clone)]
pub struct EgressConfig {
    pub filter: EgressFilter,
    pub ports: Vec<u16>,
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
    positive(file, "proxy.tcp_keepalive", p.tcp_keepalive)?;
    if p.max_connections == 0 {
        return Err(err("proxy.max_connections", &"expected at least 1"));
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
    let tls = match (p.tls_cert_file.is_empty(), p.tls_key_file.is_empty()) {
        (true, true) => None,
        (false, false) => {
            Some((clean_path(&base_dir.join(&p.tls_cert_file)), clean_path(&base_dir.join(&p.tls_key_file))))
        }
        _ => return Err(err("proxy.tls_cert_file", &"expected both tls_cert_file and tls_key_file, or neither")),
    };
    let tls_client_ca = (!p.tls_client_ca.is_empty()).then(|| clean_path(&base_dir.join(&p.tls_client_ca)));
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
    };

    let format = match raw.log.format.as_str() {
        "auto" => LogFormat::Auto,
        "json" => LogFormat::Json,
        "text" => LogFormat::Text,
        other => {
            return Err(err("log.format", &format!("expected \"auto\", \"json\" or \"text\", got {other:?}")));
        }
    };
    if tracing_subscriber::EnvFilter::try_new(&raw.log.level).is_err() {
        return Err(err("log.level", &format!("expected a level such as \"info\", got {:?}", raw.log.level)));
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
        hosts.insert(norm, ips);
    }
    positive(file, "resolver.timeout", r.timeout)?;
    let resolver = ResolverConfig { nameservers, hosts, hosts_file: r.hosts_file, timeout: r.timeout };

    let mut deny = Vec::new();
    for (i, d) in raw.egress.deny.iter().enumerate() {
        if d == "builtin" {
            deny.extend(builtin_deny());
        } else {
            deny.push(parse_net(d).map_err(|m| err(&format!("egress.deny[{i}]"), &m))?);
        }
    }
    let mut allow = Vec::new();
    for (i, a) in raw.egress.allow.iter().enumerate() {
        allow.push(parse_net(a).map_err(|m| err(&format!("egress.allow[{i}]"), &m))?);
    }
    if raw.egress.ports.contains(&0) {
        return Err(err("egress.ports", &"expected ports 1-65535, got 0"));
    }
    let egress = EgressConfig { filter: EgressFilter::new(deny, allow), ports: raw.egress.ports };

    let dir = PathBuf::from(&raw.policy.dir);
    let dir = if dir.is_absolute() { dir } else { clean_path(&base_dir.join(dir)) };
    let shadow = (!raw.policy.shadow_dir.is_empty()).then(|| clean_path(&base_dir.join(&raw.policy.shadow_dir)));
    let watch_interval = (!raw.policy.watch_interval.is_zero()).then_some(raw.policy.watch_interval);
    let policy = PolicyConfig { source: PolicySource::Dir(dir), mode: raw.policy.mode, shadow, watch_interval };

    let dns = raw.dns.map(|d| validate_dns(d, file)).transpose()?;
    let admin = validate_admin(raw.admin, file, base_dir)?;

    let drain = DrainConfig { delay: raw.drain.delay, timeout: raw.drain.timeout };
    let tokens = validate_tokens(raw.tokens, file, base_dir)?;
    let github = validate_github(raw.github, file, base_dir)?;
    let routes = validate_routes(raw.routes, file, base_dir)?;
    Ok(Config { file: file.clone(), proxy, log, resolver, egress, policy, dns, admin, drain, tokens, github, routes })
}

fn validate_admin(a: super::raw::RawAdmin, file: &DisplayPath, base_dir: &Path) -> Result<AdminConfig, ConfigError> {
    let listen = a
        .listen
        .parse()
        .map_err(|_| ConfigError::invalid(file, "admin.listen", format!("expected IP:PORT, got {:?}", a.listen)))?;
    let token = if a.token_file.is_empty() {
        None
    } else {
        let path = base_dir.join(&a.token_file);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ConfigError::invalid(file, "admin.token_file", format!("cannot read {}: {e}", path.display()))
        })?;
        let token = text.trim().to_string();
        if token.len() < 16 {
            return Err(ConfigError::invalid(file, "admin.token_file", "expected a token of at least 16 characters"));
        }
        Some(token)
    };
    Ok(AdminConfig { listen, token })
}

fn positive(file: &DisplayPath, key: &str, d: Duration) -> Result<(), ConfigError> {
    if d.is_zero() {
        return Err(ConfigError::invalid(file, key, "expected a duration above zero, such as \"10s\""));
    }
    Ok(())
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("expected \"builtin\", an IP address or a CIDR, got {s:?}"))
}

fn validate_dns(d: super::raw::RawDns, file: &DisplayPath) -> Result<DnsConfig, ConfigError> {
    let err = |key: &str, msg: String| ConfigError::invalid(file, key, msg);
    let listen = d.listen.parse().map_err(|_| err("dns.listen", format!("expected IP:PORT, got {:?}", d.listen)))?;
    if d.hostnames.is_empty() {
        return Err(err("dns.hostnames", "expected at least one hostname (the gateway's own name)".into()));
    }
    let mut hostnames = Vec::with_capacity(d.hostnames.len());
    for (i, h) in d.hostnames.iter().enumerate() {
        let n = addr::normalize_hostname(h)
            .map_err(|e| err(&format!("dns.hostnames[{i}]"), format!("expected a hostname, got {h:?}: {e}")))?;
        hostnames.push(n);
    }
    let mut addresses = Vec::with_capacity(d.addresses.len());
    for (i, a) in d.addresses.iter().enumerate() {
        addresses.push(
            a.parse::<IpAddr>()
                .map_err(|_| err(&format!("dns.addresses[{i}]"), format!("expected an IP address, got {a:?}")))?,
        );
    }
    let blocked = match d.blocked.as_str() {
        "nxdomain" => BlockMode::NxDomain,
        "nodata" => BlockMode::NoData,
        "refused" => BlockMode::Refused,
        other => {
            return Err(err("dns.blocked", format!("expected \"nxdomain\", \"nodata\" or \"refused\", got {other:?}")));
        }
    };
    let rate_limit_action = match d.rate_limit_action.as_str() {
        "drop" => RateLimitAction::Drop,
        "refused" => RateLimitAction::Refused,
        other => {
            return Err(err("dns.rate_limit_action", format!("expected \"drop\" or \"refused\", got {other:?}")));
        }
    };
    if d.rate_limit_qps > 0 && d.rate_limit_burst == 0 {
        return Err(err("dns.rate_limit_burst", "expected at least 1 when dns.rate_limit_qps is set".into()));
    }
    if d.tcp_max_connections == 0 {
        return Err(err("dns.tcp_max_connections", "expected at least 1".into()));
    }
    positive(file, "dns.tcp_idle_timeout", d.tcp_idle_timeout)?;
    Ok(DnsConfig {
        listen,
        hostnames,
        addresses,
        blocked,
        ttl: d.ttl,
        negative_ttl: d.negative_ttl,
        rate_limit_qps: d.rate_limit_qps,
        rate_limit_burst: d.rate_limit_burst,
        rate_limit_action,
        tcp_max_connections: d.tcp_max_connections,
        tcp_max_per_client: match d.tcp_max_per_client {
            Some(0) => return Err(err("dns.tcp_max_per_client", "expected at least 1".into())),
            Some(n) => n,
            None => (d.tcp_max_connections / 8).clamp(1, 64),
        },
        tcp_idle_timeout: d.tcp_idle_timeout,
        udp_sockets: d.udp_sockets,
        log_blocked_per_second: d.log_blocked_per_second,
    })
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

fn validate_tokens(t: super::raw::RawTokens, file: &DisplayPath, base_dir: &Path) -> Result<TokensConfig, ConfigError> {
    positive(file, "tokens.max_ttl", t.max_ttl)?;
    let expiry_grace = match t.expiry_grace.trim() {
        "off" => None,
        v => Some(humantime::parse_duration(v).map_err(|e| {
            ConfigError::invalid(
                file,
                "tokens.expiry_grace",
                format!("expected a duration such as \"60s\" or \"off\", got {v:?}: {e}"),
            )
        })?),
    };
    let path = |p: &str| (!p.is_empty()).then(|| clean_path(&base_dir.join(p)));
    let mut keys = Vec::with_capacity(t.keys.len());
    let mut seen = std::collections::HashSet::new();
    for (i, k) in t.keys.into_iter().enumerate() {
        let key = |name: &str| format!("tokens.keys[{i}].{name}");
        if k.kid.is_empty() || !seen.insert(k.kid.clone()) {
            return Err(ConfigError::invalid(file, key("kid"), "expected a unique, non-empty key id"));
        }
        let alg = match k.alg.as_str() {
            "HS256" => KeyAlg::Hs256,
            "EdDSA" => KeyAlg::EdDsa,
            other => {
                return Err(ConfigError::invalid(
                    file,
                    key("alg"),
                    format!("expected \"HS256\" or \"EdDSA\", got {other:?}"),
                ));
            }
        };
        let secret = match (k.secret_file.is_empty(), k.secret_env.is_empty()) {
            (true, true) => None,
            (false, true) => path(&k.secret_file).map(SecretSource::File),
            (true, false) => Some(SecretSource::Env(k.secret_env.clone())),
            (false, false) => {
                return Err(ConfigError::invalid(
                    file,
                    key("secret_file"),
                    "expected secret_file or secret_env, not both",
                ));
            }
        };
        match alg {
            KeyAlg::Hs256 if secret.is_none() => {
                return Err(ConfigError::invalid(
                    file,
                    key("secret_file"),
                    "HS256 keys need secret_file or secret_env",
                ));
            }
            KeyAlg::EdDsa if k.public_key_file.is_empty() => {
                return Err(ConfigError::invalid(file, key("public_key_file"), "EdDSA keys need a public key (PEM)"));
            }
            _ => {}
        }
        keys.push(KeySource {
            kid: k.kid,
            alg,
            secret,
            public_key_file: path(&k.public_key_file),
            private_key_file: path(&k.private_key_file),
        });
    }
    Ok(TokensConfig {
        max_ttl: t.max_ttl,
        leeway: t.leeway,
        revocation_file: path(&t.revocation_file),
        keys,
        expiry_grace,
    })
}

fn validate_github(g: super::raw::RawGithub, file: &DisplayPath, base_dir: &Path) -> Result<GithubConfig, ConfigError> {
    let url = |key: &str, v: &str| -> Result<http::Uri, ConfigError> {
        let u: http::Uri = v
            .trim_end_matches('/')
            .parse()
            .map_err(|_| ConfigError::invalid(file, key, format!("expected an http(s) URL, got {v:?}")))?;
        // The API URL may carry a path: GitHub Enterprise Server's is /api/v3.
        let path_ok = u.path() == "/"
            || u.path().is_empty()
            || key == "github.api_url"
                && u.query().is_none()
                && !u.path().contains("..")
                && !u.path().contains("//")
                && u.path().bytes().all(|b| b.is_ascii_alphanumeric() || b"/-._".contains(&b));
        match (u.scheme_str(), u.host()) {
            (Some("https" | "http"), Some(_)) if path_ok => Ok(u),
            _ if key == "github.api_url" => Err(ConfigError::invalid(
                file,
                key,
                format!("expected https://HOST[:PORT][/PATH] (e.g. https://ghe.example.com/api/v3), got {v:?}"),
            )),
            _ => {
                Err(ConfigError::invalid(file, key, format!("expected https://HOST[:PORT] without a path, got {v:?}")))
            }
        }
    };
    let web_url = url("github.web_url", &g.web_url)?;
    let api_url = url("github.api_url", &g.api_url)?;
    let web_host = web_url
        .host()
        .and_then(|h| addr::normalize_hostname(h).ok())
        .ok_or_else(|| ConfigError::invalid(file, "github.web_url", "expected a hostname"))?;
    let path = |p: &str| (!p.is_empty()).then(|| clean_path(&base_dir.join(p)));
    let app = match (g.app_id, path(&g.private_key_file)) {
        (0, None) => None,
        (id, Some(key)) if id > 0 => Some((id, key)),
        (0, Some(_)) => {
            return Err(ConfigError::invalid(file, "github.app_id", "expected the App id with private_key_file"));
        }
        _ => return Err(ConfigError::invalid(file, "github.private_key_file", "expected the App's private key (PEM)")),
    };
    let mut token_files = HashMap::new();
    for (owner, f) in g.token_files {
        let p = path(&f)
            .ok_or_else(|| ConfigError::invalid(file, format!("github.token_files.{owner}"), "expected a file"))?;
        token_files.insert(owner.to_ascii_lowercase(), p);
    }
    positive(file, "github.idle_timeout", g.idle_timeout)?;
    Ok(GithubConfig {
        web_url,
        web_host,
        api_url,
        ca_file: path(&g.ca_file),
        app,
        token_files,
        refresh_before: g.refresh_before,
        idle_timeout: g.idle_timeout,
    })
}

fn validate_routes(
    routes: Vec<super::raw::RawRoute>,
    file: &DisplayPath,
    base_dir: &Path,
) -> Result<Vec<RouteConfig>, ConfigError> {
    let mut out: Vec<RouteConfig> = Vec::with_capacity(routes.len());
    for (i, r) in routes.into_iter().enumerate() {
        let key = |k: &str| format!("routes[{i}].{k}");
        let valid_name = !r.name.is_empty()
            && r.name.len() <= 64
            && r.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid_name || out.iter().any(|o| o.name == r.name) {
            return Err(ConfigError::invalid(
                file,
                key("name"),
                "expected a unique name of letters, digits, '-' or '_'",
            ));
        }
        let upstream: http::Uri = r.upstream.trim_end_matches('/').parse().map_err(|_| {
            ConfigError::invalid(file, key("upstream"), format!("expected https://HOST, got {:?}", r.upstream))
        })?;
        if upstream.scheme_str() != Some("https") || !(upstream.path() == "/" || upstream.path().is_empty()) {
            return Err(ConfigError::invalid(file, key("upstream"), "expected https://HOST[:PORT] without a path"));
        }
        let host = upstream
            .host()
            .and_then(|h| addr::normalize_hostname(h).ok())
            .ok_or_else(|| ConfigError::invalid(file, key("upstream"), "expected a hostname"))?;
        let header = http::HeaderName::from_bytes(r.inject.header.as_bytes())
            .map_err(|_| ConfigError::invalid(file, key("inject.header"), "expected a header name"))?;
        let secret = match (r.inject.secret_file.is_empty(), r.inject.secret_env.is_empty()) {
            (false, true) => SecretSource::File(clean_path(&base_dir.join(&r.inject.secret_file))),
            (true, false) => SecretSource::Env(r.inject.secret_env.clone()),
            _ => {
                return Err(ConfigError::invalid(
                    file,
                    key("inject"),
                    "expected exactly one of secret_file and secret_env",
                ));
            }
        };
        for (j, p) in r.paths.iter().enumerate() {
            if !p.starts_with('/') || p.contains("..") || p.contains('%') {
                return Err(ConfigError::invalid(
                    file,
                    format!("routes[{i}].paths[{j}]"),
                    "expected a path prefix starting with /",
                ));
            }
        }
        out.push(RouteConfig {
            name: r.name,
            upstream,
            host,
            header,
            prefix: r.inject.prefix,
            secret,
            methods: r.methods.iter().map(|m| m.to_ascii_uppercase()).collect(),
            paths: r.paths,
            sandbox_requests_per_minute: r.sandbox_requests_per_minute,
        });
    }
    Ok(out)
}
