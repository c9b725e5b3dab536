//! Thin entry point: parse the command line, start telemetry and the runtime, call the
//! library, map errors to a message on stderr and an exit code.

use std::process::ExitCode;

use clap::Parser;
use egress_gateway::cli::{CaCommand, Cli, Command, ConfigCommand, PolicyCommand, TokenCommand, read_token_from_stdin};
use egress_gateway::commands;
use egress_gateway::config::{self, Config};
use egress_gateway::gateway::{Gateway, Shutdown};
use egress_gateway::{auth, demo, telemetry};

const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = run(cli);
    telemetry::flush();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("egress-gateway: error: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { config, listen } => serve(config, listen),
        Command::Check(args) => report(|out| commands::check::run(&args, out)),
        Command::Health { config, ready } => report(|out| commands::health::run(config.as_ref(), ready, out)),
        Command::Usage { config, sandbox, admin, policy, json } => report(|out| {
            let args = commands::usage::Args {
                config: config.as_ref(),
                sandbox: &sandbox,
                admin,
                policy: policy.as_deref(),
                json,
            };
            commands::usage::run(&args, out)
        }),
        Command::Policy { command } => report(|out| match &command {
            PolicyCommand::Test { config, files } => commands::test_file::run(config.as_ref(), files, out),
            PolicyCommand::Lint { config, deny_warnings } => commands::lint::run(config.as_ref(), *deny_warnings, out),
            PolicyCommand::Replay { log, config, json } => commands::replay::run(log, config.as_ref(), *json, out),
            PolicyCommand::Suggest { log, config, sandbox, policy, write } => {
                let filter = commands::suggest::Filter { sandbox: sandbox.as_deref(), policy: policy.as_deref() };
                commands::suggest::run(log, config.as_ref(), &filter, write.as_deref(), out)
            }
            PolicyCommand::Diff { config, old_dir, new_dir } => {
                commands::diff::run(config.as_ref(), old_dir, new_dir, out)
            }
        }),
        Command::Config { command: ConfigCommand::Validate { config } } => {
            let cfg = load_or_demo(config)?.0;
            let file = cfg.file.clone();
            // What serving builds before it binds: keys, secrets, certificates, clients.
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let shared = rt.block_on(async move { Gateway::check(cfg) })?;
            let state = shared.store.snapshot();
            let (policies, sandboxes) = (state.policies.policies.len(), state.policies.sandboxes.len());
            eprintln!("{file}: valid ({policies} policies, {sandboxes} sandboxes)");
            Ok(ExitCode::SUCCESS)
        }
        Command::Ca { command } => report(|out| match &command {
            CaCommand::Init { cert, key, name, lifetime, force } => {
                commands::ca::init(cert, key, name, *lifetime, *force, out)
            }
            CaCommand::Bundle { ca, config, out: dest } => {
                commands::ca::bundle(ca.as_ref(), config.as_ref(), dest.as_ref(), out)
            }
            CaCommand::Env { bundle } => commands::ca::env(bundle, out),
        }),
        Command::Token { command: TokenCommand::Hash } => {
            let token = read_token_from_stdin()?;
            anyhow::ensure!(!token.is_empty(), "empty token on standard input");
            #[expect(clippy::print_stdout, reason = "CLI output")]
            {
                println!("{}", hex::encode(auth::token_sha256(&token)));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Token { command: TokenCommand::Mint { config, kid, sandbox, policy, repos, ttl, jti } } => {
            let args = commands::mint::MintArgs {
                config: config.as_ref(),
                kid: &kid,
                sandbox: &sandbox,
                policy: &policy,
                repos: &repos,
                ttl,
                jti: jti.as_deref(),
            };
            report(|out| commands::mint::run(&args, out))
        }
        Command::Token { command: TokenCommand::Generate } => {
            let token = auth::generate_token();
            #[expect(clippy::print_stdout, reason = "CLI output")]
            {
                println!("token        = {token}");
                println!("token_sha256 = {}", hex::encode(auth::token_sha256(&token)));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs an offline command with standard output as its report; its value is the exit code.
fn report(f: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<u8>) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let code = f(&mut out)?;
    std::io::Write::flush(&mut out)?;
    Ok(ExitCode::from(code))
}

/// The config from `path`, or the built-in demo (with its generated token).
fn load_or_demo(path: Option<std::path::PathBuf>) -> anyhow::Result<(Config, Option<String>)> {
    match path {
        Some(p) => Ok((config::load(&p)?, None)),
        None => {
            let (cfg, token) = demo::config()?;
            Ok((cfg, Some(token)))
        }
    }
}

fn serve(path: Option<std::path::PathBuf>, listen: Option<std::net::SocketAddr>) -> anyhow::Result<ExitCode> {
    let (mut cfg, demo_token) = load_or_demo(path)?;
    if let Some(l) = listen {
        cfg.proxy.listen = l;
    }
    telemetry::init(&cfg.log).map_err(anyhow::Error::msg)?;
    if let Some(limit) = egress_gateway::os::raise_fd_limit() {
        // Each connection or tunnel holds up to two descriptors.
        let needed = 2 * cfg.proxy.max_connections as u64 + 256;
        if limit < needed {
            tracing::warn!(limit, needed, "descriptor limit below 2 x proxy.max_connections; raise `ulimit -n`");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let gateway = Gateway::bind(cfg).await?;
        if let Some(token) = demo_token {
            let addr = gateway.proxy_addr()?;
            eprintln!(
                "\nDemo mode: built-in policy, sandbox \"{sbx}\", token generated for this run.\n\
                 Try:  curl -x http://{sbx}:{token}@{addr} https://pypi.org/simple/ -o /dev/null -w '%{{http_code}}\\n'\n\
                 Denied: curl -x http://{sbx}:{token}@{addr} https://example.com/",
                sbx = demo::DEMO_SANDBOX,
            );
            if let Some(dns) = gateway.dns_addr() {
                eprintln!(
                    "DNS:  dig @{} -p {} gateway.sandbox.internal   (any other name: NXDOMAIN)",
                    dns.ip(),
                    dns.port()
                );
            }
            eprintln!();
        }
        let shutdown = Shutdown::default();
        tokio::spawn(watch_signals(shutdown.clone()));
        gateway.run(shutdown).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM (the orchestrator) starts a full drain; SIGINT (an operator's Ctrl-C) drains
/// without the load-balancer delay; a second signal of either kind stops at once.
async fn watch_signals(shutdown: Shutdown) {
    #[cfg(unix)]
    {
        use std::sync::atomic::Ordering;
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => shutdown.skip_delay.store(true, Ordering::Relaxed),
        }
        shutdown.drain.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: stopping now");
        shutdown.force.cancel();
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        shutdown.drain.cancel();
    }
}
