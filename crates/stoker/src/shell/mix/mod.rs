//! Weighted mixtures of sources: [`schedule`] gives every position of a mixture its source, a
//! pure function of the weights and the position with exact shares at every prefix; [`order`]
//! turns it into each rank's sample order over the sources' passes, epochs and elastic resumes;
//! [`tally`] counts each source's items and work for the report.

pub mod order;
pub mod schedule;
pub mod tally;

pub use order::{Deal, Exhausted, MixPart, MixSpec, Mixture, SourceInfo};
pub use schedule::{Schedule, Weights};
pub use tally::{with_slowest, MixReport, SourceReport, Tally};

#[cfg(test)]
mod tests;
