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
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Sandbox token helpers.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
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
