//! Name -> vetted socket addresses -> a connected upstream socket.
//!
//! The gateway resolves every name itself (static `resolver.hosts`, then /etc/hosts,
//! then the configured or system nameservers), drops each address the egress filter
//! refuses, and connects only to what is left. A hostname never reaches `connect()`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig as HickoryConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::addr::{Host, Target};
use crate::config::ResolverConfig;
use crate::policy::DenyReason;
use crate::policy::net::{AddressDenied, EgressFilter};

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("every address is denied (first: {} in {})", .0.addr, .0.net)]
    AddressDenied(AddressDenied),
    #[error("{0} is one of the gateway's own listeners, which are never dialled")]
    OwnListener(SocketAddr),
    #[error("resolution failed: {0}")]
    ResolveFailed(String),
    #[error("connection failed: {0}")]
    Unreachable(io::Error),
    #[error("connection timed out")]
    Timeout,
}

impl DialError {
    /// What the client is told: the reason without what the gateway's resolver
    /// answered (the denied address itself, the resolver's own error), which would
    /// make the gateway an oracle on the network's private names and addresses. The
    /// whole error is logged at debug level.
    pub fn client_hint(&self) -> String {
        tracing::debug!(error = %self, "dial refused");
        match self {
            // A range of one address would name it: said without it.
            DialError::AddressDenied(d) if d.net.prefix_len() == d.net.max_prefix_len() => {
                "every address the name resolves to is denied (egress.deny)".into()
            }
            DialError::AddressDenied(d) => {
                format!("every address the name resolves to is in a denied range ({})", d.net)
            }
            DialError::OwnListener(_) => {
                "the target is one of the gateway's own listeners, which are never dialled".into()
            }
            DialError::ResolveFailed(why) if why.contains("timed out") => "resolution timed out".into(),
            DialError::ResolveFailed(_) => "the name does not resolve to an address".into(),
            // A TLS failure's text can name what the upstream's certificate covers.
            DialError::Unreachable(e) => match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(rustls::Error::InvalidCertificate(_)) => {
                    "the upstream's certificate is not trusted or not valid for this name".into()
                }
                Some(_) => "the TLS handshake with the upstream failed".into(),
                None => self.to_string(),
            },
            DialError::Timeout => self.to_string(),
        }
    }

    pub fn reason(&self) -> DenyReason {
        match self {
            DialError::AddressDenied(_) | DialError::OwnListener(_) => DenyReason::AddressDenied,
            DialError::ResolveFailed(_) => DenyReason::ResolveFailed,
            DialError::Unreachable(_) => DenyReason::UpstreamUnreachable,
            DialError::Timeout => DenyReason::UpstreamTimeout,
        }
    }
}

/// Sees every address the gateway is about to dial, instead of the dial: for the
/// request-head fuzz target, which must never open a connection.
#[cfg(feature = "fuzzing")]
pub type DialRecorder = std::sync::Arc<dyn Fn(&Target, SocketAddr) + Send + Sync>;

/// Where a peer name (`ID.sandboxes.internal`) leads: `None` for a name that is not a
/// peer's; else the peer's one address, or why it has none.
pub type PeerLookup = std::sync::Arc<dyn Fn(&str) -> Option<Result<IpAddr, String>> + Send + Sync>;

pub struct Resolver {
    hosts: HashMap<String, Vec<IpAddr>>,
    /// Set once at start-up (it reads the current policies): peer names resolve to
    /// the peer's claimed address, the one private address a peer rule may reach.
    peers: std::sync::OnceLock<PeerLookup>,
    /// The gateway's own listeners (set once they are bound): never dialled, so a
    /// sandbox allowed loopback cannot reach the admin listener through the gateway.
    own: std::sync::OnceLock<Vec<SocketAddr>>,
    #[cfg(feature = "fuzzing")]
    recorder: Option<DialRecorder>,
    dns: TokioResolver,
    filter: EgressFilter,
    connect_timeout: Duration,
    resolve_timeout: Duration,
    keepalive: Duration,
}

/// TCP keepalive after `idle`, so that idle tunnels survive load balancers (the AWS
/// NLB drops flows idle for 350 s) and dead peers are noticed.
pub fn set_keepalive(stream: &TcpStream, idle: Duration) {
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive_params(idle)) {
        tracing::debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// Keepalive probes after `idle` without traffic, then every 10 s.
pub fn keepalive_params(idle: Duration) -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new().with_time(idle).with_interval(Duration::from_secs(10))
}

