//! Database roles for the least-privilege tests (`fencing`, `identity`, `schedule_tables`): a
//! role that may only connect, a pool that logs in as a role, and the role's drop.

use deadpool_postgres::Pool;
use pg_elector_testkit::TestDb;
use pg_elector_testkit::server::config::pool_from_config;

/// A role named `{prefix}_{database}` that may connect to `db` and nothing else (no CREATE on
/// `public`), made by `admin`; dropped by [`drop_role`].
pub async fn limited_role(db: &TestDb, admin: &tokio_postgres::Client, prefix: &str) -> String {
    let role = format!("{prefix}_{}", db.name());
    admin
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             GRANT CONNECT ON DATABASE \"{db}\" TO \"{role}\"",
            db = db.name()
        ))
        .await
        .unwrap();
    role
}

/// A pool of `size` connections to `db` that log in as `role`.
pub fn pool_as(db: &TestDb, role: &str, size: usize) -> Pool {
    let mut config = db.config();
    config.user(role);
    pool_from_config(config, size)
}

/// Drops what `role` owns, then the role.
pub async fn drop_role(admin: &tokio_postgres::Client, role: &str) {
    admin
        .batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .await
        .unwrap();
}
