//! Precision as the projection sees it: which format each GEMM of the graph runs in, per
//! role (forward, input gradient, weight gradient), and what its scaling recipe costs in
//! casts. A [`Plan`] comes from a precision plugin's answer ([`Plan::from_sites`]) or, for
//! a precision named on the command line with no plugin of that name installed, from the
//! built-in plan of that name ([`Plan::builtin`], said so in [`Plan::source`]).
//!
//! Built-in plans follow Transformer Engine and Megatron defaults (TE's docs: only Linear
//! GEMMs run in low precision; attention, norms, softmax, the loss stay high precision):
//! every linear inside the transformer layers, the routed experts included, runs in the
//! recipe's format for all three GEMMs; the embedding, the output head and MoE routers
//! stay BF16 (DeepSeek-V3 report §3.3; axolotl/accelerate skip routers); the NVFP4 plan
//! also keeps the last four transformer layers in BF16 (Megatron-Bridge's NVFP4 recipe,
//! NVIDIA blog, Feb 2026).

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use runner_graph::{Graph, OpKind, Role};

use crate::profile::GemmFormat;

/// A training precision as run files and flags name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    Bf16,
    /// FP8, per-tensor delayed scaling (TE's DelayedScaling, HYBRID E4M3/E5M2).
    Fp8,
    /// FP8, per-tensor current scaling (TE's Float8CurrentScaling).
    Fp8Cs,
    /// MXFP8: 32-element E8M0 block scales.
    Mxfp8,
    /// NVFP4: E2M1 values, 16-element E4M3 block scales, a per-tensor FP32 scale.
    Nvfp4,
}

impl Recipe {
    pub const ALL: [Recipe; 5] = [Recipe::Bf16, Recipe::Fp8, Recipe::Fp8Cs, Recipe::Mxfp8, Recipe::Nvfp4];

    /// Parse `bf16`, `fp8`, `fp8-cs`, `mxfp8`, `nvfp4` (case-insensitive; the
    /// calibration file's `FP8-MX` and `FP8-CS` spellings too).
    ///
    /// # Errors
    /// Names the accepted spellings.
    pub fn parse(s: &str) -> Result<Recipe, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" => Ok(Recipe::Bf16),
            "fp8" | "fp8-delayed" | "fp8-ds" => Ok(Recipe::Fp8),
            "fp8-cs" | "fp8-current" => Ok(Recipe::Fp8Cs),
            "mxfp8" | "fp8-mx" => Ok(Recipe::Mxfp8),
            "nvfp4" => Ok(Recipe::Nvfp4),
            other => Err(format!("unknown precision '{other}'; use bf16, fp8, fp8-cs, mxfp8 or nvfp4")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Recipe::Bf16 => "bf16",
            Recipe::Fp8 => "fp8",
            Recipe::Fp8Cs => "fp8-cs",
            Recipe::Mxfp8 => "mxfp8",
            Recipe::Nvfp4 => "nvfp4",
        }
    }

    /// The format its low-precision GEMMs run in (and whose peak MFU is taken against).
    pub fn format(self) -> GemmFormat {
        match self {
            Recipe::Bf16 => GemmFormat::Bf16,
            Recipe::Fp8 | Recipe::Fp8Cs => GemmFormat::Fp8,
            Recipe::Mxfp8 => GemmFormat::Mxfp8,
            Recipe::Nvfp4 => GemmFormat::Nvfp4,
        }
    }

    /// HBM bytes moved per element of a quantised operand, its transposed copy for the
    /// other GEMM included: read BF16 (2) and write the row- and column-wise copies;
    /// current scaling reads the tensor once more for its amax; MXFP8 quantises both
    /// copies from the high-precision tensor (TE docs), so it reads twice; NVFP4 adds the
    /// random Hadamard transform on the weight-gradient inputs. Zero for BF16.
    pub fn cast_bytes_per_element(self) -> f64 {
        // The formats' bytes with their block scales (`DType::bytes`: MXFP8 an E8M0 scale
        // per 32 elements, NVFP4 an E4M3 scale per 16).
        let (hi, q) = (runner_graph::DType::BF16.bytes(), self.format().element_bytes());
        match self {
            Recipe::Bf16 => 0.0,
            Recipe::Fp8 => hi + q + q,
            Recipe::Fp8Cs => hi + hi + q + q,
            Recipe::Mxfp8 => 2.0 * hi + 2.0 * q,
            // The Hadamard transform reads and writes the BF16 input once more.
            Recipe::Nvfp4 => 2.0 * hi + 2.0 * q + hi,
        }
    }
}

