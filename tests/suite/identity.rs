//! What the server shows of a leader: its lock session's `application_name` (the builder's
//! `identity`, or `<hostname>-<pid>` by default, cut to PostgreSQL's 63 bytes), and
//! `current_leader` (the free function and `Elector::current_leader`): the holder's pid,
//! identity and address, the epoch and its start with fencing, a new leader after a graceful
//! handover, and `None` while nobody leads.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::capture::Visitor;
use common::*;
use pg_elector::{Elector, LeaderInfo, LockKey, current_leader};
use tracing::Instrument;
use tracing::instrument::WithSubscriber;
use tracing::span;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// PostgreSQL keeps the first `NAMEDATALEN - 1` = 63 bytes of an `application_name` in
/// `pg_stat_activity`.
const PG_NAME_BYTES: usize = 63;

/// What `pg_stat_activity` shows of an ASCII `application_name`.
fn as_postgres_shows(name: &str) -> &str {
    assert!(name.is_ascii(), "the tests use ASCII identities: {name:?}");
    &name[..name.len().min(PG_NAME_BYTES)]
}

/// A replica at interval `I` on a pool of two, with `identity` unless `None`.
fn replica_named(db: &TestDb, key: LockKey, identity: Option<&str>) -> Replica {
    let mut builder = Elector::builder(db.pool(2), key).check_interval(I);
    if let Some(identity) = identity {
        builder = builder.identity(identity);
    }
    Replica::run(builder.build().expect("valid elector"))
}

/// The one backend that holds `key`, per `pg_locks`.
async fn the_holder(client: &tokio_postgres::Client, key: LockKey) -> i32 {
    let pids = holders(client, key).await;
    assert_eq!(
        pids.len(),
        1,
        "exactly one backend holds the lock: {pids:?}"
    );
    pids[0]
}

/// The `application_name` of backend `pid`, per `pg_stat_activity`.
async fn application_name(client: &tokio_postgres::Client, pid: i32) -> String {
    client
        .query_one(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .expect("the lock session is in pg_stat_activity")
        .get(0)
}

/// What [`current_leader`] reads through `client`, which must find a leader ("someone leads").
async fn someone_leads(client: &tokio_postgres::Client, key: LockKey) -> LeaderInfo {
    current_leader(client, key)
        .await
        .unwrap()
        .expect("someone leads")
}

/// The address the server sees the test's connections come from: the harness reaches its
/// server over loopback TCP (127.0.0.1), so the server sees the same loopback address; an
/// external server elsewhere (`DATABASE_URL`) sees some address of this machine.
fn assert_client_addr(info: &LeaderInfo) {
    let server_ip = PgServer::shared().unwrap().addr().ip();
    if server_ip.is_loopback() {
        assert_eq!(info.client_addr, Some(server_ip), "{info:?}");
    } else {
        assert!(info.client_addr.is_some(), "{info:?}");
    }
}

/// Waits up to 3·I for `replica` to lead: its first try runs at once, so it leads within one
/// try's round trip; 3·I leaves room for a slow first connect on a loaded machine.
async fn leads(replica: &Replica) {
    wait_for(3 * I, || replica.elector.is_leader())
        .await
        .expect("the replica leads within 3·I");
}

/// In `pg_stat_activity` the lock session is named by the identity given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_session_is_named_by_the_identity_given() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 1);
    let replica = replica_named(&db, key, Some("billing-7f9c"));
    leads(&replica).await;

    let client = db.connect().await.unwrap();
    let pid = the_holder(&client, key).await;
    assert_eq!(application_name(&client, pid).await, "billing-7f9c");
    replica.stop().await.unwrap();
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_identity_the_session_is_named_hostname_dash_pid() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 2);
    let replica = replica_named(&db, key, None);
    leads(&replica).await;

    // The elector runs in this process, so its pid is ours; the kernel's hostname is what
    // `uname` reports as the node name.
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let expected = format!("{}-{}", hostname.trim(), std::process::id());
    let client = db.connect().await.unwrap();
    let pid = the_holder(&client, key).await;
    assert_eq!(
        application_name(&client, pid).await,
        as_postgres_shows(&expected)
    );
    replica.stop().await.unwrap();
}

