//! The command line: `serve`, `config validate`, `token hash|generate`.

use std::io::{IsTerminal, Read};
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Egress gateway and DNS firewall for AI-agent code sandboxes.
#[derive(Debug, Parser)]
#[command(name = "egress-gateway", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway. Without --config, runs the built-in local demo.
    Serve {
        /// Gateway config file (TOML).
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        /// Override proxy.listen (e.g. 127.0.0.1:0 for an ephemeral port).
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Dry-run: may sandbox S reach TARGET, and by which rule? Exit 0 allow, 1 deny, 2 error.
    Check(CheckArgs),
    /// Policy authoring: test, lint, replay, diff.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Ask the running gateway's admin listener for /healthz (or /readyz with --ready):
    /// exit 0 on 200, 1 otherwise. For container health checks.
    Health {
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        ready: bool,
    },
    /// Ask the running gateway's admin listener for a sandbox's budgets, what it spent
    /// in the current windows, its open connections and its last refusals.
    Usage {
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        sandbox: String,
        /// The admin listener's address, if not `admin.listen`.
        #[arg(long)]
        admin: Option<SocketAddr>,
        /// The policy of a sandbox known only from signed tokens.
        #[arg(long)]
        policy: Option<String>,
        /// Print the admin listener's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sandbox token helpers.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// The TLS inspection CA: create one, write the bundle sandboxes trust, print the
    /// variables clients read.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a CA certificate and key (PEM; the key is written mode 0600) for
    /// [intercept] ca_cert_file and ca_key_file.
    Init {
        #[arg(long)]
        cert: PathBuf,
        #[arg(long)]
        key: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "egress-gateway inspection CA")]
        name: String,
        /// Lifetime, e.g. 365d.
        #[arg(long, default_value = "3650d", value_parser = humantime::parse_duration)]
        lifetime: std::time::Duration,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Write the system's roots plus the CA (PEM): the file sandboxes trust.
    Bundle {
        /// The CA certificate; without it, [intercept] ca_cert_file of --config.
        #[arg(long)]
        ca: Option<PathBuf>,
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        /// Where to write the bundle; standard output without it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the environment variables each common client reads, for a bundle at PATH
    /// inside the sandbox (shell `export` lines).
    Env {
        #[arg(long)]
        bundle: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Gateway config file (TOML). Without it, the built-in demo.
    #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// The sandbox id.
    #[arg(long)]
    pub sandbox: String,
    /// host:port, a URL (https://pypi.org/simple/), a git URL (https://github.com/OWNER/REPO.git),
    /// or an API route request (route:NAME/PATH).
    pub target: String,
    /// Check a push of this ref (git URLs only), e.g. refs/heads/agent/x.
    #[arg(long)]
    pub push: Option<String>,
    /// The method of a route:NAME/PATH request or of a URL (default GET): an inspected
    /// host's request rules decide it.
    #[arg(long)]
    pub method: Option<String>,
    /// Also resolve the name with the gateway's resolver and vet each address.
    #[arg(long)]
    pub resolve: bool,
    /// Also check that this token authenticates the sandbox.
    #[arg(long)]
    pub token: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Run table-driven policy test files ([[case]] sandbox, target, expect, reason, push).
    Test {
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        /// Test files (TOML).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Report errors and likely mistakes in the policy files.
    Lint {
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        /// Exit 1 on warnings too (for CI).
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Re-decide every request of an access log under a (new) policy and summarise what changes.
    /// Exit 1 if anything allowed before would be denied.
    Replay {
        /// Access log (JSON lines, as the gateway writes them).
        #[arg(long)]
        log: PathBuf,
        /// The config whose policies to replay against.
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// From an access log, the smallest set of allow rules, git repositories and routes
    /// that would have allowed what was denied (or would_deny), grouped by policy.
    Suggest {
        /// Access log (JSON lines, as the gateway writes them).
        #[arg(long)]
        log: PathBuf,
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        /// Only this sandbox's requests.
        #[arg(long)]
        sandbox: Option<String>,
        /// Only this policy's requests.
        #[arg(long)]
        policy: Option<String>,
        /// Write a copy of the policy directory with the suggestions added here.
        #[arg(long)]
        write: Option<PathBuf>,
    },
    /// Semantic diff of two policy directories, per policy and per sandbox.
    Diff {
        /// Config for defaults (egress.ports, policy.mode); its policy.dir is ignored.
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        old_dir: PathBuf,
        new_dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and validate a config and its policy files; exit 0 if valid, 2 if not.
    Validate {
        /// Gateway config file (TOML). Without it, validates the built-in demo.
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print the SHA-256 of a static token, for `token_sha256` in a policy file.
    /// Reads the token from standard input (so it stays out of shell history).
    Hash,
    /// Generate a random static token; prints the token and its SHA-256.
    Generate,
    /// Mint a signed sandbox token (JWT) with a key from [tokens] that can sign.
    Mint {
        #[arg(long, env = "EGRESS_GATEWAY_CONFIG")]
        config: Option<PathBuf>,
        /// Key id in [tokens.keys].
        #[arg(long)]
        kid: String,
        /// Sandbox id (the `sub` claim; the proxy URL's user name).
        #[arg(long)]
        sandbox: String,
        /// Policy name (the `pol` claim).
        #[arg(long)]
        policy: String,
        /// Narrow git repositories to these OWNER/REPO (repeatable).
        #[arg(long = "repo")]
        repos: Vec<String>,
        /// Lifetime, e.g. 15m or 8h (at most tokens.max_ttl).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// Token id (the `jti` claim, usable in the revocation file); random if absent.
        #[arg(long)]
        jti: Option<String>,
    },
}

/// Reads one token from standard input, without its line ending.
pub fn read_token_from_stdin() -> std::io::Result<String> {
    if std::io::stdin().is_terminal() {
        eprintln!("enter the token, then press Enter:");
    }
    let mut s = String::new();
    std::io::stdin().take(64 * 1024).read_to_string(&mut s)?;
    Ok(s.trim_end_matches(['\r', '\n']).to_string())
}
