//! The `grpc.method` label of a channel's calls: each method name is interned once, on its
//! first call, in a small fixed table of labels, up to a limit of distinct names; past it,
//! further names are `other`. A call then costs a hash of its path, a probe or two of the
//! table (lock-free loads) and a reference count: no lock, and no allocation after the first
//! call of a method. A new name takes its slot with a compare-and-swap; the table never
//! shrinks, so that a name found once is found at the same place for the channel's life.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use metrics::SharedString;

/// The longest method name that labels itself (a longer one is `other`): generated stubs'
/// names are a few dozen bytes, so this only stops a caller from writing kilobytes into a
/// label.
const MAX_NAME: usize = 256;

/// One interned name: its hash (compared first) and its label, and whether a call has had it
/// (a name pinned with `metrics_methods` is interned before any call).
struct Interned {
    hash: u64,
    label: SharedString,
    called: AtomicBool,
}

/// The interned method labels of one channel.
///
/// Two threads that meet the same new name at once may race for its slot: one wins, the
/// other finds its name there and takes that label. While a place reserved for a name that
/// then lost its slot is given back, a new name at the limit can be refused once (`other` for
/// that call only).
pub(super) struct Table {
    slots: Box<[ArcSwapOption<Interned>]>,
    /// Names interned so far (and places reserved by names about to be).
    used: AtomicUsize,
    limit: usize,
}

