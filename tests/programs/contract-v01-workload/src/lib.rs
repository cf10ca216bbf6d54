//! Test program: a workload plugin built against the published contract 0.1.0 (no SDK):
//! one tiny family whose graph is a real, trainable stack of MLP blocks, and layouts that
//! name their precision the 0.1 way ("FP8", "bf16"). The host must run it through its
//! adapter, with 0.2 defaults for what 0.1 cannot say.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "workload-plugin", path: "../../wit-0.1.0" });

use exports::runner::plugin::workload::*;
use runner::plugin::types::Dtype;

struct Old;

include!("../../shared/mlp_graph.rs");

fn layout(gpus: u32, precision: &str, tp: u32) -> ReferenceLayout {
    ReferenceLayout {
        gpu: "H100".into(), gpus_min: gpus, gpus_max: gpus, precision: precision.into(),
        tp, pp: 1, cp: 1, vp: 1, ep: 1, etp: 1, fsdp: 0, mbs: 1, gbs_per_gpu: 2.0, gbs_fixed: 0,
        source: "contract 0.1.0 test program".into(),
    }
}

impl Guest for Old {
    fn describe() -> ModelInfo {
        let hyper = Hyperparameters {
            layers: LAYERS, hidden: HIDDEN as u32, ffn: FFN as u32, heads: 4, kv_heads: 4, head_dim: 8,
            vocab: VOCAB as u32, tied_embeddings: false, position: PositionScheme::None, rope_theta: 10000.0,
            max_position: 512, norm: NormKind::RmsNorm, norm_eps: 1e-5, activation: ActivationKind::Gelu,
            attention: AttentionKind::Mha, mla: None, moe: None, attention_window: 0, window_every: 0,
            bias: false, mtp_depth: 0,
        };
        let defaults = TrainingDefaults {
            seq_len: 64, tokens: 1e9, optimizer: "adamw".into(), learning_rate: 1e-3, weight_decay: 0.1,
        };
        ModelInfo {
            family: "old".into(),
            variants: vec![Variant {
                name: "old-tiny".into(), family: "old".into(), citation: "contract 0.1.0 test program".into(),
                hyper, defaults, layouts: vec![layout(8, "FP8", 2), layout(16, "bf16", 1)],
            }],
        }
    }

    fn graph(request: GraphRequest) -> Result<ModelGraph, String> {
        if request.variant != "old-tiny" {
            return Err(format!("unknown variant '{}'; this plugin has old-tiny", request.variant));
        }
        Ok(mlp_graph(&request))
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
