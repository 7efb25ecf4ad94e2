//! The errors' texts, against a real server where one is needed.

use super::{CurrentLeaderError, Error, chain};
use crate::{Elector, LockKey};
use pg_elector_testkit::PgServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_current_leader_says_what_the_server_said() {
    let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
    let db = server.create_database().await.unwrap();
    let key = LockKey::new(12, 1);
    // Someone holds the lock, so `current_leader` goes on to read the epoch row, from a
    // fencing table that was never created.
    let holder = db.connect().await.unwrap();
    holder
        .execute(
            "SELECT pg_advisory_lock($1::int4, $2::int4)",
            &[&key.class(), &key.object()],
        )
        .await
        .unwrap();
    let elector = Elector::builder(db.pool(1), key)
        .fencing(true)
        .fencing_table(None, "no_such_epochs")
        .build()
        .unwrap();
    let error = elector
        .current_leader()
        .await
        .expect_err("the epoch table is missing");
    assert!(
        matches!(error, Error::CurrentLeader(CurrentLeaderError::Query(_))),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with("current_leader: the query failed: ")
            && text.contains("ERROR 42P01: relation \"no_such_epochs\" does not exist"),
        "{text}"
    );
    assert!(
        std::error::Error::source(&error).is_none(),
        "the text carries the cause, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_refuses_says_what_the_server_said() {
    let server = PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
    let db = server.create_database().await.unwrap();
    let mut config = db.config();
    config.dbname("no_such_database");
    let pool = pg_elector_testkit::server::config::pool_from_config(config, 1);
    let elector = Elector::builder(pool, LockKey::new(12, 2)).build().unwrap();
    let error = elector
        .current_leader()
        .await
        .expect_err("no such database");
    assert!(
        matches!(error, Error::CurrentLeader(CurrentLeaderError::Pool(_))),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with("current_leader: the pool could not hand out a connection: ")
            && text.contains("FATAL 3D000: ")
            && text.contains("\"no_such_database\" does not exist"),
        "{text}"
    );
}

#[test]
fn a_chain_without_repeats() {
    #[derive(Debug, thiserror::Error)]
    #[error("outer: inner")]
    struct Outer(#[source] Inner);
    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;
    assert_eq!(chain(&Outer(Inner)), "outer: inner");
    assert_eq!(chain(&Inner), "inner");
}
