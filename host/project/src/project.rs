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
            let c = self
                .model
                .template(key, self.source.as_mut())
                .cloned()
                .and_then(|t| Costed::new(&self.model, &t, &self.plan, &self.gpu, &self.measured, kernels));
            self.costed.insert((key, kernels), c);
        }
        self.costed[&(key, kernels)].as_ref().map_err(Clone::clone)
    }

    /// Build the templates of `keys` that are not cached yet, on every core (see
    /// [`Model::prebuild`]); [`Projector::costed`] then finds them.
    pub fn prebuild(&mut self, keys: &[ShardKey]) {
        self.model.prebuild(keys, self.source.as_mut());
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
