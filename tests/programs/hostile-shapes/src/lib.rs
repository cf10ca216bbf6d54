//! Test program: a workload plugin whose `describe` is fine but whose `graph` is hostile,
//! chosen by the variant name: `overflow` (a shape whose element count overflows u64),
//! `huge-tensor` (2^52 elements), `huge-total` (tensors of 2^50 elements each, 2^57 in
//! all), `rank` (1000 axes), `many-inputs` (an operation with 100,000 inputs),
//! `many-tensors` (1,100,000 tensors), `long-name` (a 4 MB tensor name), `escape-name` (an
//! operation name with a terminal escape), and `budget` (a consistent graph with tiny
//! weights over a billion tokens, whatever sequence was asked, that needs hundreds of GiB
//! to run). The host must refuse each before allocating
//! anything sized by it, naming the rule.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use runner_plugin_sdk::workload::builder::{decoder, defaults, variant};
use runner_plugin_sdk::workload::*;

struct Hostile;

const CASES: [&str; 9] =
    ["overflow", "huge-tensor", "huge-total", "rank", "many-inputs", "many-tensors", "long-name", "escape-name", "budget"];

fn t(name: &str, shape: &[u64], dtype: Dtype, kind: TensorKind) -> Tensor {
    Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind }
}

fn op(name: &str, kind: OpKind, inputs: &[&str], outputs: &[&str]) -> Operation {
    Operation {
        name: name.into(),
        kind,
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        attrs: Vec::new(),
        layer: -1,
        role: ParallelRole::Replicated,
    }
}

impl Guest for Hostile {
    fn describe() -> ModelInfo {
        let hyper = decoder(1, 8, 16, 2, 2, 16);
        ModelInfo {
            family: "hostile".into(),
            variants: CASES.iter().map(|c| variant(c, "hostile", "test", hyper.clone(), defaults(8, 1e6, 1e-3), [])).collect(),
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        let (b, mut s) = (u64::from(request.micro_batch), u64::from(request.seq_len));
        let c = 8u64;
        let case = request.variant.as_str();
        if case == "budget" {
            s = 1 << 30; // whatever was asked: a billion tokens, tiny weights
        }
        let mut tensors = vec![
            t("tokens", &[b, s], Dtype::Int32, TensorKind::Input),
            t("targets", &[b, s], Dtype::Int32, TensorKind::Input),
            t("embed.weight", &[16, c], Dtype::Bf16, TensorKind::Weight),
            t("h", &[b, s, c], Dtype::Bf16, TensorKind::Activation),
            t("head.weight", &[16, c], Dtype::Bf16, TensorKind::Weight),
            t("logits", &[b, s, 16], Dtype::Bf16, TensorKind::Activation),
            t("loss", &[], Dtype::Fp32, TensorKind::Activation),
        ];
        let mut operations = vec![
            op("embed", OpKind::Embedding, &["tokens", "embed.weight"], &["h"]),
            op("lm_head", OpKind::Linear, &["h", "head.weight"], &["logits"]),
            op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"]),
        ];
        match case {
            "overflow" => tensors.push(t("big", &[1 << 40, 1 << 40], Dtype::Bf16, TensorKind::Weight)),
            "huge-tensor" => tensors.push(t("big", &[1 << 26, 1 << 26], Dtype::Bf16, TensorKind::Weight)),
            "huge-total" => {
                for i in 0..128 {
                    tensors.push(t(&format!("big{i}"), &[1 << 25, 1 << 25], Dtype::Bf16, TensorKind::Weight));
                }
            }
            "rank" => tensors.push(t("deep", &[1; 1000], Dtype::Bf16, TensorKind::Weight)),
            "many-inputs" => operations[1].inputs = vec!["h".to_string(); 100_000],
            "many-tensors" => {
                for i in 0..1_100_000u32 {
                    tensors.push(t(&i.to_string(), &[1], Dtype::Bf16, TensorKind::Weight));
                }
            }
            "long-name" => tensors.push(t(&"n".repeat(4 << 20), &[1], Dtype::Bf16, TensorKind::Weight)),
            "escape-name" => operations[0].name = "embed\u{1b}[2J\u{1b}[H".into(),
            "budget" => {}
            other => return Err(format!("unknown variant '{other}'")),
        }
        Ok(Graph { tensors, operations, loss: "loss".into() })
    }
}

runner_plugin_sdk::export_workload!(Hostile);
