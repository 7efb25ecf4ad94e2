//! The keeper: a small process between `pg-elector run` and the command, so that the
//! command's whole process group ends with the lead, even when `pg-elector` itself dies.
//!
//! `pg-elector run` starts the keeper (this same binary, hidden subcommand `__keeper`) with
//! the parent-death signal set to SIGUSR1. The keeper starts the command in a new process
//! group and becomes the subreaper of everything the command starts, then waits for signals:
//!
//! - SIGTERM, SIGINT or SIGHUP (from `pg-elector` at a graceful end): SIGTERM to the command's
//!   group, SIGKILL after the grace;
//! - the command ends: SIGTERM to what it left behind in its group, SIGKILL after the grace;
//! - SIGUSR1 (the lead is lost, or `pg-elector` died): SIGKILL to the group at once;
//! - `pg-elector` found stopped (SIGSTOP, a debugger) for two check intervals: SIGKILL to
//!   the group, before the server can free the lock of a leader that went silent (four
//!   intervals after its last check), since a stopped `pg-elector` can end nothing. The
//!   keeper then ends by SIGUSR2, for `pg-elector` to tell this end from the command's own.
//!
//! A process that left the group (`setsid`, a daemon's double fork) is still the keeper's
//! descendant, and comes to the keeper when its parent dies: each signal to the group goes to
//! every child of the keeper outside the group too. The keeper exits only once every process
//! it reaps is gone, sending SIGKILL again every second while any is left (one stuck in the
//! kernel), with the command's status as a shell reports it. So when `pg-elector` sees the
//! keeper exit, everything the command started is gone.

use std::ffi::OsString;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::exit;
use crate::os::{self, Reaped};

/// How often the keeper sends SIGKILL again while processes are left after one.
const AFTER_KILL: Duration = Duration::from_secs(1);

/// How many looks at `pg-elector`'s state per stop limit: the kill comes at most a
/// sixteenth of the limit after it (an eighth of an interval).
const LOOKS_PER_LIMIT: u32 = 16;

/// The least time between two looks at `pg-elector`'s state.
const LEAST_LOOK: Duration = Duration::from_millis(5);

/// What the keeper does next.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// Nothing yet.
    Wait,
    /// SIGTERM to the command's group.
    Terminate,
    /// SIGKILL to the command's group.
    Kill,
    /// Exit with this status.
    Exit(i32),
}

/// The keeper's state, apart from its I/O (unit-tested without processes).
#[derive(Debug)]
struct Keeper {
    grace: Duration,
    /// The command's status once it ended.
    status: Option<i32>,
    /// When the group was asked to end.
    terminated: Option<Instant>,
    /// When the group was last killed.
    killed: Option<Instant>,
    /// How many times it was killed.
    kills: u32,
    /// How long `pg-elector` may be seen stopped before the group is killed.
    stop_limit: Duration,
    /// Since when `pg-elector` has been seen stopped without running in between.
    stopped_since: Option<Instant>,
    /// Its scheduler counters at the last look, to tell a process that ran between two
    /// looks (stopped and continued, as a CPU limiter does) from one that stayed stopped.
    ran: Option<String>,
    /// Whether the group was killed because `pg-elector` was stopped.
    killed_for_stop: bool,
}

impl Keeper {
    fn new(grace: Duration, stop_limit: Duration) -> Self {
        Self {
            grace,
            status: None,
            terminated: None,
            killed: None,
            kills: 0,
            stop_limit,
            stopped_since: None,
            ran: None,
            killed_for_stop: false,
        }
    }

    /// `pg-elector` was seen stopped or not at `now`, with its scheduler counters `ran`:
    /// stopped for the limit without running in between, the command is killed (unless it
    /// ended already).
    fn parent_seen(&mut self, (stopped, ran): (bool, Option<String>), now: Instant) -> Action {
        let ran_since = ran.is_some() && self.ran.is_some() && ran != self.ran;
        self.ran = ran;
        if !stopped {
            self.stopped_since = None;
            return Action::Wait;
        }
        if ran_since {
            self.stopped_since = Some(now);
        }
        let since = *self.stopped_since.get_or_insert(now);
        if now < since + self.stop_limit || self.killed.is_some() || self.status.is_some() {
            return Action::Wait;
        }
        self.killed_for_stop = true;
        self.kill(now)
    }

