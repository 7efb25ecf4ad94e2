//! Running a little async work from blocking code, whatever runtime (if any)
//! the caller is on.

use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

/// Runs `fut` on a fresh current-thread runtime in a new thread and waits for
/// it at most `timeout`. Returns `None` on timeout or if the thread or runtime
/// could not be created. Never panics; safe to call from inside a runtime
/// (it blocks the calling thread, which is what blocking functions do).
pub(crate) fn block_on_thread<F>(fut: F, timeout: Duration) -> Option<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("pg-elector-testkit".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            if let Ok(out) = rt.block_on(async { tokio::time::timeout(timeout, fut).await }) {
                let _ = tx.send(out);
            }
        });
    match spawned {
        Ok(handle) => {
            let out = rx.recv_timeout(timeout + Duration::from_secs(1)).ok();
            if out.is_some() {
                let _ = handle.join();
            }
            out
        }
        Err(_) => None,
    }
}
