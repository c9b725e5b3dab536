//! Metric names, descriptions, buckets and the recorder. Names are a stable interface:
//! prefixed `egress_`, suffixed `_total`/`_seconds`/`_bytes`, with bounded labels
//! (reasons, kinds, decisions; never hostnames, sandbox ids or tokens).

use std::sync::OnceLock;

use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::policy::Outcome;
use crate::telemetry::Kind;

/// `kind` = connect|forward|git, `decision` = allow|deny|would_deny.
pub const PROXY_REQUESTS: &str = "egress_proxy_requests_total";
/// `reason` = a stable deny-reason code.
pub const PROXY_DENIALS: &str = "egress_proxy_denials_total";
/// `kind`, `direction` = up (client to upstream) | down.
pub const PROXY_BYTES: &str = "egress_proxy_bytes_total";
/// `kind`: request (or tunnel) lifetime.
pub const PROXY_DURATION: &str = "egress_proxy_request_duration_seconds";
pub const PROXY_CONNECTIONS_ACTIVE: &str = "egress_proxy_connections_active";
pub const PROXY_TUNNELS_ACTIVE: &str = "egress_proxy_tunnels_active";
/// Connections closed at `proxy.max_connections`.
pub const PROXY_CONNECTIONS_REFUSED: &str = "egress_proxy_connections_refused_total";
/// `why` = untrusted_header|malformed_header|missing_header|timeout.
pub const PROXY_PROTOCOL_REJECTED: &str = "egress_proxy_protocol_rejected_total";
/// Connections closed because the client is not in `proxy.allowed_clients`.
pub const PROXY_CLIENTS_REJECTED: &str = "egress_proxy_clients_rejected_total";
/// `result` = ok|error.
pub const POLICY_RELOADS: &str = "egress_policy_reloads_total";
pub const POLICY_GENERATION: &str = "egress_policy_generation";
/// `live`, `shadow` = allow|deny|would_deny.
pub const POLICY_SHADOW_DISAGREEMENTS: &str = "egress_policy_shadow_disagreements_total";
/// `result` = answered|nodata|blocked|refused|formerr|notimp|rate_limited,
/// `transport` = udp|tcp.
/// Refusals and closed tunnels by the kind of budget spent (`requests`, `upload_bytes`...).
pub const BUDGET_EXHAUSTED: &str = "egress_budget_exhausted_total";
/// 1 while the shared limit store answers (or there is none), 0 while it does not.
pub const LIMIT_STORE_UP: &str = "egress_limit_store_up";
pub const DNS_QUERIES: &str = "egress_dns_queries_total";
/// `transport` = udp|tcp.
pub const DNS_DURATION: &str = "egress_dns_query_duration_seconds";
/// TCP connections refused at `dns.tcp_max_connections`.
pub const DNS_TCP_REFUSED: &str = "egress_dns_tcp_connections_refused_total";

/// Request durations: 1 ms to 10 min (tunnels live long).
const PROXY_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0];
/// DNS answers: 10 µs to 100 ms.
const DNS_BUCKETS: &[f64] = &[0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.1];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder once per process and describes every metric.
/// Returns the handle that renders `/metrics` (None if another recorder was installed
/// first, e.g. by an embedding program).
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(PROXY_DURATION.into()), PROXY_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(DNS_DURATION.into()), DNS_BUCKETS));
            let handle = match builder.map(PrometheusBuilder::install_recorder) {
                Ok(Ok(h)) => Some(h),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    None
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics buckets invalid");
                    None
                }
            };
            describe();
            let _ = REQUEST.set(RequestMetrics::register());
            handle
        })
        .clone()
}

/// The kinds and decisions of [`PROXY_REQUESTS`], in the order of the handle arrays.
const KINDS: [Kind; 5] = [Kind::Connect, Kind::Forward, Kind::Git, Kind::Unparsed, Kind::Transparent];
const DECISIONS: [Outcome; 3] = [Outcome::Allow, Outcome::Deny, Outcome::WouldDeny];

/// Handles for the metrics every request records, registered once when the recorder
/// is installed: looking one up by name and labels costs a hash, a lock and an
/// allocation, on every request.
pub struct RequestMetrics {
    requests: [[Counter; 3]; KINDS.len()],
    /// Per kind: up, down.
    bytes: [[Counter; 2]; KINDS.len()],
    duration: [Histogram; KINDS.len()],
    /// Open connections, open tunnels.
    active: [Gauge; 2],
}

static REQUEST: OnceLock<RequestMetrics> = OnceLock::new();

