//! Certificates for TLS tests, made in the test: a CA, a server certificate for
//! `localhost`/`127.0.0.1`, a client certificate signed by the CA, and a client
//! certificate signed by an unrelated CA (which mTLS must refuse). Written as PEM files
//! (keys mode 0600) into a temp dir that lives as long as the [`TestPki`].

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate and its key as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

/// A test PKI on disk.
pub struct TestPki {
    dir: tempfile::TempDir,
    /// The CA certificate (PEM) that signed `server` and `client`.
    pub ca: PathBuf,
    /// Server certificate for `localhost` and `127.0.0.1`.
    pub server: CertFiles,
    /// Client certificate signed by the CA.
    pub client: CertFiles,
    /// Client certificate signed by another CA: not trusted by the server.
    pub stranger: CertFiles,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let pem = params.self_signed(&key).expect("self-sign CA").pem();
    (params, key, pem)
}

fn leaf(
    issuer: &Issuer<'_, &KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let mut params =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("leaf params");
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("client"),
    );
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).expect("sign leaf");
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str, private: bool) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write PEM");
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    #[cfg(not(unix))]
    let _ = private;
    p
}

impl TestPki {
    /// Makes the certificates.
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let (ca_params, ca_key, ca_pem) = ca("streamgate test CA");
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let (server_cert, server_key) = leaf(
            &issuer,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(&issuer, &["producer"], ExtendedKeyUsagePurpose::ClientAuth);
        let (other_params, other_key, _) = ca("some other CA");
        let other = Issuer::from_params(&other_params, &other_key);
        let (stranger_cert, stranger_key) =
            leaf(&other, &["stranger"], ExtendedKeyUsagePurpose::ClientAuth);
        TestPki {
            ca: write(d, "ca.pem", &ca_pem, false),
            server: CertFiles {
                cert: write(d, "server.pem", &server_cert, false),
                key: write(d, "server.key", &server_key, true),
            },
            client: CertFiles {
                cert: write(d, "client.pem", &client_cert, false),
                key: write(d, "client.key", &client_key, true),
            },
            stranger: CertFiles {
                cert: write(d, "stranger.pem", &stranger_cert, false),
                key: write(d, "stranger.key", &stranger_key, true),
            },
            dir,
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for TestPki {
    fn default() -> Self {
        TestPki::new()
    }
}
