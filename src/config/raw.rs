//! The configuration files as written: serde structs with `deny_unknown_fields` and a
//! named default for every key. Nothing here interprets a value; `validate` does.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::policy::Mode;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub proxy: RawProxy,
    pub log: RawLog,
    pub resolver: RawResolver,
    pub egress: RawEgress,
    pub policy: RawPolicySection,
    pub admin: RawAdmin,
    pub drain: RawDrain,
    pub tokens: RawTokens,
    pub github: RawGithub,
    pub routes: Vec<RawRoute>,
    /// Absent: no DNS server.
    pub dns: Option<RawDns>,
    /// Absent: no transparent listeners.
    pub transparent: Option<RawTransparent>,
    pub limits: RawLimits,
    /// Absent: no TLS inspection.
    pub intercept: Option<RawIntercept>,
    /// Placeholder credentials, each bound to hosts.
    pub secrets: Vec<RawSecret>,
}

/// `[intercept]`: TLS inspection of the hosts policies list in `inspect`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIntercept {
    /// The CA certificate (PEM) leaf certificates are signed with.
    pub ca_cert_file: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub ca_key_file: PathBuf,
    /// Hosts never inspected, whatever a policy says (certificate-pinning clients).
    #[serde(default)]
    pub never: Vec<String>,
    /// Lifetime of a minted leaf certificate.
    #[serde(default = "default_leaf_ttl", with = "humantime_serde")]
    pub leaf_ttl: Duration,
    /// Extra CA (PEM) upstream certificates may chain to, besides the system roots.
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub upstream_ca_file: Option<PathBuf>,
}

fn default_leaf_ttl() -> Duration {
    Duration::from_secs(24 * 3600)
}

/// `[[secrets]]`: a credential the sandbox knows only as `EGRESS_SECRET_NAME`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSecret {
    pub name: String,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub value_file: Option<PathBuf>,
    #[serde(default)]
    pub value_env: Option<String>,
    /// Host rules (`api.openai.com`, `*.example.com`) the value may be sent to.
    pub hosts: Vec<String>,
    /// Policies whose sandboxes may use it; empty: every policy.
    #[serde(default)]
    pub policies: Vec<String>,
    /// Also replace the placeholder in the query string.
    #[serde(default)]
    pub query: bool,
    /// Also replace the placeholder in request bodies.
    #[serde(default)]
    pub body: bool,
}

/// `[limits]`: where per-sandbox limits and budgets are counted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    /// `"local"` or `"redis://HOST:PORT/DB"` (`rediss://` for TLS).
    pub store: String,
    /// `"local"` or `"deny"`.
    pub on_store_error: String,
    #[serde(deserialize_with = "absent_if_empty")]
    pub redis_password_file: Option<PathBuf>,
    /// With `rediss://`: the CA (PEM) the server's certificate must chain to, instead of
    /// the system's roots.
    #[serde(deserialize_with = "absent_if_empty")]
    pub redis_ca_file: Option<PathBuf>,
    /// How often each instance settles its counts with the store.
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            store: "local".into(),
            on_store_error: "local".into(),
            redis_password_file: None,
            redis_ca_file: None,
            sync_interval: Duration::from_millis(250),
        }
    }
}

/// `[transparent]`: listeners for clients that ignore `HTTP_PROXY`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTransparent {
    #[serde(deserialize_with = "absent_if_empty")]
    pub https_listen: Option<String>,
    #[serde(deserialize_with = "absent_if_empty")]
    pub http_listen: Option<String>,
    /// A sidecar's one sandbox: every client of the instance is this sandbox.
    #[serde(deserialize_with = "absent_if_empty")]
    pub sandbox: Option<String>,
    /// The port an SNI-routed connection is dialled on when the connection was not
    /// redirected (no `SO_ORIGINAL_DST` other than the listener itself).
    pub https_port: u16,
    pub http_port: u16,
}