impl Table {
    /// A table that interns up to `limit` names; its slots are at least twice as many, so that
    /// a probe for a name, found or not, meets an empty slot within a few steps.
    pub(super) fn new(limit: usize) -> Table {
        let slots = (2 * limit.max(1)).next_power_of_two();
        Table {
            slots: (0..slots).map(|_| ArcSwapOption::empty()).collect(),
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// The label of a call's `name`: found if it was interned before; else interned now if
    /// `add` and there is room (`None`: not interned). Marks it called (a load, and a store
    /// the first time).
    #[inline]
    pub(super) fn get(&self, name: &str, add: bool) -> Option<SharedString> {
        self.find(name, add, true)
    }

    /// Interns a pinned name before any call has it.
    pub(super) fn pin(&self, name: &str) {
        self.find(name, true, false);
    }

    /// The interned names no call has had.
    pub(super) fn uncalled(&self) -> Vec<String> {
        self.names(false)
    }

    /// The interned names that calls have had, or that none has (`called`).
    pub(super) fn names(&self, called: bool) -> Vec<String> {
        self.slots
            .iter()
            .filter_map(|slot| {
                let entry = slot.load();
                let e = entry.as_ref()?;
                (e.called.load(Ordering::Relaxed) == called).then(|| e.label.to_string())
            })
            .collect()
    }

    fn find(&self, name: &str, add: bool, call: bool) -> Option<SharedString> {
        let hash = hash(name.as_bytes());
        let mask = self.slots.len() - 1;
        let mut at = (hash as usize) & mask;
        // The table is never full (twice the limit): an empty slot ends every probe.
        for _ in 0..self.slots.len() {
            let slot = &self.slots[at];
            loop {
                let current = slot.load();
                match &*current {
                    Some(e) if e.hash == hash && *e.label == *name => {
                        if call && !e.called.load(Ordering::Relaxed) {
                            e.called.store(true, Ordering::Relaxed);
                        }
                        return Some(e.label.clone());
                    }
                    Some(_) => break,
                    None => {
                        if !add || !self.reserve() {
                            return None;
                        }
                        let label = SharedString::from(Arc::<str>::from(name));
                        let entry = Arc::new(Interned {
                            hash,
                            label: label.clone(),
                            called: AtomicBool::new(call),
                        });
                        let before = slot.compare_and_swap(&current, Some(entry));
                        if before.is_none() {
                            return Some(label);
                        }
                        // Another name took the slot first (perhaps this one): look again.
                        self.used.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            at = (at + 1) & mask;
        }
        None
    }

    /// Takes one place under the limit, if there is one.
    fn reserve(&self) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("used", &self.used.load(Ordering::Relaxed))
            .field("limit", &self.limit)
            .finish()
    }
}

/// Whether `name` (without its slash) is a method's full name, `pkg.Service/Method`, short
/// enough to label itself.
pub(super) fn full_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name.split_once('/').is_some_and(|(service, method)| {
            !service.is_empty() && !method.is_empty() && !method.contains('/')
        })
}

/// A fast hash of a method name, eight bytes at a time (FxHash's step), its high bits folded
/// into the low ones that index the table.
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        h = step(h, u64::from_le_bytes(word));
    }
    let rest = chunks.remainder();
    let mut word = [0; 8];
    word[..rest.len()].copy_from_slice(rest);
    h = step(h, u64::from_le_bytes(word));
    h ^ (h >> 29) ^ (h >> 47)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Up to the limit, each new name is interned once and found again as the same label;
    /// past it, new names are not, and the known ones still are.
    #[test]
    fn names_are_interned_up_to_the_limit() {
        let t = Table::new(8);
        let names: Vec<String> = (0..20).map(|i| format!("pkg.Svc/M{i}")).collect();
        for (i, n) in names.iter().enumerate() {
            let got = t.get(n, true);
            if i < 8 {
                assert_eq!(got.as_deref(), Some(n.as_str()));
            } else {
                assert_eq!(got, None, "{n}: past the limit");
            }
        }
        for n in &names[..8] {
            assert_eq!(t.get(n, false).as_deref(), Some(n.as_str()));
        }
        assert_eq!(t.get("pkg.Svc/M19", false), None);
    }

    /// A name not to be added is only looked up.
    #[test]
    fn lookups_do_not_add() {
        let t = Table::new(4);
        assert_eq!(t.get("a.B/C", false), None);
        assert_eq!(t.get("a.B/C", true).as_deref(), Some("a.B/C"));
        assert_eq!(t.get("a.B/C", false).as_deref(), Some("a.B/C"));
    }

    /// Threads that see the same new names at once intern each of them once: exactly the
    /// limit's number of distinct names is labelled, every thread gets the same answer for a
    /// name, and the table holds no name twice.
    #[test]
    fn concurrent_first_sights_intern_each_name_once() {
        let t = Arc::new(Table::new(16));
        let names: Arc<Vec<String>> = Arc::new((0..40).map(|i| format!("p.S/m{i}")).collect());
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let (t, names) = (t.clone(), names.clone());
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for j in 0..names.len() {
                        let n = &names[(j * (k + 1)) % names.len()];
                        got.push((n.clone(), t.get(n, true).is_some()));
                    }
                    got
                })
            })
            .collect();
        let mut labelled = std::collections::HashSet::new();
        for th in threads {
            for (n, ok) in th.join().unwrap() {
                if ok {
                    labelled.insert(n);
                }
            }
        }
        // A name refused while another's place was reserved for a slot it then lost gets its
        // place on a later call: one more pass, alone.
        for n in names.iter() {
            if t.get(n, true).is_some() {
                labelled.insert(n.clone());
            }
        }
        assert_eq!(labelled.len(), 16, "{labelled:?}");
        let mut held = Vec::new();
        for slot in t.slots.iter() {
            if let Some(e) = &*slot.load() {
                held.push(e.label.to_string());
            }
        }
        held.sort();
        let before = held.len();
        held.dedup();
        assert_eq!(held.len(), before, "a name interned twice");
        assert_eq!(held.len(), 16);
        for n in &labelled {
            assert!(t.get(n, false).is_some());
        }
    }

    #[test]
    fn full_names() {
        for ok in ["pkg.Svc/Method", "Svc/M", "a.b.c.D/e_f"] {
            assert!(full_name(ok), "{ok}");
        }
        let long = format!("p.S/{}", "m".repeat(300));
        for bad in ["", "Svc", "/M", "Svc/", "a/b/c", long.as_str()] {
            assert!(!full_name(bad), "{bad}");
        }
    }
}
