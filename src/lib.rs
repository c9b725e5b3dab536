//! egress-gateway: the egress gateway and DNS firewall for AI-agent code sandboxes.

pub mod access_log;
pub mod addr;
pub mod admin;
pub mod auth;
pub mod cli;
pub mod commands;
pub mod config;
pub mod demo;
pub mod dns;
pub mod dryrun;
pub mod fuzzing;
pub mod gateway;
pub mod git;
pub mod metrics;
pub mod os;
pub mod policy;
pub mod proxy;
pub mod reload;
pub mod resolve;
pub mod routes;
pub mod secret;
pub mod telemetry;
pub mod tokens;
pub mod upstream_tls;
