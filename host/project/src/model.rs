//! A model variant at one sequence length, as the projection needs it: its layer
//! structure, FLOPs per sequence, parameters, and a cache of reduced-depth graphs (per
//! micro-batch) and sharded templates (per [`ShardKey`]).
//!
//! Graphs come from a [`GraphSource`]: the runner's is the workload plugin (sandboxed),
//! tests use the plugin crates natively. The projection never builds a model itself.

use rustc_hash::FxHashMap as HashMap;

use runner_graph::count::{self, Convention, ParamCount};
use runner_graph::peft::{self, Lora};
use runner_graph::{Graph, OpKind};

use crate::depth::{self, Depth};
use crate::template::{ShardKey, Template};

/// Where the projection gets a model's logical forward graphs.
pub trait GraphSource {
    /// The full-depth logical graph of the model at the projection's sequence length for
    /// micro-batch `micro_batch`.
    ///
    /// # Errors
    /// The plugin failed or refused; the message names it.
    fn graph(&mut self, micro_batch: u32) -> Result<Graph, String>;
}

impl<F: FnMut(u32) -> Result<Graph, String>> GraphSource for F {
    fn graph(&mut self, micro_batch: u32) -> Result<Graph, String> {
        self(micro_batch)
    }
}

/// What a training step trains: the whole model, or a fine-tune of part of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Training {
    /// Every weight (pre-training, full fine-tuning).
    #[default]
    Full,
    /// LoRA adapters on a frozen model ([`runner_graph::peft::lora`]).
    Lora(Lora),
}

impl Training {
    /// How reports name it: empty for full training, `LoRA r32` for a LoRA fine-tune.
    pub fn label(&self) -> String {
        match self {
            Training::Full => String::new(),
            Training::Lora(l) => {
                let qkv = if l.targets == runner_graph::peft::LoraTargets::Qkv { " qkv" } else { "" };
                format!("LoRA r{}{qkv}", l.rank)
            }
        }
    }
}

/// A source whose graphs are another source's, turned into what `training` trains.
pub struct TrainedSource<'s> {
    pub inner: Box<dyn GraphSource + 's>,
    pub training: Training,
}

impl GraphSource for TrainedSource<'_> {
    fn graph(&mut self, micro_batch: u32) -> Result<Graph, String> {
        let g = self.inner.graph(micro_batch)?;
        match self.training {
            Training::Full => Ok(g),
            Training::Lora(l) => peft::lora(&g, &l).map_err(|e| format!("LoRA fine-tuning graph: {e}")),
        }
    }
}

/// Shape facts the layout search enumerates over.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shape {
    pub layers: u32,
    pub hidden: u64,
    /// Query heads and kv heads of each attention shape.
    pub heads: Vec<(u64, u64)>,
    /// Routed experts (0: dense).
    pub experts: u64,
    /// Mamba-2 scans (a hybrid model's mixer layers).
    pub scans: u32,
    pub vocab: u64,
    /// Multi-token-prediction layers beside the head (layers past the main ones).
    pub mtp: u32,
}

impl Shape {
    /// Whether Megatron-Core's attention splits over a tp of this size: it divides every
    /// attention shape's query heads and kv heads (`num_query_groups`). The search tries
    /// only such tps; [`Shape::kv_replicated`] names the ones past the kv heads.
    pub fn tp_splits_heads(&self, tp: u32) -> bool {
        let tp = u64::from(tp);
        self.heads.iter().all(|&(h, kv)| h.is_multiple_of(tp) && kv.is_multiple_of(tp))
    }

    /// The kv heads a tp of this size replicates: `Some(kv)` where tp divides every
    /// attention shape's query heads and is a multiple past some shape's `kv` kv heads.
    /// The executor runs such a tp (each kv head on tp/kv ranks); Megatron-Core's
    /// attention divides the kv heads (`num_query_groups`) by tp and cannot, so the
    /// search leaves it out and `runner project` says so when it is asked for.
    pub fn kv_replicated(&self, tp: u32) -> Option<u64> {
        let tp = u64::from(tp);
        if !self.heads.iter().all(|&(h, _)| h.is_multiple_of(tp)) {
            return None;
        }
        self.heads.iter().map(|&(_, kv)| kv).find(|&kv| kv > 0 && tp > kv && tp.is_multiple_of(kv))
    }
}

