//! Weighted mixtures of sources: [`schedule`] gives every position of a mixture its source, a
//! pure function of the weights and the position with exact shares at every prefix; [`order`]
//! turns it into each rank's sample order over the sources' passes, epochs and elastic resumes.

pub mod order;
pub mod schedule;

pub use order::{Exhausted, MixPart, MixSpec, Mixture, SourceInfo};
pub use schedule::{Schedule, Weights};

#[cfg(test)]
mod tests;
