//! Site plans of the published recipes, so a policy plugin states its recipe in a line.
//!
//! Transformer Engine's recipes (`transformer_engine/common/recipe/__init__.py`, and its
//! docs' low-precision training pages): only the linears inside the transformer layers
//! run in low precision, MoE expert linears (grouped GEMMs) included; the embedding, the
//! output head and MoE routers stay BF16 (DeepSeek-V3 report §3.3). Forward and input-gradient results are BF16, weight
//! gradients FP32 (Megatron's `main_grad`).
//!
//! Blocks follow each GEMM's reduction axis, since a scale must be constant along the
//! dot products it multiplies: forward `Y = X Wᵀ` reduces over the columns of X (m, k)
//! and W (n, k); input gradient `dX = dY W` over the columns of dY (m, n) and the rows of
//! W; weight gradient `dW = dYᵀ X` over the rows of dY and X. So a 1x32 MXFP8 block of X
//! in the forward is a 32x1 block in the weight gradient (TE quantises both copies from
//! the high-precision tensor).

use super::*;

/// Delayed scaling with Transformer Engine's defaults: amax history 1024, reduced by
/// max, margin 0, saturating casts.
pub fn delayed(format: Dtype) -> OperandPlan {
    OperandPlan {
        recipe: ScalingRecipe::Delayed,
        amax_history: 1024,
        amax_reduction: AmaxReduction::Max,
        ..unscaled_operand(format)
    }
}

/// Current (per-tensor, this tensor's own amax) scaling.
pub fn current(format: Dtype) -> OperandPlan {
    OperandPlan { recipe: ScalingRecipe::Current, ..unscaled_operand(format) }
}

/// Block scaling: `rows x cols` blocks with scales of `scale_format`, `rounding`.
pub fn blocks(format: Dtype, rows: u32, cols: u32, scale_format: ScaleFormat, rounding: ScaleRounding) -> OperandPlan {
    OperandPlan {
        recipe: ScalingRecipe::Block,
        block: BlockShape { rows, cols },
        scale_format,
        scale_rounding: rounding,
        ..unscaled_operand(format)
    }
}

/// The result formats: BF16, FP32 for weight gradients.
fn output(role: GemmRole) -> Dtype {
    if role == GemmRole::WeightGradient { Dtype::Fp32 } else { Dtype::Bf16 }
}

/// HYBRID FP8 (E4M3 activations and weights, E5M2 gradients) with per-tensor scaling
/// `scaled` (e.g. [`delayed`] or [`current`]).
pub fn hybrid(site: &GemmSite, scaled: fn(Dtype) -> OperandPlan) -> SitePlan {
    SitePlan {
        activation: scaled(Dtype::Fp8E4m3),
        weight: scaled(Dtype::Fp8E4m3),
        gradient: scaled(Dtype::Fp8E5m2),
        output: output(site.role),
    }
}

/// A 1-D block of `len` along the reduction axis of `site`'s GEMM, for an operand stored
/// (rows, cols): the weight-gradient GEMM reduces over rows, the others over the columns
/// of the activation and gradient. `weight`: the weight, which the input-gradient GEMM
/// reduces over rows.
fn along_reduction(site: &GemmSite, weight: bool, len: u32) -> (u32, u32) {
    let rows = match site.role {
        GemmRole::Forward => false,
        GemmRole::InputGradient => weight,
        GemmRole::WeightGradient => true,
    };
    if rows { (len, 1) } else { (1, len) }
}

/// MXFP8: E4M3 elements in 32-element blocks along the reduction axis, E8M0 scales
/// rounded up to a power of two (RCEIL, as cuBLAS and TE do).
pub fn mxfp8(site: &GemmSite) -> SitePlan {
    let op = |weight| {
        let (r, c) = along_reduction(site, weight, 32);
        blocks(Dtype::Mxfp8, r, c, ScaleFormat::E8m0, ScaleRounding::PowerOfTwoUp)
    };
    SitePlan { activation: op(false), weight: op(true), gradient: op(false), output: output(site.role) }
}

