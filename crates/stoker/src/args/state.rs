//! Saved states a user hands back (`load_state_dict`), checked, for every kind of loader:
//! one state ([`load_state_dict`]) or the states of every rank of a saved run, continued on
//! this loader's ranks ([`load_state_dicts`]). A kind reads its own fields ([`ReadState`]);
//! every state's fingerprint is compared with the loader's by one rule ([`check_fingerprint`]).
//! [`Saved`] reads the fields of any state. The images' and arrays' fields are read here, the
//! token kinds' in [`super::tokens`].

use crate::error::{Error, Result};
use crate::shell::kind::Loader;
use crate::shell::resume::Resumable;
use crate::shell::sampled::{SampledState, SamplerKind};
use crate::shell::sampler::{ElasticBase, ElasticStep, Fingerprint, SamplerState};
use crate::values::shown;
use serde_json::{Map, Value};

/// The fields of a saved state (`state_dict()`), for their checks.
pub struct Saved<'a> {
    /// The state's fields.
    pub fields: &'a Map<String, Value>,
    /// How the fields are named in errors: `state['...']`, `state['fingerprint']['...']`,
    /// `state[2]['...']` (a list's third state).
    pub prefix: &'a str,
}

impl Saved<'_> {
    /// How field `key` is named in errors (`state['seed']`).
    pub fn name(&self, key: &str) -> String {
        format!("{}['{key}']", self.prefix)
    }

    /// Field `key`; a missing one is an error when `required`.
    fn get(&self, key: &str, required: bool) -> Result<Option<&Value>> {
        match self.fields.get(key) {
            None if required => Err(Error::config(
                self.prefix,
                format!("has no '{key}': expected a dict from state_dict() of this kind of loader"),
            )),
            v => Ok(v),
        }
    }

    /// An integer of at least `min` (JSON integers only: not a bool, a float or text).
    pub fn integer(&self, key: &str, required: bool, min: u64) -> Result<Option<u64>> {
        let Some(v) = self.get(key, required)? else { return Ok(None) };
        match v.as_u64() {
            Some(n) if n >= min => Ok(Some(n)),
            _ => {
                let what = if min == 0 { "a non-negative integer".to_string() } else { format!("an integer >= {min}") };
                Err(Error::config(self.name(key), format!("expected {what}, got {}", shown(v))))
            }
        }
    }
}

/// `(rank, world_size)`: which rank of how many saved a state (its fingerprint says).
pub type SavedBy = (usize, usize);