/// `current_leader` names the holder, then the next leader after a handover, then nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_leader_names_the_holder_its_successor_then_nobody() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 3);
    let client = db.connect().await.unwrap();
    assert_eq!(
        current_leader(&client, key).await.unwrap(),
        None,
        "nobody leads yet"
    );

    let first = replica_named(&db, key, Some("sweeper-a"));
    leads(&first).await;
    let second = replica_named(&db, key, Some("sweeper-b"));
    // One try of the second replica, refused: it is a standby now.
    tokio::time::sleep(I).await;
    assert!(!second.elector.is_leader());

    let info = someone_leads(&client, key).await;
    let first_pid = the_holder(&client, key).await;
    assert_eq!(info.pid, first_pid);
    assert_eq!(info.identity, "sweeper-a");
    assert_client_addr(&info);
    assert_eq!((info.epoch, info.since), (None, None), "no fencing");
    // The elector's own answer is the server's, from either replica. The leader is stable
    // here (a check every I, nothing failing), so the three reads see the same holder.
    assert_eq!(
        first.elector.current_leader().await.unwrap(),
        Some(info.clone())
    );
    assert_eq!(second.elector.current_leader().await.unwrap(), Some(info));

    // A graceful handover: `stop` returns after the unlock; the standby tries every I, so it
    // leads within I of that plus its try's round trip; I/2 more for a loaded machine.
    first.stop().await.unwrap();
    let took = wait_for(I + I / 2, || second.elector.is_leader())
        .await
        .expect("the standby leads within 1.5·I of the handover");
    eprintln!("current_leader: handover took {took:?}");
    let info = current_leader(&client, key)
        .await
        .unwrap()
        .expect("the second replica leads");
    let second_pid = the_holder(&client, key).await;
    assert_eq!(info.pid, second_pid);
    assert_ne!(info.pid, first_pid, "a new lock session");
    assert_eq!(info.identity, "sweeper-b");
    assert_client_addr(&info);
    assert_eq!(second.elector.current_leader().await.unwrap(), Some(info));

    // `stop` returns after the unlock, so the lock is free at once.
    let elector = second.elector.clone();
    second.stop().await.unwrap();
    assert_eq!(current_leader(&client, key).await.unwrap(), None);
    assert_eq!(elector.current_leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fencing_current_leader_reports_epoch_and_since() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 4);
    let started = SystemTime::now();
    let fenced = |identity: &str| Replica::run(fenced_elector(db.pool(2), key, identity, I));
    let first = fenced("fenced-a");
    leads(&first).await;
    let second = fenced("fenced-b");

    let client = db.connect().await.unwrap();
    // The first grant created `pg_elector_epochs` in this fresh database, so the free
    // function reads the epoch row too.
    let info = someone_leads(&client, key).await;
    let epoch = first
        .elector
        .term()
        .epoch()
        .expect("a fenced term has an epoch");
    assert_eq!(info.epoch, Some(epoch));
    assert_eq!(info.identity, "fenced-a");
    assert_eq!(info.pid, the_holder(&client, key).await);
    let since = info.since.expect("since, with fencing");
    // The server stamps `since` with its clock, which is this machine's clock: after the
    // test started (1 s slack for clock granularity) and not in the future.
    assert!(
        since <= SystemTime::now(),
        "since {since:?} is in the future"
    );
    assert!(
        since + Duration::from_secs(1) >= started,
        "since {since:?} is before the test started ({started:?})"
    );
    assert_eq!(
        first.elector.current_leader().await.unwrap(),
        Some(info.clone())
    );
    assert_eq!(second.elector.current_leader().await.unwrap(), Some(info));

    // The next term bumps the epoch by one, and `since` moves with it.
    first.stop().await.unwrap();
    wait_for(I + I / 2, || second.elector.is_leader())
        .await
        .expect("the standby leads within 1.5·I of the handover");
    let next = current_leader(&client, key)
        .await
        .unwrap()
        .expect("the second replica leads");
    assert_eq!(next.identity, "fenced-b");
    let next_epoch = next.epoch.expect("an epoch, with fencing");
    assert!(next_epoch > epoch, "epoch {next_epoch} after {epoch}");
    assert_eq!(second.elector.term().epoch(), Some(next_epoch));
    let next_since = next.since.expect("since, with fencing");
    assert!(next_since >= since && next_since <= SystemTime::now());
    assert_eq!(second.elector.current_leader().await.unwrap(), Some(next));
    second.stop().await.unwrap();
}

