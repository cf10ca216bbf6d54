//! Device and cluster profiles: what a GPU type can do (dense peaks per GEMM format, HBM
//! capacity and bandwidth, its NVLink domain and NIC bandwidth) and how close real
//! kernels and collectives get to it ([`Efficiency`]).
//!
//! The built-in profiles are `data/gpus.toml`, every number with its public source and
//! date. A user file (`--profile FILE`) of the same shape is merged over them field by
//! field: a `[[gpu]]` whose name matches a built-in replaces just the fields it gives
//! (typically the efficiency table `runner calibrate` writes); a new name adds a GPU.
//!
//! Key items: [`Profiles`] (load, merge, look up by name or alias), [`GpuProfile`],
//! [`Efficiency`], [`GemmFormat`].

use std::collections::BTreeMap;
use std::fmt;

use runner_contract::text::number as shown;
use serde::{Deserialize, Serialize};

use crate::comm::Fabric;

/// The built-in profiles, and the efficiency tables `runner calibrate` fitted for them.
pub const BUILTIN: &str = include_str!("../data/gpus.toml");
pub const FITTED: &str = include_str!("../data/efficiency.toml");

/// The number format a GEMM runs in, which decides its peak rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmFormat {
    Bf16,
    /// Per-tensor scaled FP8 (E4M3/E5M2), delayed or current scaling.
    Fp8,
    /// FP8 with 32-element E8M0 block scales (Blackwell).
    Mxfp8,
    /// E2M1 with 16-element E4M3 block scales and a per-tensor scale (Blackwell).
    Nvfp4,
}

impl GemmFormat {
    pub const ALL: [GemmFormat; 4] = [GemmFormat::Bf16, GemmFormat::Fp8, GemmFormat::Mxfp8, GemmFormat::Nvfp4];

    pub fn name(self) -> &'static str {
        match self {
            GemmFormat::Bf16 => "bf16",
            GemmFormat::Fp8 => "fp8",
            GemmFormat::Mxfp8 => "mxfp8",
            GemmFormat::Nvfp4 => "nvfp4",
        }
    }

    /// Bytes per element of an operand stored in this format, its block scales included
    /// (MXFP8: one E8M0 byte per 32 elements; NVFP4: one E4M3 byte per 16).
    pub fn element_bytes(self) -> f64 {
        use runner_graph::DType;
        match self {
            GemmFormat::Bf16 => DType::BF16,
            GemmFormat::Fp8 => DType::Fp8E4M3,
            GemmFormat::Mxfp8 => DType::MxFp8,
            GemmFormat::Nvfp4 => DType::NvFp4,
        }
        .bytes()
    }
}

impl fmt::Display for GemmFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Dense peak TFLOP/s per GEMM format; `None` where the chip has no such tensor-core path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peaks {
    pub bf16: f64,
    pub fp8: Option<f64>,
    pub mxfp8: Option<f64>,
    pub nvfp4: Option<f64>,
}

impl Peaks {
    pub fn get(&self, f: GemmFormat) -> Option<f64> {
        match f {
            GemmFormat::Bf16 => Some(self.bf16),
            GemmFormat::Fp8 => self.fp8,
            GemmFormat::Mxfp8 => self.mxfp8,
            GemmFormat::Nvfp4 => self.nvfp4,
        }
    }
}

/// Asymptotic GEMM efficiency per format: the fraction of that format's peak a large GEMM
/// reaches, casts and scaling included.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmEfficiency {
    pub bf16: f64,
    pub fp8: f64,
    pub mxfp8: f64,
    pub nvfp4: f64,
}

impl GemmEfficiency {
    pub fn get(&self, f: GemmFormat) -> f64 {
        match f {
            GemmFormat::Bf16 => self.bf16,
            GemmFormat::Fp8 => self.fp8,
            GemmFormat::Mxfp8 => self.mxfp8,
            GemmFormat::Nvfp4 => self.nvfp4,
        }
    }

    pub fn set(&mut self, f: GemmFormat, v: f64) {
        match f {
            GemmFormat::Bf16 => self.bf16 = v,
            GemmFormat::Fp8 => self.fp8 = v,
            GemmFormat::Mxfp8 => self.mxfp8 = v,
            GemmFormat::Nvfp4 => self.nvfp4 = v,
        }
    }
}

/// The straggler spread's prior, 1 % of a step: a start the weak-scaling runs move.
fn default_straggler() -> f64 {
    0.01
}

/// How close kernels and collectives get to the hardware: the performance model's
/// parameters. The first five are what `runner calibrate` fits; the rest are set from
/// published microbenchmarks and framework defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Large-GEMM efficiency per format.
    pub gemm: GemmEfficiency,
    /// Flash-attention forward efficiency against the BF16 peak (the backward kernel
    /// does 2.5x the forward's matrix work at [`Efficiency::attention_backward`] of this).
    pub attention: f64,
    /// Mamba-2's chunked SSD scan (mamba_ssm's Triton kernels, which Megatron calls)
    /// forward efficiency against the BF16 peak; its backward does 2x the forward's
    /// matrix work at [`Efficiency::attention_backward`] of this; the chunk states its
    /// kernels pass through HBM are timed at the HBM rate on top. Fitted, after every
    /// other parameter and from the hybrid runs alone, where a GPU has hybrid runs of
    /// two models; other GPUs take it at the same TFLOP/s. It also takes up whatever else
    /// a hybrid's Mamba layers cost that no op of the graph shows (docs/VALIDATION.md).
    pub ssm: f64,
    /// Fraction of HBM bandwidth elementwise kernels (norms, activations, casts, the
    /// optimizer) reach.
    pub memory: f64,
    /// Fraction of NVLink and NIC bandwidth NCCL's bus bandwidth reaches (on the NICs:
    /// every collective but the all-to-all, whose rings and trees keep each link busy).
    pub scale_up: f64,
    pub scale_out: f64,
    /// Fraction of NIC bandwidth an all-to-all's share bound for other scale-up domains
    /// reaches: one message to each of many peers at once, with the incast at each
    /// receiver, lands well below a ring's bus bandwidth with Megatron's all-to-all
    /// dispatchers, so it has an efficiency of its own (the expert-parallel dispatch and
    /// combine).
    pub scale_out_a2a: f64,
    /// Share of the dense GEMM efficiency a routed expert's GEMMs reach on Megatron's
    /// default MoE path: Transformer Engine's `GroupedLinear` (one GEMM per local expert,
    /// the activation and its casts as kernels of their own). The fused path
    /// (Megatron-Bridge's `cutedsl_fused_grouped_mlp`: Transformer Engine's op fuser with
    /// CuTe DSL grouped GEMMs that carry the GLU in their epilogue) runs them at the dense
    /// efficiency and the activation inside them. Fitted where a GPU has runs of both;
    /// it also takes up whatever else the unfused path costs that no op of the graph
    /// shows (docs/VALIDATION.md).
    pub grouped_gemm: f64,
    /// GFLOP per GEMM call at which a GEMM reaches half its asymptotic efficiency
    /// (launch, tail and wave-quantisation losses of small products).
    pub gemm_half_gflop: f64,
    /// Relative efficiency of the attention backward kernel against its forward.
    pub attention_backward: f64,
    /// Latency of one collective step, microseconds.
    pub scale_up_latency_us: f64,
    pub scale_out_latency_us: f64,
    /// Share of tensor-parallel communication hidden behind GEMMs with Megatron's TP
    /// communication overlap (userbuffers); the rest of it, and whatever exceeds the
    /// GEMM time it overlaps, is exposed.
    pub tp_overlap: f64,
    /// Share of context-parallel K/V exchange hidden behind attention (ring P2P).
    pub cp_overlap: f64,
    /// Share of expert-parallel all-to-all hidden behind another micro-batch's compute
    /// when EP overlap is on (Megatron's combined 1F1B A2A overlap, DeepEP).
    pub ep_overlap: f64,
    /// Share of pipeline send/receive hidden (overlap_p2p_comm).
    pub pp_overlap: f64,
    /// GiB of each GPU not available to the model: the CUDA context, NCCL buffers,
    /// cuBLAS and communication-overlap workspaces.
    pub reserved_gib: f64,
    /// Extra activation memory the caching allocator holds (fragmentation), as a share.
    pub allocator_slack: f64,
    /// Spread of one rank's step time about the mean (standard deviation, as a share of
    /// the step): clocks and thermals, the OS, the network. A synchronous step waits for
    /// its slowest rank, so n ranks take σ times the expected largest of n standard
    /// normal draws longer; the other parameters are fitted to runs of a node and more,
    /// so the projection adds what n GPUs wait beyond one 8-GPU node's wait
    /// ([`crate::step::straggler_excess`]). Fitted where a GPU's runs repeat a layout at
    /// GPU counts 4x apart (weak scaling); other GPUs take it from there.
    #[serde(default = "default_straggler")]
    pub straggler: f64,
    /// What set these values (a calibration run, or "prior" for untouched defaults).
    #[serde(default)]
    pub fitted: String,
}

