//! B4: gates. A gate with no elector stays open and runs what it gates; a gate on an elector
//! is open on the leader only.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::background::P;
use pg_elector::background::{Gate, LeaderTicker};
use pg_elector::{Elector, TermEnd};
use tokio_util::sync::CancellationToken;

mod b4 {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_gate_without_an_elector_stays_open_and_runs_what_it_gates() {
        let gate = Gate::new(None);
        assert!(gate.is_open());
        assert_eq!(gate.elector().term().end(), None, "a term that never ends");
        assert_eq!(
            gate.elector().do_work(|_| async { Ok::<_, ()>(7) }).await,
            Ok(Some(7))
        );

        let shutdown = CancellationToken::new();
        let n = AtomicUsize::new(0);
        LeaderTicker::new("single-replica", Gate::always_open(), P)
            .run(shutdown.clone(), |_| {
                if n.fetch_add(1, Ordering::SeqCst) == 2 {
                    shutdown.cancel();
                }
                async { Ok::<_, String>(()) }
            })
            .await;
        assert_eq!(n.load(Ordering::SeqCst), 3);
        assert!(gate.is_open(), "still open, long after");
    }

    #[tokio::test]
    async fn a_gate_on_an_elector_is_open_only_on_the_leader() {
        let (elector, control) = Elector::manual();
        let gate = Gate::from(&elector);
        assert!(!gate.is_open());
        assert_eq!(gate.elector().term().end(), Some(TermEnd::NotLeader));
        assert_eq!(
            gate.elector().do_work(|_| async { Ok::<_, ()>(1) }).await,
            Ok(None)
        );
        let term = control.promote();
        assert!(gate.is_open());
        assert_eq!(
            gate.elector().do_work(|_| async { Ok::<_, ()>(1) }).await,
            Ok(Some(1))
        );
        let parent = CancellationToken::new();
        let linked = gate.elector().term_with(&parent);
        control.demote();
        assert!(!gate.is_open());
        assert_eq!(term.end(), Some(TermEnd::LeadershipLost));
        assert_eq!(linked.end(), Some(TermEnd::LeadershipLost));
    }
}
