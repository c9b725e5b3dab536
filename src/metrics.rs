//! Metric names, descriptions and label values. Names are a stable interface:
//! prefixed `egress_`, suffixed `_total`/`_seconds`/`_bytes`, with bounded labels
//! (never hostnames, sandbox ids or tokens).

use metrics::{Unit, describe_counter, describe_histogram};

/// `result` = answered|nodata|blocked|refused|formerr|notimp|rate_limited,
/// `transport` = udp|tcp.
pub const DNS_QUERIES: &str = "egress_dns_queries_total";
/// `transport` = udp|tcp.
pub const DNS_DURATION: &str = "egress_dns_query_duration_seconds";
/// TCP connections refused at `dns.tcp_max_connections`.
pub const DNS_TCP_REFUSED: &str = "egress_dns_tcp_connections_refused_total";

/// Registers descriptions with whatever recorder is installed.
pub fn describe() {
    describe_counter!(DNS_QUERIES, Unit::Count, "DNS queries answered by the DNS firewall, by result and transport");
    describe_histogram!(DNS_DURATION, Unit::Seconds, "Time to answer one DNS query");
    describe_counter!(DNS_TCP_REFUSED, Unit::Count, "DNS TCP connections closed at the connection cap");
}
