//! The contract's workload rules (`runner_contract::workload_rules!`, expanded here over
//! the SDK's bindings: the code the host runs on every `describe`) at their edges: each
//! ceiling accepted at the limit and refused one past it, each zero refused where a size
//! must be positive, each message naming the field. The plugin host's own tests
//! (`host/plugin/src/workload.rs`) cover the hybrid rules; these cover what a hand
//! mutation audit of `host/contract/src/workload.rs` found no test for.

use runner_contract::limits::{EXPERTS, GPUS, HEADS, LAYERS, LAYOUTS, SEQ_LEN, VARIANTS, VOCAB, WIDTH};

use super::builder::{Layout, decoder, defaults, moe, variant};
use super::*;

/// 8 layers, hidden 64, SwiGLU MLP of 128, 4 query heads of 16 over 2 KV heads, vocab 256.
fn dense() -> Hyperparameters {
    decoder(8, 64, 128, 4, 2, 256)
}

/// The same with 8 experts (top-2, width 32) in every layer.
fn with_moe() -> Hyperparameters {
    Hyperparameters { moe: Some(moe(8, 2, 32)), ..dense() }
}

/// 8 H100s, every degree 1.
fn layout() -> ReferenceLayout {
    Layout::new("H100", 8, 8, "BF16").0
}

fn one(name: &str) -> Variant {
    variant(name, "f", "", dense(), defaults(4096, 1e12, 3e-4), [Layout(layout())])
}

fn moe_of(h: &mut Hyperparameters) -> &mut MoeConfig {
    h.moe.as_mut().unwrap()
}

/// `r` is an error holding every one of `words`.
#[track_caller]
fn refused(r: Result<(), String>, words: &[&str]) {
    let m = r.expect_err("must be refused");
    for w in words {
        assert!(m.contains(w), "{w:?} not in: {m}");
    }
}

/// A size that must be in 1..=`max`: `max` passes, 0 and `max + 1` are refused, naming
/// the field and the range.
#[track_caller]
fn sized<T: Clone>(base: &T, field: &str, max: u32, set: impl Fn(&mut T, u32), check: impl Fn(&T) -> Result<(), String>) {
    let at = |v: u32| {
        let mut x = base.clone();
        set(&mut x, v);
        check(&x)
    };
    assert_eq!(at(max), Ok(()), "{field} = {max} is at the limit");
    refused(at(max + 1), &[field, &format!("1..={max}, got {}", max + 1)]);
    refused(at(0), &[field, "got 0"]);
}

/// Kills (of 121 mutations of workload.rs, 76 surviving the SDK's and the host's unit
/// tests before): each size's range check deleted (layers, hidden, heads, kv-heads,
/// head-dim, vocab, ffn), the shared range check's `>` made `>=`.
#[test]
fn each_model_size_is_accepted_at_its_ceiling_and_refused_past_it_or_at_zero() {
    type Set = fn(&mut Hyperparameters, u32);
    let fields: [(&str, u32, Set); 7] = [
        ("layers", LAYERS, |h, v| h.layers = v),
        ("hidden", WIDTH, |h, v| h.hidden = v),
        ("heads", HEADS, |h, v| (h.heads, h.kv_heads) = (v, 1)),
        ("kv-heads", HEADS, |h, v| (h.heads, h.kv_heads) = (HEADS, v)),
        ("head-dim", WIDTH, |h, v| h.head_dim = v),
        ("vocab", VOCAB, |h, v| h.vocab = v),
        ("ffn", WIDTH, |h, v| h.ffn = v),
    ];
    for (field, max, set) in fields {
        sized(&dense(), field, max, set, validate_hyperparameters);
    }
}

