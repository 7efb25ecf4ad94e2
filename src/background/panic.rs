//! Catching panics in ticks and workers, with the backtrace of the panic site.
//!
//! `catch_unwind` hands back only the payload; the backtrace of the panic site exists only
//! while the panic hook runs. So [`install_panic_hook`] chains a hook in front of the
//! current one that, on a thread that is inside [`catch_panic`], records the location and a
//! backtrace into a thread-local slot, which `catch_panic` reads once the unwind reaches it
//! (the unwind never leaves the thread it started on). Panics anywhere else cost the hook one
//! thread-local read.

use std::any::Any;
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;
use std::task::Poll;

thread_local! {
    /// How many `catch_panic` polls are on this thread's stack.
    static GUARDED: Cell<usize> = const { Cell::new(0) };
    /// What the hook saw of the last guarded panic on this thread.
    static LAST: RefCell<Option<Site>> = const { RefCell::new(None) };
}

struct Site {
    location: Option<String>,
    backtrace: String,
}

static INSTALL: Once = Once::new();

/// Installs, once per process, the panic hook that lets the background plane log the
/// backtrace of a panicking tick or worker.
///
/// **This changes process-wide state.** It is installed the first time a tick, a while-leader
/// loop or a worker runs (whichever comes first), so calling it is only needed to install the
/// hook earlier, for example before the application installs a hook of its own. The hook is
/// chained: it
/// records the panic site (only for panics inside a tick or worker of this module) and then
/// calls the hook that was installed before it, so the default message on stderr, or the
/// application's own hook, still runs for every panic. Later calls do nothing.
///
/// An application that replaces the panic hook afterwards (with [`std::panic::set_hook`]
/// without chaining to the previous one) loses the backtraces: panics are still caught and
/// logged, with `backtrace` saying it was not captured.
///
/// Catching needs unwinding: built with `panic = "abort"`, a panic in a tick, loop or worker
/// aborts the whole process, as any other panic does, and nothing is caught or restarted.
pub fn install_panic_hook() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            if GUARDED.with(Cell::get) > 0 {
                let site = Site {
                    location: info.location().map(ToString::to_string),
                    backtrace: Backtrace::force_capture().to_string(),
                };
                LAST.with(|last| *last.borrow_mut() = Some(site));
            }
            previous(info);
        }));
    });
}

/// A panic caught in a tick, a while-leader loop or a worker.
#[derive(Clone, Debug)]
pub(crate) struct CaughtPanic {
    /// The payload as text (`&str` and `String` payloads; others are described).
    pub(crate) message: String,
    /// `file:line:column` of the panic, when the hook saw it.
    pub(crate) location: Option<String>,
    /// The backtrace of the panic site, or why there is none.
    pub(crate) backtrace: String,
}

impl CaughtPanic {
    fn new(payload: Box<dyn Any + Send>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&'static str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic payload that is not a string".to_owned()
        };
        let site = LAST.with(|last| last.borrow_mut().take());
        let (location, backtrace) = match site {
            Some(site) => (site.location, site.backtrace),
            None => (
                None,
                "not captured: the panic hook of pg_elector::background was replaced".to_owned(),
            ),
        };
        Self {
            message,
            location,
            backtrace,
        }
    }
}

/// Where a panic was caught, for its log line.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CaughtIn<'a> {
    /// A leader ticker's tick, by loop name.
    Tick(&'a str),
    /// A while-leader loop, by loop name.
    Loop(&'a str),
    /// A supervisor's worker, by worker name.
    Worker(&'a str),
}

impl CaughtPanic {
    /// Logs the panic at ERROR with its message, location and backtrace: the one place that
    /// says how a caught panic is reported.
    pub(crate) fn log(&self, caught_in: CaughtIn<'_>) {
        let location = self.location.as_deref().unwrap_or("unknown");
        let (panic, backtrace) = (&self.message, &self.backtrace);
        match caught_in {
            CaughtIn::Tick(loop_name) => tracing::error!(
                loop_name, panic = %panic, location, backtrace = %backtrace, "tick panicked"
            ),
            CaughtIn::Loop(loop_name) => tracing::error!(
                loop_name, panic = %panic, location, backtrace = %backtrace,
                "loop panicked; it starts again in the next term"
            ),
            CaughtIn::Worker(worker) => tracing::error!(
                worker, panic = %panic, location, backtrace = %backtrace, "worker panicked"
            ),
        }
    }
}

impl fmt::Display for CaughtPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Leaves the guarded section even when the poll unwinds past it.
struct Guarded;

impl Guarded {
    fn enter() -> Self {
        GUARDED.with(|g| g.set(g.get() + 1));
        Guarded
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        GUARDED.with(|g| g.set(g.get() - 1));
    }
}

/// Runs `fut`, turning a panic in any of its polls into `Err`.
///
/// The future is dropped after a panic and never polled again.
pub(crate) async fn catch_panic<F: Future>(fut: F) -> Result<F::Output, CaughtPanic> {
    install_panic_hook();
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        let polled = {
            let _guarded = Guarded::enter();
            std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)))
        };
        match polled {
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(CaughtPanic::new(payload))),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_caught_with_its_message_location_and_backtrace() {
        let caught = catch_panic(async {
            tokio::task::yield_now().await;
            panic!("boom {}", 7);
        })
        .await
        .unwrap_err();
        assert_eq!(caught.message, "boom 7");
        assert!(caught.location.unwrap().contains("panic.rs"));
        assert!(!caught.backtrace.is_empty());
        assert_eq!(GUARDED.with(Cell::get), 0);
    }

    #[tokio::test]
    async fn a_future_that_does_not_panic_passes_through() {
        assert_eq!(catch_panic(async { 5 }).await.unwrap(), 5);
    }
}