/// DeepSeek-V3's blockwise FP8 (TE's Float8BlockScaling): E4M3, 1x128 blocks of
/// activations and gradients along the reduction axis, 128x128 weight tiles, FP32 scales
/// rounded to powers of two (never overflowing).
pub fn blockwise(site: &GemmSite) -> SitePlan {
    let one_d = || {
        let (r, c) = along_reduction(site, false, 128);
        blocks(Dtype::Fp8E4m3, r, c, ScaleFormat::Fp32, ScaleRounding::PowerOfTwoUp)
    };
    SitePlan {
        activation: one_d(),
        weight: blocks(Dtype::Fp8E4m3, 128, 128, ScaleFormat::Fp32, ScaleRounding::PowerOfTwoUp),
        gradient: one_d(),
        output: output(site.role),
    }
}

/// NVFP4 (NVIDIA, "Pretraining LLMs with NVFP4", arXiv 2509.25149; TE's
/// NVFP4BlockScaling): E2M1 values in 16-element blocks with E4M3 scales under an FP32
/// tensor scale; 16x16 weight tiles; stochastic rounding of gradients; a 16-point random
/// Hadamard transform on both inputs of the weight-gradient GEMM.
pub fn nvfp4(site: &GemmSite) -> SitePlan {
    let op = |rows, cols| OperandPlan {
        tensor_scale: Some(ScaleFormat::Fp32),
        ..blocks(Dtype::Nvfp4, rows, cols, ScaleFormat::E4m3, ScaleRounding::Exact)
    };
    let (r, c) = along_reduction(site, false, 16);
    let rht = if site.role == GemmRole::WeightGradient { 16 } else { 0 };
    SitePlan {
        activation: OperandPlan { hadamard: rht, ..op(r, c) },
        weight: op(16, 16),
        gradient: OperandPlan { hadamard: rht, value_rounding: ValueRounding::Stochastic, ..op(r, c) },
        output: output(site.role),
    }
}

/// Whether `site` is one a recipe leaves in BF16 by default: outside the transformer
/// layers (embedding, head: layer -1) or a MoE router.
pub fn kept_high(site: &GemmSite) -> bool {
    site.layer < 0 || site.name.contains("router")
}

/// Whether `device` runs (natively or emulated) every format `plan` uses.
pub fn runs(device: &DeviceCapabilities, plan: &SitePlan) -> bool {
    [plan.activation.format, plan.weight.format, plan.gradient.format]
        .iter()
        .all(|f| *f == Dtype::Fp32 || device.native_formats.contains(f) || device.emulated_formats.contains(f))
}

/// Plan every site with `low` except those [`kept_high`] or picked by `high`, which get
/// BF16; refuse (naming the device) when the device cannot run `low`.
///
/// # Errors
/// The device runs neither natively nor emulated a format `low` plans.
pub fn plan_with(
    request: &PlanRequest,
    recipe: &str,
    low: impl Fn(&GemmSite) -> SitePlan,
    high: impl Fn(&GemmSite) -> bool,
) -> Result<Vec<SitePlan>, String> {
    let mut out = Vec::with_capacity(request.sites.len());
    for site in &request.sites {
        if kept_high(site) || high(site) {
            out.push(SitePlan { output: output(site.role), ..unscaled(Dtype::Bf16) });
            continue;
        }
        let p = low(site);
        if !runs(&request.device, &p) {
            return Err(format!(
                "{recipe} plans formats that {} (compute capability {}) neither runs nor emulates; use a recipe its \
                 tensor cores run (e.g. fp8 on Hopper, mxfp8 or nvfp4 on Blackwell)",
                request.device.name, request.device.compute_capability
            ));
        }
        out.push(p);
    }
    Ok(out)
}