/// One model variant at one sequence length.
pub struct Model {
    pub name: String,
    pub seq_len: u32,
    pub depth: Depth,
    /// Model FLOPs (forward + backward, no recompute, attention over unmasked keys) of
    /// one sequence, multi-token-prediction modules included.
    pub flops_per_sequence: f64,
    pub params: ParamCount,
    pub shape: Shape,
    /// The logical graph at micro-batch 1 (precision plans are made over it).
    pub graph: Graph,
    reduced: HashMap<u32, Graph>,
    templates: HashMap<ShardKey, Result<Template, String>>,
}

impl Model {
    /// Read a model through `source`.
    ///
    /// # Errors
    /// The source failed, or the graph has no transformer layers.
    pub fn new(name: &str, seq_len: u32, source: &mut dyn GraphSource) -> Result<Model, String> {
        let graph = source.graph(1)?;
        // A graph without transformer layers (all embedding and head) still projects, on
        // one pipeline stage.
        let depth = depth::analyse(&graph);
        let flops_per_sequence = count::model_flops_per_step(&graph, &Convention::CAUSAL);
        let params = count::params(&graph);
        // Layer numbers are the plugin's: std's SipHash, not FxHash.
        let main: std::collections::HashSet<i32> = depth.layers.iter().copied().collect();
        let beside: std::collections::HashSet<i32> = graph.ops.iter().map(|o| o.layer).filter(|l| *l >= 0 && !main.contains(l)).collect();
        let mut shape = Shape { layers: depth.len() as u32, mtp: beside.len() as u32, ..Shape::default() };
        for op in &graph.ops {
            let dims = |i: usize| op.inputs.get(i).map_or(&[][..], |&t| graph.tensors[t].shape.as_slice());
            match op.kind {
                OpKind::Attention => {
                    if let ([_, _, h, _], [_, _, hkv, _]) = (dims(0), dims(1))
                        && !shape.heads.contains(&(*h, *hkv))
                    {
                        shape.heads.push((*h, *hkv));
                    }
                }
                OpKind::Embedding => {
                    if let [v, c] = dims(1) {
                        shape.vocab = *v;
                        shape.hidden = *c;
                    }
                }
                OpKind::GroupedLinear => {
                    if let [e, _, _] = dims(1) {
                        shape.experts = *e;
                    }
                }
                OpKind::SsmScan => shape.scans += 1,
                _ => {}
            }
        }
        Ok(Model {
            name: name.to_string(),
            seq_len,
            depth,
            flops_per_sequence,
            params,
            shape,
            graph,
            reduced: HashMap::default(),
            templates: HashMap::default(),
        })
    }

    /// The template for `key` (built on first use, then cached; a sharding the graph
    /// does not allow is cached as its error).
    ///
    /// # Errors
    /// The source failed for this micro-batch, or the sharding does not fit the graph.
    pub fn template(&mut self, key: ShardKey, source: &mut dyn GraphSource) -> Result<&Template, String> {
        if !self.templates.contains_key(&key) {
            let layers = self.depth.layers.clone();
            let built = self.reduced_graph(key.mbs, source).and_then(|g| Template::build(g, &layers, key));
            self.templates.insert(key, built);
        }
        self.templates[&key].as_ref().map_err(Clone::clone)
    }

    /// Build the templates of `keys` not cached yet, in parallel: the reduced graph of each
    /// micro-batch is read first (the plugin runs one call at a time), then each
    /// sharding's template is a pure function of its graph and key, so the cache ends as
    /// [`Model::template`] one key at a time would leave it. A micro-batch whose graph
    /// cannot be read is left to [`Model::template`] to report.
    pub fn prebuild(&mut self, keys: &[ShardKey], source: &mut dyn GraphSource) {
        use rayon::prelude::*;
        let mut todo: Vec<ShardKey> = keys.iter().copied().filter(|k| !self.templates.contains_key(k)).collect();
        todo.sort_by_key(|k| (k.mbs, k.tp, k.cp, k.ep, k.etp, k.sp));
        todo.dedup();
        let mut mbss: Vec<u32> = todo.iter().map(|k| k.mbs).collect();
        mbss.dedup();
        for mbs in mbss {
            if self.reduced_graph(mbs, source).is_err() {
                todo.retain(|k| k.mbs != mbs);
            }
        }
        let (reduced, layers) = (&self.reduced, &self.depth.layers);
        let built: Vec<(ShardKey, Result<Template, String>)> =
            todo.into_par_iter().map(|k| (k, Template::build(&reduced[&k.mbs], layers, k))).collect();
        self.templates.extend(built);
    }