/// Kills: the moe ranges deleted (experts, expert-ffn, layer-frequency), top-k 0 let
/// through, top-k == experts refused, the shared-experts and shared-ffn ceilings deleted,
/// the latent ceiling made `>=`.
#[test]
fn each_moe_size_is_accepted_at_its_ceiling_and_refused_past_it() {
    type Set = fn(&mut Hyperparameters, u32);
    let fields: [(&str, u32, Set); 3] = [
        ("moe.experts", EXPERTS, |h, v| h.moe.as_mut().unwrap().experts = v),
        ("moe.expert-ffn", WIDTH, |h, v| h.moe.as_mut().unwrap().expert_ffn = v),
        ("moe.layer-frequency", LAYERS, |h, v| h.moe.as_mut().unwrap().layer_frequency = v),
    ];
    for (field, max, set) in fields {
        // Every LAYERS-th layer is MoE only in a model of LAYERS layers.
        let base = Hyperparameters { layers: LAYERS, ..with_moe() };
        sized(&base, field, max, set, validate_hyperparameters);
    }
    let mut h = with_moe();
    moe_of(&mut h).top_k = 8;
    assert_eq!(validate_hyperparameters(&h), Ok(()), "every expert active");
    moe_of(&mut h).top_k = 0;
    refused(validate_hyperparameters(&h), &["moe.top-k must be in 1..=8, got 0"]);

    let mut h = with_moe();
    let m = moe_of(&mut h);
    (m.shared_experts, m.shared_ffn, m.latent) = (EXPERTS, WIDTH, WIDTH);
    assert_eq!(validate_hyperparameters(&h), Ok(()));
    let mut past = h.clone();
    moe_of(&mut past).shared_experts = EXPERTS + 1;
    refused(validate_hyperparameters(&past), &["moe.shared-experts", &format!("at most {EXPERTS}, got {}", EXPERTS + 1)]);
    let mut past = h.clone();
    moe_of(&mut past).shared_ffn = WIDTH + 1;
    refused(validate_hyperparameters(&past), &[&format!("moe.shared-ffn must be at most {WIDTH}"), &format!("got {}", WIDTH + 1)]);
}

/// Dense MLPs exist where a layer has one: without a pattern, in the leading dense layers
/// and between MoE layers; with one, where it has `-`. Elsewhere ffn may be 0, never past
/// the ceiling. Kills: `dense_layers > 0` and `layer_frequency > 1` dropped from the
/// "needs a dense MLP" test, the ceiling on an unused ffn deleted.
#[test]
fn ffn_is_required_exactly_where_a_layer_has_a_dense_mlp() {
    let all_moe = Hyperparameters { ffn: 0, ..with_moe() };
    assert_eq!(validate_hyperparameters(&all_moe), Ok(()), "every layer MoE: no dense MLP");
    let mut h = all_moe.clone();
    h.moe.as_mut().unwrap().dense_layers = 1;
    refused(validate_hyperparameters(&h), &["ffn must be in 1..=", "got 0"]);
    let mut h = all_moe.clone();
    h.moe.as_mut().unwrap().layer_frequency = 2;
    refused(validate_hyperparameters(&h), &["ffn must be in 1..=", "got 0"]);
    let h = Hyperparameters { ffn: WIDTH + 1, ..all_moe.clone() };
    refused(validate_hyperparameters(&h), &[&format!("ffn must be at most {WIDTH}, got {}", WIDTH + 1)]);
    let pattern = Hyperparameters { layer_pattern: "*E*E*E*E".into(), ..all_moe };
    assert_eq!(validate_hyperparameters(&pattern), Ok(()));
    refused(validate_hyperparameters(&Hyperparameters { ffn: WIDTH + 1, ..pattern }), &["ffn must be at most"]);
}

