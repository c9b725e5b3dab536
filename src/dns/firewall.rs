//! The DNS firewall's answers (a hickory `RequestHandler`, not a zone catalog).
//!
//! - a gateway hostname: `A`/`AAAA` with the configured addresses (NODATA for a family
//!   with none), other types NODATA with an SOA; `ANY` gets a minimal answer (RFC 8482);
//! - an ancestor of a gateway hostname: NODATA, never NXDOMAIN (RFC 8020 would make
//!   NXDOMAIN deny the whole subtree, the gateway's own name included);
//! - every other name: the configured block response with an SOA whose minimum sets
//!   the negative-cache TTL (`nxdomain`, `nodata`) or `REFUSED`;
//! - opcode other than QUERY: NOTIMP; class other than IN, AXFR, IXFR: REFUSED;
//!   `qdcount != 1`: FORMERR; EDNS version above 0: BADVERS.
//!
//! The question section is echoed as the client sent it, so 0x20 casing survives, and
//! answer owner names keep the client's casing too. OPT is returned only when the query
//! had one, advertising at most 1232 bytes.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Instant;

use hickory_net::runtime::Time;
use hickory_net::xfer::Protocol;
use hickory_proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;

use super::ratelimit::{RateLimiter, Sampler};
use crate::config::{BlockMode, DnsConfig, RateLimitAction};
use crate::metrics;

/// Largest UDP payload advertised (the DNS Flag Day 2020 value).
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// The result label of one query, as counted in `egress_dns_queries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Answered,
    NoData,
    Blocked,
    Refused,
    FormErr,
    NotImp,
    RateLimited,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::NoData => "nodata",
            Outcome::Blocked => "blocked",
            Outcome::Refused => "refused",
            Outcome::FormErr => "formerr",
            Outcome::NotImp => "notimp",
            Outcome::RateLimited => "rate_limited",
        }
    }
}

pub struct Firewall {
    names: HashSet<LowerName>,
    ancestors: HashSet<LowerName>,
    v4: Vec<IpAddr>,
    v6: Vec<IpAddr>,
    ttl: u32,
    blocked: BlockMode,
    soa: Record,
    limiter: RateLimiter,
    limit_action: RateLimitAction,
    log_sampler: Sampler,
    /// Answer mode: names the asking sandbox may reach get the gateway's addresses.
    answer: Option<(super::MayReach, u32)>,
}

/// What to send: a response code, whether the name is ours (AA), and the answers.
struct Plan {
    outcome: Outcome,
    rcode: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    with_soa: bool,
}

impl Plan {
    fn error(outcome: Outcome, rcode: ResponseCode) -> Self {
        Plan { outcome, rcode, authoritative: false, answers: Vec::new(), with_soa: false }
    }
}

impl Firewall {
    pub fn new(cfg: &DnsConfig) -> Result<Firewall, String> {
        let mut names = HashSet::new();
        let mut ancestors = HashSet::new();
        for h in &cfg.hostnames {
            let name = Name::from_ascii(format!("{h}.")).map_err(|e| format!("dns.hostnames: {h:?}: {e}"))?;
            let mut parent = name.base_name();
            names.insert(LowerName::from(name));
            loop {
                ancestors.insert(LowerName::from(&parent));
                if parent.is_root() {
                    break;
                }
                parent = parent.base_name();
            }
        }
        // A configured name is never also treated as a bare ancestor.
        ancestors.retain(|a| !names.contains(a));
        let primary = cfg.hostnames.first().cloned().unwrap_or_else(|| "gateway.invalid".into());
        let mname = Name::from_ascii(format!("{primary}.")).map_err(|e| e.to_string())?;
        let rname = Name::from_ascii(format!("hostmaster.{primary}.")).map_err(|e| e.to_string())?;
        let soa = SOA::new(mname, rname, 1, 3600, 600, 86400, cfg.negative_ttl);
        let soa = Record::from_rdata(Name::root(), cfg.negative_ttl, RData::SOA(soa));
        Ok(Firewall {
            names,
            ancestors,
            v4: cfg.addresses.iter().copied().filter(IpAddr::is_ipv4).collect(),
            v6: cfg.addresses.iter().copied().filter(IpAddr::is_ipv6).collect(),
            ttl: cfg.ttl,
            blocked: cfg.blocked,
            soa,
            limiter: RateLimiter::new(cfg.rate_limit_qps, cfg.rate_limit_burst),
            limit_action: cfg.rate_limit_action,
            log_sampler: Sampler::new(cfg.log_blocked_per_second),
            answer: None,
        })
    }