impl Recipe {
    /// Bytes per element of a low-precision GEMM weight's casts kept through the step:
    /// the row-wise copy the forward reads and the column-wise (transposed) one the
    /// input gradient reads, both cached across micro-batches (Transformer Engine keeps
    /// the FP8 transpose on Hopper, and both MXFP8/NVFP4 layouts with their block scales
    /// on Blackwell). Zero for BF16.
    pub fn resident_cast_bytes_per_element(self) -> f64 {
        match self {
            Recipe::Bf16 => 0.0,
            _ => 2.0 * self.format().element_bytes(),
        }
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Forward: Y = X Wᵀ; input gradient: dX = dY W; weight gradient: dW = dYᵀ X.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum GemmRole {
    Forward,
    InputGradient,
    WeightGradient,
}

impl GemmRole {
    pub const ALL: [GemmRole; 3] = [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// The formats of one GEMM op's three GEMMs.
pub type SiteFormats = [GemmFormat; 3];

/// A precision plan over a model's GEMMs (by logical op name).
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub recipe: Recipe,
    /// Where the plan came from: a plugin (name and sha256) or "built-in".
    pub source: String,
    #[serde(skip)]
    sites: HashMap<String, SiteFormats>,
    /// GEMM FLOPs share per format over the graph the plan was made for, forward and
    /// backward together.
    pub coverage: Vec<(GemmFormat, f64)>,
}

impl Plan {
    /// The built-in plan of `recipe` over logical graph `g`: the recipe's format for the
    /// GEMMs of the transformer layers; BF16 for the head and other GEMMs outside them,
    /// the routers, LoRA adapters, and under NVFP4 the last four layers.
    pub fn builtin(recipe: Recipe, g: &Graph) -> Plan {
        Plan::builtin_with(recipe, g, None)
    }

    /// [`Plan::builtin`] with the transformer layers kept in BF16 at the start and the end
    /// stated (Megatron's `num_layers_at_start_in_bf16` / `num_layers_at_end_in_bf16`);
    /// `None`: the recipe's default (NVFP4 keeps the last four, the others none).
    pub fn builtin_with(recipe: Recipe, g: &Graph, bf16_layers: Option<(usize, usize)>) -> Plan {
        let low = recipe.format();
        let layers: Vec<i32> = {
            let mut v: Vec<i32> = g.ops.iter().filter(|o| o.layer >= 0).map(|o| o.layer).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        // Main transformer layers (MTP modules come after the head and keep the recipe).
        let main = runner_graph::shard::partition(g).1;
        let (start, end) = bf16_layers.unwrap_or(if recipe == Recipe::Nvfp4 { (0, 4) } else { (0, 0) });
        let kept_bf16: Vec<i32> = main.iter().take(start).chain(main.iter().rev().take(end)).copied().collect();
        let router_inputs: Vec<usize> =
            g.ops.iter().filter(|o| o.kind == OpKind::Router).filter_map(|o| o.inputs.first().copied()).collect();
        let mut sites = HashMap::new();
        for op in g.ops.iter().filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear)) {
            let router = op.outputs.iter().any(|o| router_inputs.contains(o));
            let outside = op.layer < 0 || op.role == Role::VocabParallel || !layers.contains(&op.layer);
            let adapter = runner_graph::peft::is_adapter(op);
            let f = if recipe == Recipe::Bf16 || router || outside || adapter || kept_bf16.contains(&op.layer) {
                GemmFormat::Bf16
            } else {
                low
            };
            sites.insert(op.name.clone(), [f; 3]);
        }
        let mut plan = Plan { recipe, source: "built-in".into(), sites, coverage: Vec::new() };
        plan.coverage = plan.measure_coverage(g);
        plan
    }

    /// A plan from per-site answers (a precision plugin's), with the run's recipe.
    /// Sites the answers do not name run in BF16.
    pub fn from_sites(
        recipe: Recipe,
        source: &str,
        g: &Graph,
        answers: impl IntoIterator<Item = (String, GemmRole, GemmFormat)>,
    ) -> Plan {
        let mut sites: HashMap<String, SiteFormats> = HashMap::new();
        for (name, role, f) in answers {
            sites.entry(name).or_insert([GemmFormat::Bf16; 3])[role.index()] = f;
        }
        let mut plan = Plan { recipe, source: source.to_string(), sites, coverage: Vec::new() };
        plan.coverage = plan.measure_coverage(g);
        plan
    }

    /// The formats of op `name`'s GEMMs (BF16 where the plan does not name it).
    pub fn formats(&self, name: &str) -> SiteFormats {
        self.sites.get(name).copied().unwrap_or([GemmFormat::Bf16; 3])
    }

    /// Share of GEMM FLOPs (linears and experts, forward and backward) per format.
    fn measure_coverage(&self, g: &Graph) -> Vec<(GemmFormat, f64)> {
        let mut by: HashMap<GemmFormat, f64> = HashMap::new();
        let mut total = 0.0;
        for op in g.ops.iter().filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear)) {
            let f = runner_graph::count::op_flops(g, op).fwd_flops;
            for fmt in self.formats(&op.name) {
                *by.entry(fmt).or_insert(0.0) += f;
                total += f;
            }
        }
        let mut out: Vec<(GemmFormat, f64)> =
            GemmFormat::ALL.iter().filter_map(|f| by.get(f).map(|v| (*f, if total > 0.0 { v / total } else { 0.0 }))).collect();
        out.retain(|(_, v)| *v > 0.0);
        out
    }

