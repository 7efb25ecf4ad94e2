//! `pg-elector` as users run it: real processes of the binary against a real server, with
//! shell commands that record what they do (their starts, their ends, their grandchildren).

mod common;
mod cron;
mod handover;
mod partition;
mod run;
mod status;
mod statuses;
mod tls;
