//! A handover asked from outside the leader's process.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::millis;
use super::sql::REQUEST;
use crate::{Error, LockKey};

/// Who a handover asked with [`request_handover`] goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandoverTo {
    /// The live standby with this identity (see
    /// [`ElectorBuilder::identity`](crate::ElectorBuilder::identity)).
    Identity(String),
    /// The most preferred live standby.
    MostPreferred,
}

/// Asks the leader of `key` to hand over to another replica, from any process connected to the
/// database (for maintenance on the leader's node, say). The leader sees the request at its
/// next check, ends its term gracefully (its work drains, up to its drain timeout), unlocks,
/// and stays a standby for `stay_away`; meanwhile the other standbys leave the lock to the
/// target. Returns the target's identity.
///
/// Only a *live* standby can be named: a replica built with a
/// [`preference`](crate::ElectorBuilder::preference) (any, 0 included) that tried the lock
/// within its last two check intervals. The request stays valid for a minute, or until the
/// target's term has begun and passed its first check; if the target stops trying meanwhile,
/// the other standbys stop waiting for it within two of its intervals. The old leader stays
/// away only while the target may still lead: once the target is neither live nor leading,
/// or has led and no longer does, it stands by again.
///
/// # Errors
///
/// [`Error::NoLeader`] when no replica leads `key`; [`Error::NoSuchStandby`] when no live
/// standby matches (then nothing changed); [`Error::HandoverQuery`] when a query fails.
///
/// ```no_run
/// # async fn example(client: &tokio_postgres::Client) -> Result<(), pg_elector::Error> {
/// use std::time::Duration;
/// use pg_elector::{HandoverTo, LockKey, request_handover};
///
/// let key = LockKey::from_name("billing/sweep");
/// let to = request_handover(client, key, HandoverTo::MostPreferred, Duration::from_secs(300)).await?;
/// println!("the lead goes to {to}");
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// A dropped call may or may not have asked. It puts no timeout on the queries.
pub async fn request_handover(
    client: &tokio_postgres::Client,
    key: LockKey,
    to: HandoverTo,
    stay_away: Duration,
) -> Result<String, Error> {
    let leader = crate::postgres::leader::leader_of(client, key, None)
        .await
        .map_err(|e| match e {
            Error::CurrentLeaderQuery(e) => Error::HandoverQuery(e),
            other => other,
        })?
        .ok_or(Error::NoLeader)?;
    let named = match &to {
        HandoverTo::Identity(name) => Some(name.as_str()),
        HandoverTo::MostPreferred => None,
    };
    let stay_away = millis(stay_away);
    let rows = client
        .query_typed(
            REQUEST,
            &[
                (&key.class(), Type::INT4),
                (&key.object(), Type::INT4),
                (&leader.identity, Type::TEXT),
                (&named, Type::TEXT),
                (&stay_away, Type::INT8),
            ],
        )
        .await;
    let no_such = || Error::NoSuchStandby {
        identity: named.map(str::to_owned),
    };
    let rows = match rows {
        Ok(rows) => rows,
        // No table: nobody ever registered.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => return Err(no_such()),
        Err(e) => return Err(Error::HandoverQuery(e)),
    };
    rows.iter()
        .find(|row| row.get::<_, bool>(1))
        .map(|row| row.get::<_, String>(0))
        .ok_or_else(no_such)
}
