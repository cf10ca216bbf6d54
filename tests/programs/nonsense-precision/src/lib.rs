//! Test program: a precision policy whose `plan` answers one nonsense plan per call, in
//! this order: an int32 GEMM operand, MXFP8 in 1x128 blocks, NVFP4 without its FP32 tensor
//! scale, both operands of a GEMM in 2-D blocks, E8M0 scales that are not powers of two,
//! NVFP4 on a device that has none, one plan too few, blocks of 0x16 and of
//! 4294967295x4294967295, delayed scaling without an amax history; then sound FP8 plans. Its `on-step`
//! answers a rollback of zero steps, a re-promotion to BF16, a fallback to int32,
//! 100,000 actions, a fallback to FP8 and a global one to NVFP4 (formats that need a
//! scale the fallback cannot give), then nothing. Its `name` is honest on the first call,
//! then sets the terminal's title, then is 5,000 bytes long, then honest again.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::sync::atomic::{AtomicU32, Ordering};

use runner_plugin_sdk::precision::*;

struct Nonsense;

static PLANS: AtomicU32 = AtomicU32::new(0);
static STEPS: AtomicU32 = AtomicU32::new(0);
static NAMES: AtomicU32 = AtomicU32::new(0);

fn scaled(format: Dtype, recipe: ScalingRecipe, rows: u32, cols: u32, scale: ScaleFormat) -> OperandPlan {
    OperandPlan {
        format,
        recipe,
        block: BlockShape { rows, cols },
        scale_format: scale,
        scale_rounding: if scale == ScaleFormat::E8m0 { ScaleRounding::PowerOfTwoUp } else { ScaleRounding::Exact },
        amax_history: if recipe == ScalingRecipe::Delayed { 1024 } else { 0 },
        ..unscaled_operand(format)
    }
}

fn fp8() -> SitePlan {
    SitePlan {
        activation: scaled(Dtype::Fp8E4m3, ScalingRecipe::Delayed, 0, 0, ScaleFormat::Fp32),
        weight: scaled(Dtype::Fp8E4m3, ScalingRecipe::Delayed, 0, 0, ScaleFormat::Fp32),
        gradient: scaled(Dtype::Fp8E5m2, ScalingRecipe::Delayed, 0, 0, ScaleFormat::Fp32),
        output: Dtype::Bf16,
    }
}

impl Guest for Nonsense {
    fn name() -> String {
        match NAMES.fetch_add(1, Ordering::Relaxed) {
            1 => "\u{1b}]0;pwned\u{7}nonsense".into(),
            2 => "n".repeat(5000),
            _ => "nonsense: a different wrong plan on every call".into(),
        }
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let mut plan = fp8();
        let mut count = request.sites.len();
        match PLANS.fetch_add(1, Ordering::Relaxed) {
            0 => plan.weight.format = Dtype::Int32,
            1 => plan.activation = scaled(Dtype::Mxfp8, ScalingRecipe::Block, 1, 128, ScaleFormat::E8m0),
            2 => {
                plan.weight = OperandPlan {
                    tensor_scale: None,
                    ..scaled(Dtype::Nvfp4, ScalingRecipe::Block, 1, 16, ScaleFormat::E4m3)
                }
            }
            3 => {
                plan.activation = scaled(Dtype::Fp8E4m3, ScalingRecipe::Block, 128, 128, ScaleFormat::Fp32);
                plan.weight = scaled(Dtype::Fp8E4m3, ScalingRecipe::Block, 128, 128, ScaleFormat::Fp32);
            }
            4 => {
                plan.activation = OperandPlan {
                    scale_rounding: ScaleRounding::Exact,
                    ..scaled(Dtype::Fp8E4m3, ScalingRecipe::Block, 1, 32, ScaleFormat::E8m0)
                }
            }
            5 => {
                plan.weight = OperandPlan {
                    tensor_scale: Some(ScaleFormat::Fp32),
                    ..scaled(Dtype::Nvfp4, ScalingRecipe::Block, 1, 16, ScaleFormat::E4m3)
                }
            }
            6 => count = count.saturating_sub(1),
            7 => plan.activation = scaled(Dtype::Fp8E4m3, ScalingRecipe::Block, 0, 16, ScaleFormat::Fp32),
            8 => plan.weight = scaled(Dtype::Fp8E4m3, ScalingRecipe::Block, u32::MAX, u32::MAX, ScaleFormat::Fp32),
            9 => plan.gradient.amax_history = 0,
            _ => {}
        }
        Ok(PlanResponse { sites: vec![plan; count], state: request.state })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        let any = SiteSelector { layers: Vec::new(), names: Vec::new(), roles: Vec::new() };
        let actions = match STEPS.fetch_add(1, Ordering::Relaxed) {
            0 => vec![Action::Rollback(Rollback { steps: 0, skip_batches: 0 })],
            1 => vec![Action::Repromote(Repromotion { sites: any, to: Dtype::Bf16 })],
            2 => vec![Action::Fallback(Fallback { sites: any, scope: FallbackScope::AllGemms, to: Dtype::Int32 })],
            3 => vec![Action::SkipStep; 100_000],
            4 => vec![Action::Fallback(Fallback { sites: any, scope: FallbackScope::AllGemms, to: Dtype::Fp8E4m3 })],
            5 => vec![Action::FallbackGlobal(GlobalFallback { scope: FallbackScope::BackwardOnly, to: Dtype::Nvfp4 })],
            _ => Vec::new(),
        };
        Ok(StepResponse { actions, state: metrics.state })
    }
}

runner_plugin_sdk::export_precision!(Nonsense);