/// A hybrid model's multi-token-prediction module is one attention and one MLP (or MoE)
/// block whatever its pattern says (the SDK's builder), and a classic model's MoE layers
/// reach into its modules: a pattern of Mamba and MoE layers only with mtp-depth 1 still
/// splits attention heads over tp and, without moe, needs ffn; an moe whose first layer
/// falls past the main stack and its modules places no expert and is refused, as an moe
/// a pattern leaves unused is.
#[test]
fn the_mtp_modules_count_as_attention_mlp_and_moe_layers() {
    let m = MambaConfig { heads: 8, head_dim: 16, state: 16, groups: 4, conv_kernel: 4, chunk: 64 };
    let hybrid = Hyperparameters { mamba: Some(m), layer_pattern: "MEMEMEME".into(), ..with_moe() };
    let tp4 = ReferenceLayout { tp: 4, ..layout() };
    // 4 groups split over tp 4; 4 heads too, so raise the heads to 6 over 2 kv heads.
    let h6 = Hyperparameters { heads: 6, kv_heads: 2, ..hybrid.clone() };
    assert_eq!(validate_layout(&tp4, &h6), Ok(()), "no attention layer: the heads are not split");
    let mtp = Hyperparameters { mtp_depth: 1, ..h6 };
    refused(validate_layout(&tp4, &mtp), &["tp 4 does not divide the 6 attention heads"]);

    let dense_mamba = Hyperparameters { moe: None, layer_pattern: "MMMMMMMM".into(), ffn: 0, ..hybrid };
    assert_eq!(validate_hyperparameters(&dense_mamba), Ok(()), "Mamba layers only: no MLP");
    let with_mtp = Hyperparameters { mtp_depth: 1, ..dense_mamba.clone() };
    refused(validate_hyperparameters(&with_mtp), &["ffn must be in 1..=", "got 0", "the mtp-depth modules have a dense MLP"]);
    assert_eq!(validate_hyperparameters(&Hyperparameters { ffn: 128, ..with_mtp }), Ok(()));
    let mut moe_mtp = Hyperparameters { mtp_depth: 1, layer_pattern: "MEMMMMMM".into(), ..dense_mamba };
    moe_mtp.moe = Some(moe(8, 2, 32));
    assert_eq!(validate_hyperparameters(&moe_mtp), Ok(()), "the module's block is MoE: no ffn");

    // Without a pattern: 8 layers, MoE every second from layer 6 (6 dense, frequency 2:
    // layer 7), from 7 (layer 8: past the stack) and, with one module, layer 8 again.
    let placed = |dense: u32, freq: u32, mtp: u32| {
        let mut h = Hyperparameters { mtp_depth: mtp, ..with_moe() };
        (moe_of(&mut h).dense_layers, moe_of(&mut h).layer_frequency) = (dense, freq);
        validate_hyperparameters(&h)
    };
    assert_eq!(placed(6, 2, 0), Ok(()));
    refused(placed(7, 2, 0), &["moe is given but no layer is MoE: the first would be layer 8", "there are 8 (layers + mtp-depth)"]);
    assert_eq!(placed(7, 2, 1), Ok(()), "the module is layer 8, MoE");
    refused(placed(8, 1, 0), &["no layer is MoE", "layer 8"]);
    assert_eq!(placed(0, 8, 0), Ok(()));
    refused(placed(0, 9, 0), &["no layer is MoE", "layer 8"]);
}

/// Kills: `is_finite` dropped from the norm-eps check (an infinite epsilon passed), the
/// max-position and attention-window ceilings deleted or made `>=`.
#[test]
fn norm_eps_is_finite_and_positions_stop_at_the_sequence_ceiling() {
    for eps in [f64::INFINITY, f64::NAN, -1e-5] {
        refused(validate_hyperparameters(&Hyperparameters { norm_eps: eps, ..dense() }), &["norm-eps must be finite and > 0"]);
    }
    let at = Hyperparameters { max_position: SEQ_LEN, attention_window: SEQ_LEN, window_every: 2, ..dense() };
    assert_eq!(validate_hyperparameters(&at), Ok(()));
    let past = SEQ_LEN + 1;
    refused(validate_hyperparameters(&Hyperparameters { max_position: past, ..at.clone() }), &[&format!("max-position ({past})")]);
    refused(validate_hyperparameters(&Hyperparameters { attention_window: past, ..at }), &[&format!("attention-window ({past})")]);
}