impl Resolver {
    pub fn new(cfg: &ResolverConfig, filter: EgressFilter, connect_timeout: Duration) -> io::Result<Self> {
        Self::with_keepalive(cfg, filter, connect_timeout, Duration::from_secs(60))
    }

    pub fn with_keepalive(
        cfg: &ResolverConfig,
        filter: EgressFilter,
        connect_timeout: Duration,
        keepalive: Duration,
    ) -> io::Result<Self> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if cfg.nameservers.is_empty() {
            TokioResolver::builder(provider.clone()).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read system resolver configuration; only static hosts resolve");
                TokioResolver::builder_with_config(HickoryConfig::from_name_servers(Vec::new()), provider)
            })
        } else {
            let servers = cfg
                .nameservers
                .iter()
                .map(|sa| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = sa.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = sa.port();
                    NameServerConfig::new(sa.ip(), true, vec![udp, tcp])
                })
                .collect();
            TokioResolver::builder_with_config(HickoryConfig::from_name_servers(servers), provider)
        };
        let opts = builder.options_mut();
        // Two tries inside the overall `resolver.timeout` that `resolve` enforces.
        opts.timeout = cfg.timeout / 2;
        opts.attempts = 2;
        opts.use_hosts_file = if cfg.hosts_file { ResolveHosts::Always } else { ResolveHosts::Never };
        opts.ndots = 0;
        let dns = builder.build().map_err(io::Error::other)?;
        Ok(Resolver {
            hosts: cfg.hosts.clone(),
            peers: std::sync::OnceLock::new(),
            own: std::sync::OnceLock::new(),
            #[cfg(feature = "fuzzing")]
            recorder: None,
            dns,
            filter,
            connect_timeout,
            resolve_timeout: cfg.timeout,
            keepalive,
        })
    }

    /// From now on, dials are recorded and fail instead of connecting.
    #[cfg(feature = "fuzzing")]
    pub fn record_dials_instead(&mut self, recorder: DialRecorder) {
        self.recorder = Some(recorder);
    }

    /// Installs the peer lookup (once; later calls are ignored).
    pub fn set_peers(&self, lookup: PeerLookup) {
        let _ = self.peers.set(lookup);
    }

    /// The gateway's own listening addresses, which are never dialled.
    pub fn set_own_listeners(&self, addrs: Vec<SocketAddr>) {
        let _ = self.own.set(addrs);
    }

    pub fn filter(&self) -> &EgressFilter {
        &self.filter
    }

    /// All addresses for `host`, unvetted. IP literals resolve to themselves.
    pub async fn resolve(&self, host: &Host) -> Result<Ips, DialError> {
        let name = match host {
            Host::Ip(ip) => return Ok(smallvec::smallvec![*ip]),
            Host::Name(n) => n,
        };
        if let Some(ips) = self.hosts.get(name) {
            return Ok(ips.iter().copied().collect());
        }
        // Fully qualified, so search domains never apply.
        let fqdn = format!("{name}.");
        // Boxed: inline, the lookup's state (over a kilobyte) would sit in every dial's
        // future, and so in every connection's task, IP literals and hosts entries too.
        let lookup = Box::pin(tokio::time::timeout(self.resolve_timeout, self.dns.lookup_ip(fqdn.as_str())))
            .await
            .map_err(|_| DialError::ResolveFailed("resolution timed out".to_string()))?
            .map_err(|e| DialError::ResolveFailed(e.to_string()))?;
        let ips: Ips = lookup.iter().collect();
        if ips.is_empty() {
            return Err(DialError::ResolveFailed("no addresses".to_string()));
        }
        Ok(ips)
    }

    /// Whether `target` names one of the gateway's own listeners, without a lookup
    /// (a name looked up for a client not yet authenticated would carry its data to
    /// any name server): an address literal or a `resolver.hosts` entry at one of
    /// them, or one of `names` (`proxy.names`) on a port one listens on.
    pub fn is_own_target(&self, target: &Target, names: &[String]) -> bool {
        let Some(own) = self.own.get() else { return false };
        if !own.iter().any(|l| l.port() == target.port) {
            return false;
        }
        match &target.host {
            Host::Ip(ip) => is_own(own, SocketAddr::new(*ip, target.port)),
            Host::Name(name) => {
                names.iter().any(|n| n == name)
                    || self
                        .hosts
                        .get(name)
                        .is_some_and(|ips| ips.iter().any(|ip| is_own(own, SocketAddr::new(*ip, target.port))))
            }
        }
    }

    /// The addresses of `target` that the egress filter lets through, canonicalised.
    pub async fn vetted(&self, target: &Target) -> Result<Addrs, DialError> {
        // A peer name is never looked up in DNS, and its address is not vetted against
        // egress.deny: the front door authorized this very peer (both policies agree).
        // The gateway's own listeners stay out of reach: a peer given one of the
        // gateway's addresses would otherwise open its admin port to the sandbox.
        if let (Some(lookup), Host::Name(name)) = (self.peers.get(), &target.host)
            && let Some(peer) = lookup(name)
        {
            let addr = SocketAddr::new(peer.map_err(DialError::ResolveFailed)?, target.port);
            if self.own.get().is_some_and(|own| is_own(own, addr)) {
                return Err(DialError::OwnListener(addr));
            }
            return Ok(smallvec::smallvec![addr]);
        }
        let ips = self.resolve(&target.host).await?;
        let mut addrs = vet_all(&self.filter, &ips, target.port)?;
        if let Some(own) = self.own.get() {
            let first = addrs.first().copied();
            addrs.retain(|a| !is_own(own, *a));
            if let (true, Some(a)) = (addrs.is_empty(), first) {
                return Err(DialError::OwnListener(a));
            }
        }
        Ok(addrs)
    }

    /// Resolves (within `resolver.timeout`), vets, and connects to the first vetted
    /// address that answers, within `proxy.connect_timeout` for all attempts.
    pub async fn dial(&self, target: &Target) -> Result<(TcpStream, SocketAddr), DialError> {
        let dialled = self.dial_for_relay(target).await?;
        set_keepalive(&dialled.0, self.keepalive);
        Ok(dialled)
    }

    /// [`Resolver::dial`] without TCP keepalive, for [`crate::relay::relay_tcp`], which
    /// switches it on only for tunnels that stay open ([`Resolver::keepalive`]).
    pub async fn dial_for_relay(&self, target: &Target) -> Result<(TcpStream, SocketAddr), DialError> {
        let addrs = self.vetted(target).await?;
        let deadline = Instant::now() + self.connect_timeout;
        #[cfg(feature = "fuzzing")]
        if let Some(record) = &self.recorder {
            for addr in addrs {
                record(target, addr);
            }
            let recorded = io::Error::new(io::ErrorKind::ConnectionRefused, "dial recorded, not made");
            return Err(DialError::Unreachable(recorded));
        }
        let (stream, addr) = match addrs.as_slice() {
            [one] => match tokio::time::timeout_at(deadline, TcpStream::connect(*one)).await {
                Ok(Ok(stream)) => (stream, *one),
                Ok(Err(e)) => return Err(DialError::Unreachable(e)),
                Err(_) => return Err(DialError::Timeout),
            },
            _ => race(happy_eyeballs_order(addrs.into_vec()), deadline).await?,
        };
        let _ = stream.set_nodelay(true);
        Ok((stream, addr))
    }

    /// The keepalive idle time upstream sockets get (`proxy.tcp_keepalive`).
    pub fn keepalive(&self) -> Duration {
        self.keepalive
    }
}

