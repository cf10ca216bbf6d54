//! The workload contract's rules: what `describe` may say about a model.

/// A size that must be in `1..=max`: the one rule behind every such field of the
/// workload contract (hyperparameters, training defaults, layout degrees, a measured
/// run's GPU count), so each message reads the same.
///
/// # Errors
/// Names `field`, the range and the value.
pub fn size(field: &str, v: u32, max: u32) -> Result<(), String> {
    if v == 0 || v > max { Err(format!("{field} must be in 1..={max}, got {v}")) } else { Ok(()) }
}

/// The names `training_precision_name` prints, every training precision in the
/// contract's order: for messages that list what `training_precision` reads. The SDK's
/// tests check it against both functions.
pub const TRAINING_PRECISION_NAMES: &str = "BF16, FP16, FP8, FP8-DS, FP8-CS, FP8-BS, MXFP8, NVFP4";

/// Expand, in a module that has the generated `ReferenceLayout`, `TrainingPrecision` and
/// `RecomputeGranularity` in scope, `reference_layout(gpu, gpus_min, gpus_max, precision)`
/// (private, or of the visibility given: `reference_layout!(pub(crate))`): a layout with
/// every parallel degree 1, micro-batch 1 and one sequence of the global batch per GPU,
/// every option off, no measurement and no source. It is the one place the record's
/// defaults are written: the SDK's `Layout::new` starts from it and the host's tests
/// build on it, each over its own bindings.
#[macro_export]
macro_rules! reference_layout {
    // The visibility as tokens: a `vis` fragment cannot match an empty invocation.
    ($($vis:tt)*) => {
        $($vis)* fn reference_layout(gpu: &str, gpus_min: u32, gpus_max: u32, precision: TrainingPrecision) -> ReferenceLayout {
            ReferenceLayout {
                gpu: gpu.into(),
                gpus_min,
                gpus_max,
                precision,
                tp: 1,
                pp: 1,
                cp: 1,
                vp: 1,
                ep: 1,
                etp: 1,
                fsdp: 0,
                sequence_parallel: false,
                recompute: RecomputeGranularity::None,
                recompute_layers: 0,
                distributed_optimizer: false,
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                tp_comm_overlap: false,
                seq_len: 0,
                mbs: 1,
                gbs_per_gpu: 1.0,
                gbs_fixed: 0,
                measured: None,
                source: String::new(),
            }
        }
    };
}

