//! F5: the job tables. A role that may only read and write them (an administrator made them
//! from `ddl()`) runs jobs; a role that may not create them is told the statements to run; a
//! failed query is logged with the server's own message; tables under a schema and prefix that
//! need quoting work; a table dropped or emptied during a term is reported and handled by the
//! lost-state policy.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::capture::{Capture, Event};
use common::roles::{drop_role, limited_role, pool_as};
use common::schedules::ManualSchedule;
use common::*;
use pg_elector::Elector;
use pg_elector::schedule::{Job, LostState, Schedule};

const POLL: Duration = Duration::from_millis(50);

/// A role that may connect and nothing else, a pool of two that logs in as it, and the job
/// tables' statements, which that role may not run; `admin` is the database owner's.
struct Limited {
    admin: tokio_postgres::Client,
    role: String,
    pool: deadpool_postgres::Pool,
    ddl: String,
}

async fn limited(db: &TestDb) -> Limited {
    let admin = db.connect().await.unwrap();
    let role = limited_role(db, &admin, "sched").await;
    let pool = pool_as(db, &role, 2);
    let ddl = Schedule::new(&Elector::manual().0, pool.clone())
        .ddl()
        .unwrap();
    Limited {
        admin,
        role,
        pool,
        ddl,
    }
}

impl Limited {
    /// The administrator runs the statements and grants the role what the README says
    /// suffices.
    async fn make_tables(&self) {
        self.admin
            .batch_execute(&format!(
                "{ddl}; GRANT SELECT, INSERT, UPDATE ON pg_elector_jobs, pg_elector_job_runs \
                 TO \"{role}\"",
                ddl = self.ddl,
                role = self.role
            ))
            .await
            .unwrap();
    }

    /// Closes the pool, then drops the role.
    async fn drop(self) {
        drop(self.pool);
        drop_role(&self.admin, &self.role).await;
    }
}

/// The events captured in `capture` at `level`.
fn logged_at(capture: &Capture, level: tracing::Level) -> Vec<Event> {
    capture
        .events("")
        .into_iter()
        .filter(|e| e.level == level)
        .collect()
}

/// A schedule of one job every 100 ms on a manual elector that leads, counting its runs, its
/// events in `capture`.
struct Running {
    runs: Arc<AtomicUsize>,
    probe: pg_elector::background::Probe,
    sched: ManualSchedule,
}

fn start(schedule: impl FnOnce(&Elector) -> Schedule, capture: &Capture) -> Running {
    let (elector, control) = Elector::manual();
    control.promote();
    let runs = Arc::new(AtomicUsize::new(0));
    let schedule = schedule(&elector).poll_interval(POLL).job(
        Job::every("count", Duration::from_millis(100)),
        {
            let runs = runs.clone();
            move |_run| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, String>(()) }
            }
        },
    );
    let probe = schedule.probes().remove(0);
    Running {
        runs,
        probe,
        sched: ManualSchedule::spawn_captured(control, schedule, capture),
    }
}

impl Running {
    /// The job's runs so far.
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Cancels the schedule's shutdown and waits for it to return `Ok`.
    async fn stop(self) {
        self.sched.stop().await;
    }
}

mod f5 {
    use super::*;

    /// A role without `CREATE` is told the DDL, and runs jobs once an administrator ran it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_role_without_create_is_told_the_ddl_and_waits_for_it() {
        let _timing = timing();
        let db = fresh_db().await;
        let limited = limited(&db).await;
        let capture = Capture::default();
        let running = start(
            |elector| Schedule::new(elector, limited.pool.clone()),
            &capture,
        );

        // No tables, and no right to create them: said once, with the statements to run.
        tokio::time::sleep(10 * POLL).await;
        assert_eq!(running.runs(), 0, "no job runs without its tables");
        let said = capture.events("the job tables are not ready");
        assert!(!said.is_empty(), "the refusal is logged");
        assert_eq!(said[0].level, tracing::Level::ERROR);
        assert_eq!(
            said.iter()
                .filter(|e| e.level == tracing::Level::ERROR)
                .count(),
            1,
            "at ERROR once, not every poll: {said:?}"
        );
        let error = said[0].field("error");
        assert!(
            error.contains(&limited.ddl) && error.contains("permission denied for schema public"),
            "the statements to run, and the server's refusal: {error}"
        );

