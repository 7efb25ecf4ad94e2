use super::*;

#[test]
fn b5_backoff_doubles_up_to_its_cap() {
    let policy =
        RestartPolicy::new().backoff(Duration::from_millis(100), Duration::from_millis(500));
    let waits: Vec<_> = (0..5)
        .map(|r| policy.backoff_after(r).as_millis())
        .collect();
    assert_eq!(waits, [100, 200, 400, 500, 500]);
    assert_eq!(policy.backoff_after(u32::MAX), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn b5_budget_counts_restarts_within_the_window() {
    let policy = RestartPolicy::new()
        .backoff(Duration::from_secs(1), Duration::from_secs(60))
        .budget(3, Duration::from_secs(60));
    let mut restarts = Restarts::default();
    let t0 = Instant::now();
    assert_eq!(restarts.next(&policy, t0), Some(Duration::from_secs(1)));
    assert_eq!(
        restarts.next(&policy, t0 + Duration::from_secs(10)),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        restarts.next(&policy, t0 + Duration::from_secs(20)),
        Some(Duration::from_secs(4))
    );
    assert_eq!(
        restarts.next(&policy, t0 + Duration::from_secs(30)),
        None,
        "4th within 60 s"
    );
    // Once the first restart leaves the window, there is room for one more.
    assert_eq!(
        restarts.next(&policy, t0 + Duration::from_secs(60)),
        Some(Duration::from_secs(4))
    );
    assert_eq!(
        RestartPolicy::new()
            .budget(0, Duration::from_secs(1))
            .budget,
        0
    );
    assert_eq!(
        Restarts::default().next(&RestartPolicy::new().budget(0, Duration::from_secs(1)), t0),
        None,
        "a zero budget never restarts"
    );
}
