//! What the local electors run on: their promotion and their `run`, over the shared state.
//! They are made by `Elector::always_leader`, `Elector::manual` and `Elector::local_builder`.

use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::lease::Lease;
use crate::metrics::Change;
use crate::state::Shared;
use crate::term::TermEnd;

/// Which local elector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LocalKind {
    /// Leads from the start, and again whenever `run` is started.
    AlwaysLeader,
    /// Promoted and demoted by hand.
    Manual,
}

pub(crate) fn promote(shared: &Shared) {
    shared.promote(Lease::hold_forever, Some(shared.next_local_epoch()), None);
}

/// `run` of a local elector: an always-leader one leads (again, after an earlier `run`); then
/// it waits for shutdown and ends a live term with `Shutdown`.
pub(crate) async fn run(
    shared: &Shared,
    kind: LocalKind,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let _slot = shared.claim_run()?;
    let mut resigns = shared.resign.subscribe();
    resigns.borrow_and_update();
    if kind == LocalKind::AlwaysLeader {
        // A resign's cooldown holds even when `run` starts during it.
        if wait_out_cooldown(shared, &shutdown).await {
            promote(shared);
        }
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Ok(()) = resigns.changed() => {
                // A resign demoted it; an always-leader elector leads again after the cooldown.
                if kind == LocalKind::AlwaysLeader {
                    if !wait_out_cooldown(shared, &shutdown).await {
                        break;
                    }
                    promote(shared);
                }
            }
        }
    }
    shared.demote(TermEnd::Shutdown, Change::Released);
    Ok(())
}

