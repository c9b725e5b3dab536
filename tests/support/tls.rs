//! A test CA and a server certificate for the TLS origin.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct TestCa {
    pub ca_pem_path: PathBuf,
    /// The server certificate and key as PEM files (for the gateway's own TLS).
    pub cert_pem_path: PathBuf,
    pub key_pem_path: PathBuf,
    /// A client certificate (CN `client`, by default "sbx-a") signed by the same CA.
    pub client_cert_path: PathBuf,
    pub client_key_path: PathBuf,
    pub server_config: Arc<rustls::ServerConfig>,
    _dir: tempfile::TempDir,
}

impl TestCa {
    /// A CA and a server certificate for `names`; the CA PEM is written to a file for
    /// curl's `--cacert`.
    pub fn new(names: &[&str]) -> TestCa {
        Self::with_client(names, "sbx-a")
    }

    pub fn with_client(names: &[&str], client: &str) -> TestCa {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "egress-gateway test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key")).expect("ca");
        let key = KeyPair::generate().expect("key");
        let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        let cert = params.signed_by(&key, &ca).expect("sign");

        let dir = tempfile::tempdir().expect("tempdir");
        let ca_pem_path = dir.path().join("ca.pem");
        std::fs::write(&ca_pem_path, ca.pem()).expect("write ca");
        let client_key = KeyPair::generate().expect("client key");
        let mut client_params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        client_params.distinguished_name.push(rcgen::DnType::CommonName, client);
        client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client_params.signed_by(&client_key, &ca).expect("sign client");
        let client_cert_path = dir.path().join("client.pem");
        let client_key_path = dir.path().join("client.key");
        std::fs::write(&client_cert_path, client_cert.pem()).expect("write client cert");
        std::fs::write(&client_key_path, client_key.serialize_pem()).expect("write client key");
        let cert_pem_path = dir.path().join("cert.pem");
        let key_pem_path = dir.path().join("key.pem");
        std::fs::write(&cert_pem_path, cert.pem()).expect("write cert");
        std::fs::write(&key_pem_path, key.serialize_pem()).expect("write key");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("server config");
        TestCa {
            ca_pem_path,
            cert_pem_path,
            key_pem_path,
            client_cert_path,
            client_key_path,
            server_config: Arc::new(server_config),
            _dir: dir,
        }
    }
}