impl Default for RawTransparent {
    fn default() -> Self {
        RawTransparent { https_listen: None, http_listen: None, sandbox: None, https_port: 443, http_port: 80 }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: String,
    pub upstream: String,
    pub inject: RawInject,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
    /// Requests per minute per sandbox; 0: unlimited.
    #[serde(default)]
    pub sandbox_requests_per_minute: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    pub header: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub secret_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub secret_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawGithub {
    pub web_url: String,
    pub api_url: String,
    /// Extra CA certificates (PEM) trusted for GitHub, besides the platform's.
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub ca_file: Option<PathBuf>,
    /// GitHub App id; 0: no App.
    pub app_id: u64,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub private_key_file: Option<PathBuf>,
    /// owner -> file holding a static token for that owner's repositories.
    pub token_files: BTreeMap<String, String>,
    #[serde(with = "humantime_serde")]
    pub refresh_before: Duration,
    /// A git request or response body with no bytes for this long is aborted.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// App tokens one sandbox may cause to be minted per minute; 0: any number.
    pub sandbox_mints_per_minute: u32,
}

impl Default for RawGithub {
    fn default() -> Self {
        RawGithub {
            web_url: "https://github.com".to_string(),
            api_url: "https://api.github.com".to_string(),
            ca_file: None,
            app_id: 0,
            private_key_file: None,
            token_files: BTreeMap::new(),
            refresh_before: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(120),
            sandbox_mints_per_minute: 30,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTokens {
    #[serde(with = "humantime_serde")]
    pub max_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub leeway: Duration,
    /// Sandbox ids and token ids (`jti`), one per line; reloaded with the policies.
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub revocation_file: Option<PathBuf>,
    pub keys: Vec<RawKey>,
    /// How long past its token's `exp` a connection authenticated by a signed token may
    /// stay open: a duration, or "off".
    pub expiry_grace: String,
}

impl Default for RawTokens {
    fn default() -> Self {
        RawTokens {
            max_ttl: Duration::from_secs(24 * 3600),
            leeway: Duration::from_secs(30),
            revocation_file: None,
            keys: Vec::new(),
            expiry_grace: "60s".to_string(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawKey {
    pub kid: String,
    /// "HS256" or "EdDSA".
    pub alg: String,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub secret_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub secret_env: Option<String>,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub public_key_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub private_key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDrain {
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for RawDrain {
    fn default() -> Self {
        RawDrain { delay: Duration::from_secs(10), timeout: Duration::from_secs(90) }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    pub listen: String,
    /// File holding the bearer token for `POST /v1/reload`; empty: loopback clients only.
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub token_file: Option<PathBuf>,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin { listen: "127.0.0.1:9090".to_string(), token_file: None }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawProxy {
    pub listen: String,
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub response_header_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub tunnel_idle_timeout: Duration,
    pub max_connections: usize,
    /// Connections one client address may hold open before authenticating; unset:
    /// a quarter of max_connections (at least 4, at most 256); 0: no cap.
    pub max_unauthenticated_per_client: Option<usize>,
    /// Failed authentications per second one client address may make; 0: no limit.
    pub auth_failures_per_second: u32,
    /// Connections one sandbox may hold once authorized; unset: a sixteenth of
    /// max_connections (at least 16); 0: no cap.
    pub sandbox_max_connections: Option<usize>,
    /// Accept threads, each with its own runtime; 0: one per CPU.
    pub threads: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// "off", "optional" or "required".
    pub proxy_protocol: String,
    pub close_revoked_tunnels: bool,
    pub sandbox_max_concurrent: usize,
    pub sandbox_max_per_second: u32,
    #[serde(with = "humantime_serde")]
    pub tcp_keepalive: Duration,
    /// PEM certificate chain and key: the proxy port speaks TLS (an HTTPS proxy).
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates: every client must present a certificate from them (mTLS).
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub tls_client_ca: Option<PathBuf>,
    /// With mTLS: the client certificate's subject CN must equal the sandbox id.
    pub tls_client_cn_is_sandbox: bool,
    /// Client CIDRs admitted (after a trusted PROXY header); empty: everyone.
    pub allowed_clients: Vec<String>,
    pub trusted_proxies: Vec<String>,
    /// Names clients reach the gateway by (`gateway`, a Kubernetes service name).
    pub names: Vec<String>,
}

pub fn default_listen() -> String {
    "0.0.0.0:4002".to_string()
}

impl Default for RawProxy {
    fn default() -> Self {
        RawProxy {
            listen: default_listen(),
            header_read_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            response_header_timeout: Duration::from_secs(120),
            tunnel_idle_timeout: Duration::from_secs(300),
            max_connections: 10_000,
            max_unauthenticated_per_client: None,
            auth_failures_per_second: 10,
            sandbox_max_connections: None,
            threads: 0,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            proxy_protocol: "off".to_string(),
            close_revoked_tunnels: true,
            sandbox_max_concurrent: 512,
            sandbox_max_per_second: 200,
            tcp_keepalive: Duration::from_secs(60),
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca: None,
            tls_client_cn_is_sandbox: false,
            allowed_clients: Vec::new(),
            trusted_proxies: Vec::new(),
            names: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    pub format: String,
    pub level: String,
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog { format: "auto".to_string(), level: "info".to_string(), flush_interval: Duration::from_millis(50) }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawResolver {
    /// Empty: the system's resolv.conf.
    pub nameservers: Vec<String>,
    pub hosts: BTreeMap<String, Vec<String>>,
    pub hosts_file: bool,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for RawResolver {
    fn default() -> Self {
        RawResolver {
            nameservers: Vec::new(),
            hosts: BTreeMap::new(),
            hosts_file: true,
            timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawEgress {
    pub deny: Vec<String>,
    pub allow: Vec<String>,
    pub ports: Vec<u16>,
    /// Sandboxes reach each other as `ID.SUFFIX`.
    pub peer_suffix: String,
}

impl Default for RawEgress {
    fn default() -> Self {
        RawEgress {
            deny: vec!["builtin".to_string()],
            allow: Vec::new(),
            ports: vec![80, 443],
            peer_suffix: "sandboxes.internal".to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPolicySection {
    pub dir: String,
    pub mode: Mode,
    /// A second policy directory decided alongside, for comparison only; empty: none.
    #[serde(default, deserialize_with = "absent_if_empty")]
    pub shadow_dir: Option<PathBuf>,
    /// How often to look for changed policy, key, revocation and certificate files; 0s: never.
    #[serde(with = "humantime_serde")]
    pub watch_interval: Duration,
}

impl Default for RawPolicySection {
    fn default() -> Self {
        RawPolicySection {
            dir: "policy".to_string(),
            mode: Mode::Enforce,
            shadow_dir: None,
            watch_interval: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDns {
    pub listen: String,
    pub hostnames: Vec<String>,
    pub addresses: Vec<String>,
    pub blocked: String,
    pub ttl: u32,
    pub negative_ttl: u32,
    pub rate_limit_qps: u32,
    pub rate_limit_burst: u32,
    pub rate_limit_action: String,
    pub tcp_max_connections: usize,
    /// TCP connections one source address may hold; unset: an eighth of
    /// tcp_max_connections (1 to 64).
    pub tcp_max_per_client: Option<usize>,
    #[serde(with = "humantime_serde")]
    pub tcp_idle_timeout: Duration,
    pub udp_sockets: usize,
    pub log_blocked_per_second: u32,
    /// `hostnames` (only the gateway's names) or `gateway` (also every name the asking
    /// sandbox may reach, answered with `addresses`).
    pub answer: String,
    pub answer_ttl: u32,
}

impl Default for RawDns {
    fn default() -> Self {
        RawDns {
            listen: "0.0.0.0:53".to_string(),
            hostnames: Vec::new(),
            addresses: Vec::new(),
            blocked: "nxdomain".to_string(),
            ttl: 60,
            negative_ttl: 60,
            rate_limit_qps: 200,
            rate_limit_burst: 400,
            rate_limit_action: "drop".to_string(),
            tcp_max_connections: 512,
            tcp_max_per_client: None,
            tcp_idle_timeout: Duration::from_secs(10),
            udp_sockets: 0,
            log_blocked_per_second: 10,
            answer: "hostnames".to_string(),
            answer_ttl: 5,
        }
    }
}

/// One policy file: any number of policies and sandboxes.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawPolicyFile {
    pub policies: BTreeMap<String, RawPolicy>,
    pub sandboxes: Vec<Spanned<RawSandbox>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawPolicy {
    pub allow: Vec<Spanned<String>>,
    pub deny: Vec<Spanned<String>>,
    pub mode: Option<Mode>,
    pub git: Option<RawGit>,
    /// VPC endpoint ids the policy's sandboxes must come through.
    pub vpce: Vec<String>,
    /// API routes (`[[routes]]` names) the policy's sandboxes may use.
    pub routes: Vec<Spanned<String>>,
    /// Every destination but what `deny` and `egress.deny` refuse.
    pub allow_all: Option<Spanned<bool>>,
    /// Other sandboxes (id or label globs) the policy's sandboxes may reach.
    pub peers: Vec<Spanned<String>>,
    /// Other sandboxes (id or label globs) the policy's sandboxes accept.
    pub accept_from: Vec<Spanned<String>>,
    /// Bytes, requests and new hosts per window.
    pub budget: Option<Spanned<RawBudget>>,
    /// Hosts whose TLS the gateway terminates (needs `[intercept]`), so that each
    /// request inside is decided by `requests`.
    pub inspect: Vec<Spanned<String>>,
    /// Request rules inside inspected hosts.
    pub requests: Vec<Spanned<RawRequest>>,
}

/// `[[policies.NAME.requests]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRequest {
    pub host: String,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
    /// Parameter name -> value glob; all must match.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Header name -> value glob; all must match.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `"allow"` or `"deny"`.
    pub action: String,
}

/// `[policies.NAME.budget]`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawBudget {
    /// `"1h"` when absent.
    pub window: Option<String>,
    pub upload_bytes: Option<RawSize>,
    pub download_bytes: Option<RawSize>,
    pub requests: Option<u64>,
    pub new_hosts: Option<u64>,
    pub hosts: Vec<RawHostBudget>,
}

/// `[[policies.NAME.budget.hosts]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHostBudget {
    pub host: String,
    #[serde(default)]
    pub upload_bytes: Option<RawSize>,
    #[serde(default)]
    pub download_bytes: Option<RawSize>,
    #[serde(default)]
    pub requests: Option<u64>,
}

/// A size as written: bytes, or a string with a unit (`"100MiB"`).
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawGit {
    /// `OWNER/REPO` globs the sandboxes may clone and fetch.
    pub repos: Vec<Spanned<String>>,
    /// Ref globs they may push to; empty: read-only.
    pub push: Vec<Spanned<String>>,
    /// Let pushes delete matching refs.
    pub allow_delete: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSandbox {
    pub id: String,
    pub token_sha256: String,
    pub policy: String,
    #[serde(default)]
    pub vpce: Vec<String>,
    /// Source addresses (CIDRs) that identify the sandbox without a token, for
    /// transparent listeners and the DNS firewall's answer mode.
    #[serde(default)]
    pub addresses: Vec<Spanned<String>>,
    /// Labels `peers` and `accept_from` patterns may match.
    #[serde(default)]
    pub labels: Vec<String>,
}

/// An optional path or name: absent, or written as `""`, is `None`.
fn absent_if_empty<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: From<String>,
{
    let s = String::deserialize(d)?;
    Ok((!s.is_empty()).then(|| T::from(s)))
}
