//! The caption encoder's rule book: `context_length`, `pad_id` and `clean` ([`caption_options`]),
//! and the same limits on options made by hand ([`check_caption_options`], which
//! [`crate::tokens::CaptionEncoder::new`] runs with its tokenizer's vocabulary).

use super::values::{shown, text, unsigned};
use crate::error::{Error, Result};
use crate::tokens::{CaptionOptions, Clean};
use serde_json::Value;

/// The longest caption row: 65,536 ids (CLIP's is 77; long-caption models use a few hundred).
pub const MAX_CONTEXT_LENGTH: usize = 1 << 16;

/// [`CaptionOptions`] from the values given (`None`: not given): `context_length` (an integer
/// from 2, the start and end of text, to [`MAX_CONTEXT_LENGTH`]; default 77), `pad_id` (a token
/// id; default 0, open_clip's; HuggingFace pads with 49407) and `clean` (`"open_clip"`, the
/// default, or `"none"`: see [`crate::tokens::caption`]).
pub fn caption_options(
    context_length: Option<&Value>,
    pad_id: Option<&Value>,
    clean: Option<&Value>,
) -> Result<CaptionOptions> {
    let mut o = CaptionOptions::default();
    if let Some(v) = context_length {
        o.context_length =
            usize::try_from(unsigned("context_length", v, "an integer")?).unwrap_or(MAX_CONTEXT_LENGTH + 1);
    }
    if let Some(v) = pad_id {
        o.pad_id = u32::try_from(unsigned("pad_id", v, "a token id (a non-negative integer)")?).unwrap_or(u32::MAX);
    }
    if let Some(v) = clean {
        let name = text("clean", v, "'open_clip' or 'none'")?;
        o.clean = Clean::from_name(name)
            .ok_or_else(|| Error::config("clean", format!("expected 'open_clip' or 'none', got {}", shown(v))))?;
    }
    check_caption_options(&o, None)?;
    Ok(o)
}

/// The limits of [`caption_options`] on options made by hand: `context_length` from 2 to
/// [`MAX_CONTEXT_LENGTH`], `pad_id` an `i32` (the rows' type) and, with the tokenizer's
/// `vocab_size`, one of its ids.
pub fn check_caption_options(o: &CaptionOptions, vocab_size: Option<usize>) -> Result<()> {
    if !(2..=MAX_CONTEXT_LENGTH).contains(&o.context_length) {
        return Err(Error::config(
            "context_length",
            format!("must be from 2 (the start and end of text) to {MAX_CONTEXT_LENGTH} ids, got {}", o.context_length),
        ));
    }
    let limit = vocab_size.map_or(i32::MAX as u64, |v| v as u64 - 1).min(i32::MAX as u64);
    if u64::from(o.pad_id) > limit {
        let what = if vocab_size.is_some() { "the tokenizer's ids" } else { "token ids" };
        return Err(Error::config("pad_id", format!("must be one of {what}, from 0 to {limit}, got {}", o.pad_id)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_open_clips() {
        assert_eq!(
            caption_options(None, None, None).unwrap(),
            CaptionOptions { context_length: 77, pad_id: 0, clean: Clean::OpenClip }
        );
        let o = caption_options(Some(&json!(64)), Some(&json!(49407)), Some(&json!("none"))).unwrap();
        assert_eq!(o, CaptionOptions { context_length: 64, pad_id: 49407, clean: Clean::None });
        assert_eq!(caption_options(Some(&json!(2)), None, None).unwrap().context_length, 2);
        assert_eq!(caption_options(Some(&json!(65536)), None, None).unwrap().context_length, 65536);
    }

    #[test]
    fn bad_values_name_their_argument() {
        let err = |c: Option<Value>, p: Option<Value>, k: Option<Value>| {
            caption_options(c.as_ref(), p.as_ref(), k.as_ref()).unwrap_err().to_string()
        };
        for (e, arg, says) in [
            (err(Some(json!(1)), None, None), "`context_length`", "from 2"),
            (err(Some(json!(0)), None, None), "`context_length`", "got 0"),
            (err(Some(json!(65537)), None, None), "`context_length`", "65536"),
            (err(Some(json!(u64::MAX)), None, None), "`context_length`", "65536"),
            (err(Some(json!("77")), None, None), "`context_length`", "(a str)"),
            (err(Some(json!(-3)), None, None), "`context_length`", "-3"),
            (err(None, Some(json!(-1)), None), "`pad_id`", "-1"),
            (err(None, Some(json!(1u64 << 31)), None), "`pad_id`", "2147483647"),
            (err(None, Some(json!(true)), None), "`pad_id`", "True (a bool)"),
            (err(None, None, Some(json!("ftfy"))), "`clean`", "\"ftfy\""),
            (err(None, None, Some(json!(1))), "`clean`", "expected a string"),
        ] {
            assert!(e.contains(arg) && e.contains(says), "{e}");
        }
        let o = CaptionOptions { context_length: 77, pad_id: 49408, clean: Clean::None };
        let e = check_caption_options(&o, Some(49408)).unwrap_err().to_string();
        assert!(e.contains("`pad_id`") && e.contains("from 0 to 49407, got 49408"), "{e}");
        assert!(check_caption_options(&CaptionOptions { pad_id: 49407, ..o }, Some(49408)).is_ok());
    }
}
