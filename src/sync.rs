//! Locks of the channel's rare paths.

/// Locks a mutex of the channel's rare paths (membership, discovery, replay), going on past a
/// panic in another holder: what they guard stays consistent at every step.
#[inline(always)]
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
