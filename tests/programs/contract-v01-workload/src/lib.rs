//! Test program: a workload plugin built against the published contract 0.1.0 (no SDK):
//! one tiny family whose graph is a real, trainable stack of MLP blocks, and layouts that
//! name their precision the 0.1 way ("FP8", "bf16"). The host must run it through its
//! adapter, with 0.2 defaults for what 0.1 cannot say.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "workload-plugin", path: "../../wit-0.1.0" });

use exports::runner::plugin::workload::*;
use runner::plugin::types::Dtype;

struct Old;

const LAYERS: u32 = 2;
const HIDDEN: u64 = 32;
const FFN: u64 = 64;
const VOCAB: u64 = 128;

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
        let (b, t) = (u64::from(request.micro_batch), u64::from(request.seq_len));
        let layers = if request.layers == 0 { LAYERS } else { request.layers.min(LAYERS) };
        let mut g = ModelGraph { tensors: Vec::new(), operations: Vec::new(), loss: "loss".into() };
        let tensor = |g: &mut ModelGraph, name: &str, shape: &[u64], dtype: Dtype, kind: TensorKind| {
            g.tensors.push(Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind });
            name.to_string()
        };
        let op = |g: &mut ModelGraph, name: &str, kind: OpKind, inputs: &[&str], output: &str, attrs: Vec<Attribute>, layer: i32, role: ParallelRole| {
            g.operations.push(Operation {
                name: name.into(), kind, inputs: inputs.iter().map(|s| s.to_string()).collect(),
                outputs: vec![output.into()], attrs, layer, role,
            });
        };
        let act = |g: &mut ModelGraph, name: &str, shape: &[u64]| {
            g.tensors.push(Tensor { name: name.into(), shape: shape.to_vec(), dtype: Dtype::Bf16, kind: TensorKind::Activation });
            name.to_string()
        };
        let tokens = tensor(&mut g, "tokens", &[b, t], Dtype::Int32, TensorKind::Input);
        let targets = tensor(&mut g, "targets", &[b, t], Dtype::Int32, TensorKind::Input);
        let table = tensor(&mut g, "embed.weight", &[VOCAB, HIDDEN], Dtype::Bf16, TensorKind::Weight);
        let mut x = act(&mut g, "embed", &[b, t, HIDDEN]);
        op(&mut g, "embed", OpKind::Embedding, &[&tokens, &table], &x, vec![], -1, ParallelRole::VocabParallel);
        let eps = || vec![Attribute { key: "eps".into(), value: AttrValue::Float(1e-5) }];
        for i in 0..layers {
            let p = format!("layers.{i}");
            let l = i as i32;
            let nw = tensor(&mut g, &format!("{p}.norm.weight"), &[HIDDEN], Dtype::Bf16, TensorKind::Weight);
            let n = act(&mut g, &format!("{p}.norm"), &[b, t, HIDDEN]);
            op(&mut g, &n, OpKind::RmsNorm, &[&x, &nw], &n, eps(), l, ParallelRole::Sequence);
            let uw = tensor(&mut g, &format!("{p}.up.weight"), &[FFN, HIDDEN], Dtype::Bf16, TensorKind::Weight);
            let u = act(&mut g, &format!("{p}.up"), &[b, t, FFN]);
            op(&mut g, &u, OpKind::Linear, &[&n, &uw], &u, vec![], l, ParallelRole::ColumnParallel);
            let a = act(&mut g, &format!("{p}.act"), &[b, t, FFN]);
            op(&mut g, &a, OpKind::Gelu, &[&u], &a, vec![], l, ParallelRole::ColumnParallel);
            let dw = tensor(&mut g, &format!("{p}.down.weight"), &[HIDDEN, FFN], Dtype::Bf16, TensorKind::Weight);
            let d = act(&mut g, &format!("{p}.down"), &[b, t, HIDDEN]);
            op(&mut g, &d, OpKind::Linear, &[&a, &dw], &d, vec![], l, ParallelRole::RowParallel);
            let r = act(&mut g, &format!("{p}.residual"), &[b, t, HIDDEN]);
            op(&mut g, &r, OpKind::Add, &[&x, &d], &r, vec![], l, ParallelRole::Sequence);
            x = r;
        }
        let fw = tensor(&mut g, "final_norm.weight", &[HIDDEN], Dtype::Bf16, TensorKind::Weight);
        let f = act(&mut g, "final_norm", &[b, t, HIDDEN]);
        op(&mut g, "final_norm", OpKind::RmsNorm, &[&x, &fw], &f, eps(), -1, ParallelRole::Sequence);
        let hw = tensor(&mut g, "lm_head.weight", &[VOCAB, HIDDEN], Dtype::Bf16, TensorKind::Weight);
        let logits = act(&mut g, "lm_head", &[b, t, VOCAB]);
        op(&mut g, "lm_head", OpKind::Linear, &[&f, &hw], &logits, vec![], -1, ParallelRole::VocabParallel);
        g.tensors.push(Tensor { name: "loss".into(), shape: vec![], dtype: Dtype::Fp32, kind: TensorKind::Activation });
        op(&mut g, "loss", OpKind::CrossEntropy, &[&logits, &targets], "loss", vec![], -1, ParallelRole::VocabParallel);
        Ok(g)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