/// How a kind reads its saved states.
pub trait ReadState: Resumable {
    /// Reads the fields of one saved state, each checked (named under `s.prefix` in errors),
    /// for the loader whose fingerprint is `mine`. Its `fingerprint`, when it has one, is
    /// compared with `mine` before (see [`check_fingerprint`]); whether a state needs one is
    /// the kind's rule. With `ranks_may_differ` the state is one of a list of every rank's.
    fn read(s: &Saved<'_>, mine: &Self::Fingerprint, ranks_may_differ: bool) -> Result<Self::State>;
}

/// Restores the state dict `state` (`load_state_dict(state)`), checked field by field and
/// against the loader's fingerprint, each error naming its field (`state['next_batch']`).
pub fn load_state_dict<K: ReadState>(loader: &Loader<K>, state: &Value) -> Result<()> {
    let (st, _) = read_state::<K>(state, &loader.fingerprint(), "state", false)?;
    loader.load_state(st)
}

/// Continues a run saved by several ranks (`load_state_dict([...])`, every rank's state dict,
/// e.g. gathered with `dist.all_gather_object`) on this loader's ranks, which may be more or
/// fewer: each state checked as by [`load_state_dict`] (its fingerprint's `rank` and
/// `world_size` may differ from the loader's, the rest may not), then continued by
/// [`Loader::load_states`]. Errors name the list element and field (`state[2]['epoch']`).
pub fn load_state_dicts<K: ReadState>(loader: &Loader<K>, states: &Value) -> Result<()> {
    loader.load_states(read_states::<K>(states, &loader.fingerprint())?)
}

/// The states of the list `states` for the loader whose fingerprint is `mine`, each with the
/// rank and world size its fingerprint says saved it.
pub fn read_states<K: ReadState>(states: &Value, mine: &K::Fingerprint) -> Result<Vec<(K::State, usize, usize)>> {
    let list = states.as_array().ok_or_else(|| {
        Error::config("state", format!("expected a list of every rank's state_dict(), got {}", shown(states)))
    })?;
    let mut out = Vec::with_capacity(list.len());
    for (k, one) in list.iter().enumerate() {
        let prefix = format!("state[{k}]");
        let (st, ranks) = read_state::<K>(one, mine, &prefix, true)?;
        let (rank, world) = ranks.ok_or_else(|| {
            Error::config(
                prefix.as_str(),
                "has no 'fingerprint' with its rank and world_size: a list of states needs state_dict()s that have \
                 one (version 2 or later)",
            )
        })?;
        out.push((st, rank, world));
    }
    Ok(out)
}

/// One saved state (named `prefix` in errors), and the `(rank, world_size)` of its fingerprint
/// when it has one.
pub fn read_state<K: ReadState>(
    state: &Value,
    mine: &K::Fingerprint,
    prefix: &str,
    ranks_may_differ: bool,
) -> Result<(K::State, Option<SavedBy>)> {
    let fields = state
        .as_object()
        .ok_or_else(|| Error::config(prefix, format!("expected a dict from state_dict(), got {}", shown(state))))?;
    let s = Saved { fields, prefix };
    let mut ranks = None;
    if let Some(fp) = fields.get("fingerprint") {
        check_fingerprint(mine, fp, &s.name("fingerprint"), ranks_may_differ)?;
        let int = |k: &str| fp.get(k).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok());
        ranks = int("rank").zip(int("world_size"));
    }
    Ok((K::read(&s, mine, ranks_may_differ)?, ranks))
}

/// Compares a saved state's fingerprint (`saved`, named `name` in errors) with the loader's,
/// `mine`: every field, but `rank` and `world_size` (at any depth: a mixture's sources have
/// theirs) with `ranks_may_differ`. A field a state of an older release lacks takes its
/// default. The error names the first field that differs, and says every difference.
pub fn check_fingerprint<F>(mine: &F, saved: &Value, name: &str, ranks_may_differ: bool) -> Result<()>
where
    F: serde::Serialize + serde::de::DeserializeOwned,
{
    if !saved.is_object() {
        return Err(Error::config(name, format!("expected the dict state_dict() gives, got {}", shown(saved))));
    }
    let internal = |e: serde_json::Error| Error::Internal(e.to_string());
    let mine = serde_json::to_value(mine).map_err(internal)?;
    // Read as the loader's own type, a saved fingerprint has the defaults of the fields it lacks.
    let theirs =
        serde_json::from_value::<F>(saved.clone()).ok().map(serde_json::to_value).transpose().map_err(internal)?;
    let mut found = Vec::new();
    differences(&mine, theirs.as_ref().unwrap_or(saved), (name.to_string(), ""), ranks_may_differ, &mut found);
    match found.first() {
        None if theirs.is_some() => Ok(()),
        None => Err(Error::config(name, "is not this kind of loader's fingerprint: expected a dict from state_dict()")),
        Some((path, _)) => Err(Error::config(
            path.as_str(),
            format!(
                "{}: the state belongs to another dataset or loader configuration (transform, tokenizer, batching, \
                 sharding)",
                found.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>().join("; ")
            ),
        )),
    }
}

