//! Measure a real training step of a few layers and compose it to the full depth.
//!
//! A full model rarely fits a CPU, but its layers are identical, so the runner builds the
//! graph with only a few transformer layers (the plugin's `layers` request), times real
//! forward/backward/AdamW steps of it, and splits the median step into the part inside
//! the transformer layers (ops with `layer >= 0`, plus the AdamW updates of their
//! weights) and the rest (embedding, final norm, head, loss, their optimizer work):
//!
//! ```text
//! full_step ≈ non_layer_time + per_layer_time × full_layers
//! ```
//!
//! Model FLOPs come from [`runner_graph::count`] under a stated convention, so the
//! achieved TFLOP/s here and the projection's counts never disagree.

use std::collections::{BTreeSet, HashSet};

use runner_graph::count::{Convention, model_flops_per_step};
use runner_graph::recompute::RecomputePolicy;
use runner_graph::{DType, Graph, TensorKind};
use runner_kernels::cpu::adamw::AdamW;
use serde::Serialize;

use crate::cpu::Cpu;
use crate::device::{Device, ExecError};
use crate::executor::{ADAMW_DEFAULT, ExecOptions, Executor, Input, MemoryReport, Optimizer, int_bounds_of};
use crate::timing::{StepTiming, TimingOptions, time_steps};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasureOptions {
    pub timing: TimingOptions,
    /// Seed of weights and synthetic inputs.
    pub seed: u64,
    /// Depth to compose to (`None`: the layers present).
    pub full_layers: Option<u32>,
    /// FLOP convention of the achieved-TFLOP/s figure.
    pub convention: Convention,
    pub adamw: AdamW,
    /// Activation recomputation of the measured step.
    pub recompute: RecomputePolicy,
    /// Replay each step as one recorded CUDA graph (`ExecOptions::cuda_graph`): whole
    /// steps are timed, per-op times are not measured, so nothing is composed to the
    /// full depth (`per_layer_s` is 0 and the projected step is the measured one).
    pub cuda_graph: bool,
    /// The optimizer the measured steps run (AdamW, or Muon on the hidden matrices).
    pub optimizer: Optimizer,
}

impl Default for MeasureOptions {
    /// One warm-up and three timed steps: enough for a stable median of a step that
    /// takes about a second, and the whole default run stays well under a minute.
    fn default() -> Self {
        MeasureOptions {
            timing: TimingOptions {
                warmup: 1,
                repeats: 3,
            },
            seed: 0,
            full_layers: None,
            convention: Convention::CAUSAL,
            adamw: ADAMW_DEFAULT,
            recompute: RecomputePolicy::None,
            cuda_graph: false,
            optimizer: Optimizer::AdamW,
        }
    }
}

/// A measured step and its composition to the full depth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeasuredStep {
    pub timing: StepTiming,
    /// Median seconds of one measured step.
    pub step_s: f64,
    /// Tokens per step (elements of the `tokens` input, or of the first int input).
    pub tokens_per_step: u64,
    pub tokens_per_s: f64,
    /// Model FLOPs of one step of the measured graph under `convention`.
    pub model_flops_per_step: f64,
    pub achieved_tflops: f64,
    /// The FLOP convention, in words.
    pub convention: String,
    /// Activation recomputation the step ran with.
    pub recompute: RecomputePolicy,
    /// Median seconds the backward spent re-running forward segments (inside the
    /// backward phase).
    pub recompute_s: f64,
    /// Distinct transformer layers in the graph.
    pub layers_present: u32,
    /// Median seconds of one layer (forward + backward + its weights' AdamW).
    pub per_layer_s: f64,
    /// Median step minus the layers: embedding, head, loss, their optimizer work.
    pub non_layer_s: f64,
    pub full_layers: u32,
    /// non_layer_s + per_layer_s × full_layers.
    pub projected_full_step_s: f64,
    pub projected_tokens_per_s: f64,
    pub memory: MemoryReport,
}