/// Kills: the MLA ceilings deleted or made `>=`, the kv-lora-rank and v-head-dim ranges
/// deleted. A q-lora-rank of 0 is a setting (no query compression, DeepSeek-V2-Lite); the
/// query/key head widths (nope, rope) are not: the SDK builds a zero-wide tensor of each.
#[test]
fn mla_widths_are_bounded_and_all_but_q_lora_rank_positive() {
    let mla = MlaConfig { q_lora_rank: 0, kv_lora_rank: 32, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16 };
    let base = Hyperparameters { attention: AttentionKind::Mla, mla: Some(mla), ..dense() };
    assert_eq!(validate_hyperparameters(&base), Ok(()));
    type Set = fn(&mut MlaConfig, u32);
    let fields: [(&str, Set); 5] = [
        ("mla.q-lora-rank", |m, v| m.q_lora_rank = v),
        ("mla.kv-lora-rank", |m, v| m.kv_lora_rank = v),
        ("mla.qk-nope-head-dim", |m, v| m.qk_nope_head_dim = v),
        ("mla.qk-rope-head-dim", |m, v| m.qk_rope_head_dim = v),
        ("mla.v-head-dim", |m, v| m.v_head_dim = v),
    ];
    for (field, set) in fields {
        let with = |v: u32| {
            let mut h = base.clone();
            set(h.mla.as_mut().unwrap(), v);
            validate_hyperparameters(&h)
        };
        assert_eq!(with(WIDTH), Ok(()), "{field} at the limit");
        refused(with(WIDTH + 1), &[field, &format!("got {}", WIDTH + 1)]);
    }
    // Every width but q-lora-rank is an axis of the attention's tensors: 0 is refused
    // here, by name, not later as a tensor's zero axis.
    for (field, set) in &fields[1..] {
        let mut h = base.clone();
        set(h.mla.as_mut().unwrap(), 0);
        refused(validate_hyperparameters(&h), &[field, "must be in 1..=", "got 0"]);
    }
}

/// Kills: the Mamba inner-width ceiling made `>=` (heads x head-dim exactly at the width
/// ceiling must pass).
#[test]
fn a_mamba_inner_width_at_the_ceiling_is_accepted() {
    let m = MambaConfig { heads: 1024, head_dim: 1024, state: 64, groups: 8, conv_kernel: 4, chunk: 128 };
    let h = Hyperparameters { mamba: Some(m), layer_pattern: "M*M*M*M*".into(), ..dense() };
    assert_eq!(validate_hyperparameters(&h), Ok(()));
    let h = Hyperparameters { mamba: Some(MambaConfig { head_dim: 1025, ..m }), ..h };
    refused(validate_hyperparameters(&h), &["1024 x 1025", &format!("at most {WIDTH}")]);
}

/// Kills: each parallel size's zero let through, the shared ceiling made `>=` (mbs at the
/// ceiling), the gpus-max ceiling deleted or made `>=`.
#[test]
fn each_layout_size_is_in_range() {
    let h = with_moe();
    let check = |l: &ReferenceLayout| validate_layout(l, &h);
    for (field, set) in [
        ("tp", (|l, v| l.tp = v) as fn(&mut ReferenceLayout, u32)),
        ("pp", |l, v| l.pp = v),
        ("cp", |l, v| l.cp = v),
        ("vp", |l, v| l.vp = v),
        ("ep", |l, v| l.ep = v),
        ("etp", |l, v| l.etp = v),
        ("gpus-min", |l, v| l.gpus_min = v),
    ] {
        let mut l = layout();
        set(&mut l, 0);
        refused(check(&l), &[&format!("{field} must be in 1..={GPUS}, got 0")]);
        set(&mut l, GPUS + 1);
        refused(check(&l), &[field, &format!("got {}", GPUS + 1)]);
    }
    sized(&layout(), "mbs", GPUS, |l, v| l.mbs = v, check);
    let all = ReferenceLayout { gpus_min: GPUS, gpus_max: GPUS, ..layout() };
    assert_eq!(check(&all), Ok(()), "the whole GPU range");
    refused(check(&ReferenceLayout { gpus_max: GPUS + 1, ..all }), &["gpus-max", &format!("at most {GPUS}, got {}", GPUS + 1)]);
}

