//! The inspection CA: loads the configured CA certificate and key, and mints a leaf
//! certificate per inspected name (ECDSA P-256, one leaf key for every name, valid for
//! `intercept.leaf_ttl`), cached with its server configuration until half its life is
//! spent. Server configurations share one session cache and one ticketer, so a client
//! resumes its TLS session on its next connection.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ProducesTickets, StoresServerSessions};

use crate::addr::Host;

/// Most names whose leaf is kept at once; past it, expired leaves go, then all.
const MAX_CACHED: usize = 10_000;

/// A new CA pair as PEM: `(certificate, private key)`. The key is PKCS#8 ECDSA P-256.
pub fn generate_ca(common_name: &str, lifetime: Duration) -> Result<(String, String), String> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "egress-gateway");
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::seconds(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX / 2));
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The loaded CA and the leaves minted with it.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    leaf_key: KeyPair,
    ttl: Duration,
    sessions: Arc<dyn StoresServerSessions>,
    tickets: Arc<dyn ProducesTickets>,
    cache: Mutex<HashMap<String, (Arc<rustls::ServerConfig>, Instant)>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl Authority {
    /// Loads the CA certificate and key (PEM); the error names the file and what was
    /// expected of it.
    pub fn load(cert_file: &Path, key_file: &Path, ttl: Duration) -> Result<Authority, String> {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: cannot read: {e}", p.display()));
        let cert_pem = read(cert_file)?;
        let key_pem = read(key_file)?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| format!("{}: expected a PEM private key (PKCS#8): {e}", key_file.display()))?;
        let ca_der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("{}: expected a PEM certificate: {e}", cert_file.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|e| format!("{}: expected a CA certificate: {e}", cert_file.display()))?;
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
        let tickets = rustls::crypto::ring::Ticketer::new().map_err(|e| e.to_string())?;
        let authority = Authority {
            issuer,
            ca_der,
            leaf_key,
            ttl,
            sessions: rustls::server::ServerSessionMemoryCache::new(4096),
            tickets,
            cache: Mutex::new(HashMap::new()),
        };
        // A CA certificate that does not match its key fails here, not on a sandbox's
        // first inspected connection.
        authority.check_pair()?;
        Ok(authority)
    }

    fn check_pair(&self) -> Result<(), String> {
        let leaf = self.mint(&Host::Name("check.invalid".into()))?;
        let (_, ca) = x509_parser::parse_x509_certificate(&self.ca_der).map_err(|e| e.to_string())?;
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf).map_err(|e| e.to_string())?;
        leaf.verify_signature(Some(ca.public_key()))
            .map_err(|_| "the CA certificate and key are not a pair (a leaf it signs does not verify)".to_string())
    }

    /// The CA certificate (DER).
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    fn mint(&self, host: &Host) -> Result<CertificateDer<'static>, String> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        let (san, cn) = match host {
            Host::Name(n) => {
                (SanType::DnsName(n.clone().try_into().map_err(|e: rcgen::Error| e.to_string())?), n.clone())
            }
            Host::Ip(ip) => (SanType::IpAddress(*ip), ip.to_string()),
        };
        params.subject_alt_names = vec![san];
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::seconds(i64::try_from(self.ttl.as_secs()).unwrap_or(86_400));
        let cert = params.signed_by(&self.leaf_key, &self.issuer).map_err(|e| e.to_string())?;
        Ok(cert.der().clone())
    }

    /// The server configuration presenting a leaf for `host` (minted on first use,
    /// then cached), offering HTTP/2 and HTTP/1.1.
    pub fn server_config(&self, host: &Host) -> Result<Arc<rustls::ServerConfig>, String> {
        let name = host.to_string();
        let now = Instant::now();
        if let Ok(cache) = self.cache.lock()
            && let Some((cfg, until)) = cache.get(&name)
            && *until > now
        {
            return Ok(cfg.clone());
        }
        let leaf = self.mint(host)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![leaf, self.ca_der.clone()], key)
            .map_err(|e| e.to_string())?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        cfg.session_storage = self.sessions.clone();
        cfg.ticketer = self.tickets.clone();
        let cfg = Arc::new(cfg);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= MAX_CACHED {
                cache.retain(|_, (_, until)| *until > now);
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
            }
            cache.insert(name, (cfg.clone(), now + self.ttl / 2));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mints_verifiable_leaves_and_caches_them() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = generate_ca("test CA", Duration::from_secs(3600)).unwrap();
        std::fs::write(dir.path().join("ca.pem"), &cert).unwrap();
        std::fs::write(dir.path().join("ca.key"), &key).unwrap();
        let a =
            Authority::load(&dir.path().join("ca.pem"), &dir.path().join("ca.key"), Duration::from_secs(3600)).unwrap();
        let h = Host::Name("api.example.com".into());
        let one = a.server_config(&h).unwrap();
        let two = a.server_config(&h).unwrap();
        assert!(Arc::ptr_eq(&one, &two), "the second connection reuses the cached leaf");
        assert!(a.server_config(&Host::Ip("127.0.0.1".parse().unwrap())).is_ok());

        // Another CA's key with this certificate is refused at load.
        let (_, other_key) = generate_ca("other", Duration::from_secs(3600)).unwrap();
        std::fs::write(dir.path().join("other.key"), other_key).unwrap();
        let err = Authority::load(&dir.path().join("ca.pem"), &dir.path().join("other.key"), Duration::from_secs(60))
            .unwrap_err();
        assert!(err.contains("not a pair"), "{err}");
        let err = Authority::load(&dir.path().join("nope.pem"), &dir.path().join("ca.key"), Duration::from_secs(60))
            .unwrap_err();
        assert!(err.contains("nope.pem"), "{err}");
    }
}