    /// The template for `key` if it has been built (or refused), without building it.
    pub fn built(&self, key: ShardKey) -> Option<Result<&Template, &String>> {
        self.templates.get(&key).map(Result::as_ref)
    }

    /// Rank 0's sharded graph for `key` (what the template for `key` reads).
    ///
    /// # Errors
    /// As [`Model::template`].
    pub fn rank_graph(&mut self, key: ShardKey, source: &mut dyn GraphSource) -> Result<Graph, String> {
        self.reduced_graph(key.mbs, source).and_then(|g| crate::template::rank_graph(g, key))
    }

    fn reduced_graph(&mut self, mbs: u32, source: &mut dyn GraphSource) -> Result<&Graph, String> {
        if !self.reduced.contains_key(&mbs) {
            let full = if mbs == 1 { self.graph.clone() } else { source.graph(mbs)? };
            let d = depth::analyse(&full);
            if d.class != self.depth.class {
                return Err(format!("{}: the graph's layer pattern changes with the micro-batch", self.name));
            }
            let g = depth::reduce(&full, &d).unwrap_or(full);
            self.reduced.insert(mbs, g);
        }
        Ok(&self.reduced[&mbs])
    }

    /// The representative layer position (in the reduced graph) of model layer `p`.
    pub fn rep(&self, p: usize) -> usize {
        self.depth.reps[self.depth.class[p]]
    }
}

#[cfg(test)]
mod tests {
    use super::{Shape, Training};

    fn shape(heads: &[(u64, u64)]) -> Shape {
        Shape { layers: 1, hidden: 1, heads: heads.to_vec(), experts: 0, scans: 0, vocab: 1, mtp: 0 }
    }

    /// One rule for a tp and the attention heads: the search's tps split the query and kv
    /// heads; past the kv heads a tp replicates them (named, not tried); a tp that divides
    /// neither is neither.
    #[test]
    fn a_tp_splits_the_heads_or_replicates_the_kv_heads() {
        let gqa = shape(&[(64, 8)]);
        assert!(gqa.tp_splits_heads(8) && gqa.kv_replicated(8).is_none());
        assert!(!gqa.tp_splits_heads(16) && gqa.kv_replicated(16) == Some(8));
        assert!(!gqa.tp_splits_heads(3) && gqa.kv_replicated(3).is_none());
        // Two attention shapes: the narrower kv count decides.
        let mixed = shape(&[(32, 8), (32, 4)]);
        assert!(mixed.tp_splits_heads(4));
        assert!(!mixed.tp_splits_heads(8) && mixed.kv_replicated(8) == Some(4));
        // No attention (a pure Mamba stack): every tp splits.
        assert!(shape(&[]).tp_splits_heads(8));
    }

    /// A tp that divides the kv heads but not the query heads, or that the kv heads do
    /// not divide, replicates nothing: it is no tp of this model at all.
    #[test]
    fn kv_replication_needs_the_query_heads_split_and_whole_copies() {
        assert_eq!(shape(&[(24, 8)]).kv_replicated(16), None);
        assert_eq!(shape(&[(48, 8)]).kv_replicated(12), None);
        assert_eq!(shape(&[(48, 8)]).kv_replicated(16), Some(8));
    }

    /// Reports name a LoRA fine-tune by its rank and, on the attention's qkv alone, say
    /// so; full training has no label.
    #[test]
    fn training_labels() {
        use runner_graph::peft::{Lora, LoraTargets};
        assert_eq!(Training::Full.label(), "");
        assert_eq!(Training::Lora(Lora { rank: 32, targets: LoraTargets::All }).label(), "LoRA r32");
        assert_eq!(Training::Lora(Lora { rank: 8, targets: LoraTargets::Qkv }).label(), "LoRA r8 qkv");
    }
}
