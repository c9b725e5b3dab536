//! The optional TLS listener on the proxy port (an HTTPS proxy: the sandbox's token is
//! never in clear text between sandbox and gateway). The certificate and key reload
//! with the policies; a failed load keeps the previous ones.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{ConfigError, DisplayPath};

pub struct TlsState {
    cert_file: PathBuf,
    key_file: PathBuf,
    client_ca: Option<PathBuf>,
    config_file: DisplayPath,
    current: ArcSwap<rustls::ServerConfig>,
}

impl TlsState {
    pub fn load(
        cert_file: &Path,
        key_file: &Path,
        client_ca: Option<&Path>,
        config_file: &DisplayPath,
    ) -> Result<TlsState, ConfigError> {
        let current = ArcSwap::from_pointee(server_config(cert_file, key_file, client_ca, config_file)?);
        Ok(TlsState {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            client_ca: client_ca.map(Path::to_path_buf),
            config_file: config_file.clone(),
            current,
        })
    }

    /// Re-reads the certificate and key; on error the current ones stay.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let cfg = server_config(&self.cert_file, &self.key_file, self.client_ca.as_deref(), &self.config_file)?;
        self.current.store(Arc::new(cfg));
        Ok(())
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }
}

fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
    file: &DisplayPath,
) -> Result<rustls::ServerConfig, ConfigError> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(cert_file).and_then(|it| it.collect::<Result<Vec<_>, _>>()).map_err(|e| {
            ConfigError::invalid(
                file,
                "proxy.tls_cert_file",
                format!("{}: expected PEM certificates: {e}", cert_file.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(ConfigError::invalid(
            file,
            "proxy.tls_cert_file",
            format!("{}: no certificate", cert_file.display()),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
        ConfigError::invalid(
            file,
            "proxy.tls_key_file",
            format!("{}: expected a PEM private key: {e}", key_file.display()),
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::invalid(file, "proxy.tls_cert_file", e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| ConfigError::invalid(file, "proxy.tls_client_ca", format!("{}: {e}", ca.display())))?;
            for c in cas {
                roots
                    .add(c)
                    .map_err(|e| ConfigError::invalid(file, "proxy.tls_client_ca", format!("{}: {e}", ca.display())))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ConfigError::invalid(file, "proxy.tls_client_ca", e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder.with_single_cert(certs, key).map_err(|e| {
        ConfigError::invalid(file, "proxy.tls_key_file", format!("certificate and key do not match: {e}"))
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The subject common name of the client's certificate, if it presented one.
pub fn peer_cn<IO>(stream: &tokio_rustls::server::TlsStream<IO>) -> Option<String> {
    let cert = stream.get_ref().1.peer_certificates()?.first()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}
