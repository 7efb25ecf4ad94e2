use super::*;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

#[test]
fn a_bad_expression_or_zone_is_an_error_at_once() {
    for bad in ["", "0 25 * * *", "* * *", "61 * * * *", "0 0 * * MON-XYZ"] {
        assert!(
            matches!(Job::cron("j", bad), Err(ScheduleError::InvalidCron { .. })),
            "{bad:?}"
        );
    }
    assert!(matches!(
        Job::cron("j", "0 2 * * *").unwrap().in_zone("Mars/Olympus"),
        Err(ScheduleError::UnknownZone { .. })
    ));
    assert!(matches!(
        Job::every("j", Duration::from_secs(1)).in_zone("UTC"),
        Err(ScheduleError::NotCron { .. })
    ));
}

#[test]
fn cron_dues_on_a_fake_clock() {
    let job = Job::cron("cleanup", "0 2 * * *").unwrap();
    let next = |at: &str| job.spec.next_after(ts(at)).unwrap().to_string();
    assert_eq!(next("2026-11-30T01:59:59Z"), "2026-11-30T02:00:00Z");
    assert_eq!(
        next("2026-11-30T02:00:00Z"),
        "2026-12-01T02:00:00Z",
        "strictly after"
    );
    let five = Job::cron("health", "*/5 * * * *").unwrap();
    let (dues, more) =
        five.spec
            .dues_between(ts("2026-11-30T10:00:00Z"), ts("2026-11-30T10:30:00Z"), 100);
    assert_eq!(dues.len(), 6, "10:05 .. 10:30");
    assert!(!more);
    let (dues, more) =
        five.spec
            .dues_between(ts("2026-11-30T10:00:00Z"), ts("2026-11-30T10:30:00Z"), 2);
    assert_eq!(
        dues.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        ["2026-11-30T10:25:00Z", "2026-11-30T10:30:00Z"],
        "the most recent ones are kept"
    );
    assert!(more);
    let seconds = Job::cron("fast", "*/10 * * * * *").unwrap();
    assert_eq!(
        seconds
            .spec
            .next_after(ts("2026-11-30T10:00:01Z"))
            .unwrap()
            .to_string(),
        "2026-11-30T10:00:10Z"
    );
}

#[test]
fn a_fixed_period_is_a_grid_from_the_unix_epoch() {
    let job = Job::every("tick", Duration::from_secs(3600));
    let next = job.spec.next_after(ts("2026-11-30T10:17:00Z")).unwrap();
    assert_eq!(next.to_string(), "2026-11-30T11:00:00Z");
    assert_eq!(
        job.spec.next_after(next).unwrap().to_string(),
        "2026-11-30T12:00:00Z"
    );
}

#[test]
fn daylight_saving_time_in_a_named_zone() {
    // Berlin: 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00 CEST falls back
    // to 02:00 CET.
    let job = Job::cron("night", "30 2 * * *")
        .unwrap()
        .in_zone("Europe/Berlin")
        .unwrap();
    let (spring, _) =
        job.spec
            .dues_between(ts("2026-03-27T12:00:00Z"), ts("2026-03-31T12:00:00Z"), 100);
    let spring: Vec<String> = spring.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        spring,
        [
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:00:00Z", // 02:30 does not exist that night: 03:00 CEST
            "2026-03-30T00:30:00Z", // 02:30 CEST
            "2026-03-31T00:30:00Z",
        ]
    );
    let (autumn, _) =
        job.spec
            .dues_between(ts("2026-10-24T12:00:00Z"), ts("2026-10-26T12:00:00Z"), 100);
    let autumn: Vec<String> = autumn.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        autumn,
        ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        "02:30 on the fall-back night runs once"
    );
}