        // An administrator runs them and grants the role what the README says suffices.
        limited.make_tables().await;
        wait_for(Duration::from_secs(3), || running.runs() >= 3)
            .await
            .expect("the jobs run once the tables exist, at the next try");
        running.stop().await;

        // A later term (a restart of the process, say) finds the tables and runs at once.
        let capture = Capture::default();
        let running = start(
            |elector| Schedule::new(elector, limited.pool.clone()),
            &capture,
        );
        wait_for(Duration::from_secs(2), || running.runs() >= 3)
            .await
            .expect("a new term runs jobs with SELECT, INSERT and UPDATE alone");
        running.stop().await;
        let complaints: Vec<_> = capture
            .events("")
            .into_iter()
            .filter(|e| e.level <= tracing::Level::WARN)
            .collect();
        assert!(
            complaints.is_empty(),
            "nothing to complain about: {complaints:?}"
        );
        limited.drop().await;
    }

    /// A failed query of the job tables is logged with the server's message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_job_table_query_logs_the_server_s_message() {
        let _timing = timing();
        let db = fresh_db().await;
        let limited = limited(&db).await;
        limited.make_tables().await;
        let (admin, role) = (&limited.admin, &limited.role);
        let capture = Capture::default();
        let running = start(
            |elector| Schedule::new(elector, limited.pool.clone()),
            &capture,
        );
        wait_for(Duration::from_secs(2), || running.runs() >= 2)
            .await
            .expect("runs");

        // An operator takes a right away: every query that writes the job's row now fails.
        admin
            .batch_execute(&format!("REVOKE UPDATE ON pg_elector_jobs FROM \"{role}\""))
            .await
            .unwrap();
        let failed = || {
            capture
                .events("")
                .into_iter()
                .filter(|e| e.level == tracing::Level::WARN && !e.field("error").is_empty())
                .collect::<Vec<_>>()
        };
        wait_for(Duration::from_secs(2), || failed().len() >= 3)
            .await
            .expect("the failures are logged at WARN");
        let runs = running.runs();
        tokio::time::sleep(5 * POLL).await;
        assert!(running.runs() <= runs + 1, "no claim passes meanwhile");
        admin
            .batch_execute(&format!("GRANT UPDATE ON pg_elector_jobs TO \"{role}\""))
            .await
            .unwrap();
        wait_for(Duration::from_secs(2), || running.runs() >= runs + 3)
            .await
            .expect("the job runs on once the right is back");
        running.stop().await;

        let failed = failed();
        eprintln!("{} failures logged, e.g. {:?}", failed.len(), failed[0]);
        for event in &failed {
            let error = event.field("error");
            assert!(
                error.contains("ERROR 42501: permission denied for table pg_elector_jobs"),
                "the server's severity, code and message, not just \"db error\": {event:?}"
            );
        }
        let messages: std::collections::BTreeSet<&str> =
            failed.iter().map(|e| e.message()).collect();
        assert!(
            messages.contains("cannot claim or record the run"),
            "the claim's failure among them: {messages:?}"
        );
        limited.drop().await;
    }

    async fn drop_tables(db: &TestDb) {
        db.connect()
            .await
            .unwrap()
            .batch_execute("DROP TABLE pg_elector_jobs, pg_elector_job_runs")
            .await
            .unwrap();
    }

    /// Job tables dropped during a term are reported and made again, and the job starts over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn job_tables_dropped_in_a_term_are_made_again() {
        let _timing = timing();
        let db = fresh_db().await;
        let capture = Capture::default();
        let running = start(|elector| Schedule::new(elector, db.pool(2)), &capture);
        wait_for(Duration::from_secs(2), || running.runs() >= 3)
            .await
            .expect("runs");
        drop_tables(&db).await;
        let runs = running.runs();
        wait_for(Duration::from_secs(2), || running.runs() >= runs + 5)
            .await
            .expect("the job runs on, on tables made again");
        running.stop().await;

        let lost = logged_at(&capture, tracing::Level::ERROR);
        assert_eq!(lost.len(), 1, "reported once, at ERROR: {lost:?}");
        assert!(
            lost[0].field("error").contains("does not exist")
                && lost[0].field("policy") == "StartFromNow",
            "with the server's message and the policy applied: {:?}",
            lost[0]
        );
        let warnings = logged_at(&capture, tracing::Level::WARN).len();
        assert!(warnings <= 3, "not a WARN every poll: {warnings}");
        let stored: i64 = db
            .connect()
            .await
            .unwrap()
            .query_one(
                "SELECT count(*) FROM pg_elector_job_runs WHERE outcome = 'succeeded'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(stored >= 4, "the new tables hold the runs since: {stored}");
    }

    /// With `LostState::Halt`, lost job state fails the probe and the job runs no more in this
    /// process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_halt_lost_job_state_fails_the_probe_and_stops_the_job() {
        let _timing = timing();
        let db = fresh_db().await;
        let capture = Capture::default();
        let running = start(
            |elector| Schedule::new(elector, db.pool(2)).on_lost_state(LostState::Halt),
            &capture,
        );
        wait_for(Duration::from_secs(2), || running.runs() >= 3)
            .await
            .expect("runs");
        assert!(running.probe.status().is_pass());
        drop_tables(&db).await;
        wait_for(Duration::from_secs(2), || !running.probe.status().is_pass())
            .await
            .expect("the probe fails");
        let runs = running.runs();
        tokio::time::sleep(10 * POLL).await;
        assert_eq!(running.runs(), runs, "the job runs no more");
        let status = format!("{:?}", running.probe.status());
        assert!(
            status.contains("lost"),
            "the probe names the cause: {status}"
        );

        // Not even in a later term of this process.
        running.sched.control.demote();
        tokio::time::sleep(2 * POLL).await;
        running.sched.control.promote();
        tokio::time::sleep(10 * POLL).await;
        assert_eq!(running.runs(), runs, "halted until the process restarts");
        assert!(!running.probe.status().is_pass(), "still failing");
        running.stop().await;
        let lost = logged_at(&capture, tracing::Level::ERROR);
        assert_eq!(lost.len(), 1, "reported once, at ERROR: {lost:?}");
        assert_eq!(lost[0].field("policy"), "Halt");
    }

    /// Tables under a schema and prefix that need quoting are made and used.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tables_needing_quoting_are_made_and_used() {
        let _timing = timing();
        let db = fresh_db().await;
        let admin = db.connect().await.unwrap();
        admin.batch_execute("CREATE SCHEMA \"Ops\"").await.unwrap();
        let (schema, prefix) = (Some("Ops"), "My \"jobs\"; --");
        let capture = Capture::default();
        let handle = std::sync::Mutex::new(None);
        let running = start(
            |elector| {
                let schedule = Schedule::new(elector, db.pool(2)).tables(schema, prefix);
                *handle.lock().unwrap() = Some(schedule.handle());
                schedule
            },
            &capture,
        );
        wait_for(Duration::from_secs(2), || running.runs() >= 3)
            .await
            .expect("runs on the quoted tables");
        let handle = handle.lock().unwrap().take().unwrap();
        handle
            .trigger("count")
            .await
            .expect("a trigger finds the job");
        wait_for_async(Duration::from_secs(2), || async {
            query_i64(
                &admin,
                "SELECT count(*) FROM \"Ops\".\"My \"\"jobs\"\"; --job_runs\" \
                 WHERE kind = 'triggered'",
            )
            .await
                == 1
        })
        .await
        .expect("the triggered run is recorded in the quoted table");
        running.stop().await;

        let tables: Vec<String> = first_column(
            &admin,
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'Ops' ORDER BY 1",
        )
        .await;
        assert_eq!(
            tables,
            [
                "My \"jobs\"; --job_runs",
                "My \"jobs\"; --job_runs_pkey",
                "My \"jobs\"; --job_runs_running",
                "My \"jobs\"; --jobs",
                "My \"jobs\"; --jobs_pkey",
            ],
            "the names as given, in the schema as given"
        );
        let succeeded: i64 = admin
            .query_one(
                "SELECT count(*) FROM \"Ops\".\"My \"\"jobs\"\"; --job_runs\" \
             WHERE job = 'count' AND outcome = 'succeeded'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(succeeded >= 3, "{succeeded}");
        let public: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE '%job%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
        assert_eq!(public, 0, "nothing made under the default names");
    }
}