/// A host's addresses: one or two (an IP literal, a peer, a dual-stack name) without
/// an allocation.
pub type Ips = smallvec::SmallVec<[IpAddr; 2]>;
/// Vetted addresses to dial, inline like [`Ips`].
pub type Addrs = smallvec::SmallVec<[SocketAddr; 2]>;

/// How long an attempt has before the next address is tried beside it (RFC 8305's
/// recommended Connection Attempt Delay).
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// RFC 8305 order: IPv6 first, then alternating families, each family in the
/// resolver's order.
pub fn happy_eyeballs_order(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let (v6, v4): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs.into_iter().partition(SocketAddr::is_ipv6);
    let mut out = Vec::with_capacity(v6.len() + v4.len());
    let (mut a, mut b) = (v6.into_iter(), v4.into_iter());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return out,
            (x, y) => out.extend(x.into_iter().chain(y)),
        }
    }
}

/// Connects to the first of `addrs` that answers: a new attempt starts every
/// [`ATTEMPT_DELAY`], or at once when the last one failed; the first success wins and
/// the others are dropped. So a dead or blackholed first address costs 250 ms, not the
/// whole connect timeout.
async fn race(addrs: Vec<SocketAddr>, deadline: Instant) -> Result<(TcpStream, SocketAddr), DialError> {
    let mut attempts = tokio::task::JoinSet::new();
    let mut next = addrs.into_iter();
    let mut last_err = None;
    let mut start_next = true;
    loop {
        if std::mem::take(&mut start_next) {
            match next.next() {
                Some(addr) => {
                    attempts.spawn(async move { (addr, TcpStream::connect(addr).await) });
                }
                None if attempts.is_empty() => break,
                None => {}
            }
        }
        let more = next.len() > 0;
        let stagger = tokio::time::sleep(ATTEMPT_DELAY);
        tokio::select! {
            done = attempts.join_next(), if !attempts.is_empty() => match done {
                Some(Ok((addr, Ok(stream)))) => return Ok((stream, addr)),
                Some(Ok((_, Err(e)))) => {
                    last_err = Some(e);
                    start_next = true;
                }
                Some(Err(e)) => {
                    last_err = Some(io::Error::other(e.to_string()));
                    start_next = true;
                }
                None => start_next = true,
            },
            _ = stagger, if more => start_next = true,
            _ = tokio::time::sleep_until(deadline) => return Err(DialError::Timeout),
        }
    }
    Err(DialError::Unreachable(last_err.unwrap_or_else(|| io::Error::other("no address"))))
}