#[test]
fn a_period_or_catch_up_limit_out_of_range_saturates() {
    let never = Job::every("max", Duration::MAX);
    assert_eq!(
        never.schedule(),
        format!("every {}ms", MAX_PERIOD.as_millis())
    );
    let at = ts("2026-11-30T10:00:00Z");
    let next = never
        .spec
        .next_after(at)
        .expect("a century grid has a next due");
    assert!(next > at);
    assert!(never.spec.previous(at, true).is_some());
    let (dues, more) = never.spec.dues_between(ts("2000-01-01T00:00:00Z"), at, 10);
    assert!(dues.len() <= 1 && !more, "{dues:?}");
    // At the ends of time: no due, and no panic.
    assert_eq!(never.spec.next_after(Timestamp::MAX), None);
    assert!(never.spec.previous(Timestamp::MIN, false).is_none());

    let fastest = Job::every("zero", Duration::ZERO);
    assert_eq!(fastest.schedule(), "every 1ms");
    assert_eq!(
        fastest.spec.next_after(at).unwrap(),
        ts("2026-11-30T10:00:00.001Z")
    );
    assert_eq!(
        Job::every("sub-ms", Duration::from_micros(1500)).schedule(),
        "every 1ms"
    );

    // A stored period a hand or another version wrote: read within the same bounds.
    let stored = Spec::parse(&format!("every {}ms", u64::MAX)).unwrap();
    assert_eq!(stored.text(), never.schedule());
    assert_eq!(Spec::parse("every 0ms").unwrap().text(), "every 1ms");

    let job = Job::every("j", Duration::from_secs(1));
    assert_eq!(
        job.clone().max_catch_up(usize::MAX).max_catch_up,
        MAX_CATCH_UP
    );
    assert_eq!(job.clone().max_catch_up(0).max_catch_up, 1);
    assert_eq!(job.max_catch_up(7).max_catch_up, 7);
}

#[test]
fn dues_are_counted_exactly_for_a_period_and_up_to_a_cap_for_cron() {
    let tick = Job::every("tick", Duration::from_secs(60)).spec;
    let count = |spec: &Spec, a: &str, b: &str| spec.count_between(ts(a), ts(b));
    assert_eq!(
        count(&tick, "2026-11-30T10:00:00Z", "2026-11-30T11:00:00Z"),
        60
    );
    assert_eq!(
        count(&tick, "2026-11-30T10:00:01Z", "2026-11-30T10:01:00Z"),
        1
    );
    assert_eq!(
        count(&tick, "2026-11-30T10:00:00Z", "2026-11-30T10:00:59Z"),
        0
    );
    assert_eq!(
        count(&tick, "2026-11-30T11:00:00Z", "2026-11-30T10:00:00Z"),
        0
    );
    assert_eq!(
        count(&tick, "1969-12-31T23:58:30Z", "1970-01-01T00:01:00Z"),
        3,
        "before the UNIX epoch too: 23:59, 00:00, 00:01"
    );
    let fastest = Job::every("ms", Duration::ZERO).spec;
    assert_eq!(
        fastest.count_between(Timestamp::MIN, Timestamp::MAX),
        (Timestamp::MAX.as_millisecond() - Timestamp::MIN.as_millisecond()) as u64,
        "a millisecond grid over all of time, without overflow"
    );
    let five = Job::cron("five", "*/5 * * * *").unwrap().spec;
    assert_eq!(
        count(&five, "2026-11-30T10:00:00Z", "2026-11-30T11:00:00Z"),
        12
    );
    let (dues, _) = five.dues_between(ts("2026-11-30T10:00:00Z"), ts("2026-11-30T11:00:00Z"), 100);
    assert_eq!(dues.len(), 12);
    let second = Job::cron("second", "* * * * * *").unwrap().spec;
    assert_eq!(
        count(&second, "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"),
        MAX_COUNTED,
        "a week of a job due every second counts as the cap"
    );
}

#[test]
fn the_stored_schedule_reads_back() {
    for job in [
        Job::cron("a", "0  2 * * *").unwrap(),
        Job::cron("b", "*/10 * * * * *")
            .unwrap()
            .in_zone("America/New_York")
            .unwrap(),
        Job::every("c", Duration::from_millis(1500)),
    ] {
        let text = job.schedule();
        assert_eq!(Spec::parse(&text).unwrap().text(), text);
    }
    assert_eq!(
        Job::cron("a", "0  2 * * *").unwrap().schedule(),
        "cron 0 2 * * * UTC"
    );
    assert!(Spec::parse("hourly").is_err());
}