/// Synthetic inputs for every graph input: ids spread over each int input's range
/// (positions run 0..T), small normals for float inputs.
pub fn synthetic_inputs(g: &Graph, seed: u64) -> Vec<(String, Vec<u32>, Vec<f32>)> {
    let bounds = int_bounds_of(g);
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift64*: any deterministic spread of ids will do here.
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut out = Vec::new();
    for (id, t) in g.tensors.iter().enumerate() {
        if t.kind != TensorKind::Input {
            continue;
        }
        let n = t.numel() as usize;
        if t.dtype == DType::I32 {
            let bound = bounds.get(&id).map_or(1, |b| b.0).max(1);
            let v: Vec<u32> = if t.name.ends_with("positions") {
                let cols = t.shape.last().copied().unwrap_or(1).max(1);
                (0..n as u64).map(|i| ((i % cols) % bound) as u32).collect()
            } else {
                (0..n).map(|_| (next() % bound) as u32).collect()
            };
            out.push((t.name.clone(), v, Vec::new()));
        } else {
            let v: Vec<f32> = (0..n)
                .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1)
                .collect();
            out.push((t.name.clone(), Vec::new(), v));
        }
    }
    out
}

/// Run warm-up + repeats of forward/backward/AdamW of `graph` on the CPU and compose the
/// per-layer time to `opts.full_layers`.
///
/// # Errors
/// An invalid graph, or a kernel error.
pub fn measure_training_step(
    graph: &Graph,
    opts: MeasureOptions,
) -> Result<MeasuredStep, ExecError> {
    measure_training_step_on(graph, Cpu::new(), opts)
}

/// [`measure_training_step`] on `device`.
///
/// # Errors
/// An invalid graph, or a kernel error.
pub fn measure_training_step_on<D: Device>(
    graph: &Graph,
    device: D,
    opts: MeasureOptions,
) -> Result<MeasuredStep, ExecError> {
    measure_training_step_with(graph, device, opts, &mut |_, _, _| {})
}

/// [`measure_training_step_on`], calling `on_step(step, steps, warmup)` as each step
/// begins ([`time_steps`]): a layer of a full-size model takes tens of seconds a step
/// on a CPU, and the caller shows where it is.
///
/// # Errors
/// An invalid graph, or a kernel error.
pub fn measure_training_step_with<D: Device>(
    graph: &Graph,
    device: D,
    opts: MeasureOptions,
    on_step: &mut dyn FnMut(usize, usize, bool),
) -> Result<MeasuredStep, ExecError> {
    let mut ex = Executor::new(
        graph,
        device,
        ExecOptions {
            seed: opts.seed,
            recompute: opts.recompute,
            cuda_graph: opts.cuda_graph,
            ..ExecOptions::default()
        },
    )?;
    ex.set_optimizer(opts.optimizer)?;
    let data = synthetic_inputs(graph, opts.seed);
    let inputs: Vec<(&str, Input<'_>)> = data
        .iter()
        .map(|(n, u, f)| {
            (
                n.as_str(),
                if f.is_empty() {
                    Input::U32(u)
                } else {
                    Input::F32(f)
                },
            )
        })
        .collect();
    let timing = time_steps(&mut ex, &inputs, &opts.adamw, opts.timing, on_step)?;
    let memory = ex.memory();
    let recompute_s = timing.recompute.median;

    let full = Composition::of(graph, &timing, opts.full_layers);
    let tokens_per_step = graph
        .tensor_id("tokens")
        .or_else(|| {
            graph
                .tensors
                .iter()
                .position(|t| t.kind == TensorKind::Input && t.dtype == DType::I32)
        })
        .map_or(0, |id| graph.tensors[id].numel());
    let flops = model_flops_per_step(graph, &opts.convention);
    let step_s = timing.step.median;
    Ok(MeasuredStep {
        step_s,
        tokens_per_step,
        tokens_per_s: tokens_per_step as f64 / step_s,
        model_flops_per_step: flops,
        achieved_tflops: flops / step_s / 1e12,
        convention: opts.convention.to_string(),
        recompute: opts.recompute,
        recompute_s,
        layers_present: full.layers_present,
        per_layer_s: full.per_layer_s,
        non_layer_s: full.non_layer_s,
        full_layers: full.full_layers,
        projected_full_step_s: full.projected_full_step_s,
        projected_tokens_per_s: tokens_per_step as f64 / full.projected_full_step_s,
        memory,
        timing,
    })
}

/// The median step split into the transformer layers and the rest, and composed to the
/// full depth.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Composition {
    layers_present: u32,
    per_layer_s: f64,
    non_layer_s: f64,
    full_layers: u32,
    projected_full_step_s: f64,
}

