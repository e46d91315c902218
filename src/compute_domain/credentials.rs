//! The IMEX credentials of one ComputeDomain: a certificate authority of its own and one
//! certificate its daemons present to each other, both ways (IMEX's `SSL_TLS` mode, mutual TLS).
//! A daemon accepts only peers holding its domain's certificate, so a process that reaches a
//! node's IMEX port without it (another pod, another domain's daemon) is refused in the handshake.
//!
//! The controller makes them once per domain and keeps them in a Secret in its own namespace
//! (the CA's key is dropped once the certificate is signed: nothing more is ever issued); node
//! plugins read that Secret when they start the domain's daemon. It is deleted with the domain.
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The name every daemon's certificate holds, and that peers check it for
/// (`IMEX_SECURITY_TARGET_OVERRIDE`): peers are reached by address, which no certificate names.
pub const TARGET_NAME: &str = "compute-domain-daemon";
/// Label on the Secret: the domain's UID.
pub const SECRET_LABEL: &str = "gpu-dra/imex-credentials";
const CA: &str = "ca.crt";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("ComputeDomain {domain}: cannot make its IMEX certificates: {reason}")]
    Generate { domain: String, reason: String },
    #[error("Secret {secret}: field data.{field}: {reason}")]
    Field {
        secret: String,
        field: &'static str,
        reason: String,
    },
}

/// PEM text of the domain's CA certificate, its daemons' certificate and that certificate's key.
#[derive(Clone, PartialEq, Eq)]
pub struct DomainCredentials {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for DomainCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainCredentials").finish_non_exhaustive()
    }
}

/// The Secret holding the credentials of the domain with this UID.
pub fn secret_name(domain_uid: &str) -> String {
    format!("gpu-dra-imex-{domain_uid}")
}