impl RequestMetrics {
    fn register() -> RequestMetrics {
        let kind = |i: usize| KINDS[i].as_str();
        RequestMetrics {
            requests: std::array::from_fn(|k| {
                std::array::from_fn(
                    |d| counter!(PROXY_REQUESTS, "kind" => kind(k), "decision" => DECISIONS[d].as_str()),
                )
            }),
            bytes: std::array::from_fn(|k| {
                [
                    counter!(PROXY_BYTES, "kind" => kind(k), "direction" => "up"),
                    counter!(PROXY_BYTES, "kind" => kind(k), "direction" => "down"),
                ]
            }),
            duration: std::array::from_fn(|k| histogram!(PROXY_DURATION, "kind" => kind(k))),
            active: [gauge!(PROXY_CONNECTIONS_ACTIVE), gauge!(PROXY_TUNNELS_ACTIVE)],
        }
    }

    /// The handles, registered with whatever recorder is installed by now (none: the
    /// handles record nothing).
    fn get() -> &'static RequestMetrics {
        REQUEST.get_or_init(RequestMetrics::register)
    }
}

/// Records one finished request or tunnel.
pub fn record_request(kind: Kind, decision: Outcome, bytes_up: u64, bytes_down: u64, elapsed: Duration) {
    let m = RequestMetrics::get();
    let k = KINDS.iter().position(|x| *x == kind).unwrap_or(0);
    let d = DECISIONS.iter().position(|d| *d == decision).unwrap_or(0);
    m.requests[k][d].increment(1);
    if bytes_up > 0 {
        m.bytes[k][0].increment(bytes_up);
    }
    if bytes_down > 0 {
        m.bytes[k][1].increment(bytes_down);
    }
    m.duration[k].record(elapsed.as_secs_f64());
}

fn describe() {
    describe_counter!(PROXY_REQUESTS, Unit::Count, "Proxy requests and tunnels, by kind and decision");
    describe_counter!(PROXY_DENIALS, Unit::Count, "Denied proxy requests, by reason");
    describe_counter!(BUDGET_EXHAUSTED, Unit::Count, "Requests refused and tunnels closed by a spent budget, by kind");
    describe_gauge!(LIMIT_STORE_UP, Unit::Count, "1 while the shared limit store answers (or none is set), else 0");
    describe_counter!(PROXY_BYTES, Unit::Bytes, "Bytes relayed, by kind and direction");
    describe_histogram!(PROXY_DURATION, Unit::Seconds, "Lifetime of a proxy request or tunnel");
    describe_gauge!(
        PROXY_CONNECTIONS_ACTIVE,
        Unit::Count,
        "Open client connections on the proxy port, tunnels included"
    );
    describe_gauge!(PROXY_TUNNELS_ACTIVE, Unit::Count, "Open CONNECT tunnels and upgraded connections");
    describe_counter!(PROXY_CONNECTIONS_REFUSED, Unit::Count, "Connections closed at proxy.max_connections");
    describe_counter!(PROXY_PROTOCOL_REJECTED, Unit::Count, "Connections closed by PROXY protocol admission, by why");
    describe_counter!(PROXY_CLIENTS_REJECTED, Unit::Count, "Connections from clients outside proxy.allowed_clients");
    describe_counter!(POLICY_RELOADS, Unit::Count, "Policy reloads, by result");
    describe_gauge!(POLICY_GENERATION, Unit::Count, "Generation of the policies in force");
    describe_counter!(
        POLICY_SHADOW_DISAGREEMENTS,
        Unit::Count,
        "Requests the shadow policies decide differently from the live ones"
    );
    describe_counter!(DNS_QUERIES, Unit::Count, "DNS queries answered by the DNS firewall, by result and transport");
    describe_histogram!(DNS_DURATION, Unit::Seconds, "Time to answer one DNS query");
    describe_counter!(DNS_TCP_REFUSED, Unit::Count, "DNS TCP connections closed at the connection cap");
}

/// Counts one open thing (connection, tunnel) in a gauge for as long as it lives.
pub struct ActiveGuard(metrics::Gauge);

impl ActiveGuard {
    /// One open client connection on the proxy port (tunnels included).
    pub fn connection() -> Self {
        Self::count(&RequestMetrics::get().active[0])
    }

    /// One open CONNECT tunnel or upgraded connection.
    pub fn tunnel() -> Self {
        Self::count(&RequestMetrics::get().active[1])
    }

    fn count(g: &Gauge) -> Self {
        g.increment(1.0);
        ActiveGuard(g.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