/// An identity longer than 63 bytes still leads, and shows its 63-byte prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_over_63_bytes_leads_and_shows_its_prefix() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 5);
    let long = format!("billing-sweeper-{}", "0123456789".repeat(10));
    assert!(long.len() > PG_NAME_BYTES);
    let replica = replica_named(&db, key, Some(&long));
    leads(&replica).await;
    // Still leading a check later: the leader's checks pass with the long name.
    tokio::time::sleep(I + I / 2).await;
    assert!(replica.elector.is_leader());

    let client = db.connect().await.unwrap();
    let pid = the_holder(&client, key).await;
    let shown = application_name(&client, pid).await;
    assert_eq!(shown, &long[..PG_NAME_BYTES]);
    assert_eq!(shown.len(), PG_NAME_BYTES);
    let info = someone_leads(&client, key).await;
    assert_eq!(info.identity, &long[..PG_NAME_BYTES]);
    assert_eq!(info.pid, pid);
    replica.stop().await.unwrap();
}

/// Every event, with the fields of the spans it was emitted in (outermost first) and then its
/// own, as a log line would show them.
#[derive(Clone, Default)]
struct WithSpans(Arc<Mutex<Vec<Logged>>>);

#[derive(Clone, Debug)]
struct Logged {
    target: String,
    fields: BTreeMap<String, String>,
}

impl Logged {
    fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }
}

/// A span's fields, kept in its extensions.
struct SpanFields(BTreeMap<String, String>);

impl<S> Layer<S> for WithSpans
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Visitor(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<SpanFields>() {
                values.record(&mut Visitor(&mut fields.0));
            }
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(own) = span.extensions().get::<SpanFields>() {
                    fields.extend(own.0.clone());
                }
            }
        }
        event.record(&mut Visitor(&mut fields));
        self.0.lock().unwrap().push(Logged {
            target: event.metadata().target().to_owned(),
            fields,
        });
    }
}

/// The election's log lines carry key and identity, and a term's lines its epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_key_and_identity_and_a_terms_its_epoch() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 6);
    let logged = WithSpans::default();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(logged.clone()));
    let elector = fenced_elector(db.pool(2), key, "traced-a", I);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(
        {
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.run(shutdown).await }
        }
        .with_subscriber(dispatch.clone()),
    );
    let term = tokio::time::timeout(3 * I, elector.wait_for_leadership())
        .await
        .expect("leads within 3·I");
    let epoch = term.epoch().expect("a fenced term").to_string();

    // A tick's own lines run in the caller's task, outside the election: the span the README
    // shows carries the term's epoch (and here the key and identity) onto them.
    elector
        .do_work(|term| {
            let span = tracing::info_span!(
                "sweep",
                key = %key,
                identity = elector.identity(),
                epoch = term.epoch(),
            );
            async {
                tracing::info!(target: "sweeper", "swept");
                Ok::<_, String>(())
            }
            .instrument(span)
        })
        .with_subscriber(dispatch)
        .await
        .unwrap();
    // One leader check in the term.
    tokio::time::sleep(I + I / 2).await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let lines = logged.0.lock().unwrap().clone();
    let ours: Vec<&Logged> = lines
        .iter()
        .filter(|l| l.target == "pg_elector" || l.target.starts_with("pg_elector::"))
        .collect();
    for line in &ours {
        assert_eq!(line.fields.get("key"), Some(&key.to_string()), "{line:?}");
        assert_eq!(
            line.fields.get("identity").map(String::as_str),
            Some("traced-a"),
            "{line:?}"
        );
    }
    for message in ["leadership acquired", "leadership released"] {
        let line = ours
            .iter()
            .find(|l| l.message() == message)
            .unwrap_or_else(|| panic!("no {message:?} line in {ours:#?}"));
        assert_eq!(line.fields.get("epoch"), Some(&epoch), "{line:?}");
    }
    let swept = lines
        .iter()
        .find(|l| l.message() == "swept")
        .expect("the tick's line");
    assert_eq!(swept.fields.get("key"), Some(&key.to_string()));
    assert_eq!(
        swept.fields.get("identity").map(String::as_str),
        Some("traced-a")
    );
    assert_eq!(swept.fields.get("epoch"), Some(&epoch));
    eprintln!(
        "{} lines of the crate, each with key and identity; epoch {epoch} on the term's",
        ours.len()
    );
}

