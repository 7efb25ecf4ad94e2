//! The `/proc` readers: a process's CPU time and memory, the machine's busy time.

/// One process's `/proc/<pid>/stat` fields the benchmarks use.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stat {
    /// The parent's pid.
    pub ppid: i32,
    /// utime + stime, in clock ticks.
    pub own: u64,
    /// cutime + cstime: reaped children, in clock ticks.
    pub reaped: u64,
}

/// `/proc/<pid>/stat` of process `pid`, if it is alive.
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may contain anything.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17.
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<i64>().ok());
    Some(Stat {
        ppid: field(4)? as i32,
        own: (field(14)? + field(15)?) as u64,
        reaped: (field(16)? + field(17)?) as u64,
    })
}

/// utime + stime of this process, in clock ticks.
pub fn own_cpu_ticks() -> u64 {
    stat(std::process::id() as i32)
        .expect("/proc/self/stat")
        .own
}

/// The live processes whose parent is `parent`.
pub fn children_of(parent: i32) -> Vec<(i32, Stat)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .filter(|(_, s)| s.ppid == parent)
        .collect()
}

/// The whole machine's busy time so far (clock ticks, every CPU): the first line of
/// /proc/stat without idle, iowait and steal.
pub fn machine_ticks() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?.to_owned();
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq (guest time is inside user; steal,
            // the hypervisor's, is left out)
            Some(v.iter().take(7).sum::<u64>() - v.get(3)? - v.get(4)?)
        })
        .unwrap_or(0)
}

/// `VmRSS` of process `pid`, in kB, if it is alive.
pub fn rss_kb(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's on every architecture, if that
/// fails).
pub fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A PostgreSQL server's CPU so far (clock ticks): the postmaster, its live children, and its
/// reaped children; and how many children it has now.
pub fn server_ticks(postmaster: i32) -> (u64, usize) {
    let pm = stat(postmaster).unwrap_or_default();
    let children = children_of(postmaster);
    let live: u64 = children.iter().map(|(_, s)| s.own).sum();
    (pm.own + pm.reaped + live, children.len())
}

/// The postmaster's pid, from the first line of `postmaster.pid` in the data directory.
pub fn postmaster_pid(data_dir: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}
