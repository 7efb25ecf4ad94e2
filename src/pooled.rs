//! A pooled connection with a statement in flight: given back only once the statement's answer
//! came, closed otherwise.

use deadpool_postgres::Object;

/// A pooled connection on which a statement is in flight. Unless it is given back or kept,
/// dropping it (a timeout, a cancelled future) closes the connection instead of returning it to
/// the pool: the statement may still run on it, a lock it took may still be held, and behind a
/// partition the next borrower would wait on it in vain.
pub(crate) struct Borrowed(Option<Object>);

impl Borrowed {
    pub(crate) fn new(object: Object) -> Self {
        Self(Some(object))
    }

    pub(crate) fn client(&self) -> &Object {
        self.0
            .as_ref()
            .expect("a borrowed connection is present until it is let go")
    }

    pub(crate) fn client_mut(&mut self) -> &mut Object {
        self.0
            .as_mut()
            .expect("a borrowed connection is present until it is let go")
    }

    /// Back to the pool, unchanged.
    pub(crate) fn give_back(mut self) {
        drop(self.0.take());
    }

    /// Out of the guard, to be taken from the pool.
    pub(crate) fn keep(mut self) -> Object {
        self.0
            .take()
            .expect("a borrowed connection is present until it is let go")
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(Object::take(object));
        }
    }
}
