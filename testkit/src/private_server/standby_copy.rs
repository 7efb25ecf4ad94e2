//! Copying a running private server into a hot standby (`pg_basebackup -R`, or a copy of the
//! stopped primary's data dir), rejoining an old primary as a standby, and promoting one.

use std::io::Write;
use std::time::Instant;

use super::{PrivateServer, lock};
use crate::KitError;
use crate::server::ShutdownMode;

impl PrivateServer {
    /// Makes a hot standby of this running server, streaming from it through
    /// `upstream_port` on 127.0.0.1 (its own port, or a proxy's), and starts it
    /// on a free port: `pg_basebackup -R` when the bin dir has it, else a copy
    /// of the data dir taken while this server is stopped (`pg_ctl stop -m
    /// fast`, copy, start again: every connection to this server is cut).
    pub(crate) fn spawn_standby(&self, upstream_port: u16) -> Result<Self, KitError> {
        let started = Instant::now();
        let mut standby = PrivateServer::empty(self.bin_dir.clone(), self.run_as)?;
        let how = self.copy_into(&standby, upstream_port)?;
        standby.start_on_free_port()?;
        tracing::info!(
            port = standby.port,
            primary_port = self.port,
            upstream_port,
            how,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "private PostgreSQL standby started"
        );
        Ok(standby)
    }

    /// Makes this server (stopped first, at once, if it runs) a hot standby of
    /// `primary`, reached through `upstream_port`: its data dir is thrown away
    /// and copied again from `primary` (as [`spawn_standby`](Self::spawn_standby)
    /// does), then it starts on its own port again. What an operator does with
    /// a failed primary after a failover, instead of `pg_rewind`.
    pub(crate) fn rejoin_as_standby_of(
        &self,
        primary: &PrivateServer,
        upstream_port: u16,
    ) -> Result<(), KitError> {
        let _guard = lock(&self.control);
        let started = Instant::now();
        if self.data_dir.join("postmaster.pid").exists() {
            let _ = self.pg_ctl_stop(ShutdownMode::Immediate);
        }
        std::fs::remove_dir_all(&self.data_dir)
            .map_err(|e| KitError::io("removing the old primary's data dir", e))?;
        let how = primary.copy_into(self, upstream_port)?;
        // The copy carries the primary's settings, its port among them.
        self.write_settings(self.port)?;
        self.start_and_wait("starting the old primary as a standby")?;
        tracing::info!(
            port = self.port,
            primary_port = primary.port,
            how,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "private PostgreSQL server back as a standby"
        );
        Ok(())
    }

    /// Copies this running server into `standby`'s (absent) data dir as a
    /// standby streaming through `upstream_port`; says how.
    fn copy_into(
        &self,
        standby: &PrivateServer,
        upstream_port: u16,
    ) -> Result<&'static str, KitError> {
        if self.bin_dir.join("pg_basebackup").is_file() {
            self.base_backup_into(standby, upstream_port)?;
            Ok("pg_basebackup")
        } else {
            self.cold_copy_into(standby, upstream_port)?;
            Ok("cold copy")
        }
    }

    /// `pg_basebackup -R` from this server, reached through `upstream_port`,
    /// into `standby`'s data dir.
    fn base_backup_into(
        &self,
        standby: &PrivateServer,
        upstream_port: u16,
    ) -> Result<(), KitError> {
        let data = standby.data_dir.to_string_lossy().into_owned();
        let port = upstream_port.to_string();
        let what = "taking a base backup for a standby";
        let out = standby.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-w",
                "-D",
                &data,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            what,
        )?;
        self.check_command(&out, what, "pg_basebackup", "the primary's log ")
    }

    /// Copies this server's data dir while it is stopped, then makes the
    /// copy a standby streaming from this server (what `pg_basebackup -R`
    /// writes: `standby.signal` and `primary_conninfo`, here through
    /// `upstream_port`).
    fn cold_copy_into(&self, standby: &PrivateServer, upstream_port: u16) -> Result<(), KitError> {
        let what = "copying the data dir for a standby";
        self.stop(ShutdownMode::Fast)?;
        let copied = self
            .command_as("cp")
            .arg("-a")
            .arg(&self.data_dir)
            .arg(&standby.data_dir)
            .output()
            .map_err(|e| KitError::io(format!("{what}: running cp"), e));
        // The primary comes back whatever happened to the copy.
        let restarted = self.start_again();
        let copied = copied?;
        if !copied.status.success() {
            return Err(KitError::Server(format!(
                "{what}: cp failed ({}): {}",
                copied.status,
                String::from_utf8_lossy(&copied.stderr).trim()
            )));
        }
        restarted?;
        for stale in ["postmaster.pid", "postmaster.opts"] {
            let _ = std::fs::remove_file(standby.data_dir.join(stale));
        }
        let signal = standby.data_dir.join("standby.signal");
        std::fs::write(&signal, b"")
            .map_err(|e| KitError::io(format!("{what}: writing standby.signal"), e))?;
        let auto = standby.data_dir.join("postgresql.auto.conf");
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&auto)
            .map_err(|e| KitError::io(format!("{what}: opening postgresql.auto.conf"), e))?;
        writeln!(
            conf,
            "primary_conninfo = 'host=127.0.0.1 port={upstream_port} user=postgres application_name=standby'"
        )
        .map_err(|e| KitError::io(format!("{what}: writing postgresql.auto.conf"), e))?;
        if let Some(run_as) = self.run_as {
            run_as.chown(&signal)?;
            run_as.chown(&auto)?;
        }
        Ok(())
    }

    /// `pg_ctl promote -w`: ends recovery; returns once the server runs as a
    /// primary (as far as `pg_ctl` can tell).
    pub(crate) fn promote(&self) -> Result<(), KitError> {
        let _guard = lock(&self.control);
        self.pg_ctl("promote", &[], "promoting the standby")
    }
}