    /// The command ended with `status`: what it left in its group is asked to end too.
    fn command_ended(&mut self, status: i32, now: Instant) -> Action {
        self.status = Some(status);
        self.terminate(now)
    }

    /// The group is asked to end (a graceful end of the term).
    fn terminate(&mut self, now: Instant) -> Action {
        if self.terminated.is_some() || self.killed.is_some() {
            return Action::Wait;
        }
        self.terminated = Some(now);
        Action::Terminate
    }

    /// The group is killed at once (a lost term, or `pg-elector` died).
    fn kill(&mut self, now: Instant) -> Action {
        if self.killed.is_some() {
            return Action::Wait;
        }
        self.killed = Some(now);
        self.kills = 1;
        Action::Kill
    }

    /// After reaping: `children_left` says whether any process is left to reap.
    fn tick(&mut self, children_left: bool, now: Instant) -> Action {
        if !children_left {
            return Action::Exit(self.exit_status());
        }
        match (self.terminated, self.killed) {
            (_, Some(killed)) if now >= killed + AFTER_KILL => {
                self.killed = Some(now);
                self.kills += 1;
                Action::Kill
            }
            (Some(asked), None) if now >= asked + self.grace => self.kill(now),
            _ => Action::Wait,
        }
    }

    /// Whether the group was killed.
    fn is_killed(&self) -> bool {
        self.killed.is_some()
    }

    /// Whether the last kill repeats an earlier one (processes were left after it).
    fn killed_again(&self) -> bool {
        self.kills > 1
    }

    /// The command's status; killed before it was reaped, as a SIGKILL reports it.
    fn exit_status(&self) -> i32 {
        self.status.unwrap_or(128 + os::SIGKILL)
    }

    /// How long to wait for a signal before the next [`tick`](Self::tick): until the
    /// next kill or the grace's end, and at most a look at `pg-elector`'s state away until the
    /// group is killed.
    fn next_deadline(&self, now: Instant) -> Duration {
        let look = (self.stop_limit / LOOKS_PER_LIMIT).max(LEAST_LOOK);
        let at = match (self.terminated, self.killed) {
            (_, Some(killed)) => return (killed + AFTER_KILL).saturating_duration_since(now),
            (Some(asked), None) => asked + self.grace,
            (None, None) => return look,
        };
        at.saturating_duration_since(now).min(look)
    }
}

