//! The projection's front door: one model on one GPU type under one precision plan,
//! projecting any layout ([`Projector::project`]) with its templates and timings cached
//! so a search or a calibration fit can ask again and again cheaply.

use rustc_hash::FxHashMap as HashMap;

use crate::model::{GraphSource, Model};
use crate::precision::Plan;
use crate::profile::GpuProfile;
use crate::step::{Costed, LayoutSpec, Projection, Reject};
use crate::template::{Kernels, Measured, ShardKey};

/// A model, its graph source, a GPU and a plan.
pub struct Projector<'s> {
    pub model: Model,
    source: Box<dyn GraphSource + 's>,
    pub gpu: GpuProfile,
    pub plan: Plan,
    measured: Measured,
    costed: HashMap<(ShardKey, Kernels), Result<Costed, String>>,
}

impl<'s> Projector<'s> {
    pub fn new(model: Model, source: Box<dyn GraphSource + 's>, gpu: GpuProfile, plan: Plan) -> Projector<'s> {
        Projector { model, source, gpu, plan, measured: Measured::default(), costed: HashMap::default() }
    }

    /// Use per-op times measured on the target device where they exist.
    pub fn with_measured(mut self, measured: Measured) -> Projector<'s> {
        self.measured = measured;
        self.costed.clear();
        self
    }

    /// Change the GPU profile (a calibration step); keeps the templates.
    pub fn set_gpu(&mut self, gpu: GpuProfile) {
        self.gpu = gpu;
        self.costed.clear();
    }

    /// Change the precision plan (another series of the same model); keeps the templates.
    pub fn set_plan(&mut self, plan: Plan) {
        self.plan = plan;
        self.costed.clear();
    }

    /// The template for `key`, timed with `kernels`.
    ///
    /// # Errors
    /// The sharding does not fit the model, or the plan needs a format the GPU lacks.
    pub fn costed(&mut self, key: ShardKey, kernels: Kernels) -> Result<&Costed, String> {
        if !self.costed.contains_key(&(key, kernels)) {
            // Built (and cached) first, then read back by shared reference: timing it needs
            // the model too, and cloning the template (a `String` per op) to get around
            // that cost a third as much again as the timing.
            let c = match self.model.template(key, self.source.as_mut()).map(|_| ()) {
                Err(e) => Err(e),
                Ok(()) => match self.model.built(key) {
                    Some(Ok(t)) => Costed::new(&self.model, t, &self.plan, &self.gpu, &self.measured, kernels),
                    Some(Err(e)) => Err(e.clone()),
                    None => unreachable!("Model::template caches what it builds"),
                },
            };
            self.costed.insert((key, kernels), c);
        }
        self.costed[&(key, kernels)].as_ref().map_err(Clone::clone)
    }

    /// Build the templates of `keys` that are not cached yet, and time them with
    /// `kernels`, on every core (see [`Model::prebuild`]); [`Projector::costed`] then
    /// finds them. Timing a template is a pure function of it, the model, the GPU, the
    /// plan and the measured times, so the cache ends as [`Projector::costed`] one key
    /// at a time would leave it. Run one after another on the caller's thread, the
    /// timings were about a quarter of a cold DeepSeek search's wall time. A key whose micro-batch graph
    /// could not be read is left to [`Projector::costed`] to report.
    pub fn prebuild(&mut self, keys: &[ShardKey], kernels: Kernels) {
        use rayon::prelude::*;
        self.model.prebuild(keys, self.source.as_mut());
        let mut todo: Vec<ShardKey> = keys.iter().copied().filter(|&k| !self.costed.contains_key(&(k, kernels))).collect();
        todo.sort();
        todo.dedup();
        let (model, plan, gpu, measured) = (&self.model, &self.plan, &self.gpu, &self.measured);
        let fresh = Costed::fresh_layers(model, plan);
        let timed: Vec<((ShardKey, Kernels), Result<Costed, String>)> = todo
            .into_par_iter()
            .filter_map(|k| {
                let c = match model.built(k)? {
                    Ok(t) => Costed::new_with(model, t, plan, gpu, measured, kernels, &fresh),
                    Err(e) => Err(e.clone()),
                };
                Some(((k, kernels), c))
            })
            .collect();
        self.costed.extend(timed);
    }

    /// Rank 0's sharded graph for `key`: the ops a measurement for `key` must name.
    ///
    /// # Errors
    /// The sharding does not fit the model.
    pub fn rank_graph(&mut self, key: ShardKey) -> Result<runner_graph::Graph, String> {
        self.model.rank_graph(key, self.source.as_mut())
    }

    /// Project one layout.
    ///
    /// # Errors
    /// Why the layout cannot run (a layout that runs out of memory is projected with
    /// `fits: false`, not refused).
    pub fn project(&mut self, layout: &LayoutSpec) -> Result<Projection, String> {
        let c = self.costed(layout.key(), layout.kernels)?;
        c.evaluate(&layout.schedule()).map_err(|r: Reject| r.to_string())
    }
}
