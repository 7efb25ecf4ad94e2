//! [`Fenced`]: a write a deposed term tried, refused by [`Term::fence`](crate::Term::fence).

use super::chain;

/// A fenced write was refused: the term it was made in is over, or a later term has begun.
///
/// Returned by [`Term::fence`](crate::Term::fence); roll the transaction back (dropping it does).
/// [`ours`](Self::ours) is the epoch of the term that tried, [`current`](Self::current) the one
/// the epoch row holds.
#[derive(Debug)]
pub struct Fenced {
    ours: Option<u64>,
    current: Option<u64>,
    why: FencedBecause,
}

#[derive(Debug)]
enum FencedBecause {
    /// The row holds another epoch: a later term has begun.
    Superseded,
    /// This replica's term has ended (it may not know who leads now).
    TermEnded,
    /// The elector was built without fencing, so its terms have no epoch.
    NotFenced,
    /// The fence query failed; the transaction is unusable.
    Failed(tokio_postgres::Error),
}

impl Fenced {
    pub(crate) fn superseded(ours: u64, current: Option<u64>) -> Self {
        Self {
            ours: Some(ours),
            current,
            why: FencedBecause::Superseded,
        }
    }

    pub(crate) fn term_ended(ours: Option<u64>) -> Self {
        Self {
            ours,
            current: None,
            why: FencedBecause::TermEnded,
        }
    }

    pub(crate) fn not_fenced() -> Self {
        Self {
            ours: None,
            current: None,
            why: FencedBecause::NotFenced,
        }
    }

    pub(crate) fn failed(ours: Option<u64>, error: tokio_postgres::Error) -> Self {
        Self {
            ours,
            current: None,
            why: FencedBecause::Failed(error),
        }
    }

    /// The epoch of the term that tried to write; `None` without fencing.
    pub fn ours(&self) -> Option<u64> {
        self.ours
    }

    /// The epoch the row holds, when the fence read it (a later term's).
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Whether a later term has begun (the row holds another epoch).
    pub fn is_superseded(&self) -> bool {
        matches!(self.why, FencedBecause::Superseded)
    }

    /// Whether the fence query itself failed (a lost connection, a missing table), rather than
    /// finding the term over.
    pub fn is_query_error(&self) -> bool {
        matches!(self.why, FencedBecause::Failed(_))
    }
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ours = |f: &mut std::fmt::Formatter<'_>| match self.ours {
            Some(epoch) => write!(f, "epoch {epoch}"),
            None => f.write_str("a term without an epoch"),
        };
        f.write_str("fenced: ")?;
        match &self.why {
            FencedBecause::Superseded => {
                ours(f)?;
                match self.current {
                    Some(current) => write!(f, " is not the current one, {current}"),
                    None => f.write_str(" is not the current one (the epoch row is missing)"),
                }
            }
            FencedBecause::TermEnded => {
                f.write_str("the term of ")?;
                ours(f)?;
                f.write_str(" has ended")
            }
            FencedBecause::NotFenced => f.write_str(
                "the elector was built without fencing(true), so its terms have no epoch",
            ),
            FencedBecause::Failed(e) => write!(f, "the epoch could not be checked: {}", chain(e)),
        }
    }
}

impl std::error::Error for Fenced {}