impl Composition {
    /// A layer's time is the per-op medians of the ops with `layer >= 0` (forward,
    /// backward, recompute) plus the AdamW time of the weights only those ops read,
    /// shared evenly among the layers present. Per-op medians come from the same steps
    /// as the step's median but do not add up to it exactly, so the layers are capped at
    /// the whole step (the rest is then 0, never negative).
    fn of(graph: &Graph, timing: &StepTiming, full_layers: Option<u32>) -> Composition {
        let layers: BTreeSet<i32> = graph
            .ops
            .iter()
            .map(|o| o.layer)
            .filter(|&l| l >= 0)
            .collect();
        let layers_present = layers.len() as u32;
        // Weights read only by layer ops: their AdamW time belongs to the layers.
        let outside: HashSet<usize> = graph
            .ops
            .iter()
            .filter(|o| o.layer < 0)
            .flat_map(|o| o.inputs.iter().copied())
            .collect();
        let layer_weights: HashSet<&str> = graph
            .ops
            .iter()
            .filter(|o| o.layer >= 0)
            .flat_map(|o| o.inputs.iter().copied())
            .filter(|&i| graph.tensors[i].kind == TensorKind::Weight && !outside.contains(&i))
            .map(|i| graph.tensors[i].name.as_str())
            .collect();
        let layer_ops: f64 = timing
            .ops
            .iter()
            .filter(|o| o.layer >= 0)
            .map(|o| o.forward.median + o.backward.median + o.recompute.median)
            .sum();
        let layer_opt: f64 = timing
            .optimizer_by_weight
            .iter()
            .filter(|(n, _)| layer_weights.contains(n.as_str()))
            .map(|(_, s)| s)
            .sum();
        let step_s = timing.step.median;
        let layer_total = (layer_ops + layer_opt).min(step_s);
        let per_layer_s = if layers_present > 0 {
            layer_total / f64::from(layers_present)
        } else {
            0.0
        };
        let non_layer_s = step_s - layer_total;
        let full_layers = full_layers.unwrap_or(layers_present);
        let projected_full_step_s = non_layer_s + per_layer_s * f64::from(full_layers);
        Composition { layers_present, per_layer_s, non_layer_s, full_layers, projected_full_step_s }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toy::{ToyConfig, llama};

    fn stat(median: f64) -> crate::timing::Stat {
        crate::timing::Stat { median, ..Default::default() }
    }

    /// A timing of `g` with known parts: each layer op 1 ms forward and 2 ms backward,
    /// each other op 10 and 20 ms; AdamW 0.1 ms per weight under `layers.`, 5 ms per
    /// other weight; the step `extra` seconds longer than all of it.
    fn known_timing(g: &Graph, extra: f64) -> StepTiming {
        let ops: Vec<crate::timing::OpTiming> = g
            .ops
            .iter()
            .map(|o| {
                let f = if o.layer >= 0 { 1e-3 } else { 1e-2 };
                crate::timing::OpTiming { name: o.name.clone(), kind: String::new(), layer: o.layer, forward: stat(f), backward: stat(2.0 * f), recompute: stat(0.0) }
            })
            .collect();
        let optimizer_by_weight: Vec<(String, f64)> = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Weight)
            .map(|t| (t.name.clone(), if t.name.starts_with("layers.") { 1e-4 } else { 5e-3 }))
            .collect();
        let total = ops.iter().map(|o| o.forward.median + o.backward.median).sum::<f64>() + optimizer_by_weight.iter().map(|w| w.1).sum::<f64>();
        StepTiming {
            device: "test".into(),
            warmup: 0,
            repeats: 1,
            step: stat(total + extra),
            forward: stat(0.0),
            backward: stat(0.0),
            optimizer: stat(0.0),
            communication: stat(0.0),
            recompute: stat(0.0),
            losses: Vec::new(),
            ops,
            optimizer_by_weight,
        }
    }