/// Waits until no resign's cooldown holds (a later resign may extend it); `false` when
/// `shutdown` came first.
async fn wait_out_cooldown(shared: &Shared, shutdown: &CancellationToken) -> bool {
    while shared.cooling_down() {
        let Some(until) = shared.cooldown_end() else {
            break;
        };
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep_until(until) => {}
        }
    }
    !shutdown.is_cancelled()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Elector;
    use prometheus::Registry;

    /// The leader gauge's value for the local electors' `key` label.
    fn gauge_value(registry: &Registry) -> f64 {
        registry
            .gather()
            .iter()
            .find(|family| family.name() == crate::DEFAULT_GAUGE_NAME)
            .expect("the leader gauge is registered")
            .get_metric()[0]
            .get_gauge()
            .value()
    }

    #[tokio::test]
    async fn b6_always_leader_leads_until_its_run_shuts_down() {
        let registry = Registry::new();
        let elector = Elector::local_builder().registry(&registry).always_leader();
        assert!(elector.is_leader());
        assert_eq!(gauge_value(&registry), 1.0);
        let term = elector.term();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        });
        tokio::task::yield_now().await;
        assert!(matches!(
            elector.run(CancellationToken::new()).await,
            Err(Error::AlreadyRunning)
        ));
        shutdown.cancel();
        run.await.unwrap().unwrap();
        assert_eq!(term.end(), Some(TermEnd::Shutdown));
        assert!(!elector.is_leader());
        assert_eq!(gauge_value(&registry), 0.0);
    }

    #[tokio::test]
    async fn b6_manual_promote_and_demote_drive_terms_do_work_and_the_gauge() {
        let registry = Registry::new();
        let (elector, control) = Elector::local_builder().registry(&registry).manual();
        assert_eq!(
            elector.do_work(|_| async { Ok::<_, ()>(1) }).await,
            Ok(None)
        );
        assert_eq!(elector.term().end(), Some(TermEnd::NotLeader));

        let term = control.promote();
        assert_eq!(
            control.promote().end(),
            None,
            "promoting twice keeps the term"
        );
        assert!(term.is_leader());
        assert_eq!(
            elector.do_work(|_| async { Ok::<_, ()>(2) }).await,
            Ok(Some(2))
        );
        assert_eq!(gauge_value(&registry), 1.0);

        // A demotion while the work runs: Ok(None).
        let control = &control;
        let out = elector
            .do_work(|term| async move {
                control.demote();
                assert!(term.token().is_cancelled());
                Err::<(), _>("failed")
            })
            .await;
        assert_eq!(out, Ok(None));
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        assert_eq!(term.loss_cause(), Some(crate::LossCause::Demoted));
        assert_eq!(
            elector.subscribe().borrow().loss_cause,
            Some(crate::LossCause::Demoted)
        );
        assert_eq!(gauge_value(&registry), 0.0);
        assert!(control.promote().is_leader(), "a new term");
        assert!(!term.is_leader(), "the old term stays ended");
    }

    #[tokio::test]
    async fn always_leader_leads_again_in_every_run() {
        // Generous: every step here is immediate; the bound turns a hang into a failure.
        const LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
        let elector = Elector::always_leader();
        for round in 0..3 {
            let shutdown = CancellationToken::new();
            let run = tokio::spawn({
                let (elector, shutdown) = (elector.clone(), shutdown.clone());
                async move { elector.run(shutdown).await }
            });
            let term = tokio::time::timeout(LIMIT, elector.wait_for_leadership())
                .await
                .unwrap_or_else(|_| panic!("round {round}: no leadership within {LIMIT:?}"));
            assert!(term.is_leader(), "round {round}");
            shutdown.cancel();
            tokio::time::timeout(LIMIT, run)
                .await
                .unwrap_or_else(|_| panic!("round {round}: run did not return within {LIMIT:?}"))
                .unwrap()
                .unwrap();
            assert_eq!(term.end(), Some(TermEnd::Shutdown), "round {round}");
            assert!(!elector.is_leader(), "round {round}: standby between runs");
        }
    }

    #[test]
    fn the_gauge_follows_promotions_and_demotions_racing_on_two_threads() {
        use std::sync::{Arc, Barrier};
        const ROUNDS: usize = 20_000;
        const LINKED: usize = 50;
        let registry = Registry::new();
        let (elector, control) = Elector::local_builder().registry(&registry).manual();
        // Each round: both threads flip at once, then the gauge is compared with is_leader().
        let start = Arc::new(Barrier::new(3));
        let done = Arc::new(Barrier::new(3));
        let flipper = |promote: bool| {
            let (control, start, done) = (control.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    start.wait();
                    if promote {
                        control.promote();
                    } else {
                        control.demote();
                    }
                    done.wait();
                }
            })
        };
        let threads = [flipper(true), flipper(false)];
        let mut wrong = 0;
        let parent = CancellationToken::new();
        for _ in 0..ROUNDS {
            // Terms linked to the live term make each demotion take a while to finish, which
            // widens the window a racing promotion could slip into.
            let linked: Vec<_> = (0..LINKED).map(|_| elector.term_with(&parent)).collect();
            start.wait();
            done.wait();
            drop(linked);
            let gauge = gauge_value(&registry);
            if gauge != f64::from(u8::from(elector.is_leader())) {
                wrong += 1;
                control.demote();
                control.promote();
                control.demote();
            }
        }
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(wrong, 0, "rounds that left the gauge unlike is_leader()");
    }

    #[tokio::test]
    async fn wait_for_leadership_completes_at_the_next_promotion() {
        let (elector, control) = Elector::manual();
        let waiter = tokio::spawn({
            let elector = elector.clone();
            async move { elector.wait_for_leadership().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let term = control.promote();
        let got = waiter.await.unwrap();
        assert!(got.is_leader());
        control.demote();
        assert_eq!(got.end(), term.end(), "the same term");
        assert_eq!(got.end(), Some(TermEnd::LeadershipLost));
        let again = control.promote();
        assert!(
            elector.wait_for_leadership().await.is_leader(),
            "at once while leading"
        );
        drop(again);
    }

    /// A refused gauge is an error of the `try_` forms, and no metrics otherwise.
    #[test]
    fn a_refused_gauge_errs_in_try_forms_only() {
        let registry = Registry::new();
        let taken = prometheus::IntCounter::new("pg_elector_leader", "not ours").unwrap();
        registry.register(Box::new(taken)).unwrap();
        let builder = || Elector::local_builder().registry(&registry);
        assert!(matches!(
            builder().try_always_leader(),
            Err(Error::Build(crate::BuildError::MetricClash { .. }))
        ));
        assert!(matches!(
            builder().try_manual(),
            Err(Error::Build(crate::BuildError::MetricClash { .. }))
        ));
        let leader = builder().always_leader();
        let (standby, control) = builder().manual();
        assert!(leader.is_leader() && !standby.is_leader());
        control.promote();
        assert!(standby.is_leader(), "built without metrics, and working");
    }
}
