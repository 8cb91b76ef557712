//! Observation and tuning: what every stage did, and the settings that follow from it.
//!
//! - [`telemetry`]: per-stage counters (atomics), the consumer's starvation, the report and the
//!   bottleneck verdict.
//! - [`trace`]: a bounded ring of Chrome/Perfetto events, written at the end of a pass.
//! - [`tune`]: `threads`/`prefetch="auto"`, tuned during the first epoch.
//! - [`budget`]: the host-wide CPU registry (`/dev/shm/stoker-cpu-budget`), locked with a
//!   deadline, that splits a host's cores among stoker processes.
//! - [`cpu`]: this process's real CPU allowance (affinity mask, cgroup quota).
//!
//! Owns: counting, reporting, tuning decisions. May not touch: samples or batch buffers (it
//! observes the stages; the stages call it, never the reverse).

pub mod budget;
pub mod cpu;
pub mod telemetry;
pub mod trace;
pub mod tune;