impl DomainCredentials {
    /// New credentials for the domain with this UID.
    pub fn generate(domain_uid: &str) -> Result<Self, CredentialsError> {
        let fail = |e: rcgen::Error| CredentialsError::Generate {
            domain: domain_uid.to_string(),
            reason: e.to_string(),
        };
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("gpu-dra IMEX CA of ComputeDomain {domain_uid}"),
        );
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(
            ca_params,
            rcgen::KeyPair::generate().map_err(fail)?,
        )
        .map_err(fail)?;
        let mut params =
            rcgen::CertificateParams::new(vec![TARGET_NAME.to_string()]).map_err(fail)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, TARGET_NAME);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().map_err(fail)?;
        let cert = params.signed_by(&key, &ca).map_err(fail)?;
        Ok(Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The Secret the controller keeps them in.
    pub fn to_secret(&self, namespace: &str, domain_uid: &str) -> Secret {
        let data = [
            (CA, &self.ca_pem),
            (CERT, &self.cert_pem),
            (KEY, &self.key_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect::<BTreeMap<_, _>>();
        Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(domain_uid)),
                namespace: Some(namespace.to_string()),
                labels: Some(BTreeMap::from([(
                    SECRET_LABEL.to_string(),
                    domain_uid.to_string(),
                )])),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(data),
            ..Default::default()
        }
    }

    /// Reads them back; a missing or non-PEM field is refused, naming it.
    pub fn from_secret(secret: &Secret) -> Result<Self, CredentialsError> {
        let name = format!(
            "{}/{}",
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            secret.metadata.name.as_deref().unwrap_or_default()
        );
        let field = |field: &'static str, marker: &str| {
            let err = |reason: &str| CredentialsError::Field {
                secret: name.clone(),
                field,
                reason: reason.to_string(),
            };
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(field))
                .ok_or_else(|| err("missing"))?;
            let text = String::from_utf8(bytes.0.clone()).map_err(|_| err("not UTF-8"))?;
            if !text.contains(&format!("-----BEGIN {marker}")) {
                return Err(err(&format!("not a PEM {marker}")));
            }
            Ok(text)
        };
        Ok(Self {
            ca_pem: field(CA, "CERTIFICATE")?,
            cert_pem: field(CERT, "CERTIFICATE")?,
            key_pem: field(KEY, "PRIVATE KEY")?,
        })
    }

    /// The files a daemon reads them from, by name.
    pub fn files(&self) -> [(&'static str, &str); 3] {
        [
            (CA, &self.ca_pem),
            (CERT, &self.cert_pem),
            (KEY, &self.key_pem),
        ]
    }

    /// The lines of NVIDIA's IMEX config that turn mutual TLS on with these files, as the daemon
    /// sees them in `dir`.
    pub fn config_lines(dir: &str) -> String {
        format!(
            "IMEX_ENABLE_AUTH_ENCRYPTION=1\n\
             IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\n\
             IMEX_AUTH_SOURCE=FILE\n\
             IMEX_SERVER_KEY={dir}/{KEY}\n\
             IMEX_SERVER_CERT={dir}/{CERT}\n\
             IMEX_SERVER_CERT_AUTH={dir}/{CA}\n\
             IMEX_CLIENT_KEY={dir}/{KEY}\n\
             IMEX_CLIENT_CERT={dir}/{CERT}\n\
             IMEX_CLIENT_CERT_AUTH={dir}/{CA}\n\
             IMEX_SECURITY_TARGET_OVERRIDE={TARGET_NAME}\n"
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    use super::*;

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn roots(credentials: &DomainCredentials) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(credentials.ca_pem.as_bytes()).expect("ca"))
            .expect("root");
        Arc::new(roots)
    }

    fn identity(
        credentials: &DomainCredentials,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            vec![CertificateDer::from_pem_slice(credentials.cert_pem.as_bytes()).expect("cert")],
            PrivateKeyDer::from_pem_slice(credentials.key_pem.as_bytes()).expect("key"),
        )
    }

    /// One mutual-TLS handshake in memory, as two daemons of `server`'s and `client`'s domains
    /// would make it.
    fn handshake(
        server: &DomainCredentials,
        client: &DomainCredentials,
    ) -> Result<(), rustls::Error> {
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(server), provider())
                .build()
                .expect("verifier");
        let (chain, key) = identity(server);
        let server_config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config");
        let (chain, key) = identity(client);
        let client_config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots(client))
            .with_client_auth_cert(chain, key)
            .expect("client config");
        let mut server = rustls::ServerConnection::new(Arc::new(server_config)).expect("server");
        let mut client = rustls::ClientConnection::new(
            Arc::new(client_config),
            ServerName::try_from(TARGET_NAME).expect("name"),
        )
        .expect("client");
        for _ in 0..10 {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).expect("client writes");
            server.read_tls(&mut wire.as_slice()).expect("server reads");
            server.process_new_packets()?;
            let mut wire = Vec::new();
            server.write_tls(&mut wire).expect("server writes");
            client.read_tls(&mut wire.as_slice()).expect("client reads");
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake did not finish");
    }

    #[test]
    fn daemons_of_one_domain_trust_each_other_and_no_other_domains() {
        let one = DomainCredentials::generate("uid-1").expect("one");
        let other = DomainCredentials::generate("uid-2").expect("other");
        handshake(&one, &one).expect("one domain's daemons connect");
        let refused = handshake(&one, &other).expect_err("another domain's daemon");
        assert!(
            matches!(refused, rustls::Error::InvalidCertificate(_)),
            "{refused:?}"
        );
        let refused = handshake(&other, &one).expect_err("into another domain");
        assert!(
            matches!(refused, rustls::Error::InvalidCertificate(_)),
            "{refused:?}"
        );
    }

    #[test]
    fn a_secret_round_trips_and_a_bad_field_is_named() {
        let credentials = DomainCredentials::generate("uid-1").expect("generate");
        let mut secret = credentials.to_secret("gpu-dra", "uid-1");
        assert_eq!(secret.metadata.name.as_deref(), Some("gpu-dra-imex-uid-1"));
        assert_eq!(
            DomainCredentials::from_secret(&secret).expect("read"),
            credentials
        );
        if let Some(data) = secret.data.as_mut() {
            data.insert(KEY.into(), ByteString(b"not a key".to_vec()));
        }
        let error = DomainCredentials::from_secret(&secret).expect_err("bad key");
        assert_eq!(
            error.to_string(),
            "Secret gpu-dra/gpu-dra-imex-uid-1: field data.tls.key: not a PEM PRIVATE KEY"
        );
        if let Some(data) = secret.data.as_mut() {
            data.remove(CA);
        }
        let error = DomainCredentials::from_secret(&secret).expect_err("no CA");
        assert!(
            error.to_string().contains("data.ca.crt: missing"),
            "{error}"
        );
        // Never printed.
        assert!(!format!("{credentials:?}").contains("PRIVATE"));
    }
}