/// Every rule that divides a GPU count holds at both ends of the range. Kills: only
/// gpus-min checked, the tp x pp x cp rule deleted, pp dropped from ep x etp x pp, the
/// FSDP rule deleted.
#[test]
fn parallel_groups_divide_both_ends_of_the_gpu_range() {
    let h = with_moe();
    let check = |l: ReferenceLayout| validate_layout(&l, &h);
    let range = || ReferenceLayout { gpus_min: 8, gpus_max: 12, ..layout() };
    assert_eq!(check(ReferenceLayout { cp: 4, ..range() }), Ok(()));
    refused(check(ReferenceLayout { cp: 8, ..range() }), &["tp x pp x cp = 1 x 1 x 8 = 8 does not divide 12 GPUs"]);
    refused(check(ReferenceLayout { cp: 3, ..layout() }), &["tp x pp x cp = 1 x 1 x 3 = 3 does not divide 8 GPUs"]);
    refused(check(ReferenceLayout { ep: 8, ..range() }), &["ep x etp x pp = 8 x 1 x 1 = 8 does not divide 12 GPUs"]);
    // ep 4 over 4 GPUs, but each of 2 pipeline stages holds its own experts: 8 ranks.
    let four = || ReferenceLayout { gpus_min: 4, gpus_max: 4, pp: 2, ..layout() };
    assert_eq!(check(ReferenceLayout { ep: 2, ..four() }), Ok(()));
    refused(check(ReferenceLayout { ep: 4, ..four() }), &["ep x etp x pp = 4 x 1 x 2 = 8 does not divide 4 GPUs"]);
    assert_eq!(check(ReferenceLayout { fsdp: 4, ..range() }), Ok(()));
    refused(check(ReferenceLayout { fsdp: 8, ..range() }), &["fsdp", "8", "does not divide 12 GPUs"]);
    refused(check(ReferenceLayout { fsdp: 3, ..layout() }), &["fsdp", "3", "does not divide 8 GPUs"]);
}

/// Kills: the vp rule deleted or made `vp > 2`, the attention-heads rule skipped for a
/// classic transformer (no pattern), ep or etp > 1 let through on a model without
/// experts.
#[test]
fn stages_heads_and_experts_the_layout_splits_must_exist() {
    let check = |l: ReferenceLayout, h: &Hyperparameters| validate_layout(&l, h);
    refused(check(ReferenceLayout { vp: 2, ..layout() }, &dense()), &["vp 2 needs pipeline stages"]);
    assert_eq!(check(ReferenceLayout { vp: 2, pp: 2, ..layout() }, &dense()), Ok(()));
    assert_eq!(check(ReferenceLayout { tp: 4, ..layout() }, &dense()), Ok(()));
    refused(check(ReferenceLayout { tp: 8, ..layout() }, &dense()), &["tp 8 does not divide the 4 attention heads"]);
    for (ep, etp) in [(2, 1), (1, 2)] {
        refused(check(ReferenceLayout { ep, etp, ..layout() }, &dense()), &[&format!("ep {ep} / etp {etp} on a model without experts")]);
        assert_eq!(check(ReferenceLayout { ep, etp, ..layout() }, &with_moe()), Ok(()));
    }
}

