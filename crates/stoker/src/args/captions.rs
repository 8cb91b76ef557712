//! The caption encoder's rule book: `context_length`, `pad_id` and `clean` ([`caption_options`]);
//! their limits are [`check_caption_values`], which [`crate::tokens::CaptionEncoder::new`] also
//! runs on options made by hand, with its tokenizer's vocabulary. A pair loader's `captions`
//! argument ([`captions`]) adds the tokenizer file and where the caption is (`caption`).

use crate::error::{Error, Result};
use crate::tokens::{CaptionField, CaptionOptions, CaptionSpec, Clean};
use crate::values::{check_caption_values, shown, text, unsigned, MAX_CONTEXT_LENGTH};
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

/// A pair loader's captions from the object `v`: `tokenizer` (a `tokenizer.json` path),
/// `context_length`, `pad_id`, `clean` (see [`caption_options`]) and `caption`: `"txt"` (the
/// default: `KEY.txt`), `"json"` (the `caption` field of `KEY.json`) or `"json:FIELD"`.
pub fn captions(v: &Value) -> Result<CaptionSpec> {
    let Value::Object(o) = v else {
        return Err(Error::config("captions", format!("expected an object, got {}", shown(v))));
    };
    if let Some(k) =
        o.keys().find(|k| !["tokenizer", "context_length", "pad_id", "clean", "caption"].contains(&k.as_str()))
    {
        return Err(Error::config("captions", format!("unknown field {k:?}")));
    }
    let tokenizer = match o.get("tokenizer") {
        None | Some(Value::Null) => {
            return Err(Error::config(
                "tokenizer",
                "a pair loader needs a tokenizer.json (CLIP's, or any with <|startoftext|> and <|endoftext|>)",
            ))
        }
        Some(t) => text("tokenizer", t, "a path to a tokenizer.json")?,
    };
    if tokenizer.is_empty() {
        return Err(Error::config("tokenizer", "empty path"));
    }
    let field = match o.get("caption") {
        None | Some(Value::Null) => CaptionField::Txt,
        Some(c) => caption_field(text("caption", c, "'txt', 'json' or 'json:FIELD'")?)?,
    };
    let options = caption_options(o.get("context_length"), o.get("pad_id"), o.get("clean"))?;
    Ok(CaptionSpec { tokenizer: tokenizer.into(), options, field })
}

/// `txt`, `json` (the field `caption`) or `json:FIELD`.
fn caption_field(s: &str) -> Result<CaptionField> {
    match s.split_once(':') {
        None if s == "txt" => Ok(CaptionField::Txt),
        None if s == "json" => Ok(CaptionField::Json("caption".into())),
        Some(("json", field)) if !field.is_empty() => Ok(CaptionField::Json(field.into())),
        _ => Err(Error::config("caption", format!("expected 'txt', 'json' or 'json:FIELD', got {s:?}"))),
    }
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
    fn pair_captions() {
        let c = captions(&json!({"tokenizer": "t.json"})).unwrap();
        assert_eq!(
            (c.tokenizer.to_str(), c.field, c.options),
            (Some("t.json"), CaptionField::Txt, CaptionOptions::default())
        );
        let field = |s: &str| captions(&json!({"tokenizer": "t.json", "caption": s})).map(|c| c.field);
        assert_eq!(field("json").unwrap(), CaptionField::Json("caption".into()));
        assert_eq!(field("json:alt_text").unwrap(), CaptionField::Json("alt_text".into()));
        for bad in ["json:", "csv", "txt:x", ""] {
            assert!(field(bad).unwrap_err().to_string().contains("`caption`"), "{bad}");
        }
        let e = captions(&json!({"context_length": 77})).unwrap_err().to_string();
        assert!(e.contains("`tokenizer`"), "{e}");
        let e = captions(&json!({"tokenizer": "t.json", "max_len": 3})).unwrap_err().to_string();
        assert!(e.contains("\"max_len\""), "{e}");
        let e = captions(&json!({"tokenizer": "t.json", "context_length": 1})).unwrap_err().to_string();
        assert!(e.contains("`context_length`"), "{e}");
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
