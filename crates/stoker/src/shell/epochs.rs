//! [`Epochs`]: the epochs of a loader, written once for every kind: the position a saved state
//! resumes at (what [`super::resume`] saves and restores), `set_epoch`, and the rule that a
//! newer iteration (or a new epoch, or a restored state) makes the running one stale and takes
//! its buffers back at once.

use super::sampler::{Position, Sampler};
use std::sync::{Arc, Mutex};

/// A running iteration, as its loader sees it: something that can be stopped and made stale
/// while the iterator object lives on elsewhere (its next batch is then an error naming why).
pub trait Retire: Send + Sync {
    /// Stops the iteration now, returns its buffers and makes its next batch an error naming
    /// `why`.
    fn make_stale(&self, why: &str);
}

impl<S: Send + 'static> Retire for super::ordered::Run<S> {
    fn make_stale(&self, why: &str) {
        super::ordered::Run::make_stale(self, why);
    }
}

/// The running iteration of a loader or stage, if any.
#[derive(Default)]
pub struct Active(Mutex<Option<Arc<dyn Retire>>>);

impl Active {
    /// Makes the running iteration, if any, stale (`why`: what replaced it).
    pub fn retire(&self, why: &str) {
        let old = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(old) = old {
            old.make_stale(why);
        }
    }

    /// Records `it` as the running iteration.
    pub fn set(&self, it: Arc<dyn Retire>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(it);
    }
}

/// A kind's position: where its iterations start and stand. The sampler's [`Position`]
/// (images, arrays) and the token loader's document position are two; [`Epochs`] holds one
/// and applies the rules every kind shares.
pub trait Positioned: Default + Send + Sync + 'static {
    /// Selects `epoch`; returns whether it changed (which forgets a restored position).
    fn set_epoch(&self, epoch: u64) -> bool;
    /// Whether a restored state waits for the next iteration.
    fn resume_pending(&self) -> bool;
}

impl Positioned for Position {
    fn set_epoch(&self, epoch: u64) -> bool {
        Position::set_epoch(self, epoch)
    }

    fn resume_pending(&self) -> bool {
        Position::resume_pending(self)
    }
}

/// Epoch, position and the running iteration of one loader.
#[derive(Default)]
pub struct Epochs<P: Positioned = Position> {
    position: Arc<P>,
    active: Active,
}

impl<P: Positioned> Epochs<P> {
    /// The position the iterations of this loader advance.
    pub fn position(&self) -> &Arc<P> {
        &self.position
    }

    /// Selects the epoch for the next iteration. Changing it makes a running iteration stale
    /// and forgets a restored position; setting the current epoch again changes nothing (so a
    /// restored state survives the usual `set_epoch` call).
    pub fn set_epoch(&self, epoch: u64) {
        if self.position.set_epoch(epoch) {
            self.active.retire(&format!("set_epoch({epoch}) was called after this iterator started"));
        }
    }

    /// Whether a state was loaded and no iteration has started from it yet.
    pub fn resume_pending(&self) -> bool {
        self.position.resume_pending()
    }

    /// A state was restored into the position: a running iteration becomes stale.
    pub fn restored(&self) {
        self.active.retire("load_state_dict was called after this iterator started");
    }

    /// Stops the running iteration (it becomes stale, its buffers return to the pool) before
    /// something else takes the loader's threads (`why` names it).
    pub fn retire(&self, why: &str) {
        self.active.retire(why);
    }

    /// Stops the running iteration before a new one starts; the new one asks the position
    /// where it starts.
    pub fn begin_pass(&self) -> &Arc<P> {
        self.active.retire("a newer iteration of this loader was started");
        &self.position
    }

    /// Records `it` as the running iteration (the next [`Epochs::begin_pass`] retires it).
    pub fn started(&self, it: Arc<dyn Retire>) {
        self.active.set(it);
    }
}

/// The sampler's kinds (images, arrays): batch counts through the sampler.
impl Epochs<Position> {
    /// Batches in the current epoch on this rank (a continued elastic epoch has its own count).
    pub fn batches(&self, sampler: &Sampler) -> usize {
        self.position.batches(sampler)
    }
}
