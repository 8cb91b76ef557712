//! Saved states a user hands back (`load_state_dict`) to an image or array loader, checked
//! field by field: their positions, the elastic bases of a resume on another number of ranks,
//! and their fingerprints against the loader's ([`saved_state`], [`saved_states`]). [`Saved`]
//! reads the fields of any state, the token loader's too ([`super::token_state`]).

use crate::error::{Error, Result};
use crate::shell::sampler::{ElasticBase, ElasticStep, Fingerprint, SamplerState};
use crate::values::shown;
use serde_json::{Map, Value};

/// The fields of a saved state (`state_dict()`), for their checks.
pub(super) struct Saved<'a> {
    /// The state's fields.
    pub(super) fields: &'a Map<String, Value>,
    /// How the fields are named in errors: `state['...']`, `state['fingerprint']['...']`,
    /// `state[2]['...']` (a list's third state).
    pub(super) prefix: &'a str,
}

impl Saved<'_> {
    /// How field `key` is named in errors (`state['seed']`).
    pub(super) fn name(&self, key: &str) -> String {
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
    pub(super) fn integer(&self, key: &str, required: bool, min: u64) -> Result<Option<u64>> {
        let Some(v) = self.get(key, required)? else { return Ok(None) };
        match v.as_u64() {
            Some(n) if n >= min => Ok(Some(n)),
            _ => {
                let what = if min == 0 { "a non-negative integer".to_string() } else { format!("an integer >= {min}") };
                Err(Error::config(self.name(key), format!("expected {what}, got {}", shown(v))))
            }
        }
    }

    /// Checks that field `key` is there and is text.
    fn text(&self, key: &str) -> Result<()> {
        match self.get(key, true)? {
            Some(Value::String(_)) => Ok(()),
            Some(v) => Err(Error::config(self.name(key), format!("expected a string, got {}", shown(v)))),
            None => Ok(()),
        }
    }

    /// Checks that field `key` is there and is a boolean.
    fn boolean(&self, key: &str) -> Result<()> {
        match self.get(key, true)? {
            Some(Value::Bool(_)) => Ok(()),
            Some(v) => Err(Error::config(self.name(key), format!("expected True or False, got {}", shown(v)))),
            None => Ok(()),
        }
    }
}

/// A checked saved state of an image or array loader: the position and, when its epoch
/// continues saved runs on another number of ranks, their elastic base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    /// Seed, epoch and the next batch (of the elastic epoch's order, with `elastic`).
    pub state: SamplerState,
    /// The saved runs the epoch continues (`state_dict()['elastic']`), if any.
    pub elastic: Option<ElasticBase>,
}

/// A position a user hands back (`load_state_dict(state)`, the JSON of a `state_dict()`),
/// checked field by field for the loader whose fingerprint is `mine`:
/// - `seed`, `epoch`, `next_batch`: non-negative integers (required); whether `seed` is the
///   loader's and `next_batch` within the epoch is the sampler's check when it is loaded;
/// - `version`: 1, 2 or 3 when present (1: states without a fingerprint, from older releases;
///   3: states of an elastic epoch, which have `elastic`);
/// - `elastic` (version 3 only): a non-empty list of `{world_size, next_batch}` (an integer
///   >= 1, and that many non-negative integers): the saved runs the epoch continues;
/// - `fingerprint` (required by versions 2 and 3): an object whose fields have their types
///   (`samples`, `batch_size`, `world_size`, `rank` integers, `drop_last` a bool, the rest
///   strings), then compared with `mine`, the first difference named;
/// - `batches_per_epoch`, `rank`, `world_size`: integers when present; without a fingerprint,
///   `world_size` must be the loader's.
///
/// Other keys are left alone. Each error names its field (`state['next_batch']`).
pub fn saved_state(state: &Value, mine: &Fingerprint) -> Result<SavedState> {
    Ok(checked_state(state, mine, "state", false)?.0)
}

