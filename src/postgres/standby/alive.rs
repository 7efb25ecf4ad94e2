//! What a standby with a preference writes at each try: its row of the candidates table (it
//! is alive), from which it learns whether a live standby outranks it; and what one without a
//! preference reads when it holds a waiting slot.

use super::*;

/// What a standby with a preference remembers of saying it is alive: its failures and the
/// duplicates of its identity it saw, for [`Repeats`], and the `live_until` its last upsert
/// wrote, by which the next one sees another replica of the key with the same identity.
#[derive(Default)]
pub(super) struct Alive {
    pub(super) repeats: Repeats,
    pub(super) duplicates: Repeats,
    pub(super) written: Option<i64>,
}

/// Whether a live standby outranks this one (see [`candidates`](super::candidates)), as a
/// standby learns it before each try:
/// - with a preference, it says it is alive (its row upserted), unless it stays quiet after a
///   lead it could not keep ([`Backoff`]) or after a try that failed;
/// - without one, with fast takeover, it reads the table only while it holds a waiting slot
///   (at most three standbys a key), which it gives up if outranked, and while it is outranked;
/// - otherwise it reads nothing.
///
/// A failure is logged and counts as not outranked: the try goes on, and this replica only
/// counts as less preferred than it is.
pub(super) async fn outranked(
    pg: &PgSettings,
    reads: bool,
    quiet: bool,
    alive: &mut Alive,
) -> bool {
    let bound = pg.interval.max(MIN_TRY_BOUND);
    let said = match pg.preference {
        Some(_) if quiet => return false,
        Some(preference) => {
            let candidate = candidates::Candidate {
                table: &pg.candidates,
                key: pg.key,
                identity: &pg.identity,
                preference,
                interval: pg.interval,
                waits: pg.fast_takeover,
                written_before: alive.written,
            };
            let registered = candidates::register(&pg.pool, &candidate, bound).await;
            registered.map(|registered| said_alive(pg, registered, alive))
        }
        None if reads && pg.fast_takeover => {
            match candidates::Gate::new(Some(0), &pg.identity, &pg.candidates) {
                Some(gate) => candidates::outranked(&pg.pool, gate, pg.key, bound).await,
                None => return false,
            }
        }
        None => return false,
    };
    if said.is_err() {
        // A lost answer may have written a row this replica does not know of.
        alive.written = None;
    }
    let repeats = &mut alive.repeats;
    match said {
        Ok(outranked) => {
            repeats.clear();
            outranked
        }
        Err(e) if e.needs_an_operator() => {
            loud_or_debug!(repeats.loud("alive: no table"), error, key = %pg.key, error = %e, "this standby cannot say it is alive, so it counts as preference 0");
            false
        }
        Err(e) => {
            loud_or_debug!(repeats.loud("alive"), warn, key = %pg.key, error = %e, "this standby cannot say it is alive or read the candidates, so it counts as preference 0 until it can");
            false
        }
    }
}

/// What a standby's upsert found: whether it is outranked. A row another replica wrote since
/// this one's last upsert is another live replica of the key with this identity: said at
/// ERROR once a minute, since their rows overwrite each other's and a leader of that identity
/// drops them, so that preferences cannot see the more preferred of them.
fn said_alive(pg: &PgSettings, registered: candidates::Registered, alive: &mut Alive) -> bool {
    if registered.duplicate {
        loud_or_debug!(alive.duplicates.loud("duplicate"), error, key = %pg.key, identity = %pg.identity, "another live replica of this key has this replica's identity: their rows in the candidates table overwrite each other's, so preferences cannot tell them apart; give each replica its own identity (the default, hostname-pid, is unique on a host)");
    }
    alive.written = registered.written;
    registered.outranked
}
