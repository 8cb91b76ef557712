//! The caption encoder's rule book: `context_length`, `pad_id` and `clean` ([`caption_options`]);
//! their limits are [`check_caption_values`], which [`crate::tokens::CaptionEncoder::new`] also
//! runs on options made by hand, with its tokenizer's vocabulary.

use super::values::{check_caption_values, shown, text, unsigned, MAX_CONTEXT_LENGTH};
use crate::error::{Error, Result};
use crate::tokens::{CaptionOptions, Clean};
use serde_json::Value;

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
    check_caption_values(o.context_length, o.pad_id, None)?;
    Ok(o)
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
        let e = check_caption_values(o.context_length, o.pad_id, Some(49408)).unwrap_err().to_string();
        assert!(e.contains("`pad_id`") && e.contains("from 0 to 49407, got 49408"), "{e}");
        assert!(check_caption_values(o.context_length, 49407, Some(49408)).is_ok());
    }
}