/// The keeper's main: starts `command`, keeps its group, exits with its status (or ends by
/// SIGUSR2 when it killed the group because `pg-elector` was stopped for `stop_limit`).
/// `parent` is the `pg-elector` that started it (gone already: the group is killed at once).
pub(crate) fn main(
    grace: Duration,
    stop_limit: Duration,
    parent: i32,
    command: &[OsString],
) -> i32 {
    if let Err(e) = os::block_keeper_signals().and_then(|()| os::become_subreaper()) {
        eprintln!("pg-elector: cannot keep the command's processes: {e}");
        return exit::INTERNAL;
    }
    let child = match spawn(command) {
        Ok(child) => child,
        Err(status) => return status,
    };
    let group = child.id() as i32;
    let mut target = Target {
        group,
        empty: false,
    };
    let mut keeper = Keeper::new(grace, stop_limit);
    // The parent may have died before the parent-death signal was set.
    if os::parent_pid() != parent {
        target.act(keeper.kill(Instant::now()));
    }
    loop {
        let signal = os::wait_for_signal(Some(keeper.next_deadline(Instant::now())));
        let now = Instant::now();
        let action = match signal {
            Some(os::SIGUSR1) => keeper.kill(now),
            Some(os::SIGTERM | os::SIGINT | os::SIGHUP) => keeper.terminate(now),
            _ => Action::Wait,
        };
        target.act(action);
        if keeper.parent_seen(os::stopped_state(parent), now) == Action::Kill {
            eprintln!(
                "pg-elector: pg-elector was stopped for {stop_limit:?}: killing the command's group, since another replica may lead soon"
            );
            target.act(Action::Kill);
        }
        let children_left = loop {
            match os::reap_one() {
                Reaped::Child(pid, status) if pid == group => {
                    target.act(keeper.command_ended(status, Instant::now()));
                }
                Reaped::Child(..) => {}
                Reaped::Running => break true,
                Reaped::None => break false,
            }
        };
        match keeper.tick(children_left, Instant::now()) {
            Action::Exit(_) if keeper.killed_for_stop => return os::end_by_sigusr2(),
            Action::Exit(status) => return status,
            Action::Kill if keeper.killed_again() => {
                eprintln!(
                    "pg-elector: processes the command started are still there after SIGKILL: killing them again"
                );
                target.act(Action::Kill);
            }
            // After a kill, the orphans that came to the keeper since (their parent killed)
            // are killed as they come.
            Action::Wait if keeper.is_killed() && children_left => target.act(Action::Kill),
            action => target.act(action),
        }
    }
}

/// Starts `command` in a process group of its own; a shell's status when it cannot be run.
fn spawn(command: &[OsString]) -> Result<std::process::Child, i32> {
    let (program, args) = command.split_first().ok_or(exit::USAGE)?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    // Should the keeper itself be killed, its command does not run on unseen.
    os::die_with_parent_std(&mut cmd, os::SIGKILL);
    // The keeper blocks the signals it waits for, and exec keeps a mask: a command started
    // with SIGTERM blocked never sees the graceful end, only the SIGKILL after the grace.
    os::unblock_signals_std(&mut cmd);
    cmd.spawn().map_err(|e| {
        let program = program.to_string_lossy();
        if e.kind() == std::io::ErrorKind::NotFound {
            eprintln!("pg-elector: {program}: command not found");
            exit::NOT_FOUND
        } else {
            eprintln!("pg-elector: {program}: cannot run it: {e}");
            exit::CANNOT_RUN
        }
    })
}

/// The command's process group, signalled until it is found empty (then its id may be
/// another group's).
struct Target {
    group: i32,
    empty: bool,
}

impl Target {
    /// Sends the action's signal to the command's group, and to every descendant of the
    /// keeper that left it.
    fn act(&mut self, action: Action) {
        let signal = match action {
            Action::Terminate => os::SIGTERM,
            Action::Kill => os::SIGKILL,
            Action::Wait | Action::Exit(_) => return,
        };
        if !self.empty {
            match os::signal_group(self.group, signal) {
                Ok(any) => self.empty = !any,
                Err(e) => eprintln!(
                    "pg-elector: cannot signal the command's process group {}: {e}",
                    self.group
                ),
            }
        }
        for process in os::descendants() {
            if os::group_of(process).is_some_and(|g| g != self.group) {
                let _ = os::signal_process(process, signal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);
    const STOP_LIMIT: Duration = Duration::from_millis(400);

    #[test]
    fn a_command_that_ends_alone_is_reported_with_its_status() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        assert_eq!(keeper.command_ended(3, now), Action::Terminate);
        assert_eq!(keeper.tick(false, now), Action::Exit(3));
    }

    #[test]
    fn what_the_command_left_behind_gets_the_grace_then_a_kill() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        assert_eq!(keeper.command_ended(0, now), Action::Terminate);
        assert_eq!(keeper.tick(true, now + GRACE / 2), Action::Wait);
        assert_eq!(
            keeper.next_deadline(now + GRACE / 2),
            STOP_LIMIT / LOOKS_PER_LIMIT,
            "the next look at pg-elector's state comes before the grace's end"
        );
        assert_eq!(keeper.tick(true, now + GRACE), Action::Kill);
        assert_eq!(keeper.tick(true, now + GRACE), Action::Wait);
        assert_eq!(keeper.tick(false, now + GRACE), Action::Exit(0));
    }

    #[test]
    fn a_graceful_end_terminates_once_and_kills_after_the_grace() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        assert_eq!(keeper.next_deadline(now), STOP_LIMIT / LOOKS_PER_LIMIT);
        assert_eq!(keeper.terminate(now), Action::Terminate);
        assert_eq!(
            keeper.terminate(now),
            Action::Wait,
            "its own SIGTERM comes back"
        );
        assert_eq!(keeper.command_ended(143, now), Action::Wait);
        assert_eq!(keeper.tick(false, now), Action::Exit(143));
    }

