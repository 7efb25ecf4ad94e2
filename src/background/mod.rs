//! The background plane: running a service's background work on the leader only.
//!
//! | piece | what it does |
//! |---|---|
//! | [`LeaderTicker`] | a named tick every period, on the leader, panics caught |
//! | [`WhileLeader`] | a self-paced loop handed one term at a time |
//! | [`Probe`], [`Readiness`] | a probe per loop, and the set of them for `/readyz` |
//! | [`Gate`] | open on the leader, always open without an elector |
//! | [`Supervisor`] | named workers restarted with backoff within a budget |
//!
//! **Panics.** Ticks, while-leader loops and workers catch their panics, log them with a
//! backtrace and go on. For the backtrace the first of them to run installs a process-wide
//! panic hook, chained to the one before it ([`install_panic_hook`] installs it earlier, and
//! says more). Catching needs unwinding: with `panic = "abort"` in the build profile a panic
//! anywhere aborts the process, and nothing here is caught or restarted.
//!
//! A service typically builds one [`Elector`](crate::Elector), wraps each periodic job in a
//! [`LeaderTicker`] and each self-paced one in a [`WhileLeader`], gives every loop a probe
//! from one [`Readiness`] set, and runs the elector's `run` and every loop as workers of one
//! [`Supervisor`]:
//!
//! ```
//! use std::time::Duration;
//! use pg_elector::Elector;
//! use pg_elector::background::{LeaderTicker, Readiness, Supervisor, WhileLeader};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Elector::builder(pool, key).registry(&registry).build()? in a fleet.
//! let elector = Elector::always_leader();
//! let readiness = Readiness::new();
//! let expire = LeaderTicker::new("invitations-expire", &elector, Duration::from_secs(30))
//!     .probe(&readiness.probe("invitations-expire"));
//! let archiver = WhileLeader::new("audit-archiver", &elector);
//!
//! let supervisor = Supervisor::new()
//!     .worker("pg-elector", {
//!         let elector = elector.clone();
//!         move |token| {
//!             let elector = elector.clone();
//!             async move { elector.run(token).await }
//!         }
//!     })
//!     .worker("invitations-expire", move |token| {
//!         let expire = expire.clone();
//!         async move { expire.run(token, |_term| async { Ok::<_, std::io::Error>(()) }).await }
//!     })
//!     .worker("audit-archiver", move |token| {
//!         let archiver = archiver.clone();
//!         async move {
//!             archiver.run(token, |term| async move {
//!                 term.cancelled().await; // ... archive batches until the term ends ...
//!                 Ok::<_, std::io::Error>(())
//!             })
//!             .await
//!         }
//!     });
//! readiness.add(&supervisor.probe());
//!
//! let shutdown = CancellationToken::new();
//! shutdown.cancel(); // at SIGTERM, in a real service
//! supervisor.run(shutdown).await;
//! assert_eq!(readiness.check().status_code(), 200);
//! # }
//! ```

mod gate;
pub(crate) mod panic;
mod probe;
mod readiness;
mod signal;
mod supervisor;
mod ticker;
mod while_leader;

pub use gate::Gate;
pub use panic::install_panic_hook;
pub use probe::{Probe, ProbeStatus, TickOutcome};
pub use readiness::{FailingProbe, Readiness, ReadinessReport};
pub use signal::shutdown_on_signal;
pub use supervisor::{DEFAULT_SUPERVISOR_PROBE, RestartPolicy, Supervisor, WorkerResult};
pub use ticker::{LeaderTicker, MAX_TICK_PERIOD, MIN_TICK_PERIOD};
pub use while_leader::WhileLeader;
