//! The precision contract's rules: what a plan and a step's actions may say, the one
//! map from the contract's number formats to their names, and the one way a layer is
//! named in words ([`layer_name`], [`layers_named`]), which policies' alerts and the
//! host's decisions table share.

/// A layer as alerts and the decisions table name it. Layer -1 holds what lies outside the
/// transformer layers (wit/workload.wit: "-1 for embedding, head and loss"; `runner train`
/// puts there the embedding, the final norm and the head, as GEMM site and gradient
/// norm): "layers [-1, 0, ...]" read as a bug, so it is named in words. Only -1 is: a
/// selector's layer -7 is no layer, and says so.
pub fn layer_name(l: i32) -> String {
    match l {
        -1 => "the embedding/head".to_string(),
        ..-1 => format!("layer {l} (no such layer)"),
        _ => format!("layer {l}"),
    }
}

/// Layers in words: "layers [0, 2]", "the embedding/head", or "the embedding/head and
/// layers [0, 2]" ([`layer_name`]); empty for none. Layers below -1 stay in the list and
/// are said to be none: "layers [1000000, -7] (no layer -7)".
pub fn layers_named(layers: &[i32]) -> String {
    let inside: Vec<i32> = layers.iter().copied().filter(|l| *l != -1).collect();
    let outside = (layers.len() > inside.len()).then(|| layer_name(-1));
    let none: Vec<String> = inside.iter().filter(|l| **l < -1).map(i32::to_string).collect();
    let inside = (!inside.is_empty()).then(|| match none.len() {
        0 => format!("layers {inside:?}"),
        1 => format!("layers {inside:?} (no layer {})", none[0]),
        _ => format!("layers {inside:?} (no layers {})", none.join(", ")),
    });
    match (outside, inside) {
        (Some(o), Some(i)) => format!("{o} and {i}"),
        (Some(o), None) => o,
        (None, Some(i)) => i,
        (None, None) => String::new(),
    }
}