    /// The share of GEMM FLOPs not in BF16.
    pub fn low_precision_share(&self) -> f64 {
        self.coverage.iter().filter(|(f, _)| *f != GemmFormat::Bf16).map(|(_, v)| v).sum()
    }

    /// One line for reports: "fp8 (built-in plan): 97.1 % of GEMM FLOPs in fp8".
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self.coverage.iter().map(|(f, v)| format!("{f} {:.1} %", 100.0 * v)).collect();
        format!("{} ({}): GEMM FLOPs {}", self.recipe, self.source, parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HBM bytes per element of each recipe's casts, from the formats' layouts: FP8 one
    /// byte; MXFP8 one byte plus an E8M0 scale per 32-element block (OCP Microscaling
    /// Formats v1.0); NVFP4 half a byte plus an E4M3 scale per 16 (NVIDIA's NVFP4).
    /// Reading BF16 (2 B) and writing the row- and column-wise copies: FP8 2 + 1 + 1;
    /// current scaling reads once more for the amax, + 2; MXFP8 and NVFP4 read twice,
    /// and NVFP4's Hadamard transform adds a BF16 pass.
    #[test]
    fn cast_bytes_follow_each_formats_block_scales() {
        assert_eq!(Recipe::Bf16.cast_bytes_per_element(), 0.0);
        assert_eq!(Recipe::Fp8.cast_bytes_per_element(), 4.0);
        assert_eq!(Recipe::Fp8Cs.cast_bytes_per_element(), 6.0);
        assert_eq!(Recipe::Mxfp8.cast_bytes_per_element(), 4.0 + 2.0 * (1.0 + 1.0 / 32.0));
        assert_eq!(Recipe::Nvfp4.cast_bytes_per_element(), 4.0 + 2.0 * (0.5 + 1.0 / 16.0) + 2.0);
    }

    #[test]
    fn parse_accepts_the_calibration_spellings() {
        assert_eq!(Recipe::parse("FP8-CS").unwrap(), Recipe::Fp8Cs);
        assert_eq!(Recipe::parse("FP8-MX").unwrap(), Recipe::Mxfp8);
        assert_eq!(Recipe::parse("NVFP4").unwrap(), Recipe::Nvfp4);
        assert!(Recipe::parse("int8").unwrap_err().contains("bf16, fp8"));
    }

    #[test]
    fn cast_costs_order_by_work() {
        assert_eq!(Recipe::Bf16.cast_bytes_per_element(), 0.0);
        assert!(Recipe::Fp8.cast_bytes_per_element() < Recipe::Fp8Cs.cast_bytes_per_element());
        assert!(Recipe::Fp8.cast_bytes_per_element() < Recipe::Mxfp8.cast_bytes_per_element());
    }
}