/// A plan request over a small dense model of `layers` transformer layers (four linears
/// each, plus the head at layer -1, three roles each) on `device` ("cpu", "H100",
/// "B200"): what policy plugins' unit tests plan against.
pub fn sample_request(device: &str, layers: u32) -> PlanRequest {
    use Dtype::*;
    let high = vec![Fp32, Bf16, Fp16];
    let (cc, native, emulated) = match device {
        "cpu" => (0, vec![Fp32], vec![Bf16, Fp16, Fp8E4m3, Fp8E5m2, Mxfp8, Nvfp4]),
        "H100" => (90, [high, vec![Fp8E4m3, Fp8E5m2]].concat(), vec![]),
        _ => (100, [high, vec![Fp8E4m3, Fp8E5m2, Mxfp8, Nvfp4]].concat(), vec![]),
    };
    let mut sites = Vec::new();
    let linears = ["attn.qkv", "attn.out", "mlp.up", "mlp.down"];
    let mut add = |layer: i32, name: String| {
        for role in [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient] {
            sites.push(GemmSite { layer, name: name.clone(), role, m: 2048, n: 512, k: 256 });
        }
    };
    for l in 0..layers as i32 {
        for n in linears {
            add(l, format!("layers.{l}.{n}"));
        }
    }
    add(-1, "lm_head".into());
    PlanRequest {
        model: "sample".into(),
        layers,
        device: DeviceCapabilities { name: device.into(), compute_capability: cc, native_formats: native, emulated_formats: emulated },
        sites,
        state: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(layer: i32, role: GemmRole) -> GemmSite {
        GemmSite { layer, name: format!("layers.{layer}.mlp.up"), role, m: 4096, n: 1024, k: 512 }
    }

    fn request(device: &str) -> PlanRequest {
        let (native, cc) = match device {
            "H100" => (vec![Dtype::Fp32, Dtype::Bf16, Dtype::Fp16, Dtype::Fp8E4m3, Dtype::Fp8E5m2], 90),
            _ => (vec![Dtype::Fp32, Dtype::Bf16, Dtype::Fp16, Dtype::Fp8E4m3, Dtype::Fp8E5m2, Dtype::Mxfp8, Dtype::Nvfp4], 100),
        };
        let sites = [-1, 0, 1]
            .into_iter()
            .flat_map(|l| [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient].map(move |r| site(l, r)))
            .collect();
        PlanRequest {
            model: "m".into(),
            layers: 2,
            device: DeviceCapabilities { name: device.into(), compute_capability: cc, native_formats: native, emulated_formats: vec![] },
            sites,
            state: vec![],
        }
    }

    type Recipe = fn(&GemmSite) -> SitePlan;
    const RECIPES: [(&str, Recipe); 5] = [
        ("delayed", |s| hybrid(s, delayed)),
        ("current", |s| hybrid(s, current)),
        ("mxfp8", mxfp8),
        ("blockwise", blockwise),
        ("nvfp4", nvfp4),
    ];

    /// Every recipe passes the host's rules on a device that runs it, keeps layer -1 in
    /// BF16, and puts its blocks along each GEMM's reduction axis.
    #[test]
    fn recipes_pass_the_contract_rules() {
        let req = request("B200");
        for (name, f) in RECIPES {
            let sites = plan_with(&req, name, f, |_| false).unwrap();
            validate_plan(&req, &PlanResponse { sites: sites.clone(), state: vec![] }).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (s, p) in req.sites.iter().zip(&sites) {
                let low = is_low_precision(p.activation.format);
                assert_eq!(low, s.layer >= 0, "{name} {s:?}");
                assert_eq!(p.output, if s.role == GemmRole::WeightGradient { Dtype::Fp32 } else { Dtype::Bf16 });
            }
        }
        let wgrad = site(0, GemmRole::WeightGradient);
        let shape = |b: BlockShape| (b.rows, b.cols);
        assert_eq!(shape(mxfp8(&wgrad).activation.block), (32, 1));
        assert_eq!(shape(mxfp8(&site(0, GemmRole::Forward)).activation.block), (1, 32));
        assert_eq!(shape(mxfp8(&site(0, GemmRole::InputGradient)).weight.block), (32, 1));
        assert_eq!(shape(mxfp8(&site(0, GemmRole::InputGradient)).gradient.block), (1, 32));
        assert_eq!(nvfp4(&wgrad).gradient.hadamard, 16);
        assert_eq!(nvfp4(&wgrad).gradient.value_rounding, ValueRounding::Stochastic);
        assert_eq!(hybrid(&wgrad, delayed).gradient.format, Dtype::Fp8E5m2);
    }

    /// A MoE layer: the expert linears (grouped GEMMs, one per expert) run in every
    /// recipe's low precision like the layer's other linears, as Transformer Engine runs
    /// expert GEMMs; the router stays BF16.
    #[test]
    fn expert_linears_run_low_and_routers_stay_high() {
        let mut req = request("B200");
        let names = ["layers.0.moe.router_logits", "layers.0.moe.experts.gate", "layers.0.moe.experts.down"];
        req.sites = names
            .into_iter()
            .flat_map(|n| {
                [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient]
                    .map(|role| GemmSite { layer: 0, name: n.into(), role, m: 8192, n: 1024, k: 512 })
            })
            .collect();
        for (name, f) in RECIPES {
            let sites = plan_with(&req, name, f, |_| false).unwrap();
            for (s, p) in req.sites.iter().zip(&sites) {
                assert_eq!(is_low_precision(p.activation.format), !s.name.contains("router"), "{name} {s:?}");
            }
        }
    }

    #[test]
    fn a_device_without_the_format_is_refused_by_name() {
        let e = plan_with(&request("H100"), "nvfp4", nvfp4, |_| false).unwrap_err();
        assert!(e.contains("H100") && e.contains("compute capability 90"), "{e}");
        assert!(plan_with(&request("H100"), "fp8", |s| hybrid(s, delayed), |_| false).is_ok());
    }

    /// Each recipe's operands as its library states them, role by role: delayed scaling
    /// keeps TE's 1024-step history reduced by max; HYBRID is E4M3 for activations and
    /// weights; blockwise FP8 is 1x128 activation and gradient blocks along the reduction
    /// axis and 128x128 weight tiles, all with power-of-two scales; NVFP4 has 16x16 weight
    /// tiles whatever the role, and its Hadamard transform is on the weight-gradient GEMM's
    /// two inputs only (never on the weight).
    #[test]
    fn recipe_operands_per_role() {
        let d = delayed(Dtype::Fp8E4m3);
        assert_eq!((d.amax_history, d.amax_reduction, d.recipe), (1024, AmaxReduction::Max, ScalingRecipe::Delayed));
        let shape = |b: BlockShape| (b.rows, b.cols);
        for role in [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient] {
            let s = site(0, role);
            let h = hybrid(&s, current);
            assert_eq!((h.activation.format, h.weight.format, h.gradient.format), (Dtype::Fp8E4m3, Dtype::Fp8E4m3, Dtype::Fp8E5m2));
            let b = blockwise(&s);
            let one_d = if role == GemmRole::WeightGradient { (128, 1) } else { (1, 128) };
            assert_eq!((shape(b.activation.block), shape(b.gradient.block), shape(b.weight.block)), (one_d, one_d, (128, 128)), "{role:?}");
            for o in [b.activation, b.weight, b.gradient] {
                assert_eq!((o.scale_format, o.scale_rounding), (ScaleFormat::Fp32, ScaleRounding::PowerOfTwoUp), "{role:?}");
            }
            let n = nvfp4(&s);
            let rht = if role == GemmRole::WeightGradient { 16 } else { 0 };
            assert_eq!((n.activation.hadamard, n.gradient.hadamard, n.weight.hadamard), (rht, rht, 0), "{role:?}");
            assert_eq!(shape(n.weight.block), (16, 16), "{role:?}");
        }
    }

    /// A device that runs a plan runs each of its three operands' formats (a weight in
    /// MXFP8 on Hopper is not run), and counts emulated formats as run; the sample request
    /// carries the head (layer -1) beside four linears per layer, three roles each.
    #[test]
    fn runs_checks_every_operand_and_the_sample_has_the_head() {
        let hopper = request("H100").device;
        let mut p = hybrid(&site(0, GemmRole::Forward), delayed);
        assert!(runs(&hopper, &p));
        p.weight = blocks(Dtype::Mxfp8, 1, 32, ScaleFormat::E8m0, ScaleRounding::PowerOfTwoUp);
        assert!(!runs(&hopper, &p));
        let emulating = DeviceCapabilities { native_formats: vec![Dtype::Fp32], emulated_formats: vec![Dtype::Mxfp8], ..hopper };
        assert!(runs(&emulating, &mxfp8(&site(0, GemmRole::Forward))));
        let sample = sample_request("H100", 2);
        assert_eq!(sample.sites.len(), 3 * (2 * 4 + 1));
        assert_eq!(sample.sites.iter().filter(|s| s.layer == -1 && s.name == "lm_head").count(), 3);
        assert!(!sample.device.native_formats.contains(&Dtype::Mxfp8));
        assert!(sample_request("cpu", 1).device.emulated_formats.contains(&Dtype::Nvfp4));
        // The caller's `high` keeps a site BF16 too.
        let kept = plan_with(&request("B200"), "fp8", |s| hybrid(s, delayed), |s| s.layer == 1).unwrap();
        assert!(request("B200").sites.iter().zip(&kept).all(|(s, p)| is_low_precision(p.activation.format) == (s.layer == 0)));
    }
}