/// Expand the precision rules in a module that has the generated precision-policy types
/// and `Dtype` in scope. Defines `dtype_name`, `is_low_precision`, `validate_plan`,
/// `validate_operand`, `validate_step`, `selects` (what a site selector picks: the host
/// applies actions with the rule policies test against) and the unscaled plans.
#[macro_export]
macro_rules! precision_rules {
    () => {
        /// The contract's name of a number format (`fp8-e4m3`), as every output prints it.
        pub fn dtype_name(d: Dtype) -> &'static str {
            match d {
                Dtype::Fp32 => "fp32",
                Dtype::Bf16 => "bf16",
                Dtype::Fp16 => "fp16",
                Dtype::Fp8E4m3 => "fp8-e4m3",
                Dtype::Fp8E5m2 => "fp8-e5m2",
                Dtype::Mxfp8 => "mxfp8",
                Dtype::Nvfp4 => "nvfp4",
                Dtype::Int32 => "int32",
            }
        }

        /// An operand kept in `format` with no scaling (BF16 or FP32 training).
        pub fn unscaled_operand(format: Dtype) -> OperandPlan {
            OperandPlan {
                format,
                recipe: ScalingRecipe::None,
                block: BlockShape { rows: 0, cols: 0 },
                scale_format: ScaleFormat::Fp32,
                scale_rounding: ScaleRounding::Exact,
                tensor_scale: None,
                value_rounding: ValueRounding::NearestEven,
                amax_history: 0,
                amax_reduction: AmaxReduction::MostRecent,
                margin: 0,
                saturate: true,
                hadamard: 0,
            }
        }

        /// A plan that keeps a site in `format` with no scaling (BF16 or FP32 training):
        /// every operand and the output.
        pub fn unscaled(format: Dtype) -> SitePlan {
            let operand = unscaled_operand(format);
            SitePlan { activation: operand, weight: operand, gradient: operand, output: format }
        }

        /// Does `selector` pick `site`? Empty selector lists match anything; name
        /// patterns are globs where `*` matches any run of characters.
        pub fn selects(selector: &SiteSelector, site: &GemmSite) -> bool {
            (selector.layers.is_empty() || selector.layers.contains(&site.layer))
                && (selector.roles.is_empty() || selector.roles.contains(&site.role))
                && (selector.names.is_empty() || selector.names.iter().any(|p| $crate::text::glob(p, &site.name)))
        }

        /// FP8 and FP4 formats: the ones that need a scale.
        pub fn is_low_precision(d: Dtype) -> bool {
            matches!(d, Dtype::Fp8E4m3 | Dtype::Fp8E5m2 | Dtype::Mxfp8 | Dtype::Nvfp4)
        }

        /// One operand's plan: a floating-point format, scaled exactly when it is FP8 or
        /// FP4, with blocks, scale formats and recipe parameters that go together (MXFP8:
        /// 32-element blocks with E8M0 scales; NVFP4: 16-element blocks with E4M3 scales
        /// under an FP32 tensor scale).
        ///
        /// # Errors
        /// The first broken rule, naming the setting.
        pub fn validate_operand(p: &OperandPlan) -> Result<(), String> {
            let f = dtype_name(p.format);
            let (rows, cols) = (p.block.rows, p.block.cols);
            if p.format == Dtype::Int32 {
                return Err("int32 is not a GEMM operand format (integer GEMMs are not training formats)".into());
            }
            if !is_low_precision(p.format) {
                if p.recipe != ScalingRecipe::None || rows != 0 || cols != 0 || p.tensor_scale.is_some() || p.hadamard != 0 {
                    return Err(format!("{f} is not scaled: recipe none, no blocks, no tensor scale, no Hadamard transform"));
                }
                return Ok(());
            }
            if p.recipe == ScalingRecipe::None {
                return Err(format!("{f} needs a scaling recipe (delayed, current or block)"));
            }
            if (rows == 0) != (cols == 0) || rows > 4096 || cols > 4096 {
                return Err(format!("block {rows}x{cols}: both sides are 0 (per tensor) or both in 1..=4096"));
            }
            let per_tensor = rows == 0;
            match (p.recipe, per_tensor) {
                (ScalingRecipe::Block, true) => return Err(format!("the block recipe needs a block shape, got {rows}x{cols}")),
                (ScalingRecipe::Delayed | ScalingRecipe::Current, false) => {
                    return Err(format!("{:?} scaling is per tensor; block {rows}x{cols} needs the block recipe", p.recipe));
                }
                _ => {}
            }
            let elements = u64::from(rows) * u64::from(cols);
            match p.format {
                Dtype::Mxfp8 if !(elements == 32 && (rows == 1 || cols == 1) && p.scale_format == ScaleFormat::E8m0) => {
                    return Err(format!("mxfp8 uses 1x32 blocks with e8m0 scales, got {rows}x{cols} with {:?}", p.scale_format));
                }
                Dtype::Nvfp4
                    if !((elements == 16 && (rows == 1 || cols == 1)) || (rows == 16 && cols == 16))
                        || p.scale_format != ScaleFormat::E4m3
                        || p.tensor_scale != Some(ScaleFormat::Fp32) =>
                {
                    return Err(format!(
                        "nvfp4 uses 1x16 (or 16x16 weight) blocks with e4m3 scales under an fp32 tensor scale, \
                         got {rows}x{cols} with {:?} and tensor scale {:?}",
                        p.scale_format, p.tensor_scale
                    ));
                }
                _ => {}
            }
            if p.scale_format == ScaleFormat::E8m0 && p.scale_rounding == ScaleRounding::Exact {
                return Err("e8m0 scales are powers of two: scale-rounding must round to one".into());
            }
            if p.recipe == ScalingRecipe::Delayed && !(1..=65_536).contains(&p.amax_history) {
                return Err(format!("delayed scaling needs an amax history of 1..=65536, got {}", p.amax_history));
            }
            if p.amax_history > 65_536 {
                return Err(format!("amax-history {} is larger than 65536", p.amax_history));
            }
            if !(-64..=64).contains(&p.margin) {
                return Err(format!("margin {} is outside -64..=64", p.margin));
            }
            if p.hadamard != 0 && !(p.hadamard.is_power_of_two() && p.hadamard <= 256) {
                return Err(format!("hadamard size {} is not 0 or a power of two up to 256", p.hadamard));
            }
            Ok(())
        }

        /// One plan per site, in order; each operand valid and runnable on the device
        /// (native or emulated there); no GEMM with both operands in 2-D blocks (a layout
        /// no kernel offers: Transformer Engine refuses it).
        ///
        /// # Errors
        /// The first broken rule, naming the site, role and operand.
        pub fn validate_plan(request: &PlanRequest, r: &PlanResponse) -> Result<(), String> {
            if r.sites.len() != request.sites.len() {
                return Err(format!("{} sites were asked for but {} plans came back", request.sites.len(), r.sites.len()));
            }
            $crate::text::at_most("bytes of state", r.state.len(), $crate::limits::STATE_BYTES)?;
            let dev = &request.device;
            for (site, plan) in request.sites.iter().zip(&r.sites) {
                let ctx = |m: String| format!("site {} ({:?}): {m}", $crate::text::shown(&site.name), site.role);
                let operands = [
                    ("activation", &plan.activation),
                    ("weight", &plan.weight),
                    ("gradient", &plan.gradient),
                ];
                for (what, op) in operands {
                    validate_operand(op).map_err(|m| ctx(format!("{what}: {m}")))?;
                    let f = op.format;
                    if f != Dtype::Fp32 && !dev.native_formats.contains(&f) && !dev.emulated_formats.contains(&f) {
                        return Err(ctx(format!(
                            "{what}: {} is neither native nor emulated on {} (compute capability {})",
                            dtype_name(f),
                            $crate::text::escape(&dev.name, 32),
                            dev.compute_capability
                        )));
                    }
                }
                if plan.output == Dtype::Int32 {
                    return Err(ctx("the output format int32 is not a GEMM result format".into()));
                }
                let read = match site.role {
                    GemmRole::Forward => [&plan.activation, &plan.weight],
                    GemmRole::InputGradient => [&plan.gradient, &plan.weight],
                    GemmRole::WeightGradient => [&plan.gradient, &plan.activation],
                };
                if read.iter().all(|o| o.block.rows > 1 && o.block.cols > 1) {
                    return Err(ctx("both operands use 2-D blocks; one of them must be 1-D (e.g. 1x128 by 128x128)".into()));
                }
            }
            Ok(())
        }

        /// Actions a host can carry out: bounded in number and size, rollbacks that move
        /// back, fallbacks to an unscaled floating-point format (fp32, bf16, fp16),
        /// re-promotions to a low-precision one.
        ///
        /// # Errors
        /// The first broken rule, naming the action.
        pub fn validate_step(r: &StepResponse) -> Result<(), String> {
            use $crate::text;
            text::at_most("bytes of state", r.state.len(), $crate::limits::STATE_BYTES)?;
            text::at_most("actions in one step", r.actions.len(), $crate::limits::ACTIONS)?;
            let selector = |s: &SiteSelector| -> Result<(), String> {
                text::at_most("selector layers", s.layers.len(), $crate::limits::SELECTOR)?;
                text::at_most("selector names", s.names.len(), $crate::limits::SELECTOR)?;
                text::at_most("selector roles", s.roles.len(), 3 * $crate::limits::SELECTOR)?;
                s.names.iter().try_for_each(|n| text::name("a selector pattern", n))
            };
            // A fallback's sites get every operand in `to` with no scale, which only a
            // 16/32-bit float can run: an FP8/FP4 target used to pass here and stop the run
            // later, when the executor refused the unscaled plan.
            let float = |d: Dtype| -> Result<(), String> {
                if d == Dtype::Int32 {
                    Err("int32 is not a format to run GEMMs in".into())
                } else if is_low_precision(d) {
                    Err(format!(
                        "a fallback to {}, which needs a scaling recipe: fall back to fp32, bf16 or fp16 (re-planning gives \
                         other low-precision recipes)",
                        dtype_name(d)
                    ))
                } else {
                    Ok(())
                }
            };
            for a in &r.actions {
                match a {
                    Action::Fallback(f) => {
                        selector(&f.sites)?;
                        float(f.to)?;
                    }
                    Action::FallbackGlobal(f) => float(f.to)?,
                    Action::ChangeRecipe(c) => {
                        selector(&c.sites)?;
                        if !(-64..=64).contains(&c.margin) || c.amax_history > 65_536 {
                            return Err(format!("recipe change with margin {} / amax-history {}", c.margin, c.amax_history));
                        }
                    }
                    Action::Rollback(rb) if rb.steps == 0 => return Err("rollback of 0 steps".into()),
                    Action::Repromote(p) => {
                        selector(&p.sites)?;
                        if !is_low_precision(p.to) {
                            return Err(format!("re-promotion to {}, which is not a low-precision format", dtype_name(p.to)));
                        }
                    }
                    Action::ResetAmax(s) => selector(s)?,
                    Action::Abort(m) | Action::Alert(m) => text::free("a message", m)?,
                    Action::Rollback(_) | Action::SkipStep | Action::Replan | Action::CheckpointNow => {}
                }
            }
            Ok(())
        }
    };
}
