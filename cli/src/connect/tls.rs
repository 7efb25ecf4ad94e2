//! What libpq's TLS settings mean, and the rustls configuration that does it: which
//! certificates to trust (a file, the system's, or none), what to check of the server's
//! (nothing, its chain, its chain and its name) and the client's own certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deadpool_postgres::tokio_postgres::config::SslMode as WireMode;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};

use super::params::{SslMode, TlsParams};

/// Where the certificates to trust come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's store.
    System,
}

/// What is checked of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// Nothing (`prefer` and `require` without roots): encrypted, not authenticated.
    Nothing,
    /// Its chain up to a root (`verify-ca`, or roots given with a weaker mode).
    Chain,
    /// Its chain and that it names the host connected to (`verify-full`).
    ChainAndName,
}

/// What the TLS settings of a URL come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// What tokio-postgres does: no TLS, TLS when the server offers it, or TLS only.
    pub(crate) wire: WireMode,
    pub(crate) check: Check,
    pub(crate) roots: Option<Roots>,
    /// The client's certificate and key files.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// The plan for `params`, as libpq would connect: files not given are looked for in
/// `~/.postgresql` (`home`), through `exists`.
pub(crate) fn plan(
    params: &TlsParams,
    home: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<Plan, String> {
    // libpq 16: trusting the system's roots defaults to checking names.
    let system = params.root_cert.as_deref() == Some("system");
    let mode = (params.mode).unwrap_or(if system {
        SslMode::VerifyFull
    } else {
        SslMode::Prefer
    });
    let wire = match mode {
        SslMode::Disable => WireMode::Disable,
        SslMode::Allow | SslMode::Prefer => WireMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
    };
    if mode == SslMode::Disable {
        let check = Check::Nothing;
        return Ok(Plan {
            wire,
            check,
            roots: None,
            client: None,
        });
    }
    let default = |name: &str| home.map(|h| h.join(".postgresql").join(name));
    let roots = match params.root_cert.as_deref() {
        Some("system") => Some(Roots::System),
        Some(file) => Some(Roots::File(PathBuf::from(file))),
        None => default("root.crt").filter(|f| exists(f)).map(Roots::File),
    };
    let check = match mode {
        SslMode::VerifyFull => Check::ChainAndName,
        SslMode::VerifyCa => Check::Chain,
        _ if roots.is_some() => Check::Chain,
        _ => Check::Nothing,
    };
    if check != Check::Nothing && roots.is_none() {
        return Err("the database URL asks to check the server's certificate \
             (sslmode=verify-ca or verify-full) and names no root certificate: set \
             sslrootcert=FILE (or sslrootcert=system), or put it in ~/.postgresql/root.crt"
            .to_owned());
    }
    if roots == Some(Roots::System) && mode != SslMode::VerifyFull {
        return Err(
            "the database URL trusts the system's roots (sslrootcert=system): \
             they vouch for names, so it needs sslmode=verify-full (as libpq says)"
                .to_owned(),
        );
    }
    let cert = (params.cert.as_deref().map(PathBuf::from))
        .or_else(|| default("postgresql.crt").filter(|f| exists(f)));
    let key = (params.key.as_deref().map(PathBuf::from)).or_else(|| default("postgresql.key"));
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (Some(cert), None) => return Err(no_key(&cert)),
        (None, _) => None,
    };
    Ok(Plan {
        wire,
        check,
        roots,
        client,
    })
}

fn no_key(cert: &Path) -> String {
    format!(
        "the database URL gives a client certificate ({}) but no key: set sslkey=FILE",
        cert.display()
    )
}

/// A plan, with the system's roots read once (each read parses a few hundred certificates: per
/// connection, it would stall the command's one thread for milliseconds).
#[derive(Debug)]
pub(crate) struct Tls {
    plan: Plan,
    system: Option<Arc<RootCertStore>>,
}

impl Tls {
    /// Reads every file of `plan` once (and the system's roots for good), so that one that
    /// cannot be read is an error at the start rather than a retry at each connection.
    pub(crate) fn new(plan: Plan) -> Result<Tls, String> {
        let system = match plan.roots {
            Some(Roots::System) => Some(Arc::new(system_roots()?)),
            _ => None,
        };
        let tls = Tls { plan, system };
        tls.client_config()?;
        Ok(tls)
    }

    /// What tokio-postgres is told: no TLS, TLS when offered, or TLS only.
    pub(crate) fn wire(&self) -> WireMode {
        self.plan.wire
    }

    /// The rustls configuration that carries out the plan, its files read now (as libpq
    /// reads them for each connection: a renewed certificate serves the next one). Errors
    /// name the file that could not be read.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, String> {
        // ring, deprecated by rustls 0.23.48 for its lack of post-quantum key exchange:
        // aws-lc-rs has it, at three times ring's build (CI's time budget). PostgreSQL's own
        // TLS (OpenSSL) offers no post-quantum groups before OpenSSL 3.5 either.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = self.verifier(&provider)?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &self.plan.client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let certs = certificates(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("the database URL's sslkey {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| format!("the database URL's sslcert and sslkey: {e}"))?
            }
        };
        // What PostgreSQL 17 asks of a direct TLS connection (sslnegotiation=direct), and
        // what libpq offers every time; older servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(config)
    }

    fn verifier(
        &self,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ServerCertVerifier>, String> {
        let store = match (&self.plan.roots, &self.system) {
            (None, _) => return Ok(Arc::new(Unchecked(provider.clone()))),
            (Some(Roots::System), Some(system)) => system.clone(),
            (Some(Roots::System), None) => Arc::new(system_roots()?),
            (Some(Roots::File(file)), _) => Arc::new(file_roots(file)?),
        };
        let webpki = WebPkiServerVerifier::builder_with_provider(store, provider.clone())
            .build()
            .map_err(|e| format!("the database URL's sslrootcert: {e}"))?;
        Ok(match self.plan.check {
            Check::ChainAndName => webpki,
            Check::Chain => Arc::new(ChainOnly(webpki)),
            Check::Nothing => Arc::new(Unchecked(provider.clone())),
        })
    }
}

