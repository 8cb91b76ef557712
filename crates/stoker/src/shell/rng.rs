//! Counter-based randomness: every random choice is a pure function of `(seed, epoch, sample)`.
//!
//! There is no shared RNG state between threads, so batches are bit-identical whatever the thread
//! count or scheduling. The generator is SplitMix64 (Steele et al.), seeded by mixing the three keys.

/// SplitMix64's finaliser: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small, fast generator (SplitMix64) seeded from a tuple of keys.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Rng {
    /// A generator for the keys `(seed, stream, index)`; distinct keys give independent streams.
    pub fn new(seed: u64, stream: u64, index: u64) -> Self {
        let s = mix64(seed ^ GOLDEN);
        let s = mix64(s ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03));
        let s = mix64(s ^ index.wrapping_mul(0xaef1_7502_108e_f2d9));
        Rng { state: s }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// A uniform float in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform float in `[lo, hi)`.
    #[inline]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// A uniform integer in `[0, n)` (Lemire's nearly-divisionless method, unbiased).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let mut m = (self.next_u64() as u128) * (n as u128);
        let mut lo = m as u64;
        if lo < n {
            let t = n.wrapping_neg() % n;
            while lo < t {
                m = (self.next_u64() as u128) * (n as u128);
                lo = m as u64;
            }
        }
        (m >> 64) as u64
    }

    /// A uniform integer in the inclusive range `[lo, hi]`.
    pub fn int_inclusive(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(lo <= hi);
        lo + self.below((hi - lo) as u64 + 1) as i64
    }
}

/// Stream ids, so that different uses of the same `(seed, epoch)` never share randomness.
pub mod stream {
    /// The per-epoch permutation.
    pub const PERMUTATION: u64 = 1;
    /// Per-sample augmentation choices (crop boxes, flips).
    pub const AUGMENT: u64 = 2;
    /// The permutations of a mixture's sources, one per source and pass.
    pub const MIXTURE: u64 = 3;
    /// A rank's shuffle within windows of shards ([`crate::shell::sampler`]).
    pub const WINDOWS: u64 = 4;
    /// Per-sample photometric and policy augmentations and erasing
    /// ([`crate::image::ops::augment`]).
    pub const PHOTOMETRIC: u64 = 5;
    /// A batch's mixing draw (MixUp/CutMix, [`crate::image::ops::mix`]), per rank and batch.
    pub const BATCH_MIX: u64 = 16;
}

/// Fisher-Yates shuffle of `items` driven by `rng`.
pub fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(1, 2, 3).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(Rng::new(1, 2, 3).next_u64(), Rng::new(1, 2, 4).next_u64());
        assert_ne!(Rng::new(1, 2, 3).next_u64(), Rng::new(2, 2, 3).next_u64());
    }

    #[test]
    fn below_is_roughly_uniform() {
        let mut r = Rng::new(7, 0, 0);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..1000).collect();
        shuffle(&mut v, &mut Rng::new(0, 0, 0));
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
    }
}