/// Appends to `out` each place where `saved` differs from `mine` (`at`: the place's name in
/// errors and its field's key), as `(name, "saved with key=..., this loader has key=...")`.
fn differences(mine: &Value, saved: &Value, at: (String, &str), skip_ranks: bool, out: &mut Vec<(String, String)>) {
    let (path, key) = at;
    match (mine, saved) {
        (Value::Object(m), Value::Object(s)) => {
            for (k, v) in m.iter().filter(|(k, _)| !(skip_ranks && matches!(k.as_str(), "rank" | "world_size"))) {
                differences(v, s.get(k).unwrap_or(&Value::Null), (format!("{path}['{k}']"), k), skip_ranks, out);
            }
        }
        (Value::Array(m), Value::Array(s)) if m.len() == s.len() => {
            for (i, (a, b)) in m.iter().zip(s).enumerate() {
                differences(a, b, (format!("{path}[{i}]"), key), skip_ranks, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push((path, format!("saved with {key}={}, this loader has {key}={}", shown(b), shown(a)))),
    }
}

/// The images' and arrays' states: `seed`, `epoch`, `next_batch` (non-negative integers,
/// required; whether `seed` is the loader's and `next_batch` within the epoch is the sampler's
/// check when it is loaded); `version` 1, 2 or 3 when present (1: states without a
/// fingerprint, from older releases; 3: states of an elastic epoch, which have `elastic`, a
/// non-empty list of `{world_size, next_batch}`: the saved runs the epoch continues);
/// `fingerprint` (required by versions 2 and 3); `batches_per_epoch`, `rank`, `world_size`:
/// integers when present; without a fingerprint, `world_size` must be the loader's. Other keys
/// are left alone.
impl<K: SamplerKind> ReadState for K {
    fn read(s: &Saved<'_>, mine: &Fingerprint, ranks_may_differ: bool) -> Result<SampledState> {
        let seed = s.integer("seed", true, 0)?.unwrap_or_default();
        let epoch = s.integer("epoch", true, 0)?.unwrap_or_default();
        let next_batch = s.integer("next_batch", true, 0)?.unwrap_or_default();
        let next_batch = usize::try_from(next_batch)
            .map_err(|_| Error::config(s.name("next_batch"), format!("{next_batch} is too large")))?;
        let version = s.integer("version", false, 0)?;
        if let Some(v) = version.filter(|v| !matches!(v, 1..=3)) {
            return Err(Error::config(
                s.name("version"),
                format!("expected 1, 2 or 3 (a state from state_dict() of this or an older release), got {v}"),
            ));
        }
        let elastic = match s.fields.get("elastic") {
            None | Some(Value::Null) => None,
            Some(v) => Some(elastic_base(v, &s.name("elastic"))?),
        };
        match (version, &elastic) {
            (Some(3), None) => {
                return Err(Error::config(
                    s.prefix,
                    "has no 'elastic', which a version 3 state always has: expected a dict from state_dict()",
                ))
            }
            (v, Some(_)) if v != Some(3) => {
                return Err(Error::config(
                    s.name("version"),
                    format!(
                        "a state with 'elastic' is version 3, got {}",
                        v.map_or("no version".to_string(), |v| v.to_string())
                    ),
                ))
            }
            _ => {}
        }
        s.integer("batches_per_epoch", false, 0)?;
        s.integer("rank", false, 0)?;
        let world_size = s.integer("world_size", false, 1)?;
        if !s.fields.contains_key("fingerprint") {
            if let Some(v) = version.filter(|&v| v >= 2) {
                return Err(Error::config(
                    s.prefix,
                    format!(
                        "has no 'fingerprint', which a version {v} state always has: expected a dict from state_dict()"
                    ),
                ));
            }
            if let Some(w) = world_size.filter(|&w| !ranks_may_differ && w != mine.world_size as u64) {
                return Err(Error::config(
                    s.prefix,
                    format!("saved with world_size={w}, this loader has world_size={}", mine.world_size),
                ));
            }
        }
        Ok(SampledState { state: SamplerState { seed, epoch, next_batch }, elastic })
    }
}

/// A state's `elastic` (named `name` in errors): a non-empty list of `{world_size, next_batch}`
/// with `world_size` >= 1 and that many non-negative `next_batch` integers. Whether the batch
/// counts fit the loader is the sampler's check when it is loaded.
fn elastic_base(v: &Value, name: &str) -> Result<ElasticBase> {
    let steps = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        Error::config(name, format!("expected the non-empty list state_dict() gives, got {}", shown(v)))
    })?;
    let mut base = Vec::with_capacity(steps.len());
    for (k, step) in steps.iter().enumerate() {
        let step_name = format!("{name}[{k}]");
        let fields = step.as_object().ok_or_else(|| {
            Error::config(
                step_name.as_str(),
                format!("expected a dict {{world_size, next_batch}}, got {}", shown(step)),
            )
        })?;
        let s = Saved { fields, prefix: &step_name };
        let world = s.integer("world_size", true, 1)?.unwrap_or(1);
        let world =
            usize::try_from(world).map_err(|_| Error::config(s.name("world_size"), format!("{world} is too large")))?;
        let next = s.get("next_batch", true)?.and_then(Value::as_array).ok_or_else(|| {
            Error::config(s.name("next_batch"), format!("expected a list of {world} non-negative integers"))
        })?;
        if next.len() != world {
            return Err(Error::config(
                s.name("next_batch"),
                format!("has {} values for world_size={world}: expected one per rank", next.len()),
            ));
        }
        let next_batch = next
            .iter()
            .enumerate()
            .map(|(r, n)| {
                n.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
                    Error::config(
                        format!("{}[{r}]", s.name("next_batch")),
                        format!("expected a non-negative integer, got {}", shown(n)),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        base.push(ElasticStep { world_size: world, next_batch });
    }
    Ok(ElasticBase(base))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrays::Arrays;
    use crate::shell::resume::every_rank;
    use crate::shell::sampled::continue_sampled;
    use crate::shell::sampler::SamplerSpec;
    use serde_json::json;

    fn saved_state(v: &Value, fp: &Fingerprint) -> Result<SampledState> {
        read_state::<Arrays>(v, fp, "state", false).map(|(s, _)| s)
    }

    /// The state continuing the saved run of the list `v`, as `load_state_dicts` loads it.
    fn saved_states(v: &Value, fp: &Fingerprint) -> Result<SampledState> {
        continue_sampled(&every_rank(read_states::<Arrays>(v, fp)?)?)
    }

    fn fingerprint() -> Fingerprint {
        let spec = SamplerSpec { batch_size: 8, shuffle: true, seed: 3, ..SamplerSpec::default() };
        Fingerprint::new(&spec, 96, 0xabc, "t".into())
    }

    fn state() -> Value {
        json!({"version": 2, "seed": 3, "epoch": 2, "next_batch": 5, "batches_per_epoch": 12, "rank": 0,
               "world_size": 1, "fingerprint": serde_json::to_value(fingerprint()).unwrap()})
    }

    #[test]
    fn saved_states_are_checked_field_by_field() {
        let fp = fingerprint();
        assert_eq!(saved_state(&state(), &fp).unwrap().state, SamplerState { seed: 3, epoch: 2, next_batch: 5 });
        // An old state without version or fingerprint.
        let old = json!({"seed": 3, "epoch": 0, "next_batch": 1, "world_size": 1});
        assert_eq!(saved_state(&old, &fp).unwrap().state.next_batch, 1);
        let e = saved_state(&json!({"seed": 3, "epoch": 0, "next_batch": 1, "world_size": 2}), &fp).unwrap_err();
        assert!(e.to_string().contains("saved with world_size=2"), "{e}");
        let edit = |path: &[&str], v: Value| {
            let mut s = state();
            let mut at = &mut s;
            for k in &path[..path.len() - 1] {
                at = at.get_mut(*k).unwrap();
            }
            at.as_object_mut().unwrap().insert(path[path.len() - 1].to_string(), v);
            saved_state(&s, &fp).unwrap_err().to_string()
        };
        for (field, bad) in [
            ("next_batch", json!(-1)),
            ("next_batch", json!(1.5)),
            ("next_batch", json!("3")),
            ("seed", json!(-5)),
            ("seed", json!(true)),
            ("epoch", json!(null)),
            ("epoch", json!(1e30)),
            ("batches_per_epoch", json!(-2)),
            ("world_size", json!(0)),
        ] {
            let e = edit(&[field], bad.clone());
            assert!(e.starts_with(&format!("invalid argument `state['{field}']`")), "{field}={bad}: {e}");
        }
        let e = edit(&["version"], json!(7));
        assert!(e.contains("`state['version']`") && e.contains("expected 1, 2 or 3"), "{e}");
        let e = edit(&["fingerprint"], json!("abc"));
        assert!(e.contains("`state['fingerprint']`"), "{e}");
        for (field, bad) in
            [("samples", json!(-1)), ("batch_size", json!(0)), ("drop_last", json!(0)), ("shuffle", json!(1))]
        {
            let e = edit(&["fingerprint", field], bad);
            assert!(e.starts_with(&format!("invalid argument `state['fingerprint']['{field}']`")), "{e}");
        }
        let e = edit(&["fingerprint", "samples"], json!(95));
        assert!(e.contains("saved with samples=95"), "{e}");
        let mut s = state();
        s.as_object_mut().unwrap().remove("next_batch");
        let e = saved_state(&s, &fp).unwrap_err().to_string();
        assert!(e.contains("`state`") && e.contains("no 'next_batch'"), "{e}");
        let mut s = state();
        s.as_object_mut().unwrap().remove("fingerprint");
        assert!(saved_state(&s, &fp).unwrap_err().to_string().contains("no 'fingerprint'"));
        assert!(saved_state(&json!([1, 2]), &fp).unwrap_err().to_string().contains("expected a dict"));
    }

    #[test]
    fn a_fingerprint_is_compared_field_by_field_at_any_depth() {
        let fp = fingerprint();
        let saved = serde_json::to_value(&fp).unwrap();
        check_fingerprint(&fp, &saved, "state['fingerprint']", false).unwrap();
        // A state of an older release has no mixture: the default, "none".
        let mut old = saved.clone();
        old.as_object_mut().unwrap().remove("mixture");
        check_fingerprint(&fp, &old, "f", false).unwrap();
        // Every difference is said; the first is named.
        let mut other = saved.clone();
        other["samples"] = json!(95);
        other["batch_size"] = json!(4);
        let e = check_fingerprint(&fp, &other, "f", false).unwrap_err().to_string();
        assert!(
            e.contains(
                "`f['batch_size']`: saved with batch_size=4, this loader has batch_size=8; saved with samples=95"
            ),
            "{e}"
        );
        // Ranks differ in a list of every rank's states, at any depth (a mixture's sources).
        let nested = |rank: usize, seq: usize| json!({"sources": [{"rank": rank, "seq": seq}], "rank": rank});
        let e = check_fingerprint(&nested(0, 8), &nested(1, 8), "f", false).unwrap_err().to_string();
        assert!(e.contains("`f['rank']`") && e.contains("saved with rank=1"), "{e}");
        check_fingerprint(&nested(0, 8), &nested(1, 8), "f", true).unwrap();
        let e = check_fingerprint(&nested(0, 8), &nested(1, 9), "f", true).unwrap_err().to_string();
        assert!(e.contains("`f['sources'][0]['seq']`: saved with seq=9, this loader has seq=8"), "{e}");
        let e = check_fingerprint(&fp, &json!("x"), "f", false).unwrap_err().to_string();
        assert!(e.contains("expected the dict state_dict() gives, got \"x\""), "{e}");
    }

    #[test]
    fn lists_of_states_continue_elastically() {
        let fp = fingerprint(); // rank 0 of 1: the loader that continues
        let of = |rank: u64, world: u64, next: u64| {
            let mut s = state();
            s["next_batch"] = json!(next);
            s["rank"] = json!(rank);
            s["world_size"] = json!(world);
            s["fingerprint"]["rank"] = json!(rank);
            s["fingerprint"]["world_size"] = json!(world);
            s
        };
        let got = saved_states(&json!([of(2, 3, 4), of(0, 3, 5), of(1, 3, 5)]), &fp).unwrap();
        assert_eq!(got.state, SamplerState { seed: 3, epoch: 2, next_batch: 0 });
        assert_eq!(got.elastic, Some(ElasticBase(vec![ElasticStep { world_size: 3, next_batch: vec![5, 5, 4] }])));
        // States of an elastic epoch add a step to their base.
        let mut a = of(0, 2, 1);
        let mut b = of(1, 2, 2);
        for s in [&mut a, &mut b] {
            s["version"] = json!(3);
            s["elastic"] = json!([{"world_size": 3, "next_batch": [5, 5, 4]}]);
        }
        assert_eq!(
            saved_state(&a, &{
                let mut f = fp.clone();
                f.world_size = 2;
                f
            })
            .unwrap()
            .elastic,
            got.elastic
        );
        let chained = saved_states(&json!([a.clone(), b.clone()]), &fp).unwrap().elastic.unwrap();
        assert_eq!(chained.0.len(), 2);
        assert_eq!(chained.0[1], ElasticStep { world_size: 2, next_batch: vec![1, 2] });

        let err = |v: Value| saved_states(&v, &fp).unwrap_err().to_string();
        assert!(err(json!([])).contains("empty list"));
        assert!(err(json!({"seed": 1})).contains("expected a list"));
        let e = err(json!([of(0, 2, 1), of(0, 2, 1)]));
        assert!(e.contains("`state[1]['fingerprint']['rank']`") && e.contains("appears twice"), "{e}");
        let e = err(json!([of(0, 3, 1), of(2, 3, 1)]));
        assert!(e.contains("no state of rank 1 of the saved run's 3 ranks"), "{e}");
        let e = err(json!([of(0, 2, 1), of(1, 3, 1)]));
        assert!(e.contains("`state[1]['fingerprint']['world_size']`"), "{e}");
        let mut other = of(1, 2, 1);
        other["epoch"] = json!(7);
        let e = err(json!([of(0, 2, 1), other]));
        assert!(e.contains("`state[1]['epoch']`") && e.contains("is 7, state[0] has 2"), "{e}");
        let mut other = of(1, 2, 1);
        other["fingerprint"]["samples"] = json!(95);
        let e = err(json!([of(0, 2, 1), other]));
        assert!(e.contains("`state[1]['fingerprint']['samples']`: saved with samples=95"), "{e}");
        let e = err(json!([a.clone(), of(1, 2, 1)]));
        assert!(e.contains("`state[1]['elastic']`"), "{e}");
        let mut rank_out = of(1, 2, 1);
        rank_out["fingerprint"]["rank"] = json!(5);
        assert!(err(json!([of(0, 2, 1), rank_out])).contains("rank 5 is not in 0..2"));
        let mut old = of(1, 2, 1);
        old.as_object_mut().unwrap().remove("fingerprint");
        old.as_object_mut().unwrap().remove("version");
        assert!(err(json!([of(0, 2, 1), old])).contains("`state[1]`: has no 'fingerprint'"));
        let mut negative = of(1, 2, 1);
        negative["next_batch"] = json!(-1);
        let e = err(json!([of(0, 2, 1), negative]));
        assert!(e.contains("`state[1]['next_batch']`"), "{e}");

        // The elastic field of one state, checked.
        let one = |elastic: Value, version: Value| {
            let mut s = state();
            s["elastic"] = elastic;
            s["version"] = version;
            saved_state(&s, &fp).map(|s| s.elastic)
        };
        let e = one(json!([{"world_size": 2, "next_batch": [1]}]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic'][0]['next_batch']`") && e.contains("1 values for world_size=2"), "{e}");
        let e = one(json!([{"world_size": 2, "next_batch": [1, -1]}]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic'][0]['next_batch'][1]`"), "{e}");
        let e = one(json!([{"world_size": 0, "next_batch": []}]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic'][0]['world_size']`"), "{e}");
        let e = one(json!([]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic']`"), "{e}");
        let e = one(json!([{"world_size": 1, "next_batch": [1]}]), json!(2)).unwrap_err().to_string();
        assert!(e.contains("`state['version']`") && e.contains("version 3"), "{e}");
        let e = one(Value::Null, json!(3)).unwrap_err().to_string();
        assert!(e.contains("has no 'elastic'"), "{e}");
    }
}
