// The graph both contract test programs build (`include!`d by contract-v01-workload and
// contract-v02-workload): a real, trainable stack of MLP blocks. The same text compiles
// against either contract's generated types (0.2 kept every name it uses from 0.1), and the
// host must turn both into the same graph.

const LAYERS: u32 = 2;
const HIDDEN: u64 = 32;
const FFN: u64 = 64;
const VOCAB: u64 = 128;

fn mlp_graph(request: &GraphRequest) -> ModelGraph {
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
    g
}
