//! Small synchronisation helpers shared by every module.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex that guards no invariant a panic could break: a poisoned lock is taken as
/// it is (the panic is reported where it happened, not again by every later user).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
