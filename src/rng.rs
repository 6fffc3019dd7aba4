//! The random source of the pick's draws and of the timers' jitter: thread-local, no lock, no
//! system call per draw.

use std::cell::Cell;

/// A small, fast, thread-local random source (xorshift64*), good enough to break ties and draw
/// the two choices; not for anything that needs unpredictability.
pub struct Rng(u64);

thread_local! {
    static RNG_STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded per thread from the OS; its hash of nothing is a fine seed.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9E37_79B9_7F4A_7C15);
    h.finish() | 1
}

impl Rng {
    /// This thread's random source; give it back with [`Rng::store`].
    #[inline]
    pub fn thread() -> Rng {
        Rng(RNG_STATE.with(|s| s.get()))
    }

    /// A random source with a fixed seed, for tests and benchmarks.
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// Gives the state back to this thread, so the next draw continues the sequence.
    #[inline]
    pub fn store(self) {
        RNG_STATE.with(|s| s.set(self.0));
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-32 for any n we use).
    #[inline]
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
}

/// A uniform draw in `[0, 1)` from this thread's random source (for jitter).
pub(crate) fn random_unit() -> f64 {
    let mut rng = Rng::thread();
    let u = rng.unit();
    rng.store();
    u
}
