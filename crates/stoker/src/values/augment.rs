//! The rules of the augmentation ops' arguments (`ColorJitter`, `RandomGrayscale`,
//! `TrivialAugmentWide`, `RandAugment`, `AutoAugment`, timm's RandAugment string,
//! `RandomErasing`): torchvision's (and timm's) own checks, and what stoker does not implement
//! (another interpolation than nearest, another AutoAugment policy than ImageNet's, another timm
//! op set), refused with the argument named rather than done differently. Plain values in, so
//! that compiling a transform (`ops::TransformPlan::compile`, which a loader's arguments go
//! through) calls here without a circle.

use crate::error::{Error, Result};

/// The most ops `RandAugment` may chain per image.
pub const MAX_RAND_AUGMENT_OPS: usize = 64;
/// The most magnitude bins of a policy.
pub const MAX_MAGNITUDE_BINS: usize = 1 << 16;

fn bad(arg: &str, why: String) -> Error {
    Error::config(arg, why)
}

/// `ColorJitter`'s factor ranges (brightness, contrast, saturation: `0 <= min <= max`) and hue
/// range (`-0.5 <= min <= max <= 0.5`), as torchvision checks them.
pub fn jitter_ranges(ranges: [Option<[f64; 2]>; 4]) -> Result<()> {
    for (name, r) in ["brightness", "contrast", "saturation"].iter().zip(&ranges) {
        if let Some([lo, hi]) = r {
            if !(lo.is_finite() && hi.is_finite() && 0.0 <= *lo && lo <= hi) {
                return Err(bad(
                    &format!("ColorJitter.{name}"),
                    format!("factor range must satisfy 0 <= min <= max, got [{lo}, {hi}]"),
                ));
            }
        }
    }
    if let Some([lo, hi]) = ranges[3] {
        if !(-0.5 <= lo && lo <= hi && hi <= 0.5) {
            return Err(bad(
                "ColorJitter.hue",
                format!("range must satisfy -0.5 <= min <= max <= 0.5, got [{lo}, {hi}]"),
            ));
        }
    }
    Ok(())
}

/// A probability in `[0, 1]` (`arg` names it: `RandomGrayscale.p`).
pub fn probability(arg: &str, p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(bad(arg, format!("a probability in [0, 1], got {p}")))
    }
}

/// The uint8 fill of a policy's geometric ops from torchvision's `fill` (none: zeros, one value
/// or three, each in `[0, 255]`; rounded, as torchvision rounds the sampled float image).
pub fn fill_bytes(op: &str, fill: Option<&[f64]>) -> Result<[u8; 3]> {
    let arg = format!("{op}.fill");
    let v: [f64; 3] = match fill {
        None => [0.0; 3],
        Some([x]) => [*x; 3],
        Some([r, g, b]) => [*r, *g, *b],
        Some(other) => return Err(bad(&arg, format!("expected one value or three (RGB), got {}", other.len()))),
    };
    if v.iter().any(|x| !(0.0..=255.0).contains(x)) {
        return Err(bad(&arg, format!("values must be in [0, 255] for uint8 images, got {v:?}")));
    }
    Ok(v.map(|x| x.round_ties_even() as u8))
}

/// A policy's common arguments: `num_magnitude_bins` (at least 2: torchvision's Posterize bins
/// divide by `num_magnitude_bins - 1`; `None` for AutoAugment's fixed 10), `interpolation` (only
/// `nearest`) and `fill`; returns the fill in bytes.
pub fn policy(op: &str, bins: Option<usize>, interpolation: &str, fill: Option<&[f64]>) -> Result<[u8; 3]> {
    if let Some(n) = bins {
        if !(2..=MAX_MAGNITUDE_BINS).contains(&n) {
            return Err(bad(
                &format!("{op}.num_magnitude_bins"),
                format!("must be in 2..={MAX_MAGNITUDE_BINS}, got {n}"),
            ));
        }
    }
    if !interpolation.eq_ignore_ascii_case("nearest") {
        return Err(bad(
            &format!("{op}.interpolation"),
            format!("only NEAREST (torchvision's default) is implemented, got {interpolation:?}"),
        ));
    }
    fill_bytes(op, fill)
}