/// Whether `addr` reaches one of the gateway's own listeners `own`: the same port at the
/// listener's address, or on loopback when it listens on loopback or every address, or
/// on any of this host's own addresses when it listens on every address.
pub fn is_own(own: &[SocketAddr], addr: SocketAddr) -> bool {
    is_own_with(own, addr, is_local_address)
}

/// [`is_own`], with `is_local` telling whether an address is one of this host's.
/// Asked only for a port some listener on every address has.
pub fn is_own_with(own: &[SocketAddr], addr: SocketAddr, is_local: impl Fn(IpAddr) -> bool) -> bool {
    own.iter().any(|l| {
        l.port() == addr.port()
            && (l.ip() == addr.ip()
                || (addr.ip().is_loopback() && (l.ip().is_loopback() || l.ip().is_unspecified()))
                || (l.ip().is_unspecified() && (addr.ip().is_unspecified() || is_local(addr.ip()))))
    })
}

/// Whether `ip` is an address of one of this host's interfaces, as they are now (an
/// interface list that cannot be read counts every address as local: refused).
fn is_local_address(ip: IpAddr) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return true };
    addrs.filter_map(|i| i.address).any(|a| {
        a.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())) == Some(ip)
            || a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())) == Some(ip)
    })
}

/// Vets every address; an empty result names the first refused one.
pub fn vet_all(filter: &EgressFilter, ips: &[IpAddr], port: u16) -> Result<Addrs, DialError> {
    let mut first_denied = None;
    let mut ok = Addrs::with_capacity(ips.len());
    for ip in ips {
        match filter.vet(*ip) {
            Ok(ip) => ok.push(SocketAddr::new(ip, port)),
            Err(d) => {
                first_denied.get_or_insert(d);
            }
        }
    }
    match (ok.is_empty(), first_denied) {
        (true, Some(d)) => Err(DialError::AddressDenied(d)),
        (true, None) => Err(DialError::ResolveFailed("no addresses".to_string())),
        (false, _) => Ok(ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_own_listeners_are_never_dialled() {
        let own: Vec<SocketAddr> = vec![
            "127.0.0.1:9090".parse().unwrap_or_else(|e| panic!("{e}")),
            "0.0.0.0:4002".parse().unwrap_or_else(|e| panic!("{e}")),
        ];
        let a = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}"));
        assert!(is_own(&own, a("127.0.0.1:9090")));
        assert!(is_own(&own, a("127.0.0.2:9090")), "refused on any loopback address, to be safe");
        assert!(is_own(&own, a("127.0.0.1:4002")));
        assert!(is_own(&own, a("[::1]:4002")));
        assert!(!is_own(&own, a("127.0.0.1:8080")));
        assert!(!is_own(&own, a("192.0.2.1:9090")));
        // A listener on every address is reached through each of the host's own.
        let host_ip = |ip: IpAddr| ip == a("192.0.2.7:0").ip();
        assert!(is_own_with(&own, a("192.0.2.7:4002"), host_ip));
        assert!(!is_own_with(&own, a("192.0.2.8:4002"), host_ip));
        assert!(!is_own_with(&own, a("192.0.2.7:9090"), host_ip), "9090 listens on loopback only");
    }

    #[test]
    fn happy_eyeballs_order_starts_with_ipv6_and_alternates() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}"));
        let order = happy_eyeballs_order(vec![a("192.0.2.1:443"), a("192.0.2.2:443"), a("[2001:db8::1]:443")]);
        assert_eq!(order, vec![a("[2001:db8::1]:443"), a("192.0.2.1:443"), a("192.0.2.2:443")]);
    }

    /// A first address that never answers costs one attempt delay, not the timeout.
    /// (On loopback: a listener whose accept queue is full drops new SYNs.)
    #[tokio::test]
    async fn a_blackholed_first_address_costs_one_attempt_delay() {
        let black = std::net::TcpListener::bind("127.0.0.3:0").unwrap_or_else(|e| panic!("{e}"));
        let sock = socket2::SockRef::from(&black);
        sock.listen(0).unwrap_or_else(|e| panic!("{e}"));
        let port = black.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
        // Fill the accept queue; later SYNs are dropped, so connects hang.
        let mut fillers = Vec::new();
        for _ in 0..4 {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .unwrap_or_else(|e| panic!("{e}"));
            s.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
            let _ = s.connect(&SocketAddr::from(([127, 0, 0, 3], port)).into());
            fillers.push(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let good = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap_or_else(|e| panic!("{e}"));
        let addrs = vec![SocketAddr::from(([127, 0, 0, 3], port)), good.local_addr().unwrap_or_else(|e| panic!("{e}"))];
        let deadline = Instant::now() + Duration::from_secs(5);
        let (_stream, addr) = race(addrs, deadline).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(addr.ip(), std::net::IpAddr::from([127, 0, 0, 1]), "the second address won");
        // A refused first address moves on at once too.
        drop(black);
        let addrs = vec![SocketAddr::from(([127, 0, 0, 3], port)), good.local_addr().unwrap_or_else(|e| panic!("{e}"))];
        let (_stream, addr) =
            race(addrs, Instant::now() + Duration::from_secs(5)).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(addr.port(), port);
    }

    #[test]
    fn vet_all_keeps_only_public_addresses() {
        let f = EgressFilter::builtin();
        let ips: Vec<IpAddr> =
            ["10.0.0.1", "93.184.215.14", "::ffff:169.254.169.254"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(vet_all(&f, &ips, 443).unwrap().as_slice(), ["93.184.215.14:443".parse().unwrap()]);
        let e = vet_all(&f, &ips[..1], 443).unwrap_err();
        assert_eq!(e.reason(), DenyReason::AddressDenied);
        assert!(e.to_string().contains("10.0.0.1 in 10.0.0.0/8"), "{e}");
        // The client learns the range, not what the resolver answered.
        let hint = e.client_hint();
        assert!(hint.contains("10.0.0.0/8") && !hint.contains("10.0.0.1"), "{hint}");
        let one = EgressFilter::new(vec!["203.0.113.7/32".parse().unwrap()], vec![]);
        let hint = vet_all(&one, &["203.0.113.7".parse().unwrap()], 443).unwrap_err().client_hint();
        assert!(!hint.contains("203.0.113.7"), "{hint}");
        let failed = DialError::ResolveFailed("no records found for Query { name: Name(\"db.corp.\") }".into());
        assert_eq!(failed.client_hint(), "the name does not resolve to an address");
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        let unreachable = DialError::Unreachable(io::Error::new(io::ErrorKind::InvalidData, tls));
        assert_eq!(unreachable.client_hint(), "the upstream's certificate is not trusted or not valid for this name");
    }
}
