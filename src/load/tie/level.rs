//! Where a set's turns are ([`Level`]), and an instance that joins them: a newcomer's or a
//! returning instance's passes start at the level of the rest, not where they were.

use std::sync::atomic::Ordering;

use super::TieBreak;

/// Where a set's turns are: the median of its instances' passes (the median, so that neither
/// an instance far ahead, a slow one with a long stride, nor one far behind, owed turns it
/// missed while busy, sets it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    pass: u64,
    expensive_pass: u64,
}

impl Level {
    /// The level of these records; `None` for none.
    pub(crate) fn of<'a>(ties: impl Iterator<Item = &'a TieBreak>) -> Option<Level> {
        let (mut passes, mut expensive): (Vec<u64>, Vec<u64>) = ties
            .map(|t| {
                (
                    t.pass.load(Ordering::Relaxed),
                    t.expensive_pass.load(Ordering::Relaxed),
                )
            })
            .unzip();
        if passes.is_empty() {
            return None;
        }
        let mid = passes.len() / 2;
        Some(Level {
            pass: *passes.select_nth_unstable(mid).1,
            expensive_pass: *expensive.select_nth_unstable(mid).1,
        })
    }
}

impl TieBreak {
    /// The instance joins a set whose turns are at `level`: its passes start there (or stay
    /// where they are, if further on). Without this a newcomer (pass 0) would win
    /// [`CREDIT`](super::CREDIT) turns in a row from every client at once: with 50
    /// clients, 400 calls in a burst on an instance that gets 2 a second from each.
    pub(crate) fn join_at(&self, level: Level) {
        // Turns owed for a false gate are not paid to an instance away since: it starts afresh.
        self.owed.store(0, Ordering::Relaxed);
        self.forgiven.store(0, Ordering::Relaxed);
        self.pass.fetch_max(level.pass, Ordering::Relaxed);
        self.expensive_pass
            .fetch_max(level.expensive_pass, Ordering::Relaxed);
    }
}