/// The states of every rank of a saved run (`load_state_dict([...])`, e.g. gathered with
/// `dist.all_gather_object`), checked for continuing its epoch on the loader whose fingerprint
/// is `mine`, which may have another number of ranks: each state as by [`saved_state`]
/// (a fingerprint required; its `rank` and `world_size` may differ from `mine`'s, the rest may
/// not), all of one seed, epoch, world size and elastic base, and every rank `0..world_size`
/// exactly once, in any order. Returns the start of the continued epoch: batch 0 of an
/// elastic base that is the states' own base plus one step, what each saved rank had
/// delivered. Errors name the list element and field (`state[2]['epoch']`).
pub fn saved_states(states: &Value, mine: &Fingerprint) -> Result<SavedState> {
    let list = states.as_array().ok_or_else(|| {
        Error::config("state", format!("expected a list of every rank's state_dict(), got {}", shown(states)))
    })?;
    if list.is_empty() {
        return Err(Error::config("state", "an empty list: give the state_dict() of every rank of the saved run"));
    }
    let mut first: Option<(SavedState, usize)> = None;
    let mut at: Vec<Option<(usize, usize)>> = Vec::new(); // per saved rank: (list index, next_batch)
    for (k, one) in list.iter().enumerate() {
        let prefix = format!("state[{k}]");
        let (saved, ranks) = checked_state(one, mine, &prefix, true)?;
        let (rank, world) = ranks.ok_or_else(|| {
            Error::config(
                prefix.as_str(),
                "has no 'fingerprint': a list of states needs state_dict()s of version 2 or later",
            )
        })?;
        let (f, w) = first.get_or_insert_with(|| (saved.clone(), world));
        let differs = |field: &str, theirs: String, ours: String| {
            Error::config(
                format!("{prefix}[{field}]"),
                format!("is {theirs}, state[0] has {ours}: give the states of one run, saved at one time"),
            )
        };
        if saved.state.seed != f.state.seed {
            return Err(differs("'seed'", saved.state.seed.to_string(), f.state.seed.to_string()));
        }
        if saved.state.epoch != f.state.epoch {
            return Err(differs("'epoch'", saved.state.epoch.to_string(), f.state.epoch.to_string()));
        }
        if world != *w {
            return Err(differs("'fingerprint']['world_size'", world.to_string(), w.to_string()));
        }
        if saved.elastic != f.elastic {
            let show = |e: &Option<ElasticBase>| {
                e.as_ref().map_or("None".into(), |e| serde_json::to_string(e).unwrap_or_default())
            };
            return Err(differs("'elastic'", show(&saved.elastic), show(&f.elastic)));
        }
        if rank >= world {
            return Err(Error::config(
                format!("{prefix}['fingerprint']['rank']"),
                format!("rank {rank} is not in 0..{world} (world_size)"),
            ));
        }
        at.resize(world, None);
        if let Some((j, _)) = at[rank].replace((k, saved.state.next_batch)) {
            return Err(Error::config(
                format!("{prefix}['fingerprint']['rank']"),
                format!(
                    "rank {rank} appears twice in the list (state[{j}] and state[{k}]): give each rank's state once"
                ),
            ));
        }
    }
    let (f, world) = first.expect("a non-empty list");
    let next_batch = at
        .into_iter()
        .enumerate()
        .map(|(r, a)| {
            a.map(|(_, n)| n).ok_or_else(|| {
                Error::config(
                    "state",
                    format!(
                        "has no state of rank {r} of the saved run's {world} ranks: give every rank's state_dict() \
                         (e.g. gathered with dist.all_gather_object)"
                    ),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut base = f.elastic.unwrap_or_default();
    base.0.push(ElasticStep { world_size: world, next_batch });
    Ok(SavedState { state: SamplerState { next_batch: 0, ..f.state }, elastic: Some(base) })
}

/// [`saved_state`] with its errors named under `prefix`; with `ranks_may_differ` the
/// fingerprint's `rank` and `world_size` are not compared. Also returns `(rank, world_size)`
/// from the fingerprint, when there is one.
fn checked_state(
    state: &Value,
    mine: &Fingerprint,
    prefix: &str,
    ranks_may_differ: bool,
) -> Result<(SavedState, Option<(usize, usize)>)> {
    let fields = state
        .as_object()
        .ok_or_else(|| Error::config(prefix, format!("expected a dict from state_dict(), got {}", shown(state))))?;
    let s = Saved { fields, prefix };
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
    let elastic = match fields.get("elastic") {
        None | Some(Value::Null) => None,
        Some(v) => Some(elastic_base(v, &s.name("elastic"))?),
    };
    match (version, &elastic) {
        (Some(3), None) => {
            return Err(Error::config(
                prefix,
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
    let mut ranks = None;
    match fields.get("fingerprint") {
        Some(Value::Object(fp)) => {
            let fp_prefix = s.name("fingerprint");
            let f = Saved { fields: fp, prefix: &fp_prefix };
            for key in ["samples", "rank"] {
                f.integer(key, true, 0)?;
            }
            for key in ["batch_size", "world_size"] {
                f.integer(key, true, 1)?;
            }
            for key in ["sample_hash", "shuffle", "transform"] {
                f.text(key)?;
            }
            f.boolean("drop_last")?;
            mine.check_as(&Value::Object(fp.clone()), prefix, ranks_may_differ)?;
            let int = |k: &str| fp.get(k).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok());
            ranks = int("rank").zip(int("world_size"));
        }
        Some(v) => {
            return Err(Error::config(
                s.name("fingerprint"),
                format!("expected the dict state_dict() gives, got {}", shown(v)),
            ))
        }
        None if version.is_some_and(|v| v >= 2) => {
            return Err(Error::config(
                prefix,
                format!(
                    "has no 'fingerprint', which a version {} state always has: expected a dict from state_dict()",
                    version.unwrap_or_default()
                ),
            ))
        }
        None => {
            if let Some(w) = world_size.filter(|&w| !ranks_may_differ && w != mine.world_size as u64) {
                return Err(Error::config(
                    prefix,
                    format!("saved with world_size={w}, this loader has world_size={}", mine.world_size),
                ));
            }
        }
    }
    Ok((SavedState { state: SamplerState { seed, epoch, next_batch }, elastic }, ranks))
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
    use crate::shell::sampler::SamplerSpec;
    use serde_json::json;

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
        assert!(e.contains("`state[1]`") && e.contains("saved with samples=95"), "{e}");
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