fn file_roots(file: &Path) -> Result<RootCertStore, String> {
    let what = format!("sslrootcert {}", file.display());
    store_of(certificates(file, "sslrootcert")?, &what)
}

fn system_roots() -> Result<RootCertStore, String> {
    let what = "sslrootcert=system (the system's store)";
    store_of(rustls_native_certs::load_native_certs().certs, what)
}

fn store_of(certs: Vec<CertificateDer<'static>>, what: &str) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(certs);
    match added {
        0 => Err(format!("the database URL's {what}: no usable certificate")),
        _ => Ok(store),
    }
}

/// The certificates of a PEM file, at least one.
fn certificates(file: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let read =
        |e: &dyn std::fmt::Display| format!("the database URL's {setting} {}: {e}", file.display());
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| read(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read(&e))?;
    match certs.is_empty() {
        true => Err(read(&"no certificate in it")),
        false => Ok(certs),
    }
}

/// `verify-ca`: the chain must lead to a root; the name it gives need not be the host's.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain first: a wrong name is the only error left once it passed.
        match (self.0).verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without roots: any certificate (as libpq), but the handshake's
/// signatures are still checked, so the session is encrypted to whoever holds its key.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: Option<SslMode>, root: Option<&str>) -> TlsParams {
        TlsParams {
            mode,
            root_cert: root.map(str::to_owned),
            ..TlsParams::default()
        }
    }

    fn plan_of(params: &TlsParams, files: &[&str]) -> Result<Plan, String> {
        let exists = |f: &Path| files.iter().any(|name| f.ends_with(name));
        plan(params, Some(Path::new("/home/u")), &exists)
    }

    #[test]
    fn each_mode_checks_what_libpq_checks() {
        let cases = [
            (None, WireMode::Prefer, Check::Nothing),
            (Some(SslMode::Disable), WireMode::Disable, Check::Nothing),
            (Some(SslMode::Allow), WireMode::Prefer, Check::Nothing),
            (Some(SslMode::Require), WireMode::Require, Check::Nothing),
        ];
        for (mode, wire, check) in cases {
            let plan = plan_of(&params(mode, None), &[]).unwrap();
            assert_eq!((plan.wire, plan.check), (wire, check), "{mode:?}");
        }
        let full = plan_of(&params(Some(SslMode::VerifyFull), Some("/ca.pem")), &[]).unwrap();
        assert_eq!(full.check, Check::ChainAndName);
        assert_eq!(full.roots, Some(Roots::File("/ca.pem".into())));
        let ca = plan_of(&params(Some(SslMode::VerifyCa), Some("/ca.pem")), &[]).unwrap();
        assert_eq!((ca.wire, ca.check), (WireMode::Require, Check::Chain));
    }

    #[test]
    fn roots_make_require_check_the_chain_and_their_absence_refuses_verify() {
        let require = plan_of(&params(Some(SslMode::Require), Some("/ca.pem")), &[]).unwrap();
        assert_eq!(require.check, Check::Chain);
        let home_root = plan_of(&params(Some(SslMode::Require), None), &["root.crt"]).unwrap();
        let expected = Roots::File("/home/u/.postgresql/root.crt".into());
        assert_eq!(
            (home_root.check, home_root.roots),
            (Check::Chain, Some(expected))
        );
        let e = plan_of(&params(Some(SslMode::VerifyFull), None), &[]).unwrap_err();
        assert!(e.contains("sslrootcert=FILE"), "{e}");
        let e = plan_of(&params(Some(SslMode::Require), Some("system")), &[]).unwrap_err();
        assert!(e.contains("verify-full"), "{e}");
        let system = plan_of(&params(Some(SslMode::VerifyFull), Some("system")), &[]).unwrap();
        assert_eq!(system.roots, Some(Roots::System));
        let system = plan_of(&params(None, Some("system")), &[]).unwrap();
        assert_eq!(
            (system.check, system.roots),
            (Check::ChainAndName, Some(Roots::System))
        );
    }

    #[test]
    fn a_client_certificate_comes_with_its_key_and_disable_reads_no_file() {
        let mut given = params(Some(SslMode::Require), None);
        given.cert = Some("/c.pem".into());
        let with_cert = plan_of(&given, &[]).unwrap();
        let key = PathBuf::from("/home/u/.postgresql/postgresql.key");
        assert_eq!(with_cert.client, Some(("/c.pem".into(), key)));
        let home = plan_of(&params(None, None), &["postgresql.crt"]).unwrap();
        assert!(home.client.is_some());
        let mut disable = params(Some(SslMode::Disable), Some("/missing.pem"));
        disable.cert = Some("/missing.pem".into());
        let disabled = plan_of(&disable, &["root.crt"]).unwrap();
        assert_eq!((disabled.roots, disabled.client), (None, None));
        let no_home = plan(&given, None, &|_| true);
        assert!(no_home.unwrap_err().contains("sslkey"));
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let plan = Plan {
            wire: WireMode::Require,
            check: Check::ChainAndName,
            roots: Some(Roots::File("/nonexistent/ca.pem".into())),
            client: None,
        };
        let e = Tls::new(plan).unwrap_err();
        assert!(e.contains("sslrootcert /nonexistent/ca.pem"), "{e}");
    }
}
