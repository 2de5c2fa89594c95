//! TLS on the embedded proxy's listener (`QUEEN_TLS_CERT`, `QUEEN_TLS_KEY`: PEM files of the
//! certificate chain and its private key), with rustls and aws-lc-rs. Setting one without the
//! other, or files that do not hold a usable chain and key, stops the boot with one line.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

use crate::proxy::ProxyConfigError;

/// The listener's TLS: an acceptor built once at boot.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

fn bad(variable: &'static str, problem: impl Into<String>) -> ProxyConfigError {
    ProxyConfigError {
        variable,
        problem: problem.into(),
    }
}

impl Tls {
    /// TLS from `QUEEN_TLS_CERT` and `QUEEN_TLS_KEY`; `None` when neither is set.
    ///
    /// # Errors
    /// One set without the other, a file that cannot be read, no certificate, no key, or a key
    /// that does not match.
    pub fn from_env(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ProxyConfigError> {
        let set = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let (cert, key) = match (set("QUEEN_TLS_CERT"), set("QUEEN_TLS_KEY")) {
            (None, None) => return Ok(None),
            (Some(c), Some(k)) => (c, k),
            (Some(_), None) => {
                return Err(bad(
                    "QUEEN_TLS_KEY",
                    "is required when QUEEN_TLS_CERT is set",
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "QUEEN_TLS_CERT",
                    "is required when QUEEN_TLS_KEY is set",
                ));
            }
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
            .map_err(|e| bad("QUEEN_TLS_CERT", format!("cannot be read as PEM ({e})")))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad("QUEEN_TLS_CERT", format!("holds a bad certificate ({e})")))?;
        if chain.is_empty() {
            return Err(bad("QUEEN_TLS_CERT", "holds no certificate"));
        }
        // The key's file name only: never its bytes.
        let private = PrivateKeyDer::from_pem_file(&key).map_err(|e| {
            bad(
                "QUEEN_TLS_KEY",
                format!("holds no usable private key ({e})"),
            )
        })?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("QUEEN_TLS_CERT", format!("cannot be used ({e})")))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| {
                bad(
                    "QUEEN_TLS_KEY",
                    format!("does not go with the certificate ({e})"),
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        }))
    }

    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}