/// Expand the workload rules in a module that has the generated workload types in scope
/// (`ModelInfo`, `Variant`, `Hyperparameters`, `ReferenceLayout`, `TrainingPrecision`, ...):
///
/// ```ignore
/// mod rules {
///     use crate::bindings::exports::runner::plugin::workload::*;
///     runner_contract::workload_rules!();
/// }
/// ```
///
/// Defines `validate_model_info`, `validate_variant`, `validate_hyperparameters`,
/// `validate_layout`, `training_precision` (a name, as published recipes and contract 0.1
/// spell it, to the typed precision) and `training_precision_name`.
#[macro_export]
macro_rules! workload_rules {
    () => {
        /// The rules `describe` output must follow: a family with uniquely named variants,
        /// each valid. Linear in the size of the answer.
        ///
        /// # Errors
        /// The first broken rule, naming the variant and the field.
        pub fn validate_model_info(info: &ModelInfo) -> Result<(), String> {
            use $crate::text;
            text::name("family", &info.family)?;
            if info.variants.is_empty() {
                return Err(format!("family {} has no variants", text::shown(&info.family)));
            }
            text::at_most("variants", info.variants.len(), $crate::limits::VARIANTS)?;
            let mut names = std::collections::HashSet::new();
            for v in &info.variants {
                text::name("a variant's name", &v.name)?;
                if !names.insert(v.name.as_str()) {
                    return Err(format!("variant name {} appears twice", text::shown(&v.name)));
                }
                validate_variant(v).map_err(|m| format!("variant {}: {m}", text::shown(&v.name)))?;
            }
            Ok(())
        }

        /// One variant: its names, hyperparameters, training defaults and layouts.
        ///
        /// # Errors
        /// The first broken rule, naming the field.
        pub fn validate_variant(v: &Variant) -> Result<(), String> {
            use $crate::text;
            text::name("family", &v.family)?;
            text::free("citation", &v.citation)?;
            validate_hyperparameters(&v.hyper)?;
            let d = &v.defaults;
            $crate::workload::size("defaults.seq-len", d.seq_len, $crate::limits::SEQ_LEN)?;
            if !(d.tokens.is_finite() && d.tokens > 0.0 && d.tokens <= $crate::limits::TOKENS) {
                return Err(format!("defaults.tokens must be finite, > 0 and <= {:e}, got {}", $crate::limits::TOKENS, $crate::text::number(d.tokens)));
            }
            for (what, x) in [("defaults.learning-rate", d.learning_rate), ("defaults.weight-decay", d.weight_decay)] {
                if !(x.is_finite() && x >= 0.0) {
                    return Err(format!("{what} must be finite and >= 0, got {}", $crate::text::number(x)));
                }
            }
            // `runner train` decays weights by this factor (decoupled, AdamW's) and prints
            // it; past 1 no recipe publishes one, and 1e300 would print 301 digits.
            if !$crate::limits::WEIGHT_DECAY.contains(&d.weight_decay) {
                return Err(format!(
                    "defaults.weight-decay must be from 0 to 1 (AdamW's decoupled decay; recipes use 0 to 0.1), got {}",
                    $crate::text::number(d.weight_decay)
                ));
            }
            // The runner trains at this rate (0: its own default) and prints it with `{}`
            // when a run diverges: 1e-300 or 1e300 would be 301 digits of advice.
            if d.learning_rate != 0.0 && !$crate::limits::LEARNING_RATE.contains(&d.learning_rate) {
                return Err(format!(
                    "defaults.learning-rate must be 0 (the runner's default) or from 1e-8 to 10, got {}",
                    $crate::text::number(d.learning_rate)
                ));
            }
            text::name("defaults.optimizer", &d.optimizer)?;
            text::at_most("layouts", v.layouts.len(), $crate::limits::LAYOUTS)?;
            for (i, l) in v.layouts.iter().enumerate() {
                validate_layout(l, &v.hyper).map_err(|m| {
                    format!("layout #{i} ({} {}): {m}", text::escape(&l.gpu, 32), training_precision_name(l.precision))
                })?;
            }
            Ok(())
        }

        /// Hyperparameters a transformer (or a hybrid of Mamba-2, attention, MLP and MoE
        /// layers) can be built from: positive sizes under the ceilings in
        /// [`runner_contract::limits`], heads grouped evenly over kv-heads, MoE, MLA and
        /// Mamba settings that agree with each other and with the layer pattern.
        ///
        /// A non-empty `layer-pattern` places every block: it is `layers` characters of
        /// `M` (needs `mamba`), `*`, `-` (needs `ffn`) and `E` (needs `moe`), and with it
        /// `moe.dense-layers` must be 0 and `moe.layer-frequency` 1 (those place MoE blocks
        /// in a classic transformer; two placements could contradict each other). A
        /// `mamba` or `moe` that no layer of the pattern uses is refused as a likely slip.
        ///
        /// # Errors
        /// The first broken rule, naming the field and its value.
        pub fn validate_hyperparameters(h: &Hyperparameters) -> Result<(), String> {
            use $crate::limits::{EXPERTS, HEADS, LAYERS, VOCAB, WIDTH};
            use $crate::text;
            let range = $crate::workload::size;
            range("layers", h.layers, LAYERS)?;
            range("hidden", h.hidden, WIDTH)?;
            range("heads", h.heads, HEADS)?;
            range("kv-heads", h.kv_heads, HEADS)?;
            range("head-dim", h.head_dim, WIDTH)?;
            range("vocab", h.vocab, VOCAB)?;
            if !h.heads.is_multiple_of(h.kv_heads) {
                return Err(format!("heads ({}) must be a multiple of kv-heads ({})", h.heads, h.kv_heads));
            }
            if !(h.norm_eps.is_finite() && h.norm_eps > 0.0) {
                return Err(format!("norm-eps must be finite and > 0, got {}", $crate::text::number(h.norm_eps)));
            }
            if h.position == PositionScheme::Rope && !(h.rope_theta.is_finite() && h.rope_theta > 0.0) {
                return Err(format!("rope-theta must be finite and > 0, got {}", $crate::text::number(h.rope_theta)));
            }
            if h.max_position > $crate::limits::SEQ_LEN || h.attention_window > $crate::limits::SEQ_LEN {
                return Err(format!(
                    "max-position ({}) and attention-window ({}) must be at most {}",
                    h.max_position, h.attention_window, $crate::limits::SEQ_LEN
                ));
            }
            if h.mtp_depth > 16 {
                return Err(format!("mtp-depth must be at most 16, got {}", h.mtp_depth));
            }
            if h.attention == AttentionKind::Mla && h.mla.is_none() {
                return Err("attention is mla but no mla ranks are given".into());
            }
            if let Some(m) = &h.mla {
                for (what, v) in [
                    ("mla.q-lora-rank", m.q_lora_rank),
                    ("mla.kv-lora-rank", m.kv_lora_rank),
                    ("mla.qk-nope-head-dim", m.qk_nope_head_dim),
                    ("mla.qk-rope-head-dim", m.qk_rope_head_dim),
                    ("mla.v-head-dim", m.v_head_dim),
                ] {
                    if v > WIDTH {
                        return Err(format!("{what} must be at most {WIDTH}, got {v}"));
                    }
                }
                // Only the query may skip its low-rank latent (q-lora-rank 0, DeepSeek-V2-Lite);
                // every other width is an axis of the attention's tensors, and a zero axis
                // would be refused only later, in the graph, naming a tensor and not the field.
                range("mla.kv-lora-rank", m.kv_lora_rank, WIDTH)?;
                range("mla.qk-nope-head-dim", m.qk_nope_head_dim, WIDTH)?;
                range("mla.qk-rope-head-dim", m.qk_rope_head_dim, WIDTH)?;
                range("mla.v-head-dim", m.v_head_dim, WIDTH)?;
            }
            let pattern = h.layer_pattern.as_str();
            if let Some(c) = pattern.chars().find(|c| !matches!(c, 'M' | '*' | '-' | 'E')) {
                return Err(format!(
                    "layer-pattern holds {} ({}); it may hold only M (Mamba-2 mixer), * (attention), \
                     - (dense MLP) and E (mixture of experts), one per layer",
                    text::shown(c.encode_utf8(&mut [0; 4])),
                    text::escape(pattern, 64)
                ));
            }
            // Only ASCII is left: bytes are characters.
            if !pattern.is_empty() && pattern.len() != h.layers as usize {
                return Err(format!(
                    "layer-pattern has {} characters but layers is {}; give one character per layer",
                    pattern.len(),
                    h.layers
                ));
            }
            let has = |c: char| pattern.contains(c);
            match (&h.mamba, has('M')) {
                (None, true) => {
                    return Err("layer-pattern has Mamba layers (M) but no mamba sizes are given".into());
                }
                (Some(_), false) => {
                    return Err("mamba sizes are given but layer-pattern has no Mamba layer (M); drop mamba or mark its layers".into());
                }
                _ => {}
            }
            if !pattern.is_empty() {
                match &h.moe {
                    None if has('E') => {
                        return Err("layer-pattern has MoE layers (E) but no moe config is given".into());
                    }
                    Some(_) if !has('E') => {
                        return Err("moe is given but layer-pattern has no MoE layer (E); drop moe or mark its layers".into());
                    }
                    Some(m) if m.dense_layers != 0 || m.layer_frequency != 1 => {
                        return Err(format!(
                            "with a layer-pattern, the pattern places the MoE layers: moe.dense-layers must be 0 and \
                             moe.layer-frequency 1, got {} and {}",
                            m.dense_layers, m.layer_frequency
                        ));
                    }
                    _ => {}
                }
            }
            // Dense MLPs exist where the pattern has `-`, and in a hybrid model's
            // multi-token-prediction modules when it has no moe (each is one attention and
            // one MLP or MoE block); without a pattern, unless every layer is MoE.
            let needs_dense = if pattern.is_empty() {
                h.moe.as_ref().is_none_or(|m| m.dense_layers > 0 || m.layer_frequency > 1)
            } else {
                has('-') || (h.mtp_depth > 0 && h.moe.is_none())
            };
            if needs_dense {
                range("ffn", h.ffn, WIDTH).map_err(|m| {
                    if pattern.is_empty() {
                        m
                    } else if has('-') {
                        format!("{m} (layer-pattern has dense MLP layers, -)")
                    } else {
                        format!("{m} (the mtp-depth modules have a dense MLP: no moe is given)")
                    }
                })?;
            } else if h.ffn > WIDTH {
                return Err(format!("ffn must be at most {WIDTH}, got {}", h.ffn));
            }
            if let Some(m) = &h.moe {
                range("moe.experts", m.experts, EXPERTS)?;
                range("moe.expert-ffn", m.expert_ffn, WIDTH)?;
                range("moe.layer-frequency", m.layer_frequency, LAYERS)?;
                range("moe.top-k", m.top_k, m.experts)?;
                if m.shared_experts > EXPERTS {
                    return Err(format!("moe.shared-experts must be at most {EXPERTS}, got {}", m.shared_experts));
                }
                if m.shared_ffn > WIDTH {
                    return Err(format!(
                        "moe.shared-ffn must be at most {WIDTH} (0: shared experts as wide as moe.expert-ffn), got {}",
                        m.shared_ffn
                    ));
                }
                if m.dense_layers > h.layers {
                    return Err(format!("moe.dense-layers ({}) exceeds layers ({})", m.dense_layers, h.layers));
                }
                if m.latent > WIDTH {
                    return Err(format!("moe.latent must be at most {WIDTH} (0: experts at hidden width), got {}", m.latent));
                }
                // Without a pattern, MoE layers are every `layer-frequency`-th from `dense-layers`
                // on, over the main stack and the multi-token-prediction modules after it: an
                // moe that places none is the same slip the pattern rule above refuses.
                if pattern.is_empty() {
                    let first = u64::from(m.dense_layers) + u64::from(m.layer_frequency) - 1;
                    let stack = u64::from(h.layers) + u64::from(h.mtp_depth);
                    if first >= stack {
                        return Err(format!(
                            "moe is given but no layer is MoE: the first would be layer {first} (moe.dense-layers {} + \
                             moe.layer-frequency {} - 1), but there are {stack} (layers + mtp-depth); drop moe or lower \
                             dense-layers or layer-frequency",
                            m.dense_layers, m.layer_frequency
                        ));
                    }
                }
            }
            if let Some(m) = &h.mamba {
                use $crate::limits::{CONV_KERNEL, SSM_CHUNK, SSM_STATE};
                range("mamba.heads", m.heads, HEADS)?;
                range("mamba.head-dim", m.head_dim, WIDTH)?;
                range("mamba.state", m.state, SSM_STATE)?;
                range("mamba.groups", m.groups, HEADS)?;
                range("mamba.conv-kernel", m.conv_kernel, CONV_KERNEL)?;
                range("mamba.chunk", m.chunk, SSM_CHUNK)?;
                if !m.heads.is_multiple_of(m.groups) {
                    return Err(format!(
                        "mamba.groups ({}) must divide mamba.heads ({}): each group's B and C serve whole heads",
                        m.groups, m.heads
                    ));
                }
                let inner = u64::from(m.heads) * u64::from(m.head_dim);
                if inner > u64::from(WIDTH) {
                    return Err(format!(
                        "the Mamba mixer's inner width mamba.heads x mamba.head-dim = {} x {} = {inner} must be at most {WIDTH}",
                        m.heads, m.head_dim
                    ));
                }
            }
            Ok(())
        }

        /// A published layout the host could run: every parallel size at least 1, the
        /// model-parallel product dividing both ends of the GPU range, expert parallelism
        /// only over experts that exist, a global-batch rule that gives a batch.
        ///
        /// # Errors
        /// The first broken rule, naming the sizes involved.
        pub fn validate_layout(l: &ReferenceLayout, h: &Hyperparameters) -> Result<(), String> {
            use $crate::text;
            text::name("gpu", &l.gpu)?;
            text::free("source", &l.source)?;
            for (what, v) in [
                ("tp", l.tp),
                ("pp", l.pp),
                ("cp", l.cp),
                ("vp", l.vp),
                ("ep", l.ep),
                ("etp", l.etp),
                ("mbs", l.mbs),
                ("gpus-min", l.gpus_min),
            ] {
                $crate::workload::size(what, v, $crate::limits::GPUS)?;
            }
            if l.gpus_max > $crate::limits::GPUS {
                return Err(format!("gpus-max must be at most {}, got {}", $crate::limits::GPUS, l.gpus_max));
            }
            if l.gpus_min > l.gpus_max {
                return Err(format!(
                    "the GPU range {}..={} is empty: gpus-min must be at most gpus-max",
                    l.gpus_min, l.gpus_max
                ));
            }
            // Products of u32 sizes in u64 cannot overflow for three factors.
            let model_parallel = u64::from(l.tp) * u64::from(l.pp) * u64::from(l.cp);
            let expert_parallel = u64::from(l.ep) * u64::from(l.etp) * u64::from(l.pp);
            for gpus in [l.gpus_min, l.gpus_max] {
                let gpus = u64::from(gpus);
                if !gpus.is_multiple_of(model_parallel) {
                    return Err(format!(
                        "tp x pp x cp = {} x {} x {} = {model_parallel} does not divide {gpus} GPUs",
                        l.tp, l.pp, l.cp
                    ));
                }
                if !gpus.is_multiple_of(expert_parallel) {
                    return Err(format!(
                        "ep x etp x pp = {} x {} x {} = {expert_parallel} does not divide {gpus} GPUs",
                        l.ep, l.etp, l.pp
                    ));
                }
                if l.fsdp > 0 && !gpus.is_multiple_of(u64::from(l.fsdp)) {
                    return Err(format!(
                        "fsdp {} does not divide {gpus} GPUs: the FSDP group must divide both ends of the GPU range (0: no FSDP)",
                        l.fsdp
                    ));
                }
            }
            if l.vp > 1 && l.pp == 1 {
                return Err(format!("vp {} needs pipeline stages (pp is 1)", l.vp));
            }
            // Attention heads split over tp only where there are attention layers: the
            // pattern's `*`, every layer without one, and each multi-token-prediction module.
            let pattern = h.layer_pattern.as_str();
            if (pattern.is_empty() || pattern.contains('*') || h.mtp_depth > 0) && !h.heads.is_multiple_of(l.tp) {
                return Err(format!("tp {} does not divide the {} attention heads", l.tp, h.heads));
            }
            // Megatron splits a Mamba mixer by whole groups; groups divide heads, so a tp that
            // divides the groups divides the heads too.
            if let Some(m) = &h.mamba
                && pattern.contains('M')
                && !m.groups.is_multiple_of(l.tp)
            {
                return Err(format!(
                    "tp {} does not divide the {} groups of the Mamba mixer (mamba.groups; {} heads; Megatron splits whole groups)",
                    l.tp, m.groups, m.heads
                ));
            }
            match &h.moe {
                Some(m) if !m.experts.is_multiple_of(l.ep) => {
                    return Err(format!("ep {} does not divide the {} experts", l.ep, m.experts));
                }
                None if l.ep > 1 || l.etp > 1 => {
                    return Err(format!("ep {} / etp {} on a model without experts: set both to 1", l.ep, l.etp));
                }
                _ => {}
            }
            if l.seq_len > $crate::limits::SEQ_LEN {
                return Err(format!(
                    "seq-len must be at most {} (0: the variant's defaults.seq-len), got {}",
                    $crate::limits::SEQ_LEN,
                    l.seq_len
                ));
            }
            if l.recompute_layers > h.layers {
                return Err(format!(
                    "recompute-layers must be at most layers ({}), got {}",
                    h.layers, l.recompute_layers
                ));
            }
            if !(l.gbs_per_gpu.is_finite() && (0.0..=1e6).contains(&l.gbs_per_gpu)) {
                return Err(format!(
                    "gbs-per-gpu must be finite, >= 0 and at most 1e6 sequences per GPU, got {}",
                    text::number(l.gbs_per_gpu)
                ));
            }
            // Under one sequence per million GPUs (the GPU ceiling) a per-GPU rule is a slip
            // or hostile, and reports print the published rule with `{}`: 1e-300 would be
            // 301 digits on the terminal.
            if l.gbs_per_gpu > 0.0 && l.gbs_per_gpu < 1e-6 {
                return Err(format!(
                    "gbs-per-gpu must be 0 (the batch is gbs-fixed alone) or at least 1e-6 sequences per GPU, got {}",
                    text::number(l.gbs_per_gpu)
                ));
            }
            if l.gbs_per_gpu == 0.0 && l.gbs_fixed == 0 {
                return Err("the global batch rule gives no batch (gbs-per-gpu 0 and gbs-fixed 0): give either".into());
            }
            if let Some(m) = &l.measured {
                text::free("measured.source", &m.source)?;
                for (what, x) in [
                    ("measured.step-time-s", m.step_time_s),
                    ("measured.tokens-per-s-per-gpu", m.tokens_per_s_per_gpu),
                    ("measured.model-tflops-per-gpu", m.model_tflops_per_gpu),
                ] {
                    if !(x.is_finite() && x >= 0.0) {
                        return Err(format!("{what} must be finite and >= 0, got {}", $crate::text::number(x)));
                    }
                }
                $crate::workload::size("measured.gpus", m.gpus, $crate::limits::GPUS)?;
            }
            Ok(())
        }

        /// The typed precision of a layout from the name a recipe gives it (`BF16`, `FP8`,
        /// `FP8-CS`, `mxfp8`, ...), case-insensitive; `None` for an unknown name.
        pub fn training_precision(name: &str) -> Option<TrainingPrecision> {
            let n = name.trim().to_ascii_lowercase().replace('_', "-");
            Some(match n.as_str() {
                "bf16" => TrainingPrecision::Bf16,
                "fp16" => TrainingPrecision::Fp16,
                "fp8" => TrainingPrecision::Fp8,
                "fp8-delayed" | "fp8-ds" => TrainingPrecision::Fp8Delayed,
                "fp8-current" | "fp8-cs" => TrainingPrecision::Fp8Current,
                "fp8-blockwise" | "fp8-block" | "fp8-bs" => TrainingPrecision::Fp8Blockwise,
                "mxfp8" | "fp8-mx" => TrainingPrecision::Mxfp8,
                "nvfp4" => TrainingPrecision::Nvfp4,
                _ => return None,
            })
        }

        /// How reports print a layout's precision.
        pub fn training_precision_name(p: TrainingPrecision) -> &'static str {
            match p {
                TrainingPrecision::Bf16 => "BF16",
                TrainingPrecision::Fp16 => "FP16",
                TrainingPrecision::Fp8 => "FP8",
                TrainingPrecision::Fp8Delayed => "FP8-DS",
                TrainingPrecision::Fp8Current => "FP8-CS",
                TrainingPrecision::Fp8Blockwise => "FP8-BS",
                TrainingPrecision::Mxfp8 => "MXFP8",
                TrainingPrecision::Nvfp4 => "NVFP4",
            }
        }
    };
}