    /// Answer mode: a name `may_reach` allows for the asking address is answered with
    /// the gateway's addresses (TTL `ttl`); `HTTPS`, `SVCB` and every other type get
    /// NODATA, so clients learn of no QUIC endpoint and no other address.
    pub fn answer_for(&mut self, may_reach: super::MayReach, ttl: u32) {
        self.answer = Some((may_reach, ttl));
    }

    /// Decides the answer to `request`; pure apart from the rate limiter and sampler.
    fn plan(&self, request: &Request) -> Plan {
        if self.limiter.enabled() && !self.limiter.allow(request.src().ip(), Instant::now()) {
            return Plan::error(Outcome::RateLimited, ResponseCode::Refused);
        }
        if request.metadata.op_code != OpCode::Query {
            return Plan::error(Outcome::NotImp, ResponseCode::NotImp);
        }
        if request.version() > 0 {
            return Plan::error(Outcome::FormErr, ResponseCode::BADVERS);
        }
        let queries = request.queries.queries();
        let [query] = queries else {
            return Plan::error(Outcome::FormErr, ResponseCode::FormErr);
        };
        let qtype = query.query_type();
        if query.query_class() != DNSClass::IN || matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Plan::error(Outcome::Refused, ResponseCode::Refused);
        }
        let name = query.name();
        if self.names.contains(name) {
            let owner = query.original().name();
            let answers = match qtype {
                RecordType::A => self.records(owner, &self.v4, self.ttl),
                RecordType::AAAA => self.records(owner, &self.v6, self.ttl),
                // RFC 8482: a minimal, non-empty answer rather than everything.
                RecordType::ANY if !self.v4.is_empty() => self.records(owner, &self.v4[..1], self.ttl),
                RecordType::ANY => self.records(owner, &self.v6[..self.v6.len().min(1)], self.ttl),
                _ => Vec::new(),
            };
            let outcome = if answers.is_empty() { Outcome::NoData } else { Outcome::Answered };
            let with_soa = answers.is_empty();
            return Plan { outcome, rcode: ResponseCode::NoError, authoritative: true, answers, with_soa };
        }
        if self.ancestors.contains(name) {
            return Plan {
                outcome: Outcome::NoData,
                rcode: ResponseCode::NoError,
                authoritative: true,
                answers: Vec::new(),
                with_soa: true,
            };
        }
        if let Some((may_reach, ttl)) = &self.answer {
            let text = name.to_string();
            let text = text.strip_suffix('.').unwrap_or(&text);
            if may_reach(request.src().ip(), text) {
                let owner = query.original().name();
                let answers = match qtype {
                    RecordType::A => self.records(owner, &self.v4, *ttl),
                    RecordType::AAAA => self.records(owner, &self.v6, *ttl),
                    _ => Vec::new(),
                };
                let outcome = if answers.is_empty() { Outcome::NoData } else { Outcome::Answered };
                let with_soa = answers.is_empty();
                return Plan { outcome, rcode: ResponseCode::NoError, authoritative: true, answers, with_soa };
            }
        }
        if let Some(suppressed) = self.log_sampler.sample() {
            tracing::info!(
                name = %query.original().name(),
                qtype = %qtype,
                client_addr = %request.src(),
                suppressed,
                "dns query blocked"
            );
        }
        let (rcode, with_soa) = match self.blocked {
            BlockMode::NxDomain => (ResponseCode::NXDomain, true),
            BlockMode::NoData => (ResponseCode::NoError, true),
            BlockMode::Refused => (ResponseCode::Refused, false),
        };
        Plan { outcome: Outcome::Blocked, rcode, authoritative: with_soa, answers: Vec::new(), with_soa }
    }

    fn records(&self, owner: &Name, ips: &[IpAddr], ttl: u32) -> Vec<Record> {
        ips.iter()
            .map(|ip| {
                let rdata = match ip {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                Record::from_rdata(owner.clone(), ttl, rdata)
            })
            .collect()
    }

    /// Answers one request through `response`, returning what was sent (or, for a
    /// dropped query, the header that would have been).
    pub async fn respond<R: ResponseHandler>(&self, request: &Request, mut response: R) -> (Outcome, ResponseInfo) {
        let plan = self.plan(request);
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = plan.rcode;
        metadata.authoritative = plan.authoritative;
        if plan.outcome == Outcome::RateLimited && self.limit_action == RateLimitAction::Drop {
            return (plan.outcome, ResponseInfo::from(Header { metadata, counts: HeaderCounts::default() }));
        }
        let edns = request.edns.as_ref().map(|client| {
            let mut e = Edns::new();
            e.set_max_payload(client.max_payload().clamp(512, MAX_UDP_PAYLOAD));
            e.set_version(0);
            e
        });
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(e) = &edns {
            builder.edns(e);
        }
        let soa = plan.with_soa.then_some(&self.soa);
        let message = builder.build(metadata, plan.answers.iter(), [], soa, []);
        match response.send_response(message).await {
            Ok(info) => (plan.outcome, info),
            Err(e) => {
                tracing::debug!(error = %e, client_addr = %request.src(), "dns response not sent");
                metadata.response_code = ResponseCode::ServFail;
                (plan.outcome, ResponseInfo::from(Header { metadata, counts: HeaderCounts::default() }))
            }
        }
    }
}

