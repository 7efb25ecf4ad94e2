//! The integration tests, in one binary: one test process, one shared server, and the
//! timing-sensitive tests spread over a few slots (`pg_elector_testkit::replicas::timing`) rather than
//! run one binary after another. Each module is the tests of one concern, named as before.

mod common;

mod config;
mod db_failover;
mod db_failover_epochs;
mod db_failover_schedule;
mod demotion;
mod drain;
mod events;
mod fast_demotion;
mod fast_takeover;
mod fencing;
mod gate;
mod identity;
mod key;
mod lifecycle;
mod no_overlap;
mod pitfalls;
mod preference;
mod preference_faults;
mod processes;
mod readiness;
mod resign;
mod restart;
mod schedule;
mod schedule_changes;
mod schedule_failover;
mod schedule_hardening;
mod schedule_metrics;
mod schedule_partial;
mod schedule_tables;
mod session_bounds;
mod shards;
mod shards_background;
mod shards_faults;
mod shards_schedule;
mod standby;
mod status;
mod supervisor;
mod ticker;
mod while_leader;
mod work;
mod wrong_servers;