/// A public source for one or more numbers of a profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub what: String,
    pub cite: String,
    pub date: String,
}

/// One GPU type and the node and fabric it comes in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfile {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub description: String,
    pub memory_gib: f64,
    pub hbm_gbs: f64,
    /// GPUs billed and placed together (8 on HGX boards; 4 per GB200/GB300 tray).
    pub gpus_per_node: u32,
    /// GPUs in one NVLink domain.
    pub scale_up_domain: u32,
    /// NVLink bandwidth per GPU per direction, GB/s.
    pub scale_up_gbs: f64,
    /// NIC bandwidth per GPU, GB/s.
    pub scale_out_gbs: f64,
    /// Host link per GPU per direction, GB/s (PCIe on HGX boards, NVLink-C2C to the Grace
    /// CPU on GB200/GB300): what activation offloading to host memory moves over. Absent:
    /// unknown, and a layout that offloads is refused on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_link_gbs: Option<f64>,
    /// Host memory per GPU, GiB (the node's system memory over its GPUs; a Grace CPU's
    /// over the two GPUs it serves): what offloaded activations must fit in. Absent:
    /// unknown, and a layout that offloads is refused on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_gib: Option<f64>,
    /// Whether the GPU's NIC traffic (GPUDirect RDMA) crosses the same link as its host
    /// traffic: on HGX/DGX boards each GPU reaches both its NIC and the CPU through one
    /// PCIe x16 link to a switch it shares with the NIC, so activation offload's copies
    /// and the scale-out collectives running beside them split `host_link_gbs` per
    /// direction. False (absent) where the host link is a link of its own (NVLink-C2C
    /// on Grace boards, whose NIC hangs off PCIe).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nic_shares_host_link: bool,
    pub peak_tflops: Peaks,
    /// Formats the chip runs but this profile gives no peak for, each with why (MI355X's
    /// MXFP8: no public figure for its rate): a refusal of one says the profile lacks the
    /// rate, not that the hardware lacks the format.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unrated: BTreeMap<String, String>,
    pub efficiency: Efficiency,
    /// Another GPU whose efficiencies this one takes when it has none of its own (the
    /// same chip in another package).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency_from: Option<String>,
    /// With `efficiency_from`: the GEMM efficiencies taken, scaled by this ratio (capped
    /// at 1), where one measurement method on both chips says their GEMMs reach different
    /// shares of peak (A100 against H100: the best matmul each reaches, 86.9 % and
    /// 80.3 %). Everything else is taken as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_from_ratio: Option<f64>,
    /// The GPUs nearest this one, nearest first (the same die in another package, then
    /// the same architecture): where this GPU's runs cannot fit a parameter, `runner
    /// calibrate` takes it from the first of them whose runs fitted it, and only then from
    /// the best-measured GPU (another architecture's kernels and clocks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub siblings: Vec<String>,
    #[serde(default, rename = "source")]
    pub sources: Vec<Source>,
}

impl GpuProfile {
    /// Whether per-tensor FP8 and MXFP8 run at one peak (Blackwell's FP8 tensor cores
    /// take block scales at no cost in rate), so one efficiency describes both.
    pub fn fp8_datapath_shared(&self) -> bool {
        self.peak_tflops.fp8.is_some() && self.peak_tflops.fp8 == self.peak_tflops.mxfp8
    }

    /// Peak FLOP/s of `f`, or why this GPU cannot run it.
    pub fn peak_flops(&self, f: GemmFormat) -> Result<f64, String> {
        self.peak_tflops.get(f).map(|t| t * 1e12).ok_or_else(|| {
            let has: Vec<&str> = GemmFormat::ALL.iter().filter(|g| self.peak_tflops.get(**g).is_some()).map(|g| g.name()).collect();
            match self.unrated.get(f.name()) {
                Some(why) => format!("the {} profile has no {f} rate: {why} (it is priced in {})", self.name, has.join(", ")),
                None => format!("{} has no {f} tensor-core path (it runs {})", self.name, has.join(", ")),
            }
        })
    }

    /// The links as collectives see them.
    pub fn fabric(&self) -> Fabric {
        let e = &self.efficiency;
        Fabric {
            domain: self.scale_up_domain.max(1),
            scale_up_bps: self.scale_up_gbs * 1e9 * e.scale_up,
            scale_out_bps: self.scale_out_gbs * 1e9 * e.scale_out,
            scale_out_a2a_bps: self.scale_out_gbs * 1e9 * e.scale_out_a2a,
            scale_up_latency_s: e.scale_up_latency_us * 1e-6,
            scale_out_latency_s: e.scale_out_latency_us * 1e-6,
        }
    }

    /// Bytes the model may use on one GPU.
    pub fn usable_bytes(&self) -> f64 {
        (self.memory_gib - self.efficiency.reserved_gib).max(0.0) * GIB
    }