/// Kills: the layout's seq-len ceiling deleted or made `>=`, negative or exactly 1e6
/// sequences per GPU judged wrongly, the 1e-6 floor deleted or made `<=`, the measured step's source, GPU ceiling, and the
/// layout's gpu name and source going unchecked.
#[test]
fn a_layouts_sequence_batch_measurement_and_text_are_checked() {
    let h = dense();
    let check = |l: ReferenceLayout| validate_layout(&l, &h);
    assert_eq!(check(ReferenceLayout { seq_len: SEQ_LEN, ..layout() }), Ok(()));
    refused(check(ReferenceLayout { seq_len: SEQ_LEN + 1, ..layout() }), &[&format!("seq-len must be at most {SEQ_LEN}"), &format!("got {}", SEQ_LEN + 1)]);
    assert_eq!(check(ReferenceLayout { gbs_per_gpu: 1e6, ..layout() }), Ok(()));
    for bad in [-1.0, 1e6 + 1.0, f64::NAN, f64::INFINITY] {
        refused(check(ReferenceLayout { gbs_per_gpu: bad, ..layout() }), &["gbs-per-gpu must be finite, >= 0 and at most 1e6"]);
    }
    // The smallest per-GPU rule is one sequence per million GPUs; below it, a positive
    // rule such as 1e-300 (which `{}` prints as 301 digits) is refused, named compactly.
    assert_eq!(check(ReferenceLayout { gbs_per_gpu: 1e-6, ..layout() }), Ok(()));
    for tiny in [1e-300, 9e-7, f64::MIN_POSITIVE] {
        let m = check(ReferenceLayout { gbs_per_gpu: tiny, gbs_fixed: 8, ..layout() }).expect_err("a sliver of a sequence per GPU");
        assert!(m.contains("gbs-per-gpu must be 0 (the batch is gbs-fixed alone) or at least 1e-6") && m.len() < 200, "{m}");
    }
    assert_eq!(check(ReferenceLayout { gbs_per_gpu: 0.0, gbs_fixed: 8, ..layout() }), Ok(()));
    let measured =
        PublishedMeasurement { step_time_s: 1.0, tokens_per_s_per_gpu: 1e4, model_tflops_per_gpu: 400.0, gpus: GPUS, source: "paper".into() };
    assert_eq!(check(ReferenceLayout { measured: Some(measured.clone()), ..layout() }), Ok(()));
    let past = PublishedMeasurement { gpus: GPUS + 1, ..measured.clone() };
    refused(check(ReferenceLayout { measured: Some(past), ..layout() }), &[&format!("measured.gpus must be in 1..={GPUS}")]);
    let escape = PublishedMeasurement { source: "\u{1b}[2J".into(), ..measured };
    refused(check(ReferenceLayout { measured: Some(escape), ..layout() }), &["measured.source", "U+001B"]);
    refused(check(ReferenceLayout { gpu: " ".into(), ..layout() }), &["gpu is empty"]);
    refused(check(ReferenceLayout { source: "\r\n".into(), ..layout() }), &["source", "U+000D"]);
}

/// Kills: the family's name, the empty family, the variant count's ceiling (off by one
/// either way), a variant's name, family, citation and optimizer unchecked, its
/// hyperparameters or layouts not validated, the layout count's ceiling (off by one either
/// way), a zero defaults.seq-len or tokens let through, a learning rate outside 0 or
/// 1e-8..=10.
#[test]
fn a_family_its_variants_and_their_defaults_are_checked() {
    let info = |variants: Vec<Variant>| ModelInfo { family: "f".into(), variants };
    let many = |n: usize| (0..n).map(|i| one(&format!("v{i}"))).collect::<Vec<_>>();
    assert_eq!(validate_model_info(&info(many(VARIANTS))), Ok(()));
    refused(validate_model_info(&info(many(VARIANTS + 1))), &[&format!("{} variants (at most {VARIANTS})", VARIANTS + 1)]);
    refused(validate_model_info(&info(vec![])), &["family 'f' has no variants"]);
    refused(validate_model_info(&ModelInfo { family: "\u{1b}]0;x".into(), variants: many(1) }), &["family", "U+001B"]);
    refused(validate_model_info(&info(vec![one("a\u{7}")])), &["a variant's name", "U+0007"]);

    let v = one("a");
    assert_eq!(validate_variant(&v), Ok(()));
    refused(validate_variant(&Variant { family: String::new(), ..v.clone() }), &["family is empty"]);
    refused(validate_variant(&Variant { citation: "\u{202e}".into(), ..v.clone() }), &["citation", "U+202E"]);
    refused(validate_variant(&Variant { hyper: Hyperparameters { layers: 0, ..dense() }, ..v.clone() }), &["layers must be in 1..="]);
    let layouts = |n: usize| vec![layout(); n];
    assert_eq!(validate_variant(&Variant { layouts: layouts(LAYOUTS), ..v.clone() }), Ok(()));
    refused(validate_variant(&Variant { layouts: layouts(LAYOUTS + 1), ..v.clone() }), &[&format!("{} layouts (at most {LAYOUTS})", LAYOUTS + 1)]);
    let bad = ReferenceLayout { tp: 3, ..layout() };
    refused(validate_variant(&Variant { layouts: vec![layout(), bad], ..v.clone() }), &["layout #1 (H100 BF16)", "tp x pp x cp"]);
    let with = |f: fn(&mut TrainingDefaults)| {
        let mut v = v.clone();
        f(&mut v.defaults);
        validate_variant(&v)
    };
    refused(with(|d| d.seq_len = 0), &[&format!("defaults.seq-len must be in 1..={SEQ_LEN}, got 0")]);
    refused(with(|d| d.tokens = 0.0), &["defaults.tokens must be finite, > 0", "got 0"]);
    refused(with(|d| d.optimizer = String::new()), &["defaults.optimizer is empty"]);
    // Weight decay is AdamW's decoupled factor: 0 to 1, as `runner train` applies it.
    for wd in [0.0, 0.1, 1.0] {
        assert_eq!(with_wd(&v, wd), Ok(()), "weight decay {wd}");
    }
    for wd in [1.5, 1e300] {
        let m = with_wd(&v, wd).expect_err("a weight decay no recipe publishes");
        assert!(m.contains("defaults.weight-decay must be from 0 to 1") && m.len() < 140, "{m}");
    }
    refused(with_wd(&v, -0.1), &["defaults.weight-decay must be finite and >= 0"]);
    // A learning rate is 0 (the runner's default) or one a recipe could publish; the
    // runner prints it raw in its advice when a run diverges.
    for lr in [0.0, 1e-8, 1.6e-3, 10.0] {
        assert_eq!(with_lr(&v, lr), Ok(()), "learning rate {lr}");
    }
    for lr in [1e-300, 9e-9, 10.5, 1e300] {
        let m = with_lr(&v, lr).expect_err("a learning rate no recipe publishes");
        assert!(m.contains("defaults.learning-rate must be 0 (the runner's default) or from 1e-8 to 10") && m.len() < 120, "{m}");
    }
}

