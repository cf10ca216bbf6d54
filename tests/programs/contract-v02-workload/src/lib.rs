//! Test program: a workload plugin built against the released contract 0.2.0 (no SDK): one
//! tiny family whose graph is a real, trainable stack of MLP blocks, described with a MoE
//! config and layouts that use 0.2's layout fields (sequence parallelism, recompute, a
//! published measurement). The host must run it through its adapter, with 0.3 defaults
//! for what 0.2 cannot say (no Mamba mixer, no layer pattern, no latent MoE width), and
//! send inference requests down unchanged (this plugin refuses them, naming the shape).

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "workload-plugin", path: "../../wit-0.2.0" });

use exports::runner::plugin::workload::*;
use runner::plugin::types::Dtype;

struct Old;

include!("../../shared/mlp_graph.rs");

fn layout(gpus: u32, precision: TrainingPrecision, tp: u32, measured: Option<PublishedMeasurement>) -> ReferenceLayout {
    ReferenceLayout {
        gpu: "H100".into(), gpus_min: gpus, gpus_max: gpus, precision, tp, pp: 1, cp: 1, vp: 1, ep: 2,
        etp: 1, fsdp: 0, sequence_parallel: tp > 1, recompute: RecomputeGranularity::Selective,
        recompute_layers: 0, distributed_optimizer: true, overlap_grad_reduce: true, overlap_param_gather: false,
        tp_comm_overlap: false, seq_len: 128, mbs: 1, gbs_per_gpu: 2.0, gbs_fixed: 0, measured,
        source: "contract 0.2.0 test program".into(),
    }
}

impl Guest for Old {
    fn describe() -> ModelInfo {
        let hyper = Hyperparameters {
            layers: LAYERS, hidden: HIDDEN as u32, ffn: FFN as u32, heads: 4, kv_heads: 4, head_dim: 8,
            vocab: VOCAB as u32, tied_embeddings: false, position: PositionScheme::None, rope_theta: 10000.0,
            max_position: 512, norm: NormKind::RmsNorm, norm_eps: 1e-5, activation: ActivationKind::Gelu,
            attention: AttentionKind::Mha, mla: None,
            moe: Some(MoeConfig {
                experts: 4, top_k: 2, shared_experts: 0, expert_ffn: 16, shared_ffn: 0, dense_layers: 1,
                layer_frequency: 1, score: RouterScore::Softmax, normalize_top_k: true,
            }),
            attention_window: 0, window_every: 0, bias: false, mtp_depth: 0,
        };
        let defaults = TrainingDefaults {
            seq_len: 64, tokens: 1e9, optimizer: "adamw".into(), learning_rate: 1e-3, weight_decay: 0.1,
        };
        let measured = PublishedMeasurement {
            step_time_s: 1.5, tokens_per_s_per_gpu: 1000.0, model_tflops_per_gpu: 0.0, gpus: 8,
            source: "contract 0.2.0 test program, table 1".into(),
        };
        ModelInfo {
            family: "old".into(),
            variants: vec![Variant {
                name: "old-tiny".into(), family: "old".into(), citation: "contract 0.2.0 test program".into(),
                hyper, defaults,
                layouts: vec![
                    layout(8, TrainingPrecision::Fp8Current, 2, Some(measured)),
                    layout(16, TrainingPrecision::Bf16, 1, None),
                ],
            }],
        }
    }

    fn graph(request: GraphRequest) -> Result<ModelGraph, String> {
        if request.variant != "old-tiny" {
            return Err(format!("unknown variant '{}'; this plugin has old-tiny", request.variant));
        }
        match request.phase {
            Phase::Training => {}
            Phase::Prefill(s) | Phase::Decode(s) => {
                return Err(format!("no inference graph (asked for kv-len {}, concurrency {})", s.kv_len, s.concurrency));
            }
        }
        Ok(mlp_graph(&request))
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