    /// Every rule a profile must follow, so a user's file cannot make the model divide by
    /// zero or print nonsense.
    fn check(&self) -> Result<(), String> {
        // The name titles every table and is what --gpu finds the profile by.
        if self.name.trim().is_empty() || self.name.chars().any(char::is_control) {
            return Err("name must be a visible GPU name, e.g. name = \"H100\"".into());
        }
        if let Some(r) = self.gemm_from_ratio {
            if self.efficiency_from.is_none() {
                return Err("gemm_from_ratio scales the GEMM efficiencies efficiency_from takes: give efficiency_from too".into());
            }
            if !(r.is_finite() && (0.25..=4.0).contains(&r)) {
                return Err(format!("gemm_from_ratio must be between 0.25 and 4, got {}", shown(r)));
            }
        }
        let e = &self.efficiency;
        // Ranges wide enough for any chip, narrow enough that a slipped unit (1e-300, 1e300)
        // is refused instead of printing steps hundreds of digits long.
        let ranged = [
            ("memory_gib", self.memory_gib, 0.1, 1e6),
            ("hbm_gbs", self.hbm_gbs, 1.0, 1e6),
            ("scale_up_gbs", self.scale_up_gbs, 0.01, 1e6),
            ("scale_out_gbs", self.scale_out_gbs, 0.001, 1e6),
            ("peak_tflops.bf16", self.peak_tflops.bf16, 0.01, 1e6),
            ("efficiency.gemm_half_gflop", e.gemm_half_gflop, 1e-3, 1e6),
        ];
        let optional = [
            ("host_link_gbs", self.host_link_gbs, 0.01, 1e6),
            ("host_memory_gib", self.host_memory_gib, 0.1, 1e7),
            ("peak_tflops.fp8", self.peak_tflops.get(GemmFormat::Fp8), 0.01, 1e6),
            ("peak_tflops.mxfp8", self.peak_tflops.get(GemmFormat::Mxfp8), 0.01, 1e6),
            ("peak_tflops.nvfp4", self.peak_tflops.get(GemmFormat::Nvfp4), 0.01, 1e6),
        ];
        for (f, why) in &self.unrated {
            match GemmFormat::ALL.iter().find(|g| g.name() == f) {
                None => return Err(format!("unrated.{f}: not a GEMM format (one of bf16, fp8, mxfp8, nvfp4)")),
                Some(g) if self.peak_tflops.get(*g).is_some() => {
                    return Err(format!("unrated.{f}: peak_tflops.{f} gives its rate; drop one of the two"));
                }
                Some(_) if why.trim().is_empty() => return Err(format!("unrated.{f}: say why the rate is left out")),
                Some(_) => {}
            }
        }
        if self.nic_shares_host_link && self.host_link_gbs.is_none() {
            return Err("nic_shares_host_link says the NIC's traffic crosses the host link, but host_link_gbs is absent: give host_link_gbs too, or drop nic_shares_host_link".into());
        }
        let given = optional.into_iter().filter_map(|(what, v, lo, hi)| v.map(|v| (what, v, lo, hi)));
        for (what, v, lo, hi) in ranged.into_iter().chain(given) {
            if !(v.is_finite() && (lo..=hi).contains(&v)) {
                return Err(format!("{what} must be between {lo} and {hi:e}, got {}: check its unit", shown(v)));
            }
        }
        let fractions = [
            ("efficiency.gemm.bf16", e.gemm.bf16),
            ("efficiency.gemm.fp8", e.gemm.fp8),
            ("efficiency.gemm.mxfp8", e.gemm.mxfp8),
            ("efficiency.gemm.nvfp4", e.gemm.nvfp4),
            ("efficiency.attention", e.attention),
            ("efficiency.attention_backward", e.attention_backward),
            ("efficiency.ssm", e.ssm),
            ("efficiency.memory", e.memory),
            ("efficiency.scale_up", e.scale_up),
            ("efficiency.scale_out", e.scale_out),
            ("efficiency.scale_out_a2a", e.scale_out_a2a),
            ("efficiency.grouped_gemm", e.grouped_gemm),
        ];
        if !(e.straggler.is_finite() && (0.0..=0.5).contains(&e.straggler)) {
            return Err(format!("efficiency.straggler must be in [0, 0.5], got {}", shown(e.straggler)));
        }
        for (what, v) in fractions {
            if !(v.is_finite() && (MIN_EFFICIENCY..=1.0).contains(&v)) {
                return Err(format!("{what} must be in [{MIN_EFFICIENCY:e}, 1], got {}", shown(v)));
            }
        }
        for (what, v) in [("efficiency.tp_overlap", e.tp_overlap), ("efficiency.cp_overlap", e.cp_overlap), ("efficiency.ep_overlap", e.ep_overlap), ("efficiency.pp_overlap", e.pp_overlap), ("efficiency.allocator_slack", e.allocator_slack)] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(format!("{what} must be in [0, 1], got {}", shown(v)));
            }
        }
        for (what, v) in [("efficiency.scale_up_latency_us", e.scale_up_latency_us), ("efficiency.scale_out_latency_us", e.scale_out_latency_us), ("efficiency.reserved_gib", e.reserved_gib)] {
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(format!("{what} must be between 0 and 1e6, got {}", shown(v)));
            }
        }
        if e.reserved_gib >= self.memory_gib {
            return Err(format!("efficiency.reserved_gib ({}) leaves no memory of {} GiB", shown(e.reserved_gib), shown(self.memory_gib)));
        }
        for (what, v) in [("gpus_per_node", self.gpus_per_node), ("scale_up_domain", self.scale_up_domain)] {
            if v == 0 || v > 1 << 20 {
                return Err(format!("{what} must be in 1..=1048576, got {v}"));
            }
        }
        if !self.scale_up_domain.is_multiple_of(self.gpus_per_node) && !self.gpus_per_node.is_multiple_of(self.scale_up_domain) {
            return Err(format!(
                "scale_up_domain ({}) and gpus_per_node ({}) must divide one another",
                self.scale_up_domain, self.gpus_per_node
            ));
        }
        Ok(())
    }
}

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The least efficiency a profile may give: a millionth of a nominal figure. Below it a
/// slipped unit (1e-300) would print steps hundreds of digits long; above it a profile
/// fitted to a CPU's loopback against a nominal link (about 1e-4 of it) still loads.
pub const MIN_EFFICIENCY: f64 = 1e-6;

/// Every known profile.
#[derive(Clone, Debug, Serialize)]
pub struct Profiles {
    pub gpus: Vec<GpuProfile>,
    /// Where the profiles came from: "built-in", plus each user file merged in.
    pub origin: Vec<String>,
    /// The file-level `[efficiency]` a new GPU starts from.
    #[serde(skip)]
    default_efficiency: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    efficiency: Option<toml::Table>,
    #[serde(default)]
    gpu: Vec<toml::Table>,
}

/// Merge `over` into `base`, tables recursively, everything else replaced.
fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

impl Profiles {
    /// The built-in profiles.
    pub fn builtin() -> Profiles {
        // The built-in files are part of the program; a test checks they parse.
        let base = Profiles::parse_over(Vec::new(), toml::Table::new(), BUILTIN, "built-in")
            .unwrap_or_else(|e| panic!("data/gpus.toml: {e}"));
        let tables = base.tables();
        let mut out = Profiles::parse_over(tables, base.default_efficiency, FITTED, "built-in")
            .unwrap_or_else(|e| panic!("data/efficiency.toml: {e}"));
        out.origin = vec!["built-in".into()];
        out
    }

    /// The built-in profiles before calibration: `data/gpus.toml` and its priors, without
    /// the fitted tables (what `runner calibrate` starts from, so refitting is
    /// reproducible).
    pub fn priors() -> Profiles {
        Profiles::parse_over(Vec::new(), toml::Table::new(), BUILTIN, "built-in priors")
            .unwrap_or_else(|e| panic!("data/gpus.toml: {e}"))
    }

    fn tables(&self) -> Vec<toml::Table> {
        self.gpus.iter().filter_map(|g| toml::Table::try_from(g).ok()).collect()
    }

    /// The built-in profiles with `text` (a user's file, named `origin` in messages)
    /// merged over them.
    ///
    /// # Errors
    /// TOML syntax, an unknown field, a new GPU missing fields, or a value out of range;
    /// each message names the GPU and the field.
    pub fn with_overrides(text: &str, origin: &str) -> Result<Profiles, String> {
        // A file that sets nothing (empty, or comments only) is most likely the wrong one or
        // one cut short; it ran as the built-in profiles while the notes named it.
        if let Ok(File { efficiency: None, gpu }) = toml::from_str::<File>(text)
            && gpu.is_empty()
        {
            return Err(format!(
                "{origin} sets nothing: a GPU profile has an [efficiency] table or [[gpu]] tables (as `runner calibrate -o FILE.toml` writes); leave --profile out for the built-in profiles"
            ));
        }
        let base = Profiles::builtin();
        let tables = base.tables();
        let mut out = Profiles::parse_over(tables, base.default_efficiency, text, origin)?;
        out.origin = vec!["built-in".into(), origin.into()];
        Ok(out)
    }

