//! [`TlsFiles`]: where the certificates of a private server's TLS are, and what they are.

use std::path::PathBuf;

/// The certificates of a private server's TLS ([`PgServer::enable_tls`](crate::PgServer::enable_tls)),
/// all PEM files in the `tls/` directory next to the server's data dir, valid for 5 days from
/// their making, with EC P-256 keys:
///
/// - the test CA, `CN=pg-elector test CA`, self-signed ([`root_cert`](Self::root_cert));
/// - the server's certificate, signed by the CA: `CN=localhost`, subject alternative name
///   `DNS:localhost` only, no IP address (so a client that verifies the name refuses
///   `127.0.0.1`, and one that checks only the chain accepts it), extended key usage
///   `serverAuth`;
/// - a client certificate signed by the CA, `CN=tls_client` (the user a `cert` line of
///   `pg_hba.conf` maps it to), extended key usage `clientAuth`, and its key
///   ([`client_cert`](Self::client_cert), [`client_key`](Self::client_key));
/// - a stranger CA, `CN=pg-elector stranger CA`, self-signed, that signed nothing here
///   ([`stranger_root_cert`](Self::stranger_root_cert)): a client that trusts only it must
///   refuse the server.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    dir: PathBuf,
}

impl TlsFiles {
    pub(super) fn in_dir(dir: PathBuf) -> Self {
        TlsFiles { dir }
    }

    /// The test CA's certificate (`ca.crt`): the root a client trusts to accept the server.
    pub fn root_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Another self-signed CA's certificate (`stranger.crt`), which signed neither the
    /// server's nor the client's certificate.
    pub fn stranger_root_cert(&self) -> PathBuf {
        self.dir.join("stranger.crt")
    }

    /// The client certificate (`client.crt`), `CN=tls_client`, signed by the test CA.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// The client certificate's private key (`client.key`, PKCS#8 PEM, mode 0600).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }
}
