//! The few Linux calls the command line needs that std does not wrap: signals to a process
//! group, the parent-death signal, a child subreaper, reaping any child, waiting for a signal.
//! Every `unsafe` of the crate is here, each a plain system call on plain integers.
#![allow(unsafe_code)]

use std::io;
use std::time::Duration;

pub(crate) use libc::{SIGCHLD, SIGHUP, SIGINT, SIGKILL, SIGTERM, SIGUSR1, SIGUSR2};

/// Sends `signal` to every process of the group `pgid`. `Ok(false)`: the group is empty.
pub(crate) fn signal_group(pgid: i32, signal: i32) -> io::Result<bool> {
    // SAFETY: kill(2) with plain integers.
    if unsafe { libc::kill(-pgid, signal) } == 0 {
        return Ok(true);
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        e => Err(e),
    }
}

/// Whether the process `pid` is stopped (SIGSTOP, SIGTSTP, a debugger's stop), as `/proc`
/// says (`false` when it cannot be read); and its scheduler counters (`/proc/PID/schedstat`:
/// time on a CPU, time waiting, timeslices), which change whenever it ran.
pub(crate) fn stopped_state(pid: i32) -> (bool, Option<String>) {
    let stopped = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command's name, which is in parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
    });
    let ran = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok();
    (stopped, ran)
}

/// Ends this process by SIGUSR2 (its default action ends it), which no blocked mask delays:
/// the keeper's way to say that it killed the group because `pg-elector` was stopped.
pub(crate) fn end_by_sigusr2() -> i32 {
    // SAFETY: signal(2), sigprocmask(2) and raise(3) with plain integers and a set of our
    // own: SIGUSR2's default action, unblocked, then raised.
    unsafe {
        libc::signal(libc::SIGUSR2, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGUSR2);
    }
    crate::exit::INTERNAL
}

/// Sends `signal` to the process `pid`.
pub(crate) fn signal_process(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: kill(2) with plain integers.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to send `signal` to this process when the thread that started it ends
/// (async-signal-safe: callable between fork and exec).
pub(crate) fn parent_death_signal(signal: i32) -> io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only.
    let done = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes this process the one that inherits its orphaned descendants (instead of init), so
/// that it can reap them and knows when they are all gone.
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only.
    let done = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// This process's parent.
pub(crate) fn parent_pid() -> i32 {
    // SAFETY: getppid(2) cannot fail.
    unsafe { libc::getppid() }
}

/// This process's id.
pub(crate) fn own_pid() -> i32 {
    std::process::id() as i32
}

/// What reaping found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reaped {
    /// A child ended: its pid and its status as a shell reports it (the exit code, or 128 and
    /// the signal that killed it).
    Child(i32, i32),
    /// Children remain, none of them ended.
    Running,
    /// No child is left.
    None,
}

/// Reaps one ended child, without waiting.
pub(crate) fn reap_one() -> Reaped {
    let mut status = 0;
    // SAFETY: waitpid(2) writes one int through a valid pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    match pid {
        0 => Reaped::Running,
        -1 => Reaped::None,
        pid if libc::WIFEXITED(status) => Reaped::Child(pid, libc::WEXITSTATUS(status)),
        pid if libc::WIFSIGNALED(status) => Reaped::Child(pid, 128 + libc::WTERMSIG(status)),
        // Stopped or continued children are not reported without WUNTRACED/WCONTINUED.
        _ => Reaped::Running,
    }
}

/// The set of signals the keeper waits for instead of handling them.
fn keeper_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        // SIGUSR2 too: blocked, so that only the keeper's own ends it (`end_by_sigusr2`).
        for signal in [SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2] {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Blocks the signals the keeper waits for, so that they stay pending until
/// [`wait_for_signal`] takes them (the command's spawn unblocks them again before its exec:
/// [`unblock_signals_std`]).
pub(crate) fn block_keeper_signals() -> io::Result<()> {
    let set = keeper_set();
    // SAFETY: sigprocmask(2) reads a valid set; the old mask is not wanted.
    let done = unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits at most `timeout` (`None`: without end) for one of the keeper's signals; `None`
/// when none came.
pub(crate) fn wait_for_signal(timeout: Option<Duration>) -> Option<i32> {
    let set = keeper_set();
    let timeout = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let pointer = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: sigtimedwait(2) reads a valid set and an optional valid timespec.
    let signal = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), pointer) };
    (signal > 0).then_some(signal)
}

/// As [`die_with_parent`], for a command started with std (by the single-threaded keeper).
pub(crate) fn die_with_parent_std(command: &mut std::process::Command, signal: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: as in `die_with_parent`.
    unsafe {
        command.pre_exec(move || parent_death_signal(signal));
    }
}

/// Makes `command`'s process start with no signal blocked, whatever the mask of the thread
/// that starts it.
pub(crate) fn unblock_signals_std(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only makes sigemptyset(3) and
    // sigprocmask(2) calls on a set of its own, both async-signal-safe; it allocates nothing
    // and takes no lock.
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
}

/// Makes `command`'s process receive `signal` when the thread that starts it ends.
pub(crate) fn die_with_parent(command: &mut tokio::process::Command, signal: i32) {
    // SAFETY: the closure runs between fork and exec and only makes one prctl(2) call, which
    // is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || parent_death_signal(signal));
    }
}

/// Every descendant of this process (the orphans it reaps as a subreaper included), from
/// `/proc`: its children, theirs, and so on.
pub(crate) fn descendants() -> Vec<i32> {
    let mut found = Vec::new();
    let mut parents = vec![own_pid()];
    while let Some(parent) = parents.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|pid| pid.parse().ok())
            {
                found.push(child);
                parents.push(child);
            }
        }
    }
    found
}

/// The process group of `pid`; `None` when it is gone.
pub(crate) fn group_of(pid: i32) -> Option<i32> {
    // SAFETY: getpgid(2) with a plain integer.
    let group = unsafe { libc::getpgid(pid) };
    (group >= 0).then_some(group)
}