/// The hickory handler: a shared [`Firewall`] plus metric handles resolved once, so
/// counting a query does not build label sets per query.
#[derive(Clone)]
pub struct Handler {
    firewall: std::sync::Arc<Firewall>,
    metrics: std::sync::Arc<DnsMetrics>,
}

impl Handler {
    /// Call after the metrics recorder is installed: handles bind to it here.
    pub fn new(firewall: Firewall) -> Self {
        Handler { firewall: std::sync::Arc::new(firewall), metrics: std::sync::Arc::new(DnsMetrics::new()) }
    }
}

const OUTCOMES: [Outcome; 7] = [
    Outcome::Answered,
    Outcome::NoData,
    Outcome::Blocked,
    Outcome::Refused,
    Outcome::FormErr,
    Outcome::NotImp,
    Outcome::RateLimited,
];

struct DnsMetrics {
    /// `[transport][outcome]`, transport 0 = udp, 1 = tcp.
    queries: [[::metrics::Counter; 7]; 2],
    duration: [::metrics::Histogram; 2],
}

impl DnsMetrics {
    fn new() -> Self {
        let per = |t: &'static str| {
            OUTCOMES.map(|o| ::metrics::counter!(metrics::DNS_QUERIES, "result" => o.as_str(), "transport" => t))
        };
        DnsMetrics {
            queries: [per("udp"), per("tcp")],
            duration: [
                ::metrics::histogram!(metrics::DNS_DURATION, "transport" => "udp"),
                ::metrics::histogram!(metrics::DNS_DURATION, "transport" => "tcp"),
            ],
        }
    }

    fn record(&self, tcp: bool, outcome: Outcome, started: Instant) {
        let t = usize::from(tcp);
        let o = OUTCOMES.iter().position(|x| *x == outcome).unwrap_or(0);
        self.queries[t][o].increment(1);
        // The latency histogram takes every 16th query per thread: a uniform sample is
        // as good a distribution, and recording every query cost measurable throughput.
        if latency_sample() {
            self.duration[t].record(started.elapsed().as_secs_f64());
        }
    }

    /// A query answered FORMERR before it reached the handler (unparseable).
    pub fn formerr(&self, tcp: bool) {
        self.queries[usize::from(tcp)][4].increment(1);
    }
}

fn latency_sample() -> bool {
    thread_local! {
        static N: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    N.with(|n| {
        let v = n.get().wrapping_add(1);
        n.set(v);
        v.is_multiple_of(16)
    })
}

impl Handler {
    /// A query that could not be parsed, from `src`: whether to answer it FORMERR. It
    /// spends its source's rate as any query does (a flood of garbage is no cheaper),
    /// and over the rate it is dropped when `dns.rate_limit_action` drops.
    pub fn answer_unparseable(&self, src: std::net::IpAddr, tcp: bool) -> bool {
        let f = &self.firewall;
        if f.limiter.enabled() && !f.limiter.allow(src, Instant::now()) {
            self.metrics.record(tcp, Outcome::RateLimited, Instant::now());
            return f.limit_action != RateLimitAction::Drop;
        }
        self.metrics.formerr(tcp);
        true
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(&self, request: &Request, response: R) -> ResponseInfo {
        let started = Instant::now();
        let (outcome, info) = self.firewall.respond(request, response).await;
        self.metrics.record(request.protocol() == Protocol::Tcp, outcome, started);
        info
    }
}
