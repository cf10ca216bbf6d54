//! Test program: a workload plugin whose `describe` is fine but whose `graph` returns
//! nonsense chosen by the variant name: `bad-shape` (a linear whose weight does not fit
//! its input), `unknown-tensor` (an operation reading an undeclared tensor),
//! `duplicate` (two tensors with one name), `nan-attr` (a non-finite attribute).
//! The host must reject each with a message naming the rule.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use runner_plugin_sdk::workload::*;

struct Misbehave;

fn t(name: &str, shape: &[u64], dtype: Dtype, kind: TensorKind) -> Tensor {
    Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind }
}

fn op(name: &str, kind: OpKind, inputs: &[&str], outputs: &[&str], attrs: Vec<Attribute>) -> Operation {
    Operation {
        name: name.into(),
        kind,
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        attrs,
        layer: -1,
        role: ParallelRole::Replicated,
    }
}

impl Guest for Misbehave {
    fn describe() -> ModelInfo {
        let hyper = Hyperparameters {
            layers: 1, hidden: 8, ffn: 16, heads: 2, kv_heads: 2, head_dim: 4, vocab: 16,
            tied_embeddings: false, position: PositionScheme::Rope, rope_theta: 10000.0, max_position: 64,
            norm: NormKind::RmsNorm, norm_eps: 1e-5, activation: ActivationKind::Swiglu,
            attention: AttentionKind::Mha, mla: None, moe: None, attention_window: 0, window_every: 0,
            bias: false, mtp_depth: 0, mamba: None, layer_pattern: String::new(),
        };
        let defaults = TrainingDefaults { seq_len: 8, tokens: 1e6, optimizer: "adamw".into(), learning_rate: 1e-3, weight_decay: 0.0 };
        let variants = ["bad-shape", "unknown-tensor", "duplicate", "nan-attr"]
            .into_iter()
            .map(|name| Variant {
                name: name.into(), family: "misbehave".into(), citation: "test".into(),
                hyper: hyper.clone(), defaults: defaults.clone(), layouts: vec![],
            })
            .collect();
        ModelInfo { family: "misbehave".into(), variants }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        let (b, s) = (u64::from(request.micro_batch), u64::from(request.seq_len));
        let mut tensors = vec![
            t("tokens", &[b, s], Dtype::Int32, TensorKind::Input),
            t("targets", &[b, s], Dtype::Int32, TensorKind::Input),
            t("embed.weight", &[16, 8], Dtype::Bf16, TensorKind::Weight),
            t("h", &[b, s, 8], Dtype::Bf16, TensorKind::Activation),
            t("head.weight", &[16, 7], Dtype::Bf16, TensorKind::Weight),
            t("logits", &[b, s, 16], Dtype::Bf16, TensorKind::Activation),
            t("loss", &[], Dtype::Fp32, TensorKind::Activation),
        ];
        let mut head_input = "h";
        let mut embed_attrs = vec![];
        match request.variant.as_str() {
            "bad-shape" => {}
            "unknown-tensor" => head_input = "nowhere",
            "duplicate" => tensors.push(t("h", &[b, s, 8], Dtype::Bf16, TensorKind::Activation)),
            "nan-attr" => embed_attrs.push(Attribute { key: "scale".into(), value: AttrValue::Float(f64::NAN) }),
            other => return Err(format!("unknown variant '{other}'")),
        }
        let operations = vec![
            op("embed", OpKind::Embedding, &["tokens", "embed.weight"], &["h"], embed_attrs),
            op("lm_head", OpKind::Linear, &[head_input, "head.weight"], &["logits"], vec![]),
            op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], vec![]),
        ];
        Ok(Graph { tensors, operations, loss: "loss".into() })
    }
}

runner_plugin_sdk::export_workload!(Misbehave);
