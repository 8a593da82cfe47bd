//! A throwaway certificate authority for HTTPS tests: made at run time, so
//! no key is ever checked in.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A CA and a server certificate it signed for `localhost`, `127.0.0.1`
/// and `::1`.
pub struct TestCa {
    /// The CA certificate, PEM: what a kubeconfig's
    /// `certificate-authority(-data)` holds.
    pub ca_pem: String,
    server_cert: CertificateDer<'static>,
    server_key: PrivatePkcs8KeyDer<'static>,
}

impl TestCa {
    pub fn generate() -> TestCa {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "k8s-standin test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");

        let key = KeyPair::generate().expect("server key");
        let sans = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        let mut server = CertificateParams::new(sans).expect("server params");
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = server
            .signed_by(&key, &ca_cert, &ca_key)
            .expect("server certificate");
        TestCa {
            ca_pem: ca_cert.pem(),
            server_cert: cert.der().clone(),
            server_key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }

    /// A TLS acceptor serving the server certificate.
    pub fn acceptor(&self) -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![self.server_cert.clone()],
                PrivateKeyDer::Pkcs8(self.server_key.clone_key()),
            )
            .expect("server certificate and key");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}
