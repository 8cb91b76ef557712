//! The `mixture` argument of every loader kind: `{"sources": [{"name", "weight", "exhausted",
//! ...the kind's own fields}], "epoch_items"}`. The shell's part ([`MixSpec`]) is checked here;
//! each source's remaining fields go back to its kind's rule book, named by the source.

use super::Taker;
use crate::error::{Error, Result};
use crate::shell::mix::{Exhausted, MixPart, MixSpec};
use crate::values::{positive, shown};
use serde_json::Value;

/// A source's fields that a kind reads, and the source's name for its errors.
pub(super) struct SourceArgs {
    /// `mixture source 'NAME'`: what an error about one of its fields names.
    pub(super) what: String,
    /// The fields the kind reads ([`SourceArgs::finish`] refuses any left over).
    pub(super) args: Taker,
}

impl SourceArgs {
    /// An error about field `field` of this source.
    pub(super) fn error(&self, field: &str, why: impl std::fmt::Display) -> Error {
        Error::config("mixture", format!("{}: {field}: {why}", self.what))
    }

    /// Refuses a field the kind did not read.
    pub(super) fn finish(self) -> Result<()> {
        match self.args.args.keys().next() {
            Some(k) => Err(Error::config("mixture", format!("{}: unknown field `{k}`", self.what))),
            None => Ok(()),
        }
    }
}

/// The shell's part of a `mixture` argument, and each source's own fields.
pub(super) fn mixture(v: &Value) -> Result<(MixSpec, Vec<SourceArgs>)> {
    let bad = |why: String| Error::config("mixture", why);
    let Some(obj) = v.as_object() else {
        return Err(bad(format!("expected {{\"sources\": [...], \"epoch_items\": N}}, got {}", shown(v))));
    };
    let mut top = Taker::new(obj.clone());
    let epoch_items = top.typed("epoch_items").map(|v| positive("epoch_items", &v).map(|n| n as u64)).transpose()?;
    let Some(Value::Array(list)) = top.take("sources") else {
        return Err(bad("expected a list of sources under `sources`".into()));
    };
    top.finish().map_err(|e| bad(format!("{e}")))?;
    if list.is_empty() {
        return Err(bad("has no source".into()));
    }
    let (mut parts, mut rest) = (vec![], vec![]);
    for (k, item) in list.iter().enumerate() {
        let Some(fields) = item.as_object() else {
            return Err(bad(format!("source {k}: expected an object, got {}", shown(item))));
        };
        let mut a = Taker::new(fields.clone());
        let name = match a.take("name") {
            Some(Value::String(s)) if !s.is_empty() => s,
            other => return Err(bad(format!("source {k}: expected a non-empty `name`, got {other:?}"))),
        };
        if parts.iter().any(|p: &MixPart| p.name == name) {
            return Err(bad(format!("two sources are named '{name}'")));
        }
        let what = format!("mixture source '{name}'");
        let weight = match a.typed("weight") {
            Some(Value::Number(n)) => n.as_f64().filter(|w| w.is_finite() && *w > 0.0),
            Some(Value::String(s)) => s.parse::<f64>().ok().filter(|w| w.is_finite() && *w > 0.0),
            _ => None,
        }
        .ok_or_else(|| bad(format!("{what}: weight: expected a positive number")))?;
        let exhausted = match a.take("exhausted") {
            None => Exhausted::Repeat,
            Some(Value::String(s)) => Exhausted::parse(&s)
                .ok_or_else(|| bad(format!("{what}: exhausted: expected repeat or stop, got '{s}'")))?,
            Some(v) => return Err(bad(format!("{what}: exhausted: expected repeat or stop, got {}", shown(&v)))),
        };
        parts.push(MixPart { name, weight, exhausted });
        rest.push(SourceArgs { what, args: a });
    }
    let spec = MixSpec { parts, epoch_items };
    // The weights' own rule (positive, not too small to schedule) is the schedule's.
    crate::shell::mix::Weights::new(&spec.parts.iter().map(|p| p.weight).collect::<Vec<_>>())?;
    Ok((spec, rest))
}

/// The fields as arguments of their own (for a kind's rule book).
impl SourceArgs {
    /// Takes a field that is text by nature.
    pub(super) fn take(&mut self, name: &str) -> Option<Value> {
        self.args.take(name)
    }

    /// Takes any other field.
    pub(super) fn typed(&mut self, name: &str) -> Option<Value> {
        self.args.typed(name)
    }

    /// Takes the field `name` that says where the source's data is: a path (or URL, glob,
    /// folder), or a non-empty list of them; else an error saying what it should be
    /// (`expected`).
    pub(super) fn paths(&mut self, name: &str, expected: &str) -> Result<Vec<String>> {
        match self.take(name) {
            Some(Value::String(p)) => Ok(vec![p]),
            Some(Value::Array(list)) if !list.is_empty() && list.iter().all(Value::is_string) => {
                Ok(list.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            }
            _ => Err(self.error(name, expected)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_mixture_names_the_source_and_field_that_is_wrong() {
        let (spec, rest) = mixture(&json!({"sources": [
            {"name": "web", "weight": 0.7, "root": "a"},
            {"name": "books", "weight": 0.3, "exhausted": "stop", "root": "b"}], "epoch_items": 100}))
        .unwrap();
        assert_eq!(spec.parts[1].exhausted, Exhausted::Stop);
        assert_eq!((spec.epoch_items, rest.len()), (Some(100), 2));
        for (bad, says) in [
            (json!([]), "expected {"),
            (json!({"sources": []}), "has no source"),
            (json!({"sources": [{"weight": 1}]}), "non-empty `name`"),
            (json!({"sources": [{"name": "a", "weight": 0}]}), "mixture source 'a': weight"),
            (json!({"sources": [{"name": "a", "weight": 1, "exhausted": "never"}]}), "repeat or stop"),
            (json!({"sources": [{"name": "a", "weight": 1}, {"name": "a", "weight": 1}]}), "two sources"),
            (json!({"sources": [{"name": "a", "weight": 1}], "epoch_items": 0}), "epoch_items"),
            (json!({"sources": [{"name": "a", "weight": 1}], "epoch": 3}), "unknown argument"),
        ] {
            let e = mixture(&bad).err().unwrap().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