    #[test]
    fn a_layer_is_its_ops_and_its_weights_updates_and_nothing_else() {
        let g = llama(&ToyConfig { hidden: 16, ffn: 32, ..ToyConfig::tiny() });
        let layer_ops = g.ops.iter().filter(|o| o.layer >= 0).count() as f64;
        let layer_weights = g.tensors.iter().filter(|t| t.kind == TensorKind::Weight && t.name.starts_with("layers.")).count() as f64;
        let other_ops = g.ops.len() as f64 - layer_ops;
        let other_weights = g.tensors.iter().filter(|t| t.kind == TensorKind::Weight).count() as f64 - layer_weights;
        assert!(layer_ops > 0.0 && other_ops > 0.0 && other_weights > 0.0);

        let c = Composition::of(&g, &known_timing(&g, 0.25), Some(32));
        assert_eq!((c.layers_present, c.full_layers), (2, 32));
        let per_layer = (layer_ops * 3e-3 + layer_weights * 1e-4) / 2.0;
        let rest = other_ops * 3e-2 + other_weights * 5e-3 + 0.25;
        assert!((c.per_layer_s - per_layer).abs() < 1e-12, "{} vs {per_layer}", c.per_layer_s);
        assert!((c.non_layer_s - rest).abs() < 1e-12, "{} vs {rest}", c.non_layer_s);
        assert!((c.projected_full_step_s - (rest + 32.0 * per_layer)).abs() < 1e-12);

        // Per-op medians past the step's own: the layers take the whole step, the rest
        // is 0, not negative.
        let mut t = known_timing(&g, 0.0);
        t.step = stat(layer_ops * 3e-3);
        let c = Composition::of(&g, &t, None);
        assert_eq!(c.full_layers, 2);
        assert_eq!(c.non_layer_s, 0.0);
        assert!((c.per_layer_s * 2.0 - t.step.median).abs() < 1e-15);
    }