/// `RandAugment`'s `num_ops` (at most [`MAX_RAND_AUGMENT_OPS`]) and `magnitude` (a bin below
/// `num_magnitude_bins`, as torchvision indexes it).
pub fn rand_augment(num_ops: usize, magnitude: usize, bins: usize) -> Result<()> {
    if num_ops > MAX_RAND_AUGMENT_OPS {
        return Err(bad("RandAugment.num_ops", format!("at most {MAX_RAND_AUGMENT_OPS}, got {num_ops}")));
    }
    if magnitude >= bins {
        return Err(bad("RandAugment.magnitude", format!("a bin below num_magnitude_bins ({bins}), got {magnitude}")));
    }
    Ok(())
}

/// `AutoAugment`'s policy: only `imagenet`.
pub fn auto_augment_policy(policy: &str) -> Result<()> {
    if policy.eq_ignore_ascii_case("imagenet") {
        Ok(())
    } else {
        Err(bad("AutoAugment.policy", format!("only AutoAugmentPolicy.IMAGENET is implemented, got {policy:?}")))
    }
}

/// `RandomErasing`'s `p`, `scale` (`0 <= min <= max <= 1`), `ratio` (`0 < min <= max`) and
/// `value` (one finite value, three, or `None`: `'random'`).
pub fn erasing(p: f64, scale: [f64; 2], ratio: [f64; 2], value: Option<&[f64]>) -> Result<()> {
    probability("RandomErasing.p", p)?;
    if !(0.0 <= scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
        return Err(bad("RandomErasing.scale", format!("must satisfy 0 <= min <= max <= 1, got {scale:?}")));
    }
    if !(ratio[0] > 0.0 && ratio[0] <= ratio[1] && ratio[1].is_finite()) {
        return Err(bad("RandomErasing.ratio", format!("must satisfy 0 < min <= max, got {ratio:?}")));
    }
    match value {
        None => Ok(()),
        Some(v) if (v.len() == 1 || v.len() == 3) && v.iter().all(|x| x.is_finite()) => Ok(()),
        Some(v) => Err(bad("RandomErasing.value", format!("one finite value, three (RGB) or 'random', got {v:?}"))),
    }
}

/// timm's RandAugment settings from its config string (see [`timm_rand_augment`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimmConfig {
    /// `m` (10).
    pub magnitude: f64,
    /// `n` (2).
    pub num_ops: usize,
    /// `p` (0.5).
    pub prob: f64,
    /// `mstd` (0; infinite above 100: uniform).
    pub magnitude_std: f64,
    /// `mmax` (10).
    pub magnitude_max: f64,
    /// `inc` (false).
    pub increasing: bool,
}