fn with_wd(v: &Variant, weight_decay: f64) -> Result<(), String> {
    validate_variant(&Variant { defaults: TrainingDefaults { weight_decay, ..v.defaults.clone() }, ..v.clone() })
}

fn with_lr(v: &Variant, learning_rate: f64) -> Result<(), String> {
    validate_variant(&Variant { defaults: TrainingDefaults { learning_rate, ..v.defaults.clone() }, ..v.clone() })
}

/// The names reports print, and the names recipes publish, to one typed precision each.
/// Kills: trimming, lower-casing or `_` -> `-` dropped, an alias lost or mapped to its
/// neighbour, a printed name changed.
#[test]
fn precision_names_round_trip_and_aliases_parse() {
    use TrainingPrecision as P;
    let all = [
        (P::Bf16, "BF16"),
        (P::Fp16, "FP16"),
        (P::Fp8, "FP8"),
        (P::Fp8Delayed, "FP8-DS"),
        (P::Fp8Current, "FP8-CS"),
        (P::Fp8Blockwise, "FP8-BS"),
        (P::Mxfp8, "MXFP8"),
        (P::Nvfp4, "NVFP4"),
    ];
    for (p, name) in all {
        assert_eq!(training_precision_name(p), name);
        assert_eq!(training_precision(name), Some(p), "{name}");
    }
    // The list messages print (the SDK's `Layout::new`) is these names, in this order.
    assert_eq!(runner_contract::workload::TRAINING_PRECISION_NAMES, all.map(|(_, name)| name).join(", "));
    for (alias, p) in [
        (" fp8_cs ", P::Fp8Current),
        ("FP8-Current", P::Fp8Current),
        ("fp8_delayed", P::Fp8Delayed),
        ("fp8-block", P::Fp8Blockwise),
        ("FP8-Blockwise", P::Fp8Blockwise),
        ("fp8-mx", P::Mxfp8),
        ("\tnvfp4", P::Nvfp4),
    ] {
        assert_eq!(training_precision(alias), Some(p), "{alias:?}");
    }
    for unknown in ["", "fp4", "fp8 cs", "bf-16"] {
        assert_eq!(training_precision(unknown), None, "{unknown:?}");
    }
}

/// A typo in a plugin's table names every precision the contract reads, from the
/// contract's one list.
#[test]
#[should_panic(expected = "unknown training precision 'fp9': use one of BF16, FP16, FP8, FP8-DS, FP8-CS, FP8-BS, MXFP8, NVFP4")]
fn an_unknown_precision_in_a_plugins_table_names_every_known_one() {
    let _ = Layout::new("H100", 8, 8, "fp9");
}