    fn parse_over(
        mut tables: Vec<toml::Table>,
        mut default_eff: toml::Table,
        text: &str,
        origin: &str,
    ) -> Result<Profiles, String> {
        let file: File = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        if let Some(e) = &file.efficiency {
            merge(&mut default_eff, e);
        }
        let mut explicit: Vec<String> = Vec::new();
        for g in file.gpu {
            let Some(name) = g.get("name").and_then(|n| n.as_str()).map(str::to_string) else {
                return Err(format!("{origin}: a [[gpu]] table has no name"));
            };
            let existing = tables.iter_mut().find(|t| {
                let known = |s: &str| s.eq_ignore_ascii_case(&name);
                t.get("name").and_then(|n| n.as_str()).is_some_and(known)
                    || t.get("aliases").and_then(|a| a.as_array()).is_some_and(|a| a.iter().filter_map(|x| x.as_str()).any(known))
            });
            match existing {
                Some(t) => {
                    if g.contains_key("efficiency") {
                        explicit.push(t.get("name").and_then(|n| n.as_str()).unwrap_or(&name).to_string());
                    }
                    let mut g = g.clone();
                    g.remove("name");
                    merge(t, &g);
                }
                None => {
                    if g.contains_key("efficiency") {
                        explicit.push(name.clone());
                    }
                    let mut t = toml::Table::new();
                    t.insert("efficiency".into(), toml::Value::Table(default_eff.clone()));
                    merge(&mut t, &g);
                    tables.push(t);
                }
            }
        }
        // Efficiency fields absent from a GPU come from the file-level [efficiency].
        for t in tables.iter_mut() {
            let mut eff = default_eff.clone();
            if let Some(toml::Value::Table(own)) = t.get("efficiency") {
                merge(&mut eff, own);
            }
            t.insert("efficiency".into(), toml::Value::Table(eff));
        }
        // A GPU with `efficiency_from` takes that GPU's table, unless this file gives it
        // one of its own.
        let snapshot = tables.clone();
        // Which GPUs took another's table: a value out of range there is reported at the
        // GPU whose table it is (a user's bad H100 memory was reported at A100-40GB, the
        // first GPU in the file to take H100's table).
        let mut took = vec![false; tables.len()];
        for (t, took) in tables.iter_mut().zip(&mut took) {
            let name = t.get("name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
            let Some(from) = t.get("efficiency_from").and_then(|v| v.as_str()).map(str::to_string) else { continue };
            if explicit.iter().any(|e| e.eq_ignore_ascii_case(&name)) {
                continue;
            }
            *took = true;
            let src = snapshot
                .iter()
                .find(|o| o.get("name").and_then(|n| n.as_str()).is_some_and(|n| n.eq_ignore_ascii_case(&from)))
                .and_then(|o| o.get("efficiency"))
                .and_then(|e| e.as_table())
                .ok_or_else(|| format!("{origin}: GPU '{name}': efficiency_from names '{from}', which is not a known GPU"))?;
            let mut e = src.clone();
            let ratio = t.get("gemm_from_ratio").and_then(toml::Value::as_float);
            if let (Some(r), Some(toml::Value::Table(gemm))) = (ratio, e.get_mut("gemm")) {
                for (_, v) in gemm.iter_mut() {
                    if let Some(x) = v.as_float() {
                        *v = toml::Value::Float((x * r).min(1.0));
                    }
                }
            }
            let fitted = e.get("fitted").and_then(|f| f.as_str()).unwrap_or("prior").to_string();
            let label = match ratio {
                Some(r) => format!("{from}'s, GEMMs x{r}: {fitted}"),
                None if fitted.starts_with(&format!("{from}'s")) => fitted,
                None => format!("{from}'s: {fitted}"),
            };
            e.insert("fitted".into(), toml::Value::String(label));
            t.insert("efficiency".into(), toml::Value::Table(e));
        }
        let mut gpus = Vec::new();
        // The first error of a GPU with its own table, else the first of one that took another's.
        let mut first_error: Option<(bool, String)> = None;
        for (t, took) in tables.into_iter().zip(took) {
            let name = t.get("name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
            let g = toml::Value::Table(t)
                .try_into::<GpuProfile>()
                .map_err(|e| format!("{origin}: GPU '{name}': {}", e.message()))
                .and_then(|g| g.check().map(|()| g).map_err(|e| format!("{origin}: GPU '{name}': {e}")));
            match g {
                Ok(g) => gpus.push(g),
                Err(e) if first_error.as_ref().is_none_or(|(t, _)| *t && !took) => first_error = Some((took, e)),
                Err(_) => {}
            }
        }
        if let Some((_, e)) = first_error {
            return Err(e);
        }
        for g in &gpus {
            if let Some(s) = g.siblings.iter().find(|s| !gpus.iter().any(|o| o.name.eq_ignore_ascii_case(s))) {
                return Err(format!("{origin}: GPU '{}': siblings names '{s}', which is not a known GPU", g.name));
            }
        }
        Ok(Profiles { gpus, origin: vec![origin.to_string()], default_efficiency: default_eff })
    }

    /// Where `name` is an alias that begins another profile's name (`a100`, A100-80GB's
    /// alias, begins A100-40GB): which profile it was taken as, and the names of the others,
    /// for a note. A price file's bare `A100` is refused for the same doubt (SkyPilot's
    /// catalogs mean the 40 GB part by it); `--gpu a100` keeps working, said aloud.
    pub fn taken_as(&self, name: &str) -> Option<String> {
        let given = name.trim().to_lowercase();
        let taken = self.get(&given).ok()?;
        if taken.name.eq_ignore_ascii_case(&given) {
            return None;
        }
        let others: Vec<String> = self
            .gpus
            .iter()
            .filter(|g| g.name != taken.name)
            .filter(|g| std::iter::once(&g.name).chain(&g.aliases).any(|n| n.to_lowercase().starts_with(&format!("{given}-"))))
            .map(|g| format!("--gpu {} for the {}", g.name.to_lowercase(), g.name))
            .collect();
        (!others.is_empty()).then(|| format!("--gpu {given} taken as {}; {}", taken.name, others.join(", ")))
    }

    /// A profile by name or alias, case-insensitively.
    ///
    /// # Errors
    /// Lists the known names.
    pub fn get(&self, name: &str) -> Result<&GpuProfile, String> {
        let hit = |g: &&GpuProfile| g.name.eq_ignore_ascii_case(name) || g.aliases.iter().any(|a| a.eq_ignore_ascii_case(name));
        self.gpus.iter().find(hit).ok_or_else(|| {
            // SkyPilot's accelerator:count ("H100:8"): the type is known, the count is not its place.
            if let Some((gpu, n)) = name.split_once(':')
                && n.trim().parse::<u32>().is_ok()
                && let Ok(g) = self.get(gpu.trim())
            {
                return format!(
                    "GPU '{name}' carries a count (SkyPilot's accelerator:count): name the type alone ({}) and give the count as the GPU count (--gpus {}, or [cluster] gpus)",
                    g.name.to_lowercase(),
                    n.trim()
                );
            }
            let names: Vec<String> = self.gpus.iter().map(|g| g.name.to_lowercase()).collect();
            // A board named by a known GPU and more ("H100-80GB", SkyPilot's name for
            // both the SXM and the PCIe H100; "h100-pcie"): say which profile is nearest
            // and what it describes, since only the user knows whether it is that board.
            let lower = name.trim().to_lowercase();
            let nearest = self
                .gpus
                .iter()
                .flat_map(|g| std::iter::once(&g.name).chain(&g.aliases).map(move |n| (g, n.to_lowercase())))
                .filter(|(_, n)| lower.strip_prefix(n.as_str()).is_some_and(|rest| rest.starts_with(['-', '_', ' '])))
                .max_by_key(|(_, n)| n.len());
            if let Some((g, _)) = nearest {
                return format!(
                    "unknown GPU '{name}'; the nearest profile is {} ({}): if that is the board, name it {}; if not, add yours with --profile FILE",
                    g.name,
                    g.description,
                    g.name.to_lowercase()
                );
            }
            format!("unknown GPU '{name}'; known: {} (or add one with --profile FILE)", names.join(", "))
        })
    }

    /// The efficiency tables as a profile file: what `runner calibrate` writes.
    pub fn efficiency_file<E: Serialize>(gpus: &[(&str, E)]) -> String {
        #[derive(Serialize)]
        struct Entry<'a, E> {
            name: &'a str,
            efficiency: &'a E,
        }
        #[derive(Serialize)]
        struct Out<'a, E> {
            gpu: Vec<Entry<'a, E>>,
        }
        let out = Out { gpu: gpus.iter().map(|(name, efficiency)| Entry { name, efficiency }).collect() };
        toml::to_string(&out).unwrap_or_default()
    }

    /// `e` as a profile file's `[gpu.efficiency]` table holding only the parameters
    /// named (as `runner calibrate` names them: `gemm.bf16`, `gemm.fp8+mxfp8`,
    /// `attention`, ...) and the `fitted` label: merged over a profile, it overrides
    /// those and leaves the rest to the profile.
    pub fn efficiency_only(e: &Efficiency, names: &[String]) -> toml::Table {
        let Ok(toml::Value::Table(all)) = toml::Value::try_from(e) else { return toml::Table::new() };
        let mut out = toml::Table::new();
        let mut gemm = toml::Table::new();
        for (k, v) in &all {
            match (k.as_str(), v) {
                ("fitted", _) => {
                    out.insert(k.clone(), v.clone());
                }
                ("gemm", toml::Value::Table(formats)) => {
                    for (f, x) in formats {
                        let shared = matches!(f.as_str(), "fp8" | "mxfp8") && names.iter().any(|n| n == "gemm.fp8+mxfp8");
                        if shared || names.iter().any(|n| *n == format!("gemm.{f}")) {
                            gemm.insert(f.clone(), x.clone());
                        }
                    }
                }
                _ if names.iter().any(|n| n == k) => {
                    out.insert(k.clone(), v.clone());
                }
                _ => {}
            }
        }
        if !gemm.is_empty() {
            out.insert("gemm".into(), toml::Value::Table(gemm));
        }
        out
    }
}

