//! The channel's method references: how long each method takes on a fast instance (see the
//! parent module's docs).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::noise::Noise;

/// Which slot of the method table a call's method uses, and the tag that tells its method from
/// others that hash to the same slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Method(u32);

const SLOTS: usize = 256;
/// How far a reference moves for one answer, as a share of itself.
const STEP: f64 = 1.0 / 32.0;

impl Method {
    /// No method: never expensive, for picks made outside a call (benchmarks).
    pub(crate) const NONE: Method = Method(0);

    /// The key of a method path (`/package.Service/Method`): a hash of its bytes, eight at a
    /// time.
    #[inline]
    pub(crate) fn of(path: &str) -> Method {
        let mut h: u64 = 0x243F_6A88_85A3_08D3 ^ path.len() as u64;
        let bytes = path.as_bytes();
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
        }
        let mut last = [0u8; 8];
        let rest = chunks.remainder();
        last[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(last)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 32;
        // Never 0: 0 marks an empty slot.
        Method((h as u32) | 1)
    }

    fn slot(self) -> usize {
        (self.0 >> 24) as usize % SLOTS
    }
}

/// A method whose reference is more than this many times the typical call's is expensive.
pub(crate) const EXPENSIVE_AT: f64 = 4.0;

/// The channel's method references (see the module docs).
pub(crate) struct Methods {
    /// Per slot: the tag of its method (high 32 bits) and its reference in nanoseconds (`f32`
    /// bits, low 32 bits); 0 when empty.
    slots: Box<[AtomicU64]>,
    /// The typical call's reference (`f32` bits, nanoseconds; 0 before the first answer): it
    /// moves by [`STEP`] of itself towards the reference of each answered call's method, so it
    /// settles on the median over calls (a method called nine times in ten sets it).
    typical: AtomicU32,
    /// How often an answer is slow by chance (see [`Noise`]).
    pub(crate) noise: Noise,
}

impl Methods {
    pub(crate) fn new() -> Methods {
        Methods {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            typical: AtomicU32::new(0),
            noise: Noise::default(),
        }
    }

    /// Whether calls to `method` are expensive: its reference is more than [`EXPENSIVE_AT`]
    /// times the typical call's. Such calls hold an instance much longer than most; the pick
    /// gives them turns of their own ([`TieBreak::expensive_turn`]), so that each instance gets
    /// its share of them, and with it its share of all the calls (an instance that drew more
    /// than its share of expensive calls would be busy, and out of the ties for cheap ones,
    /// longer than the rest).
    /// Two loads; false for a method not seen yet.
    #[inline]
    pub(crate) fn is_expensive(&self, method: Method) -> bool {
        let word = self.slots[method.slot()].load(Ordering::Relaxed);
        if (word >> 32) as u32 != method.0 {
            return false;
        }
        let r = f32::from_bits(word as u32);
        let typical = f32::from_bits(self.typical.load(Ordering::Relaxed));
        typical > 0.0 && f64::from(r) > EXPENSIVE_AT * f64::from(typical)
    }

    /// The reference for `method` as it is (0 for a method not seen yet), without a sample.
    pub(crate) fn current(&self, method: Method) -> f64 {
        let word = self.slots[method.slot()].load(Ordering::Relaxed);
        if (word >> 32) as u32 == method.0 {
            f64::from(f32::from_bits(word as u32))
        } else {
            0.0
        }
    }

    /// The reference for `method` before this sample, which then updates it. A method new to
    /// its slot takes it, and its first sample is its own reference.
    pub(crate) fn reference(&self, method: Method, sample_ns: f64) -> f64 {
        let slot = &self.slots[method.slot()];
        let word = slot.load(Ordering::Relaxed);
        let (tag, r) = ((word >> 32) as u32, f64::from(f32::from_bits(word as u32)));
        let (reference, next) = if tag == method.0 && r > 0.0 {
            let next = if sample_ns > r {
                sample_ns.min(r * (1.0 + STEP))
            } else if sample_ns < 0.5 * r {
                r + 0.25 * (sample_ns - r)
            } else {
                sample_ns.max(r * (1.0 - STEP))
            };
            (r, next)
        } else {
            (sample_ns, sample_ns)
        };
        let packed = (u64::from(method.0) << 32) | u64::from((next as f32).to_bits());
        if packed != word {
            slot.store(packed, Ordering::Relaxed);
        }
        let typical = f64::from(f32::from_bits(self.typical.load(Ordering::Relaxed)));
        let moved = if typical <= 0.0 {
            next
        } else if next > typical {
            next.min(typical * (1.0 + STEP))
        } else {
            next.max(typical * (1.0 - STEP))
        };
        if moved != typical {
            self.typical
                .store((moved as f32).to_bits(), Ordering::Relaxed);
        }
        reference
    }
}

impl std::fmt::Debug for Methods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Methods").finish_non_exhaustive()
    }
}
