use super::*;

#[test]
fn a_standby_term_is_born_ended() {
    let term = Term::not_leader();
    assert!(!term.is_leader());
    assert!(term.token().is_cancelled());
    assert_eq!(term.end(), Some(TermEnd::NotLeader));
}

#[test]
fn finishing_sets_the_cause_once_and_cancels() {
    let term = Term::leading(Born::default());
    assert!(term.is_leader());
    assert_eq!(term.end(), None);
    term.finish(TermEnd::Shutdown);
    term.finish(TermEnd::LeadershipLost);
    assert!(!term.is_leader());
    assert_eq!(term.end(), Some(TermEnd::Shutdown));
}

#[test]
fn a_linked_term_ends_with_its_term_or_its_parent() {
    let term = Term::leading(Born::default());
    let parent = CancellationToken::new();
    let child = term.linked_to(&parent);
    assert!(child.is_leader());
    parent.cancel();
    assert_eq!(child.end(), Some(TermEnd::ParentCancelled));
    assert!(term.is_leader(), "the parent does not end the term itself");

    let child = term.linked_to(&CancellationToken::new());
    term.finish(TermEnd::LeadershipLost);
    assert_eq!(child.end(), Some(TermEnd::LeadershipLost));

    let late = term.linked_to(&CancellationToken::new());
    assert_eq!(
        late.end(),
        Some(TermEnd::LeadershipLost),
        "linked after the end"
    );
}

/// A handle ends with its term, but cancelling it ends only the handle.
#[test]
fn cancelling_a_handle_ends_only_the_handle() {
    let term = Term::leading(Born::default());
    let (a, b) = (term.handle(), term.handle());
    a.token().cancel();
    assert_eq!(a.end(), Some(TermEnd::ParentCancelled));
    assert!(b.is_leader() && term.is_leader());
    term.finish(TermEnd::LeadershipLost);
    assert_eq!(b.end(), Some(TermEnd::LeadershipLost));
    assert!(b.token().is_cancelled());
}

#[test]
fn a_handle_of_a_handle_is_a_handle_on_the_term() {
    let term = Term::leading(Born::default());
    let first = term.handle();
    let second = first.handle();
    first.token().cancel();
    assert!(second.is_leader(), "cancelling one handle leaves the other");
    term.finish(TermEnd::Shutdown);
    assert_eq!(second.end(), Some(TermEnd::Shutdown));
}

#[test]
fn a_lost_term_keeps_its_cause_in_every_handle_and_linked_term() {
    let term = Term::leading(Born::default());
    let handle = term.handle();
    let linked = term.linked_to(&CancellationToken::new());
    let cancelled_parent = CancellationToken::new();
    let cut_off = term.linked_to(&cancelled_parent);
    cancelled_parent.cancel();
    assert_eq!(term.loss_cause(), None, "live");
    term.finish_lost(Some(LossCause::CheckTimeout));
    let late = term.linked_to(&CancellationToken::new());
    for t in [&term, &handle, &linked, &late] {
        assert_eq!(t.end(), Some(TermEnd::LeadershipLost));
        assert_eq!(t.loss_cause(), Some(LossCause::CheckTimeout));
    }
    assert_eq!(cut_off.end(), Some(TermEnd::ParentCancelled));
    assert_eq!(cut_off.loss_cause(), None, "its parent ended it first");

    let shut = Term::leading(Born::default());
    shut.finish(TermEnd::Shutdown);
    shut.finish_lost(Some(LossCause::LockGone));
    assert_eq!(shut.end(), Some(TermEnd::Shutdown));
    assert_eq!(shut.loss_cause(), None, "the first end stays");
    assert_eq!(Term::not_leader().loss_cause(), None);
}

#[test]
fn linked_terms_that_were_dropped_are_pruned() {
    let term = Term::leading(Born::default());
    for _ in 0..1000 {
        drop(term.linked_to(&CancellationToken::new()));
    }
    assert!(lock(&term.inner.linked).len() <= 1);
}

#[test]
fn an_expired_lease_ends_leadership_in_the_term() {
    let lease = Arc::new(Lease::default());
    lease.hold_forever();
    let term = Term::leading(Born {
        lease: Some(lease.clone()),
        ..Born::default()
    });
    assert!(term.is_leader());
    lease.clear();
    assert!(!term.is_leader());
}
