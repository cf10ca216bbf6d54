//! What the runner measures on the local device before it projects: a real training step
//! (forward, backward, AdamW) of the model's graph on the device `--device` picks (a
//! usable GPU, else the CPU), timed with warm-up and repeats, a few layers run and
//! composed to the full depth.
//!
//! The measurement runs "at a size the machine can run": the chosen variant itself when
//! its weights and optimizer state fit the memory budget, otherwise the smallest variant
//! of the same plugin (the family's proxy), at a short sequence. The outcome says which.

use serde::Serialize;

use runner_exec::proxy::{MeasureOptions, MeasuredStep, measure_training_step_on};
use runner_exec::select::{Chosen, choose_timed};
use runner_exec::timing::TimingOptions;
use runner_graph::count::{self, Convention};
use runner_graph::recompute::RecomputePolicy;

use crate::plugin::PluginError;
use crate::plugin::workload::{GraphRequest, ModelInfo, Variant, Workload};
use crate::runfile::MeasureSection;

// The budget of the measured step (what it runs on the CPU and on a GPU), shared with the
// model plugins' tests of their CPU proxies.
use runner_contract::measurement::{
    BYTES_PER_PARAM, CPU_MAX_SEQ as MAX_SEQ, CPU_PARAM_BUDGET_BYTES, CPU_TOKENS as TOKENS, GPU_MAX_SEQ, GPU_PARAM_BUDGET_BYTES,
    GPU_TOKENS, LAYERS_RUN,
};

/// What the measured step may allocate at most.
pub const EXECUTOR_BUDGET_BYTES: u64 = 8 << 30;