    #[test]
    fn composes_per_layer_time_to_full_depth() {
        let g = llama(&ToyConfig {
            hidden: 16,
            ffn: 32,
            ..ToyConfig::tiny()
        });
        let m = measure_training_step(
            &g,
            MeasureOptions {
                full_layers: Some(32),
                ..MeasureOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            (m.layers_present, m.full_layers, m.tokens_per_step),
            (2, 32, 16)
        );
        // The composition itself is checked on known times above; here, that a real
        // step feeds it: every op timed, the layers a real share of the step.
        assert_eq!(m.timing.ops.len(), g.ops.len());
        assert!(m.per_layer_s > 0.0 && m.per_layer_s < m.step_s);
        assert!(m.projected_full_step_s > m.step_s);
        assert!(m.achieved_tflops > 0.0 && m.convention.contains("causal"));
    }

    /// The hook hears of every step as it begins, warm-up ones first and marked, so
    /// `runner bench layer` can show a step of a minute on the CPU as it comes.
    #[test]
    fn each_step_is_announced_as_it_begins() {
        let g = llama(&ToyConfig { hidden: 16, ffn: 32, ..ToyConfig::tiny() });
        let mut heard = Vec::new();
        let opts = MeasureOptions { timing: TimingOptions { warmup: 2, repeats: 3 }, ..MeasureOptions::default() };
        let m = measure_training_step_with(&g, Cpu::new(), opts, &mut |step, steps, warmup| heard.push((step, steps, warmup))).unwrap();
        assert_eq!(heard, [(1, 5, true), (2, 5, true), (3, 5, false), (4, 5, false), (5, 5, false)]);
        assert_eq!(m.timing.losses.len(), 3);
    }

    /// A layer's re-run forward segments (recompute) are the layer's time; a weight a
    /// layer shares with an op outside the stack (as a tied embedding is) has its AdamW
    /// update counted outside the layers, not as a layer's.
    #[test]
    fn recompute_is_a_layers_and_a_shared_weights_update_is_not() {
        let mut g = llama(&ToyConfig { hidden: 16, ffn: 32, ..ToyConfig::tiny() });
        let shared = g.tensors.iter().position(|t| t.kind == TensorKind::Weight && t.name.starts_with("layers.0.")).unwrap();
        let outside = g.ops.iter().position(|o| o.layer < 0).unwrap();
        g.ops[outside].inputs.push(shared);
        let layer_ops = g.ops.iter().filter(|o| o.layer >= 0).count() as f64;
        let layer_weights = g.tensors.iter().filter(|t| t.kind == TensorKind::Weight && t.name.starts_with("layers.")).count() as f64;
        let other_ops = g.ops.len() as f64 - layer_ops;
        let other_weights = g.tensors.iter().filter(|t| t.kind == TensorKind::Weight).count() as f64 - layer_weights;

        let mut t = known_timing(&g, 0.25);
        for o in t.ops.iter_mut().filter(|o| o.layer >= 0) {
            o.recompute = stat(4e-3);
        }
        t.step = stat(t.step.median + layer_ops * 4e-3);
        let c = Composition::of(&g, &t, Some(32));
        // Each layer op 1 + 2 + 4 ms; every layer weight but the shared one 0.1 ms.
        let per_layer = (layer_ops * 7e-3 + (layer_weights - 1.0) * 1e-4) / 2.0;
        let rest = other_ops * 3e-2 + other_weights * 5e-3 + 1e-4 + 0.25;
        assert!((c.per_layer_s - per_layer).abs() < 1e-12, "{} vs {per_layer}", c.per_layer_s);
        assert!((c.non_layer_s - rest).abs() < 1e-12, "{} vs {rest}", c.non_layer_s);
        assert!((c.projected_full_step_s - (rest + 32.0 * per_layer)).abs() < 1e-12);
    }

    /// The figures of a measured step are the median step's: tokens per second of the
    /// measured and of the projected step, achieved TFLOP/s (1e12 FLOP/s) under the
    /// convention asked for, and the backward's recompute under the policy asked for.
    #[test]
    fn a_measured_steps_figures_follow_its_median_step_and_options() {
        let g = llama(&ToyConfig { hidden: 16, ffn: 32, ..ToyConfig::tiny() });
        let opts = MeasureOptions { convention: Convention::FULL, recompute: RecomputePolicy::Selective, full_layers: Some(8), ..MeasureOptions::default() };
        let m = measure_training_step(&g, opts).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        // Batch 2 of 8 tokens.
        assert_eq!(m.tokens_per_step, 16);
        assert_eq!(m.step_s, m.timing.step.median);
        assert!(close(m.tokens_per_s, 16.0 / m.step_s), "{m:?}");
        assert!(close(m.projected_tokens_per_s, 16.0 / m.projected_full_step_s), "{m:?}");
        let full = model_flops_per_step(&g, &Convention::FULL);
        assert!(full > model_flops_per_step(&g, &Convention::CAUSAL));
        assert_eq!(m.model_flops_per_step, full);
        assert!(close(m.achieved_tflops, full / m.step_s / 1e12), "{m:?}");
        assert_eq!(m.convention, Convention::FULL.to_string());
        assert_eq!(m.recompute, RecomputePolicy::Selective);
        assert!(m.recompute_s > 0.0 && m.recompute_s == m.timing.recompute.median, "{:?}", m.timing.recompute);
    }

    /// The seed is the weights' and the synthetic inputs': the measured steps train on
    /// `synthetic_inputs(graph, seed)` from weights of that seed (the same losses as an
    /// executor of that seed timed on those inputs).
    #[test]
    fn the_seed_seeds_weights_and_inputs() {
        let g = llama(&ToyConfig { hidden: 16, ffn: 32, ..ToyConfig::tiny() });
        let m = measure_training_step(&g, MeasureOptions { seed: 3, ..MeasureOptions::default() }).unwrap();
        let mut ex = Executor::new(&g, Cpu::new(), ExecOptions { seed: 3, ..ExecOptions::default() }).unwrap();
        let data = synthetic_inputs(&g, 3);
        let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect();
        let t = time_steps(&mut ex, &inputs, &ADAMW_DEFAULT, MeasureOptions::default().timing, &mut |_, _, _| {}).unwrap();
        assert_eq!(m.timing.losses, t.losses);
        assert_ne!(synthetic_inputs(&g, 0), data);
    }

    /// A graph whose token ids are not named `tokens` (ids 0..16), with a learned
    /// position table of 128 rows read by a `positions` input, and a float input added to
    /// the embeddings; batch 4 of 64 tokens, every op outside the layers.
    fn ids_positions_noise() -> Graph {
        use runner_graph::{NamedOp, OpKind, Role, Tensor};
        let t = |n: &str, s: &[u64], dtype, kind| Tensor { name: n.into(), shape: s.to_vec(), dtype, kind };
        let op = |n: &str, kind, i: &[&str]| NamedOp {
            name: n.into(),
            kind,
            inputs: i.iter().map(|s| s.to_string()).collect(),
            outputs: vec![n.to_string()],
            attrs: Default::default(),
            layer: -1,
            role: Role::Replicated,
        };
        let (b, s, c, v, p) = (4, 64, 8, 16, 128);
        let act = TensorKind::Activation;
        Graph::new(
            vec![
                t("noise", &[b, s, c], DType::F32, TensorKind::Input),
                t("ids", &[b, s], DType::I32, TensorKind::Input),
                t("positions", &[b, s], DType::I32, TensorKind::Input),
                t("targets", &[b, s], DType::I32, TensorKind::Input),
                t("embed.weight", &[v, c], DType::F32, TensorKind::Weight),
                t("pos.weight", &[p, c], DType::F32, TensorKind::Weight),
                t("head.weight", &[v, c], DType::F32, TensorKind::Weight),
                t("embed", &[b, s, c], DType::F32, act),
                t("pos", &[b, s, c], DType::F32, act),
                t("x", &[b, s, c], DType::F32, act),
                t("y", &[b, s, c], DType::F32, act),
                t("head", &[b, s, v], DType::F32, act),
                t("loss", &[], DType::F32, act),
            ],
            vec![
                op("embed", OpKind::Embedding, &["ids", "embed.weight"]),
                op("pos", OpKind::Embedding, &["positions", "pos.weight"]),
                op("x", OpKind::Add, &["embed", "pos"]),
                op("y", OpKind::Add, &["x", "noise"]),
                op("head", OpKind::Linear, &["y", "head.weight"]),
                NamedOp { outputs: vec!["loss".into()], ..op("loss", OpKind::CrossEntropy, &["head", "targets"]) },
            ],
            "loss",
        )
        .unwrap()
    }

    /// Synthetic inputs: ids spread over their whole range (every one of 16 ids among
    /// 256 draws, none past it, from seed 0 too), positions 0..T along each row of the
    /// batch, floats small normals-like values in [-0.05, 0.05] around 0.
    #[test]
    fn synthetic_ids_cover_their_range_and_positions_run_along_each_row() {
        let g = ids_positions_noise();
        let data = synthetic_inputs(&g, 0);
        let get = |n: &str| data.iter().find(|d| d.0 == n).unwrap_or_else(|| panic!("no input {n}"));
        for name in ["ids", "targets"] {
            let ids = &get(name).1;
            assert_eq!(ids.len(), 256);
            assert!(ids.iter().all(|&i| i < 16), "{name}: {ids:?}");
            let seen: BTreeSet<u32> = ids.iter().copied().collect();
            assert_eq!(seen.len(), 16, "{name}: {seen:?}");
        }
        assert_eq!(get("positions").1, (0..256).map(|i| i % 64).collect::<Vec<u32>>());
        let noise = &get("noise").2;
        assert_eq!(noise.len(), 4 * 64 * 8);
        assert!(noise.iter().all(|x| x.abs() <= 0.05), "{noise:?}");
        assert!(noise.iter().any(|&x| x < -0.04) && noise.iter().any(|&x| x > 0.04));
        let mean = noise.iter().map(|&x| f64::from(x)).sum::<f64>() / noise.len() as f64;
        assert!(mean.abs() < 0.005, "mean {mean}");
    }

    /// Without an input named `tokens`, the tokens of a step are the elements of the
    /// first int input (not of the float input before it); and a measured step in
    /// graph mode goes to the executor as asked, which refuses it on the CPU rather than
    /// timing eager steps under the graph-mode label.
    #[test]
    fn tokens_are_the_first_int_input_and_graph_mode_reaches_the_executor() {
        let opts = MeasureOptions { timing: TimingOptions { warmup: 0, repeats: 1 }, ..MeasureOptions::default() };
        let m = measure_training_step(&ids_positions_noise(), opts).unwrap();
        assert_eq!(m.tokens_per_step, 256);
        assert!(m.tokens_per_s > 0.0 && m.layers_present == 0, "{m:?}");
        let g = llama(&ToyConfig { hidden: 16, ffn: 32, ..ToyConfig::tiny() });
        let e = measure_training_step(&g, MeasureOptions { cuda_graph: true, ..opts }).unwrap_err().to_string();
        assert!(e.contains("cannot be recorded"), "{e}");
    }

    /// The measured step runs the optimizer asked for: under Muon the hidden matrices
    /// keep one momentum instead of AdamW's two moments, so less state at rest, by
    /// exactly one f32 per element of those matrices.
    #[test]
    fn the_measured_step_runs_the_optimizer_asked_for() {
        let g = llama(&ToyConfig { hidden: 16, ffn: 32, layers: 1, ..ToyConfig::tiny() });
        let opts = MeasureOptions { timing: TimingOptions { warmup: 0, repeats: 1 }, ..MeasureOptions::default() };
        let adamw = measure_training_step(&g, opts).unwrap();
        let muon = measure_training_step(&g, MeasureOptions { optimizer: Optimizer::Muon(crate::executor::MUON_DEFAULT), ..opts }).unwrap();
        let plan = runner_graph::autodiff::backward_plan(&g).unwrap();
        let matrices: u64 = crate::executor::muon_weights(&g, &plan.needs_grad)
            .iter()
            .enumerate()
            .filter(|(_, m)| **m)
            .map(|(id, _)| g.tensors[id].shape.iter().product::<u64>())
            .sum();
        assert!(matrices > 0);
        assert_eq!(adamw.memory.state_bytes - muon.memory.state_bytes, 4 * matrices);
        assert!(muon.timing.losses.iter().all(|l| l.is_finite()), "{:?}", muon.timing.losses);
    }
}
