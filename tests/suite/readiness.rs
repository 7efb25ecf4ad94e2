//! B3: probes and readiness. A ticker's probe through the state table across a demotion, and
//! the `/readyz` status and body that name the failing loops.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::background::P;
use pg_elector::Elector;
use pg_elector::background::{LeaderTicker, Probe, ProbeStatus, Readiness, TickOutcome};
use tokio_util::sync::CancellationToken;

mod b3 {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tickers_probe_follows_the_state_table_through_a_demotion() {
        let (elector, control) = Elector::manual();
        let shutdown = CancellationToken::new();
        let readiness = Readiness::new();
        let probe = readiness.probe("sweep");
        probe.set_boot(Err("boot sweep pending"));
        assert_eq!(readiness.check().status_code(), 503, "the boot state");

        let fail = Arc::new(AtomicBool::new(false));
        let ticker = LeaderTicker::new("sweep", &elector, P)
            .probe(&probe)
            .tick_at_start(false);
        let task = tokio::spawn({
            let (shutdown, fail) = (shutdown.clone(), fail.clone());
            async move {
                ticker
                    .run(shutdown, move |_| {
                        let fail = fail.load(Ordering::SeqCst);
                        async move { if fail { Err("disk full") } else { Ok(()) } }
                    })
                    .await
            }
        });
        // Before the first tick: boot state.
        tokio::time::sleep(P / 2).await;
        assert_eq!(
            probe.status(),
            ProbeStatus::Fail("boot sweep pending".into())
        );
        // Standby tick: pass.
        tokio::time::sleep(P).await;
        assert_eq!(probe.status(), ProbeStatus::Pass);

        control.promote();
        fail.store(true, Ordering::SeqCst);
        tokio::time::sleep(P).await;
        assert_eq!(
            probe.status(),
            ProbeStatus::Fail("disk full".into()),
            "leader, failed"
        );
        let report = readiness.check();
        assert_eq!(report.status_code(), 503);
        assert_eq!(report.body(), "not ready\nsweep: disk full\n");
        tokio::time::sleep(P).await;
        assert!(!probe.status().is_pass(), "until a later success");
        fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(P).await;
        assert_eq!(probe.status(), ProbeStatus::Pass, "leader, succeeded");

        fail.store(true, Ordering::SeqCst);
        tokio::time::sleep(P).await;
        assert!(!probe.status().is_pass());
        control.demote();
        tokio::time::sleep(P).await;
        assert_eq!(
            probe.status(),
            ProbeStatus::Pass,
            "cleared on the first standby tick"
        );
        assert_eq!(readiness.check().status_code(), 200);
        shutdown.cancel();
        task.await.unwrap();
    }

    #[test]
    fn readiness_renders_a_status_and_names_the_failing_loops() {
        let readiness = Readiness::new();
        let a = readiness.probe("invitations-expire");
        let b = readiness.probe("approvals-expire");
        readiness.add(&Probe::new("actions-timeout"));
        let report = readiness.check();
        assert!(report.is_ready());
        assert_eq!(
            (report.status_code(), report.body().as_str()),
            (200, "ok\n")
        );
        assert_eq!(report.probe_count(), 3);

        a.record(TickOutcome::Failed("timeout\nexpired".into()));
        b.record(TickOutcome::Failed("deadlock detected".into()));
        let report = readiness.check();
        assert_eq!(report.status_code(), 503);
        assert_eq!(
            report.body(),
            "not ready\ninvitations-expire: timeout expired\napprovals-expire: deadlock detected\n"
        );
        let names: Vec<_> = report.failing().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["invitations-expire", "approvals-expire"]);
        a.record(TickOutcome::Standby);
        b.record(TickOutcome::Succeeded);
        assert!(readiness.check().is_ready());
    }
}