/// Bytes the executor allocates for `g` at most: an f32 value and gradient for every
/// tensor, and two AdamW moments more for every weight. None on overflow.
pub fn executor_bytes(g: &runner_graph::Graph) -> Option<u64> {
    g.tensors.iter().try_fold(0u64, |acc, t| {
        let numel = t.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let per = if t.kind == runner_graph::TensorKind::Weight {
            16
        } else {
            8
        };
        acc.checked_add(numel.checked_mul(per)?)
    })
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct LocalMeasurement {
    pub device: String,
    /// The variant whose graph was run (the requested one, or the family's proxy).
    pub variant: String,
    pub layers_run: u32,
    pub full_layers: u32,
    pub seq_len: u32,
    pub micro_batch: u32,
    pub step_s: f64,
    pub step_p10_s: f64,
    pub step_p90_s: f64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
    pub per_layer_s: f64,
    pub projected_full_step_s: f64,
    pub tokens_per_s: f64,
    pub achieved_gflops: f64,
    pub peak_memory_bytes: u64,
    pub convention: String,
    /// Activation recomputation of the measured step, and the median seconds its
    /// re-runs took inside the backward.
    pub recompute: RecomputePolicy,
    pub recompute_s: f64,
    pub why_this_size: String,
    /// Why the measurement ran on the CPU when `--device auto` looked for a GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_note: Option<String>,
}

/// Measure a training step on the `--device` device: `settings.repeats` timed steps after
/// one warm-up, under `settings.recompute`.
///
/// # Errors
/// A plugin failure while building the graph, or an executor error.
pub fn measure(
    workload: &mut Workload,
    info: &ModelInfo,
    variant: &Variant,
    settings: &MeasureSection,
) -> anyhow::Result<LocalMeasurement> {
    let device = choose_timed(crate::local_device::requested(), "a run file's [measure] section")?;
    let on_gpu = !matches!(device, Chosen::Cpu(..));
    let (budget, max_seq, tokens) = if on_gpu {
        (GPU_PARAM_BUDGET_BYTES as f64, GPU_MAX_SEQ, GPU_TOKENS)
    } else {
        (CPU_PARAM_BUDGET_BYTES as f64, MAX_SEQ, TOKENS)
    };
    let fits = |v: &Variant, w: &mut Workload| -> Result<(bool, f64), PluginError> {
        let g = w.graph(&GraphRequest::training(
            &v.name,
            16,
            1,
            LAYERS_RUN.min(v.hyper.layers),
        ))?;
        let bytes = count::params(&g).total as f64 * BYTES_PER_PARAM as f64;
        Ok((bytes <= budget, bytes))
    };
    let (own_fits, own_bytes) = fits(variant, workload)?;
    let (chosen, why) = if own_fits {
        (
            variant.clone(),
            format!(
                "{} itself ({LAYERS_RUN} layers fit the {:.0} GiB budget)",
                variant.name,
                budget / (1u64 << 30) as f64
            ),
        )
    } else {
        let mut smallest: Option<(f64, &Variant)> = None;
        for v in &info.variants {
            let (ok, bytes) = fits(v, workload)?;
            if ok && smallest.is_none_or(|(b, _)| bytes < b) {
                smallest = Some((bytes, v));
            }
        }
        let Some((_, proxy)) = smallest else {
            anyhow::bail!(
                "no variant of {} fits the measurement budget ({:.1} GiB for {LAYERS_RUN} layers of {}); \
                 add a small proxy variant to the plugin",
                info.family,
                own_bytes / (1u64 << 30) as f64,
                variant.name
            );
        };
        (
            proxy.clone(),
            format!(
                "{}'s {LAYERS_RUN} layers need {:.1} GiB of f32 weights and optimizer state, beyond the {} budget, \
                 so the family's proxy {} was run",
                variant.name,
                own_bytes / (1u64 << 30) as f64,
                if on_gpu { "GPU" } else { "CPU" },
                proxy.name
            ),
        )
    };
    let seq_len = chosen.defaults.seq_len.min(max_seq);
    let micro_batch = (tokens / seq_len).max(1);
    let layers_run = LAYERS_RUN.min(chosen.hyper.layers);
    let graph = workload.graph(&GraphRequest::training(
        &chosen.name,
        seq_len,
        micro_batch,
        layers_run,
    ))?;
    // The plugin chose these shapes, whatever was asked: check what the executor would
    // allocate before it allocates anything.
    let bytes = executor_bytes(&graph);
    if bytes.is_none_or(|b| b > EXECUTOR_BUDGET_BYTES) {
        anyhow::bail!(
            "{}'s graph for {} (seq {seq_len} x batch {micro_batch}, {layers_run} layers) needs {} of memory to run, \
             more than the {} GiB the measurement may use; the plugin's shapes do not fit the request",
            workload.info.name,
            chosen.name,
            bytes.map_or("more than 2^64 bytes".to_string(), |b| format!(
                "{:.1} GiB",
                b as f64 / (1u64 << 30) as f64
            )),
            EXECUTOR_BUDGET_BYTES >> 30
        );
    }
    let opts = MeasureOptions {
        timing: TimingOptions {
            warmup: 1,
            repeats: settings.repeats.max(1),
        },
        recompute: settings.recompute,
        full_layers: Some(chosen.hyper.layers),
        convention: Convention::CAUSAL,
        ..MeasureOptions::default()
    };
    let (m, device_note): (MeasuredStep, Option<String>) = match device {
        Chosen::Cpu(cpu, note) => (measure_training_step_on(&graph, cpu, opts)?, note),
        #[cfg(feature = "cuda")]
        Chosen::Cuda(gpu) => (measure_training_step_on(&graph, gpu, opts)?, None),
    };
    Ok(LocalMeasurement {
        device: m.timing.device.clone(),
        variant: chosen.name.clone(),
        layers_run,
        full_layers: chosen.hyper.layers,
        seq_len,
        micro_batch,
        step_s: m.step_s,
        step_p10_s: m.timing.step.p10,
        step_p90_s: m.timing.step.p90,
        forward_s: m.timing.forward.median,
        backward_s: m.timing.backward.median,
        optimizer_s: m.timing.optimizer.median,
        per_layer_s: m.per_layer_s,
        projected_full_step_s: m.projected_full_step_s,
        tokens_per_s: m.tokens_per_s,
        achieved_gflops: m.achieved_tflops * 1e3,
        peak_memory_bytes: m.memory.peak_bytes,
        convention: m.convention,
        recompute: m.recompute,
        recompute_s: m.recompute_s,
        why_this_size: why,
        device_note,
    })
}

impl LocalMeasurement {
    /// One line for the report's notes.
    pub fn summary(&self) -> String {
        format!(
            "measured: a real training step (forward, backward, AdamW) of {} on {}: {} of {} layers, seq {} x batch {}, \
             median {:.3} s (p10 {:.3}, p90 {:.3}; fwd {:.3}, bwd {:.3}, opt {:.3}), {:.0} tokens/s, {:.1} model GFLOP/s; \
             composed to {} layers: {:.2} s/step; peak memory {:.0} MiB{}. Chosen because: {}{}",
            self.variant,
            self.device,
            self.layers_run,
            self.full_layers,
            self.seq_len,
            self.micro_batch,
            self.step_s,
            self.step_p10_s,
            self.step_p90_s,
            self.forward_s,
            self.backward_s,
            self.optimizer_s,
            self.tokens_per_s,
            self.achieved_gflops,
            self.full_layers,
            self.projected_full_step_s,
            self.peak_memory_bytes as f64 / (1u64 << 20) as f64,
            match self.recompute {
                RecomputePolicy::None => String::new(),
                p => format!(
                    "; {} activation recompute ({:.3} s of the backward re-runs the forward)",
                    format!("{p:?}").to_lowercase(),
                    self.recompute_s
                ),
            },
            self.why_this_size,
            self.device_note.as_deref().map(|n| format!(". Device: {n}")).unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_graph::{DType, Graph, Tensor, TensorKind};

    fn graph(tensors: &[(&str, &[u64], TensorKind)]) -> Graph {
        let tensors = tensors.iter().map(|(name, shape, kind)| Tensor { name: name.to_string(), shape: shape.to_vec(), dtype: DType::F32, kind: *kind }).collect();
        Graph::new(tensors, Vec::new(), "loss").unwrap()
    }

    /// 8 bytes (value and gradient) per element, 16 for a weight (two AdamW moments more);
    /// a size past 2^64 bytes is None, never a wrapped small number.
    #[test]
    fn executor_bytes_count_gradients_and_moments_and_refuse_overflow() {
        let g = graph(&[("w", &[3, 4], TensorKind::Weight), ("x", &[2, 5], TensorKind::Input), ("loss", &[1], TensorKind::Activation)]);
        assert_eq!(executor_bytes(&g), Some(12 * 16 + 10 * 8 + 8));
        let huge = graph(&[("w", &[1 << 32, 1 << 32], TensorKind::Weight), ("loss", &[1], TensorKind::Activation)]);
        assert_eq!(executor_bytes(&huge), None, "2^64 elements");
        let bytes = graph(&[("w", &[1 << 30, 1 << 30], TensorKind::Weight), ("loss", &[1], TensorKind::Activation)]);
        assert_eq!(executor_bytes(&bytes), None, "2^60 elements of 16 bytes");
        let sum = graph(&[("a", &[1 << 60], TensorKind::Input), ("b", &[1 << 60], TensorKind::Input), ("loss", &[1], TensorKind::Activation)]);
        assert_eq!(executor_bytes(&sum), None, "two tensors of 2^63 bytes");
    }

    #[test]
    fn the_summary_says_what_ran_where_and_how_long() {
        let mut m = LocalMeasurement {
            device: "cpu".into(),
            variant: "tiny".into(),
            layers_run: 2,
            full_layers: 32,
            seq_len: 256,
            micro_batch: 4,
            step_s: 0.5,
            step_p10_s: 0.4,
            step_p90_s: 0.7,
            forward_s: 0.1,
            backward_s: 0.3,
            optimizer_s: 0.05,
            per_layer_s: 0.2,
            projected_full_step_s: 6.4,
            tokens_per_s: 2048.0,
            achieved_gflops: 12.34,
            peak_memory_bytes: 300 << 20,
            convention: "causal".into(),
            recompute: RecomputePolicy::None,
            recompute_s: 0.0,
            why_this_size: "tiny itself".into(),
            device_note: None,
        };
        assert_eq!(
            m.summary(),
            "measured: a real training step (forward, backward, AdamW) of tiny on cpu: 2 of 32 layers, seq 256 x batch 4, \
             median 0.500 s (p10 0.400, p90 0.700; fwd 0.100, bwd 0.300, opt 0.050), 2048 tokens/s, 12.3 model GFLOP/s; \
             composed to 32 layers: 6.40 s/step; peak memory 300 MiB. Chosen because: tiny itself"
        );
        m.recompute = RecomputePolicy::Full;
        m.recompute_s = 0.125;
        m.device_note = Some("no GPU".into());
        let s = m.summary();
        assert!(s.contains("peak memory 300 MiB; full activation recompute (0.125 s of the backward re-runs the forward)"), "{s}");
        assert!(s.ends_with("Chosen because: tiny itself. Device: no GPU"), "{s}");
    }
}