    #[test]
    fn a_lost_lead_kills_at_once_and_again_while_processes_are_left() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        assert_eq!(keeper.kill(now), Action::Kill);
        assert!(!keeper.killed_again());
        assert_eq!(keeper.terminate(now), Action::Wait);
        assert_eq!(keeper.tick(true, now), Action::Wait);
        assert_eq!(keeper.tick(true, now + AFTER_KILL), Action::Kill);
        assert!(keeper.killed_again());
        assert_eq!(keeper.tick(true, now + AFTER_KILL), Action::Wait);
        assert_eq!(keeper.tick(false, now + AFTER_KILL), Action::Exit(137));
    }

    #[test]
    fn a_stopped_pg_elector_gets_its_group_killed_after_the_limit() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        let stopped = |ran: &str| (true, Some(ran.to_owned()));
        assert_eq!(keeper.parent_seen(stopped("1 0 1"), now), Action::Wait);
        assert_eq!(
            keeper.parent_seen((false, Some("2 0 2".into())), now + STOP_LIMIT / 2),
            Action::Wait,
            "running again: the stop is forgotten"
        );
        let at = now + STOP_LIMIT;
        assert_eq!(keeper.parent_seen(stopped("3 0 3"), at), Action::Wait);
        assert_eq!(
            keeper.parent_seen(stopped("3 0 3"), at + STOP_LIMIT / 2),
            Action::Wait
        );
        assert_eq!(
            keeper.parent_seen(stopped("3 0 3"), at + STOP_LIMIT),
            Action::Kill
        );
        assert!(keeper.killed_for_stop);
        assert_eq!(
            keeper.parent_seen(stopped("3 0 3"), at + 2 * STOP_LIMIT),
            Action::Wait,
            "killed once; the kill repeats as any kill does"
        );
        assert_eq!(keeper.next_deadline(at + STOP_LIMIT), AFTER_KILL);
    }

    #[test]
    fn a_pg_elector_stopped_at_each_look_but_running_between_is_not_killed() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        for n in 0..10u32 {
            let ran = format!("{n} 0 {n}");
            assert_eq!(
                keeper.parent_seen((true, Some(ran)), now + n * STOP_LIMIT / 2),
                Action::Wait,
                "look {n}: it ran since the last one (a CPU limiter's stops)"
            );
        }
    }

    #[test]
    fn a_command_that_ended_is_not_reported_killed_for_a_stop() {
        let (mut keeper, now) = (Keeper::new(GRACE, STOP_LIMIT), Instant::now());
        assert_eq!(keeper.command_ended(0, now), Action::Terminate);
        keeper.parent_seen((true, None), now);
        assert_eq!(
            keeper.parent_seen((true, None), now + STOP_LIMIT),
            Action::Wait
        );
        assert!(!keeper.killed_for_stop);
        assert_eq!(keeper.tick(false, now + STOP_LIMIT), Action::Exit(0));
    }

    #[test]
    fn the_looks_have_a_floor() {
        let keeper = Keeper::new(GRACE, Duration::ZERO);
        assert_eq!(keeper.next_deadline(Instant::now()), LEAST_LOOK);
    }
}