/// Profile lookups keyed by name, for callers that hold several.
pub type ByName<'a> = BTreeMap<String, &'a GpuProfile>;

/// The built-in H100 profile, for the crate's tests.
#[cfg(test)]
pub(crate) fn test_h100() -> GpuProfile {
    Profiles::builtin().get("h100").unwrap().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_parses_and_every_gpu_has_sources() {
        let p = Profiles::builtin();
        let names: Vec<&str> = p.gpus.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["A100-40GB", "A100-80GB", "H100", "H200", "H800", "H20", "GH200", "B200", "B300", "GB200", "GB300", "MI300X", "MI355X"]);
        for g in &p.gpus {
            assert!(!g.sources.is_empty(), "{} has no source", g.name);
            assert!(g.sources.iter().all(|s| !s.cite.is_empty() && !s.date.is_empty()));
        }
        assert!(p.get("H100").unwrap().peak_flops(GemmFormat::Nvfp4).unwrap_err().contains("no nvfp4"));
        assert_eq!(p.get("gb200").unwrap().scale_up_domain, 72);
        assert!(p.get("v100").unwrap_err().contains("known: a100-40gb"));
    }

    #[test]
    fn user_file_overrides_fields_and_adds_gpus() {
        let text = r#"
[[gpu]]
name = "h100"
[gpu.efficiency]
scale_out = 0.5
scale_out_a2a = 0.25

[[gpu]]
name = "X1"
description = "test chip"
memory_gib = 64.0
hbm_gbs = 2000.0
gpus_per_node = 4
scale_up_domain = 4
scale_up_gbs = 100.0
scale_out_gbs = 25.0
[gpu.peak_tflops]
bf16 = 500.0
"#;
        let p = Profiles::with_overrides(text, "mine.toml").unwrap();
        let h = p.get("H100").unwrap();
        assert_eq!(h.efficiency.scale_out, 0.5);
        assert_eq!(h.efficiency.scale_out_a2a, 0.25);
        // The two NIC efficiencies reach the fabric separately.
        assert_eq!(h.fabric().scale_out_bps, h.scale_out_gbs * 1e9 * 0.5);
        assert_eq!(h.fabric().scale_out_a2a_bps, h.scale_out_gbs * 1e9 * 0.25);
        assert_eq!(h.peak_tflops.bf16, 989.0, "fields not given stay");
        for nothing in ["", "# fitted later\n"] {
            let e = Profiles::with_overrides(nothing, "empty.toml").unwrap_err();
            assert!(e.starts_with("empty.toml sets nothing: a GPU profile has"), "{e}");
        }
        assert!(Profiles::with_overrides("[efficiency]\nmemory = 0.5\n", "eff.toml").is_ok(), "a file-level table alone sets something");
        let bad = Profiles::with_overrides("[[gpu]]\nname = \"h100\"\n[gpu.efficiency]\nscale_out_a2a = 0.0\n", "bad.toml");
        assert!(bad.unwrap_err().contains("efficiency.scale_out_a2a must be in [1e-6, 1]"));
        // A slipped unit is refused by name, printed short, not projected to a step of
        // hundreds of digits.
        for (field, text) in [("attention", "[gpu.efficiency]\nattention = 1e-300"), ("hbm_gbs", "hbm_gbs = 1e-300"), ("memory_gib", "memory_gib = 1e300"), ("tp_overlap", "[gpu.efficiency]\ntp_overlap = 1e300")] {
            let e = Profiles::with_overrides(&format!("[[gpu]]\nname = \"h100\"\n{text}\n"), "u.toml").unwrap_err();
            assert!(e.contains(field) && (e.contains("1e-300") || e.contains("1e300")) && e.len() < 200, "{e}");
        }
        let x = p.get("x1").unwrap();
        assert_eq!(x.efficiency.fitted, "prior", "a new GPU starts from the file-level defaults");
        // The straggler spread is a share of a step: a percentage typed as 2 is refused.
        assert_eq!(x.efficiency.straggler, 0.01);
        let e = Profiles::with_overrides("[[gpu]]\nname = \"h100\"\n[gpu.efficiency]\nstraggler = 2.0\n", "u.toml").unwrap_err();
        assert!(e.contains("efficiency.straggler must be in [0, 0.5], got 2"), "{e}");
        // Siblings name known GPUs: a typo is refused, not silently skipped by the fit.
        let e = Profiles::with_overrides("[[gpu]]\nname = \"b200\"\nsiblings = [\"GB20\"]\n", "u.toml").unwrap_err();
        assert!(e.contains("siblings names 'GB20'") && e.contains("B200"), "{e}");
        assert_eq!(Profiles::builtin().get("b200").unwrap().siblings[0], "GB200", "the same die first");
        // A new GPU needs a name to title its tables with.
        let nameless = text.split("\n[[gpu]]\n").nth(2).unwrap().replace("name = \"X1\"", "name = \" \"");
        let e = Profiles::with_overrides(&format!("[[gpu]]\n{nameless}"), "u.toml").unwrap_err();
        assert!(e.contains("name must be a visible GPU name"), "{e}");
    }

    /// The names clouds give the GPUs find them (GCP's accelerator types); SkyPilot's
    /// accelerator:count is refused with the type and the count apart, not "unknown GPU".
    #[test]
    fn gpus_by_the_names_clouds_give_them() {
        let p = Profiles::builtin();
        for (name, gpu) in [("nvidia-h100-80gb", "H100"), ("NVIDIA-H200-141GB", "H200"), ("nvidia-tesla-a100", "A100-40GB"), ("nvidia-a100-80gb", "A100-80GB"), ("nvidia-b200", "B200")] {
            assert_eq!(p.get(name).map(|g| g.name.as_str()), Ok(gpu), "{name}");
        }
        let e = p.get("H100:8").unwrap_err();
        assert!(e.contains("name the type alone (h100)") && e.contains("--gpus 8"), "{e}");
        let e = p.get("H100:x").unwrap_err();
        assert!(e.starts_with("unknown GPU 'H100:x'"), "{e}");
        let e = p.get("X9:8").unwrap_err();
        assert!(e.starts_with("unknown GPU 'X9:8'"), "{e}");
        // A known GPU's name and more: the nearest profile (by its longest name or alias),
        // what it describes, and both ways on; without a separator, the known names.
        let e = p.get("H100-80GB").unwrap_err();
        assert!(e.starts_with("unknown GPU 'H100-80GB'; the nearest profile is H100 (NVIDIA H100 SXM5 80 GB"), "{e}");
        assert!(e.ends_with("if that is the board, name it h100; if not, add yours with --profile FILE"), "{e}");
        assert!(p.get("h100-sxm5-94gb").unwrap_err().contains("the nearest profile is H100 ("));
        assert!(p.get("gb200-nvl4").unwrap_err().contains("the nearest profile is GB200 ("));
        let e = p.get("h1000").unwrap_err();
        assert!(e.starts_with("unknown GPU 'h1000'; known: a100-40gb,"), "{e}");
    }

    /// H800 is H100's die with NVLink cut from 450 to 200 GB/s a direction: everything
    /// else, the efficiencies included, is H100's.
    #[test]
    fn h800_is_h100_with_a_narrower_nvlink() {
        let p = Profiles::builtin();
        let (h100, h800) = (p.get("h100").unwrap(), p.get("nvidia-h800-80gb").unwrap());
        assert_eq!((h800.name.as_str(), h800.scale_up_gbs, h100.scale_up_gbs), ("H800", 200.0, 450.0));
        let rest = |g: &GpuProfile| {
            (g.hbm_gbs, g.gpus_per_node, g.scale_up_domain, g.scale_out_gbs, g.peak_flops(GemmFormat::Bf16), g.peak_flops(GemmFormat::Fp8))
        };
        assert_eq!(rest(h800), rest(h100));
        // H100's is what its device exposes (81,559 MiB); H800's, not checked, its datasheet's.
        assert_eq!((h100.memory_gib, h800.memory_gib), (79.65, 80.0));
        assert_eq!(h800.efficiency.gemm, h100.efficiency.gemm);
        assert_eq!(h800.efficiency.scale_out, h100.efficiency.scale_out);
        assert!(h800.efficiency.fitted.starts_with("H100's"), "{}", h800.efficiency.fitted);
    }

    /// H20 and GH200 are H100's die: H20 at about 15 % of its tensor-core rate with more
    /// and faster HBM in the same 8-GPU NVLink board; GH200 at its full rate with 96 GB
    /// of HBM3, in quad nodes whose four GPUs are linked all-to-all (150 GB/s a pair a
    /// direction, 450 in all) and each has its own 200 Gb/s NIC and NVLink-C2C to its
    /// Grace CPU. Both take H100's fitted efficiencies and say so.
    #[test]
    fn h20_and_gh200_are_h100s_die_in_their_own_nodes() {
        let p = Profiles::builtin();
        let h100 = p.get("h100").unwrap();
        let figures = |g: &GpuProfile| {
            (g.memory_gib, g.hbm_gbs, g.gpus_per_node, g.scale_up_domain, g.scale_up_gbs, g.scale_out_gbs, g.host_link_gbs, g.host_memory_gib)
        };
        let h20 = p.get("nvidia-h20").unwrap();
        assert_eq!(h20.name, "H20");
        assert_eq!(figures(h20), (96.0, 4000.0, 8, 8, 450.0, 50.0, Some(63.0), Some(256.0)));
        assert_eq!((h20.peak_tflops.bf16, h20.peak_tflops.fp8, h20.peak_tflops.mxfp8), (148.0, Some(296.0), None));
        let gh200 = p.get("gh200-120gb").unwrap();
        assert_eq!(gh200.name, "GH200");
        assert_eq!(figures(gh200), (96.0, 4000.0, 4, 4, 450.0, 25.0, Some(450.0), Some(111.0)));
        assert_eq!((gh200.peak_tflops.bf16, gh200.peak_tflops.fp8), (h100.peak_tflops.bf16, h100.peak_tflops.fp8));
        for g in [h20, gh200] {
            assert_eq!(g.efficiency_from.as_deref(), Some("H100"), "{}", g.name);
            assert_eq!(g.siblings, ["H100"], "{}", g.name);
            assert_eq!(g.efficiency, Efficiency { fitted: g.efficiency.fitted.clone(), ..h100.efficiency.clone() }, "{}", g.name);
            assert!(g.efficiency.fitted.starts_with("H100's"), "{}: {}", g.name, g.efficiency.fitted);
            assert!(g.description.contains("efficiency taken from H100"), "{}", g.description);
            assert!(g.sources.len() >= 4, "{}", g.name);
        }
        // The H20 with HBM3e and the GH200 with 144 GB are other boards: not aliases, and
        // named by the nearest profile.
        assert!(p.get("h20-3e").unwrap_err().contains("the nearest profile is H20 ("));
        assert!(p.get("gh200-144gb").unwrap_err().contains("the nearest profile is GH200 ("));
        // H200 is not H20.
        assert_eq!(p.get("h200").unwrap().name, "H200");
    }

    /// MI300X and MI355X, AMD's 8-GPU OAM boards, take H100's fitted table with their GEMMs
    /// scaled by each chip's best BF16 matmul as a share of this file's peak against H100's
    /// (one public benchmark on all three: 668.4 of 1,307.4, 1,565.0 of 2,516.6 and 794.5 of
    /// 989 TFLOP/s), the rest of the table as it is. Each GPU's seven Infinity Fabric links,
    /// one to each peer at 64 GB/s a direction, make 448 (MI355X's own link figure was not
    /// found: MI300X's). Found by OCI's names (`MI300X`, `MI355X`) and the usual spellings;
    /// no MXFP8 or NVFP4 peak.
    #[test]
    fn amd_boards_take_h100s_table_with_their_gemms_scaled() {
        let p = Profiles::builtin();
        let h100 = p.get("h100").unwrap();
        let figures = |g: &GpuProfile| {
            (g.memory_gib, g.hbm_gbs, g.gpus_per_node, g.scale_up_domain, g.scale_up_gbs, g.scale_out_gbs, g.host_link_gbs, g.host_memory_gib)
        };
        let amd = [
            (["MI300X", "mi300x", "instinct-mi300x", "AMD-MI300X", "mi300x-192gb"], (192.0, 5300.0, 8, 8, 448.0, 50.0, Some(63.0), Some(231.0)), (1307.4, 2614.9), 668.4 / 1307.4),
            (["MI355X", "mi355x", "instinct-mi355x", "amd-instinct-mi355x", "mi355x-288gb"], (288.0, 8000.0, 8, 8, 448.0, 50.0, Some(63.0), Some(384.0)), (2516.6, 5033.2), 1565.0 / 2516.6),
        ];
        for (names, figs, (bf16, fp8), share) in amd {
            let g = p.get(names[0]).unwrap();
            for n in names {
                assert_eq!(p.get(n).unwrap().name, g.name, "{n}");
                assert_eq!(p.taken_as(n), None, "{n}");
            }
            assert_eq!(figures(g), figs, "{}", g.name);
            assert_eq!((g.peak_tflops.bf16, g.peak_tflops.fp8), (bf16, Some(fp8)), "{}", g.name);
            let no_mxfp8 = g.peak_flops(GemmFormat::Mxfp8).unwrap_err();
            // CDNA 3 has no MX formats; CDNA 4 runs MXFP8, its rate unpublished.
            let want = if g.name == "MI355X" { "the MI355X profile has no mxfp8 rate: CDNA 4 runs MXFP8" } else { "MI300X has no mxfp8 tensor-core path" };
            assert!(no_mxfp8.starts_with(want), "{}: {no_mxfp8}", g.name);
            assert!(g.peak_flops(GemmFormat::Nvfp4).is_err(), "{}", g.name);
            assert!(!g.fp8_datapath_shared(), "{}", g.name);
            let r = g.gemm_from_ratio.unwrap();
            assert!((r - share / (794.5 / 989.0)).abs() < 1e-3, "{}: {r}", g.name);
            assert_eq!(g.efficiency.gemm.bf16, h100.efficiency.gemm.bf16 * r, "{}", g.name);
            assert_eq!(g.efficiency.gemm.fp8, h100.efficiency.gemm.fp8 * r, "{}", g.name);
            let rest = |e: &Efficiency| Efficiency { gemm: h100.efficiency.gemm.clone(), fitted: String::new(), ..e.clone() };
            assert_eq!(rest(&g.efficiency), rest(&h100.efficiency), "{}", g.name);
            assert!(g.efficiency.fitted.starts_with(&format!("H100's, GEMMs x{r}: runner calibrate")), "{}: {}", g.name, g.efficiency.fitted);
            assert!(g.description.contains("efficiency taken from H100"), "{}", g.description);
            assert!(g.siblings.is_empty() && g.sources.len() >= 6, "{}", g.name);
        }
        // The MI300A (an APU), the MI325X and the MI350X (other boards and peaks) are not
        // taken for them.
        for other in ["mi300a", "mi300", "mi325x", "mi350x"] {
            assert!(p.get(other).unwrap_err().starts_with(&format!("unknown GPU '{other}'; known: ")), "{other}");
        }
    }

    /// An alias that begins another GPU's name is said as a choice; one that does not
    /// (`nvidia-h20`, beside H200's `nvidia-h200-141gb`, is no prefix up to a dash), or a
    /// full name, is not.
    #[test]
    fn an_alias_shared_by_two_boards_is_said_as_a_choice() {
        let p = Profiles::builtin();
        for a100 in ["a100", " A100 "] {
            assert_eq!(p.taken_as(a100).as_deref(), Some("--gpu a100 taken as A100-80GB; --gpu a100-40gb for the A100-40GB"), "{a100:?}");
        }
        for plain in ["h100", "h20", "nvidia-h20", "a100-80gb", "A100-40GB", "gh200", "nvidia-tesla-a100", "nonsense"] {
            assert_eq!(p.taken_as(plain), None, "{plain}");
        }
    }

    #[test]
    fn fitted_tables_are_merged_and_h200_takes_h100s() {
        let p = Profiles::builtin();
        let h100 = p.get("h100").unwrap();
        assert!(h100.efficiency.fitted.starts_with("runner calibrate"), "{}", h100.efficiency.fitted);
        let h200 = p.get("h200").unwrap();
        assert_eq!(h200.efficiency.gemm, h100.efficiency.gemm);
        assert!(h200.efficiency.fitted.starts_with("H100's"), "{}", h200.efficiency.fitted);
        // The A100s take H100's too (docs/VALIDATION.md, the A100 runs of other stacks),
        // their GEMMs scaled by gemm_from_ratio (capped at 1), the rest as it is.
        for a100 in ["a100", "a100-40gb"] {
            let g = p.get(a100).unwrap();
            let r = g.gemm_from_ratio.unwrap();
            assert!((r - 0.869 / 0.803).abs() < 1e-3, "{a100}: {r}");
            assert_eq!(g.efficiency.gemm.bf16, (h100.efficiency.gemm.bf16 * r).min(1.0), "{a100}");
            assert_eq!(g.efficiency.gemm.fp8, (h100.efficiency.gemm.fp8 * r).min(1.0), "{a100}");
            let rest = |e: &Efficiency| Efficiency { gemm: h100.efficiency.gemm.clone(), fitted: String::new(), ..e.clone() };
            assert_eq!(rest(&g.efficiency), rest(&h100.efficiency), "{a100}");
            assert!(g.efficiency.fitted.starts_with(&format!("H100's, GEMMs x{r}: runner calibrate")), "{a100}: {}", g.efficiency.fitted);
        }
        // The ratio scales only a table taken, within sane bounds.
        let bad = |toml: &str, want: &str| {
            let e = Profiles::with_overrides(toml, "u.toml").unwrap_err();
            assert!(e.contains(want), "want '{want}': {e}");
        };
        bad("[[gpu]]\nname = \"h100\"\ngemm_from_ratio = 1.1\n", "give efficiency_from too");
        bad("[[gpu]]\nname = \"a100\"\ngemm_from_ratio = 40.0\n", "between 0.25 and 4");
        // A user's own table for H200 wins over efficiency_from.
        let q = Profiles::with_overrides("[[gpu]]\nname = \"h200\"\n[gpu.efficiency]\nmemory = 0.5\n", "u.toml").unwrap();
        assert_eq!(q.get("h200").unwrap().efficiency.memory, 0.5);
        assert_eq!(q.get("h200").unwrap().efficiency.gemm, p.get("h200").unwrap().efficiency.gemm);
        // A [[gpu]] named by an alias overrides that GPU; it adds none.
        let q = Profiles::with_overrides("[[gpu]]\nname = \"nvidia-h100-80gb\"\n[gpu.efficiency]\nmemory = 0.5\n", "u.toml").unwrap();
        assert_eq!(q.get("h100").unwrap().efficiency.memory, 0.5);
        assert_eq!(q.gpus.len(), p.gpus.len());
    }

    /// What `runner calibrate` writes for a GPU holds the parameters it fitted and the
    /// label, nothing else, so the rest stays the profile's; FP8's shared fit writes both
    /// FP8 efficiencies.
    #[test]
    fn efficiency_only_keeps_the_named_parameters_and_the_label() {
        let e = test_h100().efficiency;
        let keys = |t: &toml::Table| t.keys().cloned().collect::<Vec<_>>();
        let t = Profiles::efficiency_only(&e, &["gemm.fp8+mxfp8".into(), "attention".into()]);
        assert_eq!(keys(&t), ["attention", "fitted", "gemm"]);
        let gemm = t["gemm"].as_table().unwrap();
        assert_eq!(keys(gemm), ["fp8", "mxfp8"]);
        assert_eq!((gemm["fp8"].as_float(), gemm["mxfp8"].as_float()), (Some(e.gemm.fp8), Some(e.gemm.mxfp8)));
        assert_eq!((t["attention"].as_float(), t["fitted"].as_str()), (Some(e.attention), Some(e.fitted.as_str())));
        let t = Profiles::efficiency_only(&e, &["gemm.bf16".into(), "scale_out_a2a".into()]);
        assert_eq!(keys(&t), ["fitted", "gemm", "scale_out_a2a"]);
        assert_eq!(keys(t["gemm"].as_table().unwrap()), ["bf16"]);
    }

    /// Each format reads and writes its own peak and efficiency, and stores its operands
    /// in its own bytes per element, block scales included: BF16 2, FP8 1, MXFP8 1 + 1/32
    /// (an E8M0 scale per 32 elements), NVFP4 1/2 + 1/16 (an E4M3 scale per 16).
    #[test]
    fn each_format_has_its_own_peak_efficiency_and_bytes() {
        let bytes: Vec<f64> = GemmFormat::ALL.iter().map(|f| f.element_bytes()).collect();
        assert_eq!(bytes, [2.0, 1.0, 1.03125, 0.5625]);
        let peaks = Peaks { bf16: 1.0, fp8: Some(2.0), mxfp8: Some(3.0), nvfp4: Some(4.0) };
        let mut e = GemmEfficiency { bf16: 0.0, fp8: 0.0, mxfp8: 0.0, nvfp4: 0.0 };
        for (f, v) in GemmFormat::ALL.into_iter().zip([0.1, 0.2, 0.3, 0.4]) {
            e.set(f, v);
        }
        assert_eq!(e, GemmEfficiency { bf16: 0.1, fp8: 0.2, mxfp8: 0.3, nvfp4: 0.4 });
        for (f, (peak, eff)) in GemmFormat::ALL.into_iter().zip([(1.0, 0.1), (2.0, 0.2), (3.0, 0.3), (4.0, 0.4)]) {
            assert_eq!((peaks.get(f), e.get(f)), (Some(peak), eff), "{f}");
        }
    }

    /// The HGX/DGX boards reach their NICs and the host through one PCIe link a GPU
    /// (`nic_shares_host_link`); Grace boards reach the host over NVLink-C2C, a link of its
    /// own, and AMD's boards are not checked: neither says so. A profile that says so
    /// without a host link is refused by name, and `--profile` sets it like any field.
    #[test]
    fn the_nic_shares_the_host_link_on_pcie_boards_only() {
        let p = Profiles::builtin();
        let shared: Vec<&str> = p.gpus.iter().filter(|g| g.nic_shares_host_link).map(|g| g.name.as_str()).collect();
        assert_eq!(shared, ["A100-40GB", "A100-80GB", "H100", "H200", "H800", "H20", "B200", "B300"]);
        let mut g = test_h100();
        g.host_link_gbs = None;
        let e = g.check().unwrap_err();
        assert!(e.contains("nic_shares_host_link") && e.contains("host_link_gbs"), "{e}");
        g.nic_shares_host_link = false;
        assert_eq!(g.check(), Ok(()));
        let over = Profiles::with_overrides("[[gpu]]\nname = \"H100\"\nnic_shares_host_link = false\n", "test.toml").unwrap();
        assert!(!over.get("h100").unwrap().nic_shares_host_link);
        assert!(Profiles::with_overrides("[[gpu]]\nname = \"H100\"\nnic_shares_host_link = 1\n", "test.toml").is_err());
    }

    /// One efficiency serves per-tensor FP8 and MXFP8 only where both run at one peak
    /// (Blackwell); Hopper runs FP8 and no MXFP8, Ampere neither.
    #[test]
    fn fp8_and_mxfp8_share_an_efficiency_only_at_one_peak() {
        let p = Profiles::builtin();
        assert!(p.get("b200").unwrap().fp8_datapath_shared());
        assert!(!p.get("h100").unwrap().fp8_datapath_shared());
        assert!(!p.get("a100-80gb").unwrap().fp8_datapath_shared());
    }

    /// What the model may use: the card's GiB less the reserved GiB, 2^30 bytes each.
    #[test]
    fn usable_memory_is_the_card_less_the_reserve_in_gib() {
        let mut g = test_h100();
        g.memory_gib = 80.0;
        g.efficiency.reserved_gib = 4.5;
        assert_eq!(g.usable_bytes(), 81_067_507_712.0);
    }

    /// Every number a profile gives is checked against its range, NaN and infinity
    /// included, and the message names the field; the counts must divide one another
    /// either way round.
    #[test]
    fn every_field_out_of_its_range_is_refused_by_name() {
        type Set = fn(&mut GpuProfile, f64);
        let cases: [(&str, Set, f64); 26] = [
            ("memory_gib", |g, v| g.memory_gib = v, f64::INFINITY),
            ("hbm_gbs", |g, v| g.hbm_gbs = v, f64::NAN),
            ("scale_up_gbs", |g, v| g.scale_up_gbs = v, 0.0),
            ("scale_out_gbs", |g, v| g.scale_out_gbs = v, 0.0),
            ("peak_tflops.bf16", |g, v| g.peak_tflops.bf16 = v, 0.0),
            ("efficiency.gemm_half_gflop", |g, v| g.efficiency.gemm_half_gflop = v, 0.0),
            ("host_link_gbs", |g, v| g.host_link_gbs = Some(v), 0.0),
            ("host_memory_gib", |g, v| g.host_memory_gib = Some(v), 1e300),
            ("peak_tflops.fp8", |g, v| g.peak_tflops.fp8 = Some(v), f64::NAN),
            ("peak_tflops.mxfp8", |g, v| g.peak_tflops.mxfp8 = Some(v), 1e300),
            ("peak_tflops.nvfp4", |g, v| g.peak_tflops.nvfp4 = Some(v), -1.0),
            ("efficiency.gemm.nvfp4", |g, v| g.efficiency.gemm.nvfp4 = v, 0.0),
            ("efficiency.attention_backward", |g, v| g.efficiency.attention_backward = v, f64::NAN),
            ("efficiency.ssm", |g, v| g.efficiency.ssm = v, 0.0),
            ("efficiency.grouped_gemm", |g, v| g.efficiency.grouped_gemm = v, 1.5),
            ("efficiency.scale_up", |g, v| g.efficiency.scale_up = v, 2.0),
            ("efficiency.tp_overlap", |g, v| g.efficiency.tp_overlap = v, 1.5),
            ("efficiency.cp_overlap", |g, v| g.efficiency.cp_overlap = v, -0.1),
            ("efficiency.ep_overlap", |g, v| g.efficiency.ep_overlap = v, f64::NAN),
            ("efficiency.pp_overlap", |g, v| g.efficiency.pp_overlap = v, 1.01),
            ("efficiency.allocator_slack", |g, v| g.efficiency.allocator_slack = v, f64::NAN),
            ("efficiency.scale_up_latency_us", |g, v| g.efficiency.scale_up_latency_us = v, f64::INFINITY),
            ("efficiency.scale_out_latency_us", |g, v| g.efficiency.scale_out_latency_us = v, -1.0),
            ("efficiency.reserved_gib", |g, v| g.efficiency.reserved_gib = v, -1.0),
            ("efficiency.reserved_gib", |g, v| g.efficiency.reserved_gib = v, 80.0),
            ("efficiency.straggler", |g, v| g.efficiency.straggler = v, 0.6),
        ];
        let mut h = test_h100();
        h.memory_gib = 80.0;
        assert_eq!(h.check(), Ok(()));
        for (field, set, bad) in cases {
            let mut g = h.clone();
            set(&mut g, bad);
            let e = g.check().unwrap_err();
            assert!(e.contains(field), "{field} = {bad}: {e}");
        }
        let counts = |gpus_per_node: u32, scale_up_domain: u32| GpuProfile { gpus_per_node, scale_up_domain, ..h.clone() }.check();
        assert_eq!(counts(8, 12), Err("scale_up_domain (12) and gpus_per_node (8) must divide one another".into()));
        assert_eq!(counts(8, 4), Ok(()), "a domain of half a node");
        assert_eq!(counts(4, 72), Ok(()));
        assert!(counts(0, 8).unwrap_err().contains("gpus_per_node must be in 1..=1048576"));
        assert!(counts(1, 1 << 21).unwrap_err().contains("scale_up_domain must be in 1..=1048576"));
        let mut g = h.clone();
        g.name = "H100\u{1b}[2J".into();
        assert!(g.check().unwrap_err().contains("visible GPU name"));
    }

    /// The lower bound of the memory range, with no reserve to refuse it first; and the
    /// `unrated` table's three rules: a format's name, no rate given beside it, a reason.
    #[test]
    fn a_tiny_memory_and_bad_unrated_entries_are_refused_by_name() {
        let mut h = test_h100();
        h.efficiency.reserved_gib = 0.0;
        h.memory_gib = 0.05;
        let e = h.check().unwrap_err();
        assert!(e.starts_with("memory_gib must be between 0.1"), "{e}");
        h.memory_gib = 0.1;
        assert_eq!(h.check(), Ok(()));
        h.peak_tflops.nvfp4 = None;
        let unrated = |f: &str, why: &str| {
            let mut g = h.clone();
            g.unrated.insert(f.into(), why.into());
            g.check()
        };
        assert_eq!(unrated("nvfp4", "no public figure"), Ok(()));
        assert_eq!(unrated("bf16", "no public figure"), Err("unrated.bf16: peak_tflops.bf16 gives its rate; drop one of the two".into()));
        assert_eq!(unrated("nvfp4", "  "), Err("unrated.nvfp4: say why the rate is left out".into()));
        assert!(unrated("fp4", "x").unwrap_err().contains("not a GEMM format"));
        // A NIC of 2 PB/s is a unit slip.
        let mut g = test_h100();
        g.scale_out_gbs = 2e6;
        assert!(g.check().unwrap_err().starts_with("scale_out_gbs must be between 0.001 and 1e6"));
    }

    /// A GPU that takes another's table with its GEMMs scaled keeps them at most 1 (the
    /// ratio's largest, 4, over H100's); and a label that already names the GPU taken
    /// from is not named twice.
    #[test]
    fn a_taken_table_is_capped_at_1_and_labelled_once() {
        let p = Profiles::with_overrides("[[gpu]]\nname = \"a100-80gb\"\ngemm_from_ratio = 4.0\n", "f.toml").unwrap();
        let g = &p.get("a100-80gb").unwrap().efficiency.gemm;
        assert_eq!((g.bf16, g.fp8, g.mxfp8, g.nvfp4), (1.0, 1.0, 1.0, 1.0));
        let p = Profiles::with_overrides("[[gpu]]\nname = \"h100\"\n[gpu.efficiency]\nfitted = \"H100's own re-fit\"\n", "f.toml").unwrap();
        assert_eq!(p.get("h200").unwrap().efficiency.fitted, "H100's own re-fit");
    }

    #[test]
    fn bad_files_name_the_field() {
        let e = Profiles::with_overrides("[[gpu]]\nname = \"h100\"\n[gpu.efficiency]\nmemory = 1.5\n", "f.toml").unwrap_err();
        assert!(e.contains("f.toml") && e.contains("H100") && e.contains("efficiency.memory"), "{e}");
        let e = Profiles::with_overrides("[[gpu]]\nname = \"new\"\nmemory_gib = 1.0\n", "f.toml").unwrap_err();
        assert!(e.contains("GPU 'new'") && e.contains("missing field"), "{e}");
        let e = Profiles::with_overrides("[[gpu]]\nname = \"h100\"\nscale_up_domain = 0\n", "f.toml").unwrap_err();
        assert!(e.contains("scale_up_domain"), "{e}");
        let e = Profiles::with_overrides("[[gpu]]\nname = \"h100\"\nbogus = 1\n", "f.toml").unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        let e = Profiles::with_overrides("[[gpu]\n", "f.toml").unwrap_err();
        assert!(e.contains("f.toml"), "{e}");
    }
}
