//! `egress-gateway ca init|bundle|env`: the TLS inspection CA, the trust bundle a
//! sandbox installs, and the variables its clients read.

use std::io::Write;
use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Writes a new CA pair; refuses to overwrite unless `force`.
pub fn init(
    cert: &Path,
    key: &Path,
    name: &str,
    lifetime: std::time::Duration,
    force: bool,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    for p in [cert, key] {
        anyhow::ensure!(force || !p.exists(), "{} exists; pass --force to overwrite it", p.display());
    }
    let (cert_pem, key_pem) = crate::intercept::ca::generate_ca(name, lifetime).map_err(anyhow::Error::msg)?;
    write_private(key, key_pem.as_bytes())?;
    std::fs::write(cert, cert_pem).map_err(|e| anyhow::anyhow!("{}: {e}", cert.display()))?;
    writeln!(out, "wrote {} and {} (mode 0600)", cert.display(), key.display())?;
    writeln!(
        out,
        "[intercept]\nca_cert_file = {:?}\nca_key_file = {:?}",
        cert.display().to_string(),
        key.display().to_string()
    )?;
    Ok(0)
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

/// The system's roots plus the CA at `ca` (or the config's), as PEM.
pub fn bundle(
    ca: Option<&PathBuf>,
    config: Option<&PathBuf>,
    dest: Option<&PathBuf>,
    out: &mut dyn Write,
) -> anyhow::Result<u8> {
    let ca = match ca {
        Some(p) => p.clone(),
        None => {
            let cfg = super::load_config(config)?;
            let Some(i) = cfg.intercept else {
                anyhow::bail!("{}: no [intercept] section; pass --ca CA.pem", cfg.file);
            };
            i.ca_cert_file
        }
    };
    let ca_pem = std::fs::read(&ca).map_err(|e| anyhow::anyhow!("{}: {e}", ca.display()))?;
    CertificateDer::from_pem_slice(&ca_pem)
        .map_err(|e| anyhow::anyhow!("{}: expected a PEM certificate: {e}", ca.display()))?;
    let mut text = String::new();
    for cert in rustls_native_certs::load_native_certs().certs {
        text.push_str(&pem("CERTIFICATE", cert.as_ref()));
    }
    text.push_str(&String::from_utf8_lossy(&ca_pem));
    match dest {
        Some(p) => {
            std::fs::write(p, text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            writeln!(out, "wrote {}", p.display())?;
        }
        None => out.write_all(text.as_bytes())?,
    }
    Ok(0)
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(&String::from_utf8_lossy(chunk));
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

/// `export` lines for the clients that read a CA bundle from the environment.
pub fn env(bundle: &Path, out: &mut dyn Write) -> anyhow::Result<u8> {
    let b = bundle.display().to_string();
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CARGO_HTTP_CAINFO",
        "AWS_CA_BUNDLE",
        "DENO_CERT",
    ] {
        writeln!(out, "export {var}={}", shell_quote(&b))?;
    }
    writeln!(out, "# Java reads a trust store, not PEM: import the CA once, then point the JVM at it:")?;
    writeln!(
        out,
        "#   keytool -importcert -noprompt -alias egress-gateway -file CA.pem -keystore /etc/egress-gateway/truststore.p12 -storetype PKCS12 -storepass changeit"
    )?;
    writeln!(
        out,
        "export JAVA_TOOL_OPTIONS={}",
        shell_quote(
            "-Djavax.net.ssl.trustStore=/etc/egress-gateway/truststore.p12 -Djavax.net.ssl.trustStorePassword=changeit -Djavax.net.ssl.trustStoreType=PKCS12"
        )
    )?;
    Ok(0)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
