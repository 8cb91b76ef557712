//! The `Tokenizer` class's rule book: the token names it is built with ([`tokenizer_names`])
//! and the options of one call to encode ([`encode_options`]).

use super::env::env_threads;
use super::{Args, Taker};
use crate::error::Result;
use crate::tokens::EncodeOptions;
use crate::values::{boolean, text, threads};
use serde_json::Value;

/// The BOS and EOS token names a `Tokenizer` is built with: `bos_token`, `eos_token` (a
/// token's text, or `None`: the first of the usual names the vocabulary has), as the token
/// loader takes them.
pub fn tokenizer_names(args: Args) -> Result<(Option<String>, Option<String>)> {
    let mut a = Taker::new(args);
    let mut name = |k: &str| -> Result<Option<String>> {
        match a.take(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(text(k, &v, "a token's text")?.to_string())),
        }
    };
    let names = (name("bos_token")?, name("eos_token")?);
    a.finish()?;
    Ok(names)
}

/// The options of a call to `encode_batch`: `add_bos`, `add_eos` (default off: the ids are
/// `tokenizers`' own unless asked), `add_special_tokens` (default off, as `tokenizers`'
/// `encode_batch(..., add_special_tokens=False)`) and `threads` (a number, or `auto`/`None`:
/// `STOKER_NUM_THREADS` when set, else the process's CPU allowance).
pub fn encode_options(args: Args) -> Result<EncodeOptions> {
    let mut a = Taker::new(args);
    let mut flag = |k: &str| a.typed(k).map(|v| boolean(k, &v)).transpose().map(Option::unwrap_or_default);
    let (add_bos, add_eos, add_special_tokens) = (flag("add_bos")?, flag("add_eos")?, flag("add_special_tokens")?);
    let given = a.typed("threads").map(|v| threads("threads", &v)).transpose()?.flatten();
    let threads = match given {
        Some(n) => Some(n),
        None => env_threads()?,
    };
    a.finish()?;
    Ok(EncodeOptions { add_bos, add_eos, add_special_tokens, threads })
}

#[cfg(test)]
mod tests {
    use super::super::args;
    use super::*;
    use serde_json::json;

    #[test]
    fn options_are_checked_and_default_off() {
        let o = encode_options(args(json!({"threads": 3}))).unwrap();
        assert_eq!(o, EncodeOptions { threads: Some(3), ..Default::default() });
        let o = encode_options(args(json!({"add_bos": true, "add_eos": true, "add_special_tokens": true}))).unwrap();
        assert!(o.add_bos && o.add_eos && o.add_special_tokens);
        for (bad, arg) in [
            (json!({"add_bos": 1}), "`add_bos`"),
            (json!({"threads": 0}), "`threads`"),
            (json!({"threads": "many"}), "`threads`"),
            (json!({"thread": 2}), "`thread`"),
        ] {
            let e = encode_options(args(bad)).unwrap_err().to_string();
            assert!(e.contains(arg), "{e}");
        }
    }

    #[test]
    fn names_are_text() {
        let got = tokenizer_names(args(json!({"bos_token": "<s>", "eos_token": null}))).unwrap();
        assert_eq!(got, (Some("<s>".to_string()), None));
        let e = tokenizer_names(args(json!({"eos_token": 5}))).unwrap_err().to_string();
        assert!(e.contains("`eos_token`"), "{e}");
    }
}
