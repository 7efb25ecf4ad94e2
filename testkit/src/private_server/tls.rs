//! TLS for a private server, for tests of a client that speaks it: a test CA and its
//! certificates made with the `openssl` command, the server's `ssl` settings (kept by
//! `write_settings`, so a restart or a new start keeps them) and `pg_hba.conf` lines of the
//! test's, on top.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{PrivateServer, TlsFiles, lock};
use crate::KitError;
use crate::command::{COMMAND_TIMEOUT, output_within};
use crate::server::ShutdownMode;

/// How long the certificates are valid: a test suite's run, with room for a slow machine.
const VALID_DAYS: &str = "5";

/// The extensions of each certificate. rustls/webpki checks them strictly: CAs with
/// `CA:TRUE` and `keyCertSign`, leaves with `CA:FALSE`, `digitalSignature` and the right
/// extended key usage. The server's name is `localhost` only: no IP address, so that a client
/// that verifies the name refuses `127.0.0.1`.
const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
[dn]
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// A new EC P-256 key, unencrypted (PKCS#8 PEM).
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

impl PrivateServer {
    /// Makes the certificates, turns `ssl` on, puts `hba` on top of `pg_hba.conf` and
    /// restarts the server (`pg_ctl restart -m fast`); returns once it accepts connections.
    pub(crate) fn enable_tls(&self, hba: &[&str]) -> Result<TlsFiles, KitError> {
        let _guard = lock(&self.control);
        let files = self.make_certificates()?;
        // The settings are written with the port's, which `tls_settings` now adds to.
        self.write_settings(self.port)?;
        self.prepend_hba(hba)?;
        let log = self.log_file.to_string_lossy().into_owned();
        let what = "restarting the server with TLS on";
        let mode = ShutdownMode::Fast.as_str();
        self.pg_ctl("restart", &["-l", &log, "-m", mode], what)?;
        self.wait_accepting(what)?;
        Ok(files)
    }

    /// The directory of the certificates, next to the data dir (out of the copies a standby
    /// is made from).
    fn tls_dir(&self) -> PathBuf {
        self.root.join("tls")
    }

    /// The `ssl` lines of `harness.conf`: none until [`enable_tls`](Self::enable_tls) made
    /// the server's certificate.
    pub(super) fn tls_settings(&self) -> String {
        let dir = self.tls_dir();
        let files = ["server.crt", "server.key", "ca.crt"].map(|f| dir.join(f));
        if !files.iter().all(|f| f.is_file()) {
            return String::new();
        }
        let quoted = |p: &Path| format!("'{}'", p.to_string_lossy().replace('\'', "''"));
        format!(
            "ssl = on\nssl_cert_file = {}\nssl_key_file = {}\nssl_ca_file = {}\n",
            quoted(&files[0]),
            quoted(&files[1]),
            quoted(&files[2])
        )
    }

    /// The CAs, the server's and the client's certificates, made in `tls/` by `openssl` as
    /// the server's user (the server reads its key, and refuses one others may read).
    fn make_certificates(&self) -> Result<TlsFiles, KitError> {
        let openssl = find_openssl()?;
        let dir = self.tls_dir();
        std::fs::create_dir_all(&dir).map_err(|e| KitError::io("creating the tls dir", e))?;
        if let Some(run_as) = self.run_as {
            run_as.chown(&dir)?;
        }
        std::fs::write(dir.join("openssl.cnf"), OPENSSL_CNF)
            .map_err(|e| KitError::io("writing tls/openssl.cnf", e))?;
        let run = |args: &[&str], what: &str| self.openssl(&openssl, &dir, args, what);
        for (name, cn) in [("ca", "test CA"), ("stranger", "stranger CA")] {
            let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
            let subj = format!("/CN=pg-elector {cn}");
            let mut args = vec!["req", "-config", "openssl.cnf", "-x509", "-new"];
            args.extend(NEW_KEY.split(' '));
            args.extend(["-keyout", &key, "-out", &crt, "-subj", &subj]);
            args.extend(["-days", VALID_DAYS, "-extensions", "ca_ext"]);
            run(&args, "making a test CA")?;
        }
        for (name, cn) in [("server", "localhost"), ("client", "tls_client")] {
            let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
            let (crt, ext) = (format!("{name}.crt"), format!("{name}_ext"));
            let subj = format!("/CN={cn}");
            let mut req = vec!["req", "-config", "openssl.cnf", "-new"];
            req.extend(NEW_KEY.split(' '));
            req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            run(&req, "making a certificate request")?;
            let mut sign = vec!["x509", "-req", "-in", &csr, "-out", &crt];
            sign.extend(["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"]);
            sign.extend(["-days", VALID_DAYS, "-extfile", "openssl.cnf"]);
            sign.extend(["-extensions", &ext]);
            run(&sign, "signing a certificate with the test CA")?;
        }
        // openssl makes keys 0600 already; the server refuses to start on anything looser.
        let key = dir.join("server.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| KitError::io("chmod 0600 of tls/server.key", e))?;
        Ok(TlsFiles::in_dir(dir))
    }

    /// Runs `openssl {args}` as the server's user in `dir`; an error carries its stderr.
    fn openssl(&self, exe: &Path, dir: &Path, args: &[&str], what: &str) -> Result<(), KitError> {
        let mut command = self.command_as(exe);
        // Our configuration for every command, so that the machine's openssl.cnf plays no part.
        command
            .current_dir(dir)
            .env("OPENSSL_CONF", dir.join("openssl.cnf"))
            .args(args);
        let out = output_within(command, COMMAND_TIMEOUT, what)?;
        if out.status.success() {
            return Ok(());
        }
        Err(KitError::Server(format!(
            "{what}: `openssl {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }

    /// Puts `hba` at the top of `pg_hba.conf`, before `initdb`'s `trust` lines (the first
    /// line that matches a connection decides).
    fn prepend_hba(&self, hba: &[&str]) -> Result<(), KitError> {
        let path = self.data_dir.join("pg_hba.conf");
        let old =
            std::fs::read_to_string(&path).map_err(|e| KitError::io("reading pg_hba.conf", e))?;
        let mut text = String::from("# Added by pg-elector-testkit (enable_tls)\n");
        for line in hba {
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&old);
        std::fs::write(&path, text).map_err(|e| KitError::io("writing pg_hba.conf", e))?;
        if let Some(run_as) = self.run_as {
            run_as.chown(&path)?;
        }
        Ok(())
    }
}

/// The `openssl` program: on `PATH`, else in `/usr/bin` or `/usr/local/bin`.
fn find_openssl() -> Result<PathBuf, KitError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut candidates: Vec<_> = std::env::split_paths(&path)
        .map(|d| d.join("openssl"))
        .collect();
    candidates.extend(["/usr/bin/openssl", "/usr/local/bin/openssl"].map(PathBuf::from));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        KitError::Server(
            "enabling TLS: no `openssl` command (on PATH, /usr/bin, /usr/local/bin) to make the \
             test certificates with: install it with `apt-get install openssl` (Debian/Ubuntu)"
                .into(),
        )
    })
}