/// timm's `rand_augment_transform` config string, parsed as timm parses it: `rand` then
/// sections `m<int>` (magnitude, 10), `n<int>` (ops, 2), `p<float>` (probability, 0.5),
/// `mstd<float>` (magnitude noise, 0; above 100: uniform), `mmax<int>` (magnitude clip, 10),
/// `inc<0|1>` (increasing-severity set); a section without a number is ignored (as timm does);
/// `t<name>` (another op set) and unknown keys are refused.
pub fn timm_rand_augment(config: &str) -> Result<TimmConfig> {
    let arg = "TimmRandAugment.config";
    let mut parts = config.split('-');
    if parts.next() != Some("rand") {
        return Err(bad(arg, format!("timm's RandAugment strings start with 'rand-', got {config:?}")));
    }
    let mut t = TimmConfig {
        magnitude: 10.0,
        num_ops: 2,
        prob: 0.5,
        magnitude_std: 0.0,
        magnitude_max: 10.0,
        increasing: false,
    };
    for c in parts {
        if let Some(name) = c.strip_prefix('t') {
            return Err(bad(arg, format!("only timm's default op sets are implemented, got the set {name:?}")));
        }
        // timm: `re.split(r'(\d.*)', c)`: the key is what precedes the first digit.
        let Some(at) = c.find(|ch: char| ch.is_ascii_digit()) else { continue };
        let (key, val) = c.split_at(at);
        let num = |what: &str| -> Result<f64> {
            val.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| bad(arg, format!("section {c:?}: {what}, got {val:?}")))
        };
        let int = |what: &str| -> Result<f64> {
            val.parse::<u32>().map(f64::from).map_err(|_| bad(arg, format!("section {c:?}: {what}, got {val:?}")))
        };
        match key {
            "m" => t.magnitude = int("an integer magnitude")?,
            "n" => {
                t.num_ops = int("an integer number of ops")? as usize;
                if t.num_ops > MAX_RAND_AUGMENT_OPS {
                    return Err(bad(arg, format!("at most {MAX_RAND_AUGMENT_OPS} ops, got {}", t.num_ops)));
                }
            }
            "p" => {
                t.prob = num("a probability")?;
                if !(0.0..=1.0).contains(&t.prob) {
                    return Err(bad(arg, format!("section {c:?}: a probability in [0, 1]")));
                }
            }
            "mstd" => {
                let v = num("a deviation")?;
                t.magnitude_std = if v > 100.0 { f64::INFINITY } else { v };
            }
            "mmax" => t.magnitude_max = int("an integer magnitude")?,
            "inc" => t.increasing = int("0 or 1")? != 0.0,
            _ => return Err(bad(arg, format!("unknown section {c:?}; allowed: m, n, p, mstd, mmax, inc"))),
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timm_strings_parse_as_timm_parses_them() {
        let t = timm_rand_augment("rand-m9-mstd0.5-inc1").unwrap();
        assert_eq!((t.magnitude, t.num_ops, t.prob, t.magnitude_std, t.increasing), (9.0, 2, 0.5, 0.5, true));
        let t = timm_rand_augment("rand-n3-m7-mstd101-p0.7-mmax12").unwrap();
        assert_eq!((t.magnitude, t.num_ops, t.prob, t.magnitude_max), (7.0, 3, 0.7, 12.0));
        assert!(t.magnitude_std.is_infinite() && !t.increasing);
        for bad in ["auto-m9", "rand-m9-x3", "rand-tweights", "rand-mfoo1x"] {
            let e = timm_rand_augment(bad).unwrap_err();
            assert!(e.to_string().contains("TimmRandAugment.config"), "{bad}: {e}");
        }
    }

    #[test]
    fn refusals_name_the_argument() {
        let e = policy("TrivialAugmentWide", Some(31), "bilinear", None).unwrap_err();
        assert!(e.to_string().contains("TrivialAugmentWide.interpolation"), "{e}");
        let e = policy("RandAugment", Some(1), "nearest", None).unwrap_err();
        assert!(e.to_string().contains("RandAugment.num_magnitude_bins"), "{e}");
        let e = policy("AutoAugment", None, "nearest", Some(&[1.0, 2.0])).unwrap_err();
        assert!(e.to_string().contains("AutoAugment.fill"), "{e}");
        assert_eq!(policy("AutoAugment", None, "NEAREST", Some(&[127.5])).unwrap(), [128; 3]);
        let e = rand_augment(2, 31, 31).unwrap_err();
        assert!(e.to_string().contains("RandAugment.magnitude"), "{e}");
        let e = jitter_ranges([None, None, None, Some([-0.6, 0.0])]).unwrap_err();
        assert!(e.to_string().contains("ColorJitter.hue"), "{e}");
        let e = auto_augment_policy("cifar10").unwrap_err();
        assert!(e.to_string().contains("AutoAugment.policy"), "{e}");
        let e = erasing(0.5, [0.5, 0.1], [0.3, 3.3], None).unwrap_err();
        assert!(e.to_string().contains("RandomErasing.scale"), "{e}");
    }
}
