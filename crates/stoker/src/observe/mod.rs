//! Observation and tuning: what every stage did, and the settings that follow from it.
//!
//! - [`telemetry`]: per-stage counters (atomics), the shell's counters of every loader
//!   (buffer wait, consumer and its starvation, transfer, samples, skipped samples, device).
//! - [`report`]: the [`report::Report`] of every kind: the common fields once, the kind's typed
//!   [`report::Section`] flattened into it, the [`report::Bottleneck`] verdict's shape.
//! - [`trace`]: a bounded ring of Chrome/Perfetto events, written at the end of a pass.
//! - [`tune`]: `threads`/`prefetch="auto"`, tuned during the first epoch.
//! - [`budget`]: the host-wide CPU registry (`/dev/shm/stoker-cpu-budget`), locked with a
//!   deadline, that splits a host's cores among stoker processes.
//! - [`cpu`]: this process's real CPU allowance (affinity mask, cgroup quota).
//!
//! Owns: counting, reporting, tuning decisions. May not touch: samples or batch buffers (it
//! observes the stages; the stages call it, never the reverse), or any kind's types (a kind
//! brings its report section and its verdict).

pub mod budget;
pub mod cpu;
pub mod report;
pub mod telemetry;
pub mod trace;
pub mod tune;
