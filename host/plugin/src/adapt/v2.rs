//! Contract 0.2.0 workload answers up to 0.3.0: hyperparameters gain `mamba: none`, an
//! empty `layer-pattern` and `latent: 0` (the model 0.2 could describe); layouts, defaults
//! and graphs are the same values; a graph request goes down unchanged.

use super::{same_enum, workload_up};
use crate::bindings::{v2, v3};

use v2::workload::exports::runner::plugin::workload as w2;
use v3::workload::exports::runner::plugin::workload as w3;

workload_up!(
    w2 => w3,
    hyperparameters { mamba: None, layer_pattern: String::new() },
    moe { latent: 0 },
);
same_enum!(w2::TrainingPrecision => w3::TrainingPrecision {
    Bf16, Fp16, Fp8, Fp8Delayed, Fp8Current, Fp8Blockwise, Mxfp8, Nvfp4,
});
same_enum!(w2::RecomputeGranularity => w3::RecomputeGranularity { None, Selective, Full });

pub fn model_info(m: w2::ModelInfo) -> w3::ModelInfo {
    w3::ModelInfo {
        family: m.family,
        variants: m.variants.into_iter().map(variant).collect(),
    }
}

fn variant(v: w2::Variant) -> w3::Variant {
    w3::Variant {
        name: v.name,
        family: v.family,
        citation: v.citation,
        hyper: hyperparameters(v.hyper),
        defaults: defaults(v.defaults),
        layouts: v.layouts.into_iter().map(layout).collect(),
    }
}

fn layout(l: w2::ReferenceLayout) -> w3::ReferenceLayout {
    w3::ReferenceLayout {
        gpu: l.gpu,
        gpus_min: l.gpus_min,
        gpus_max: l.gpus_max,
        precision: l.precision.into(),
        tp: l.tp,
        pp: l.pp,
        cp: l.cp,
        vp: l.vp,
        ep: l.ep,
        etp: l.etp,
        fsdp: l.fsdp,
        sequence_parallel: l.sequence_parallel,
        recompute: l.recompute.into(),
        recompute_layers: l.recompute_layers,
        distributed_optimizer: l.distributed_optimizer,
        overlap_grad_reduce: l.overlap_grad_reduce,
        overlap_param_gather: l.overlap_param_gather,
        tp_comm_overlap: l.tp_comm_overlap,
        seq_len: l.seq_len,
        mbs: l.mbs,
        gbs_per_gpu: l.gbs_per_gpu,
        gbs_fixed: l.gbs_fixed,
        measured: l.measured.map(|m| w3::PublishedMeasurement {
            step_time_s: m.step_time_s,
            tokens_per_s_per_gpu: m.tokens_per_s_per_gpu,
            model_tflops_per_gpu: m.model_tflops_per_gpu,
            gpus: m.gpus,
            source: m.source,
        }),
        source: l.source,
    }
}

pub fn graph_request(r: &w3::GraphRequest) -> w2::GraphRequest {
    let shape = |s: &w3::InferenceShape| w2::InferenceShape {
        kv_len: s.kv_len,
        concurrency: s.concurrency,
    };
    w2::GraphRequest {
        variant: r.variant.clone(),
        seq_len: r.seq_len,
        micro_batch: r.micro_batch,
        layers: r.layers,
        phase: match &r.phase {
            w3::Phase::Training => w2::Phase::Training,
            w3::Phase::Prefill(s) => w2::Phase::Prefill(shape(s)),
            w3::Phase::Decode(s) => w2::Phase::Decode(shape(s)),
        },
    }
}
