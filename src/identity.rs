//! A replica's default identity, and whether PostgreSQL keeps an identity whole in
//! `application_name`.

/// The most of an `application_name` PostgreSQL keeps: `NAMEDATALEN - 1` bytes.
const APPLICATION_NAME_BYTES: usize = 63;

/// Whether PostgreSQL shows `identity` as it is in `application_name`: at most
/// [`APPLICATION_NAME_BYTES`] bytes, each printable ASCII (it replaces any other byte). A
/// replica with a preference is found by its identity in both its candidates row and
/// `pg_stat_activity`, so it needs one that both show alike.
pub(crate) fn kept_whole(identity: &str) -> bool {
    identity.len() <= APPLICATION_NAME_BYTES && identity.bytes().all(|b| (b' '..=b'~').contains(&b))
}

/// `<hostname>-<pid>`, so that the whole is kept in `application_name` as it is: a character
/// of the host name outside printable ASCII becomes `-`, and a host name too long keeps its
/// end (a pod's name ends with what tells it from its siblings).
pub(crate) fn default_identity() -> String {
    let pid = format!("-{}", std::process::id());
    let host: Vec<u8> = hostname()
        .bytes()
        .map(|b| if (b' '..=b'~').contains(&b) { b } else { b'-' })
        .collect();
    let keep = APPLICATION_NAME_BYTES
        .saturating_sub(pid.len())
        .min(host.len());
    let tail = String::from_utf8_lossy(&host[host.len() - keep..]);
    format!("{tail}{pid}")
}

#[cfg(target_os = "linux")]
fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

#[cfg(not(target_os = "linux"))]
fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown-host".to_owned())
}