/// What a role of its own (a monitoring role, say) needs to call `current_leader`: nothing
/// beyond connecting for the holder's pid and identity (`pg_locks` and the `application_name`
/// of `pg_stat_activity` are readable by all), `SELECT` on the epoch table once it exists
/// (the call reads it, and fails without the right), and `pg_read_all_stats` for the
/// leader's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_current_leader_needs_from_another_role() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 7);
    let admin = db.connect().await.unwrap();
    let role = roles::limited_role(&db, &admin, "watcher").await;
    let pool = roles::pool_as(&db, &role, 1);
    let watcher = pool.get().await.unwrap();

    // Without fencing: pid and identity, no address.
    let plain = replica_named(&db, key, Some("watched"));
    leads(&plain).await;
    let info = someone_leads(&watcher, key).await;
    assert_eq!(info.identity, "watched");
    assert_eq!(info.pid, the_holder(&admin, key).await);
    assert_eq!(
        info.client_addr, None,
        "the address needs pg_read_all_stats"
    );
    plain.stop().await.unwrap();

    // With fencing the epoch table exists, and the call reads it.
    let fenced = Replica::run(fenced_elector(db.pool(2), key, "watched", I));
    leads(&fenced).await;
    let denied = current_leader(&watcher, key)
        .await
        .expect_err("the epoch row needs SELECT");
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    admin
        .batch_execute(&format!("GRANT SELECT ON pg_elector_epochs TO \"{role}\""))
        .await
        .unwrap();
    let info = someone_leads(&watcher, key).await;
    assert_eq!(info.identity, "watched");
    assert_eq!(info.epoch, fenced.elector.term().epoch());
    assert_eq!(info.client_addr, None);

    admin
        .batch_execute(&format!("GRANT pg_read_all_stats TO \"{role}\""))
        .await
        .unwrap();
    let info = someone_leads(&watcher, key).await;
    assert_client_addr(&info);
    drop(watcher);
    drop(pool);
    fenced.stop().await.unwrap();
    roles::drop_role(&admin, &role).await;
}

/// `Elector::current_leader` is bounded: behind a partition (the pool's idle connection goes
/// through a proxy that forwards nothing) it fails within about two intervals (one for the
/// connection, one for the answer) instead of hanging, and the connection it gave up on is not
/// given back to the pool (the next call opens a new one once the network is back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_leader_fails_within_two_intervals_in_a_partition() {
    let _timing = timing();
    let db = fresh_db().await;
    let key = LockKey::new(0x1d, 9);
    let leader = replica_named(&db, key, Some("the-leader"));
    let proxy = proxy_beside(&leader).await;
    // A standby whose pool goes through the proxy; its tries keep a connection idle there.
    let watcher = Elector::builder(db.pool_via(proxy.addr(), 1), key)
        .check_interval(I)
        .build()
        .unwrap();
    let before = watcher.current_leader().await.unwrap().expect("a leader");
    assert_eq!(before.identity, "the-leader");
    proxy.blackhole();
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(10 * I, watcher.current_leader())
        .await
        .expect("current_leader does not hang in a partition");
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(pg_elector::Error::CurrentLeader(pg_elector::CurrentLeaderError::Timeout(bound))) if bound == I),
        "{outcome:?}"
    );
    assert!(
        took < 2 * I + I / 2,
        "failed after {took:?}; bound about two intervals (2·I + I/2)"
    );
    proxy.pass();
    let after = watcher.current_leader().await.unwrap().expect("a leader");
    assert_eq!(after.pid, before.pid);
    eprintln!("current_leader in a partition failed after {took:?}");
    leader.stop().await.unwrap();
}
