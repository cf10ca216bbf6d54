//! The executor's side of precision plans: quantised copies of each linear's and grouped
//! (expert) linear's operands as its site plan says (forward, input gradient, weight
//! gradient each with their own), the delayed-scaling amax histories, the step's
//! numerics, fault injection, and the snapshots a rollback restores.
//!
//! A GEMM site without a plan runs as before (f32). With one, every operand is copied,
//! quantised and dequantised on the device (`Device::quantize`), the GEMM runs on the
//! copies with f32 accumulation, and its result is rounded to the plan's output format.
//! What each quantisation did is merged per (op, role, operand) until
//! [`Executor::end_precision_step`] moves the amaxes into the histories. On the native
//! FP8 route (a linear or grouped linear whose operands are both per-tensor FP8, on a
//! device with FP8 GEMMs) each operand is instead cast straight to FP8 codes in one pass
//! (`Device::quantize_fp8_codes`; a grouped linear's weights one tensor per expert),
//! which holds the same values and reports the same.
//!
//! A grouped linear (MoE experts: X (rows, k) sorted by expert, W (E, n, k)) is quantised
//! as Transformer Engine's grouped GEMM is: the weights expert by expert (TE keeps one FP8
//! weight tensor per expert), so each expert's matrix has its own scale or block grid; the
//! dispatched activations and gradients as one tensor (one per-tensor scale over all
//! experts' rows, as TE's grouped linear does for its input), except where a block spans
//! rows or a Hadamard transform mixes rows (the weight-gradient inputs, whose reduction
//! axis is the tokens): there each expert's rows are quantised alone, so no block and no
//! transform mixes two experts' tokens. The statistics of all experts merge into the op's
//! (op, role, operand) entry, and the delayed-scaling history is that entry's too: one
//! history per op shared by its experts. Per-expert histories would give each expert a
//! scale from its own past amaxes, but the policy sees one figure per (op, role, operand)
//! either way, and a shared history's scale (from the largest expert amax) never
//! saturates an expert on the step after another one grew; an expert whose weights are
//! far smaller than the others' loses resolution to it (a current or block recipe scales
//! each expert alone).

use std::collections::{HashMap, VecDeque};

use runner_graph::{OpKind, TensorId};
use runner_kernels::cpu::quant::{QuantSpec, tensor_scale};

use super::Executor;
use crate::device::{Device, DeviceBuffer, Elem, ExecError, ExpertWeights};
use crate::precision::{
    AmaxReduction, Fault, FaultKind, GemmRole, Operand, OperandNumerics, OperandPlan, Scaling, SiteNumerics, SitePlan,
};

/// A GEMM operand: (op, role, operand).
pub(super) type Key = (usize, GemmRole, Operand);

/// Quantised GEMM inputs (A, B) and the format of the GEMM's result.
pub(super) type Operands<B> = (B, Quantised<B>, runner_graph::DType);

/// A quantised GEMM input: one tensor, or (a grouped linear's weights on the native FP8
/// route) one FP8 tensor per expert, each with its own scale.
pub(super) enum Quantised<B> {
    One(B),
    PerExpert(Vec<B>),
}

impl<B: DeviceBuffer> Quantised<B> {
    /// As a grouped GEMM reads it as its weights.
    pub(super) fn experts(&self) -> ExpertWeights<'_, B> {
        match self {
            Quantised::One(b) => ExpertWeights::Stacked(b),
            Quantised::PerExpert(bs) => ExpertWeights::Each(bs),
        }
    }
    /// The one tensor (`None`: per expert).
    pub(super) fn one(&self) -> Option<&B> {
        match self {
            Quantised::One(b) => Some(b),
            Quantised::PerExpert(_) => None,
        }
    }
}

/// Plans, histories and this step's numerics.
#[derive(Clone, Debug, Default)]
pub(super) struct QuantState {
    pub(super) sites: HashMap<(usize, GemmRole), SitePlan>,
    history: HashMap<Key, VecDeque<f32>>,
    step: HashMap<Key, OperandNumerics>,
    faults: Vec<(usize, Fault)>,
    /// Quantisations so far: the stochastic-rounding seed of the next one.
    draws: u64,
    /// Off while a recompute re-runs forward ops (their operands were counted once).
    pub(super) quiet: bool,
    /// Per-tensor FP8 operands of linears go to the device's FP8 GEMM as codes.
    pub(super) native: bool,
    /// GEMMs that ran on FP8 codes so far.
    pub(super) native_gemms: u64,
    /// Of those operands, the ones cast by the norm or activation that produced them.
    fused_casts: u64,
    /// The one op reading each tensor (`None`: none, or several).
    reader: Vec<Option<usize>>,
}

impl QuantState {
    /// No plans yet; `native`: per-tensor FP8 operands go to FP8 GEMMs as codes.
    pub(super) fn new(native: bool, g: &runner_graph::Graph) -> QuantState {
        let mut reads = vec![(0u32, 0usize); g.tensors.len()];
        for (oi, op) in g.ops.iter().enumerate() {
            for &t in &op.inputs {
                if let Some(r) = reads.get_mut(t) {
                    *r = (r.0.saturating_add(1), oi);
                }
            }
        }
        let reader = reads.into_iter().map(|(n, oi)| (n == 1).then_some(oi)).collect();
        QuantState { native, reader, ..QuantState::default() }
    }
}

/// FP8 codes of a tensor, cast by the RMSNorm or activation that produced it (a fused
/// norm / activation + cast), with what the cast did, until the GEMM operand `key` reads
/// them.
pub(super) struct Cast<B, S> {
    pub(super) tensor: TensorId,
    pub(super) key: Key,
    pub(super) codes: B,
    pub(super) stats: S,
}

/// The quantised operands of a linear's (or grouped linear's) backward GEMMs.
pub(super) struct LinearBackward<B> {
    /// (dY, W) quantised for dX, and dX's format.
    pub(super) dgrad: Option<Operands<B>>,
    /// (dY, X) quantised (Hadamard-transformed when planned) for dW, and dW's format.
    pub(super) wgrad: Option<(B, B, runner_graph::DType)>,
}

/// One operand of a GEMM: value (`grad: false`) or gradient `id`, seen as (rows, cols).
#[derive(Clone, Copy)]
pub(super) struct Side {
    id: TensorId,
    grad: bool,
    rows: usize,
    cols: usize,
    operand: Operand,
}

/// The state a rollback restores: weights, AdamW moments, Muon's momentum and the
/// step, and the amax histories (resuming without them is not deterministic: TE#759).
#[derive(Clone, Debug)]
pub struct Snapshot {
    weights: Vec<(TensorId, Vec<f32>)>,
    moments: Vec<(TensorId, Vec<f32>, Vec<f32>)>,
    momentum: Vec<(TensorId, Vec<f32>)>,
    /// Which optimizer's state it holds (restored into an executor of another, a
    /// matrix's state would be left as it was).
    optimizer: &'static str,
    adam_step: u32,
    history: HashMap<Key, VecDeque<f32>>,
}

impl Snapshot {
    /// Bytes held (4 per value).
    pub fn bytes(&self) -> usize {
        4 * (self.weights.iter().map(|w| w.1.len()).sum::<usize>()
            + self.moments.iter().map(|m| m.1.len() + m.2.len()).sum::<usize>()
            + self.momentum.iter().map(|m| m.1.len()).sum::<usize>())
    }
}

fn plan_key_ok(p: &OperandPlan, role: GemmRole, operand: Operand) -> Result<(), String> {
    p.spec(Some(1.0), 0)?;
    if p.hadamard != 0 {
        if role != GemmRole::WeightGradient || operand == Operand::Weight {
            return Err("a Hadamard transform applies to the weight-gradient GEMM's inputs only".into());
        }
        if !p.hadamard.is_power_of_two() || p.hadamard > 256 {
            return Err(format!("Hadamard size {} is not a power of two up to 256", p.hadamard));
        }
    }
    if !matches!(p.format, runner_graph::DType::F32 | runner_graph::DType::BF16 | runner_graph::DType::F16)
        && !p.is_low_precision()
    {
        return Err(format!("{} is not an operand format", p.format.name()));
    }
    Ok(())
}

impl<D: Device> Executor<D> {
    /// Run the linear and grouped (expert) linear ops named in `plans` with their operands
    /// quantised per role as the plans say; every other GEMM stays f32. Replaces the previous plans. The amax
    /// history of an operand whose format or scaling changes is forgotten, so its first
    /// step under the new plan takes its scale from its own amax.
    ///
    /// # Errors
    /// An unknown op, a low-precision plan for an op that is not a GEMM (linear or grouped
    /// linear), or a plan the executor cannot run (a Hadamard transform anywhere
    /// but on both inputs of a weight-gradient GEMM, a format without its scaling); the
    /// previous plans stay.
    pub fn set_precision(&mut self, plans: &[(String, GemmRole, SitePlan)]) -> Result<(), ExecError> {
        let mut sites = HashMap::new();
        for (name, role, plan) in plans {
            let oi = self
                .graph
                .ops
                .iter()
                .position(|o| &o.name == name)
                .ok_or_else(|| ExecError::Input(format!("precision plan for '{name}': the graph has no such op")))?;
            if !matches!(self.graph.ops[oi].kind, OpKind::Linear | OpKind::GroupedLinear) {
                let low = Operand::ALL.iter().any(|o| plan.operand(*o).is_low_precision());
                if low {
                    return Err(ExecError::Input(format!(
                        "precision plan for '{name}' ({:?}): only GEMMs (linear and grouped expert linear layers) run \
                         quantised",
                        self.graph.ops[oi].kind
                    )));
                }
                continue;
            }
            for o in Operand::ALL {
                plan_key_ok(plan.operand(o), *role, o)
                    .map_err(|m| ExecError::Input(format!("precision plan for '{name}' ({role:?}, {o:?}): {m}")))?;
            }
            if *role == GemmRole::WeightGradient && plan.gradient.hadamard != plan.activation.hadamard {
                return Err(ExecError::Input(format!(
                    "precision plan for '{name}': a Hadamard transform must be applied to both inputs of the \
                     weight-gradient GEMM alike (gradient {}, activation {})",
                    plan.gradient.hadamard, plan.activation.hadamard
                )));
            }
            if !matches!(plan.output, runner_graph::DType::F32 | runner_graph::DType::BF16 | runner_graph::DType::F16 | runner_graph::DType::Fp8E4M3 | runner_graph::DType::Fp8E5M2) {
                return Err(ExecError::Input(format!(
                    "precision plan for '{name}': output format {} (use f32, bf16, f16 or an FP8 format)",
                    plan.output.name()
                )));
            }
            sites.insert((oi, *role), *plan);
        }
        let old = std::mem::take(&mut self.quant.sites);
        self.quant.history.retain(|(oi, role, o), _| {
            match (old.get(&(*oi, *role)), sites.get(&(*oi, *role))) {
                (Some(a), Some(b)) => {
                    let (a, b) = (a.operand(*o), b.operand(*o));
                    a.format == b.format && std::mem::discriminant(&a.scaling) == std::mem::discriminant(&b.scaling)
                }
                _ => false,
            }
        });
        self.quant.sites = sites;
        Ok(())
    }

    /// The plan of op `oi`'s GEMM of `role`, if it has one.
    pub fn site_plan(&self, oi: usize, role: GemmRole) -> Option<&SitePlan> {
        self.quant.sites.get(&(oi, role))
    }

    /// What quantisation did to every planned operand since the last
    /// [`Executor::end_precision_step`], sorted by op, role and operand.
    pub fn precision_numerics(&self) -> Vec<SiteNumerics> {
        let mut v: Vec<SiteNumerics> = self
            .quant
            .step
            .iter()
            .map(|(&(op, role, operand), n)| SiteNumerics {
                op,
                name: self.graph.ops[op].name.clone(),
                layer: self.graph.ops[op].layer,
                role,
                operand,
                numerics: *n,
            })
            .collect();
        v.sort_by_key(|s| (s.op, s.role, s.operand));
        v
    }

    /// Close a training step for the precision plans: each delayed-scaled operand's amax
    /// of this step enters its history (the oldest leaves) unless it is 0 or not finite
    /// (its scale then stays the previous one, as Transformer Engine keeps it), and the step's numerics are
    /// cleared. Call once per step, whether or not the update was applied: the amax
    /// was seen (Transformer Engine rotates its histories every step).
    pub fn end_precision_step(&mut self) {
        let q = &mut self.quant;
        for (key, n) in q.step.drain() {
            let Some(plan) = q.sites.get(&(key.0, key.1)) else { continue };
            if let Scaling::Delayed { history, .. } = plan.operand(key.2).scaling {
                let h = q.history.entry(key).or_default();
                // Transformer Engine keeps the previous scale when the amax is 0 or not
                // finite; leaving such an amax out of the history does that (the newest
                // entry stays the one the previous scale came from), and a NaN step does
                // not poison the history for its length. An amax of 0 entered as such
                // gave scale 1 next step under most-recent: a small tensor's values all
                // flushed to zero.
                if n.amax.is_finite() && n.amax > 0.0 {
                    h.push_front(n.amax);
                }
                h.truncate(history.max(1) as usize);
            }
        }
    }

    /// Drop the numerics gathered since the last step without touching the histories (an
    /// evaluation pass between training steps).
    pub fn discard_precision_step(&mut self) {
        self.quant_stats.clear();
        self.quant.step.clear();
    }

    /// Read the statistics of the pass's quantisations from the device, waiting for it
    /// once, and merge them into the step's numerics (the end of each forward and
    /// backward pass).
    pub(super) fn settle_quant(&mut self) -> Result<(), ExecError> {
        if self.quant_stats.is_empty() {
            return Ok(());
        }
        let (keys, stats): (Vec<Key>, Vec<D::QuantStats>) = std::mem::take(&mut self.quant_stats).into_iter().unzip();
        for (key, r) in keys.into_iter().zip(self.device.read_quant(stats)?) {
            self.quant.step.entry(key).or_default().merge(&r);
        }
        Ok(())
    }

    /// Forget the amax histories of op `oi`'s GEMMs of `roles` (all when empty): their
    /// next step takes the scale from its own amax.
    pub fn reset_amax(&mut self, oi: usize, roles: &[GemmRole]) {
        self.quant.history.retain(|(o, r, _), _| !(*o == oi && (roles.is_empty() || roles.contains(r))));
    }

    /// Inject `fault` into the named operand the next time it is quantised.
    ///
    /// # Errors
    /// The op is not a GEMM (linear or grouped linear) with a plan for that role.
    pub fn inject(&mut self, fault: Fault) -> Result<(), ExecError> {
        let oi = self
            .graph
            .ops
            .iter()
            .position(|o| o.name == fault.op)
            .filter(|oi| self.quant.sites.contains_key(&(*oi, fault.role)))
            .ok_or_else(|| ExecError::Input(format!("fault: '{}' ({:?}) is not a planned GEMM site", fault.op, fault.role)))?;
        self.quant.faults.push((oi, fault));
        Ok(())
    }

    /// The delayed scale of an operand from its history (`None`: empty history).
    fn delayed_scale(&self, key: Key, plan: &OperandPlan) -> Option<f32> {
        let Scaling::Delayed { reduction, margin, .. } = plan.scaling else { return None };
        let h = self.quant.history.get(&key).filter(|h| !h.is_empty())?;
        let amax = match reduction {
            AmaxReduction::MostRecent => h[0],
            AmaxReduction::Max => h.iter().copied().fold(0.0, f32::max),
        };
        let f = match plan.format {
            runner_graph::DType::Fp8E5M2 => runner_kernels::cpu::quant::Format::E5M2,
            _ => runner_kernels::cpu::quant::Format::E4M3,
        };
        Some(tensor_scale(amax, f, margin))
    }

    /// A quantised copy of `src` (rows x cols) as operand `key.2` of op `key.0`'s GEMM of
    /// role `key.1`, recording what the quantisation did. `groups`: row offsets (from 0 to
    /// `rows`) of ranges quantised each alone (a grouped linear's experts), `None`: the
    /// whole tensor at once. A planned Hadamard transform (the weight-gradient inputs)
    /// runs along the rows of each range first.
    pub(super) fn quantised(
        &mut self,
        src: &D::Buffer,
        rows: usize,
        cols: usize,
        key: Key,
        plan: &OperandPlan,
        groups: Option<&[usize]>,
    ) -> Result<D::Buffer, ExecError> {
        let (oi, role, o) = key;
        let mut x = self.device.alloc(Elem::F32, src.len())?;
        self.device.copy(&mut x, 0, src, 0, src.len())?;
        if let Some(i) = self.quant.faults.iter().position(|(f, fl)| *f == oi && fl.role == role && fl.operand == o) {
            let (_, fault) = self.quant.faults.remove(i);
            let mut host = self.device.read_f32(&x)?;
            if let Some(at) = (0..host.len()).max_by(|&a, &b| host[a].abs().total_cmp(&host[b].abs())) {
                host[at] = match fault.kind {
                    FaultKind::Outlier(f) => host[at] * f,
                    FaultKind::Nan => f32::NAN,
                };
            }
            self.device.write_f32(&mut x, &host)?;
        }
        let Some(groups) = groups else {
            self.quantise_rows(&mut x, rows, cols, key, plan)?;
            return Ok(x);
        };
        if groups.first() != Some(&0) || groups.last() != Some(&rows) || groups.windows(2).any(|w| w[1] < w[0]) {
            return Err(ExecError::State(format!(
                "operation '{}': row groups {groups:?} do not cover its {rows} rows",
                self.graph.ops[oi].name
            )));
        }
        // An expert without rows has nothing to quantise (and no scale to take).
        for w in groups.windows(2).filter(|w| w[1] > w[0]) {
            let len = (w[1] - w[0]) * cols;
            let mut part = self.device.alloc(Elem::F32, len)?;
            self.device.copy(&mut part, 0, &x, w[0] * cols, len)?;
            self.quantise_rows(&mut part, w[1] - w[0], cols, key, plan)?;
            self.device.copy(&mut x, w[0] * cols, &part, 0, len)?;
        }
        Ok(x)
    }

    /// Transform (when planned) and quantise `x` (rows x cols) in place as operand `key`,
    /// merging the report into the step's numerics.
    fn quantise_rows(&mut self, x: &mut D::Buffer, rows: usize, cols: usize, key: Key, plan: &OperandPlan) -> Result<(), ExecError> {
        let oi = key.0;
        if plan.hadamard > 1 {
            // One sign pattern per step and site, shared by both operands of the GEMM.
            let seed = ((oi as u64) << 32) ^ u64::from(self.adam_step);
            self.device.hadamard_rows(x, rows, cols, plan.hadamard as usize, seed)?;
        }
        let spec = self.next_spec(key, plan)?;
        let stats = self.device.quantize(x, rows, cols, &spec)?;
        self.keep_stats(key, stats);
        Ok(())
    }

    /// The spec of operand `key`'s next quantisation under `plan` (its delayed scale, or
    /// its current one), taking the next stochastic-rounding draw.
    fn next_spec(&mut self, key: Key, plan: &OperandPlan) -> Result<QuantSpec, ExecError> {
        let spec = plan
            .spec(self.delayed_scale(key, plan), self.quant.draws)
            .map_err(|m| ExecError::Input(format!("precision plan of '{}': {m}", self.graph.ops[key.0].name)))?;
        self.quant.draws += 1;
        Ok(spec)
    }

    /// Keep what a quantisation of operand `key` did for the pass's numerics (not while a
    /// recompute repeats it).
    fn keep_stats(&mut self, key: Key, stats: D::QuantStats) {
        if !self.quant.quiet {
            self.quant_stats.push((key, stats));
        }
    }

    /// Whether a fault waits to be injected into op `oi`'s GEMM of `role` (into
    /// `operand`, or into any of its operands).
    fn fault_waits(&self, oi: usize, role: GemmRole, operand: Option<Operand>) -> bool {
        self.quant.faults.iter().any(|(f, fl)| *f == oi && fl.role == role && operand.is_none_or(|o| fl.operand == o))
    }

    /// The error for an operand quantised while its tensor is not live.
    fn not_live(&self, oi: usize, id: TensorId, grad: bool) -> ExecError {
        ExecError::State(format!(
            "operation '{}' quantises {}'{}', which is not live",
            self.graph.ops[oi].name,
            if grad { "the gradient of " } else { "" },
            self.graph.tensors[id].name
        ))
    }

    /// Whether linear or grouped linear `oi`'s GEMMs take their operands, planned `pa`
    /// and `pb`, as FP8 codes: both per-tensor FP8 rounded to nearest (the codes kernels
    /// have no stochastic rounding) under this executor's native route, and a pair the
    /// device's FP8 GEMM takes (not E5M2 x E5M2; the weight's two dimensions multiples of
    /// 16, as cuBLASLt asks of an FP8 GEMM's columns and contraction; the token count is
    /// the free dimension, or a contraction the device pads with zeros).
    fn native_pair(&self, oi: usize, pa: &OperandPlan, pb: &OperandPlan) -> bool {
        let per_tensor = |p: &OperandPlan| {
            matches!(p.format, runner_graph::DType::Fp8E4M3 | runner_graph::DType::Fp8E5M2)
                && matches!(p.scaling, Scaling::Delayed { .. } | Scaling::Current { .. })
                && p.hadamard <= 1
                && !p.stochastic
        };
        let (_, n, k) = self.weight_shape(oi);
        self.quant.native
            && matches!(self.graph.ops[oi].kind, OpKind::Linear | OpKind::GroupedLinear)
            && per_tensor(pa)
            && per_tensor(pb)
            && !(pa.format == runner_graph::DType::Fp8E5M2 && pb.format == runner_graph::DType::Fp8E5M2)
            && n % 16 == 0
            && k % 16 == 0
    }

    /// The two operands of GEMM op `oi` of `role` as the GEMM reads them. On the native
    /// route ([`Executor::native_pair`]) each tensor is cast straight to its FP8 codes
    /// ([`Device::quantize_fp8_codes`]: one pass, no f32 copy), a grouped linear's
    /// weights expert by expert, holding the values the emulated route's quantised
    /// copies hold; otherwise (and while a fault waits to be injected into either, which
    /// edits a copy) the quantised f32 copies.
    fn gemm_operands(&mut self, oi: usize, role: GemmRole, plan: &SitePlan, a: Side, b: Side) -> Result<(D::Buffer, Quantised<D::Buffer>), ExecError> {
        let (pa, pb) = (*plan.operand(a.operand), *plan.operand(b.operand));
        let pending = |o: Operand| self.fault_waits(oi, role, Some(o));
        if self.native_pair(oi, &pa, &pb) && !pending(a.operand) && !pending(b.operand) {
            let qa = self.codes_tensor(a, (oi, role, a.operand), &pa)?;
            let key = (oi, role, b.operand);
            let qb = if b.operand != Operand::Weight || self.graph.ops[oi].kind != OpKind::GroupedLinear {
                Quantised::One(self.codes_tensor(b, key, &pb)?)
            } else if self.delayed_scale(key, &pb).is_some() {
                // Under delayed scaling with a history every expert takes the op's one
                // scale, so one cast of the whole stack holds what the casts expert by
                // expert would (merged numerics alike), in one pass instead of E; the
                // draws those casts would take are taken.
                let (e, _, _) = self.weight_shape(oi);
                self.quant.draws += e.saturating_sub(1) as u64;
                Quantised::One(self.codes_of(b, key, &pb, 0, None)?)
            } else {
                let (e, n, k) = self.weight_shape(oi);
                Quantised::PerExpert((0..e).map(|ex| self.codes_of(b, key, &pb, ex * n * k, Some(n * k))).collect::<Result<_, _>>()?)
            };
            self.quant.native_gemms += 1;
            return Ok((qa, qb));
        }
        // Codes a producer cast for this GEMM are not read on the copy route.
        if self.cast.as_ref().is_some_and(|c| c.key.0 == oi && c.key.1 == role) {
            self.cast = None;
        }
        let mut copy = |s: Side, p: &OperandPlan| -> Result<D::Buffer, ExecError> {
            let groups = match s.operand {
                Operand::Weight => self.weight_groups(oi),
                _ => self.token_groups(oi, p)?,
            };
            self.quantised_tensor(s.id, s.grad, s.rows, s.cols, (oi, role, s.operand), p, groups.as_deref())
        };
        let qa = copy(a, &pa)?;
        let qb = copy(b, &pb)?;
        Ok((qa, Quantised::One(qb)))
    }

    /// Value or gradient `s.id` cast to the FP8 codes of operand `key` under per-tensor
    /// `plan` (its delayed scale, or its current one), recording what the cast did as
    /// [`Executor::quantised`] records it.
    fn codes_tensor(&mut self, s: Side, key: Key, plan: &OperandPlan) -> Result<D::Buffer, ExecError> {
        if !s.grad
            && let Some(c) = self.cast.take_if(|c| c.tensor == s.id && c.key == key)
        {
            // Cast already, by the op that produced the tensor (with the scale this would take).
            self.quant.draws += 1;
            self.quant.fused_casts += 1;
            self.keep_stats(key, c.stats);
            return Ok(c.codes);
        }
        self.codes_of(s, key, plan, 0, None)
    }

    /// `len` elements (`None`: all) of value or gradient `s.id` from element `at` on,
    /// cast to FP8 codes as [`Executor::codes_tensor`] casts them: one expert's matrix of
    /// a grouped linear's weights, or the whole tensor.
    fn codes_of(&mut self, s: Side, key: Key, plan: &OperandPlan, at: usize, len: Option<usize>) -> Result<D::Buffer, ExecError> {
        let spec = self.next_spec(key, plan)?;
        let elem = Elem::of(plan.format).ok_or_else(|| ExecError::State(format!("{} has no FP8 buffer", plan.format.name())))?;
        let store = if s.grad { &self.grads } else { &self.vals };
        let src = store[s.id].as_ref().ok_or_else(|| self.not_live(key.0, s.id, s.grad))?;
        let mut q = self.device.alloc(elem, len.unwrap_or(src.len().saturating_sub(at)))?;
        let stats = self.device.quantize_fp8_codes(&mut q, src, at, &spec)?;
        self.keep_stats(key, stats);
        Ok(q)
    }

    /// GEMMs that have run on FP8 codes (the native route) since the executor was made.
    pub fn native_fp8_gemms(&self) -> u64 {
        self.quant.native_gemms
    }

    /// Native-route GEMM operands cast to FP8 by the RMSNorm or MLP activation that
    /// produced them (fused norm / activation + cast) since the executor was made.
    pub fn fused_fp8_casts(&self) -> u64 {
        self.quant.fused_casts
    }

    /// The FP8 cast forward op `oi` can fuse: an RMSNorm or MLP activation (SwiGLU,
    /// GeGLU, GELU, squared ReLU) whose output only a
    /// linear or grouped linear (an expert's down projection) reads, as X, on the native
    /// route (both operands per-tensor FP8, see
    /// [`Executor::native_pair`]), under delayed scaling with a history (the scale is
    /// known before the op runs; a current scale needs the output's amax first, which
    /// is the unfused route's pass anyway), no stochastic rounding, and no fault waiting
    /// for that GEMM. The operand's key, its spec, and the codes' buffer type.
    pub(super) fn fused_cast(&self, oi: usize) -> Option<(Key, QuantSpec, Elem)> {
        let op = &self.graph.ops[oi];
        let producer = matches!(op.kind, OpKind::RmsNorm | OpKind::SwiGlu | OpKind::GeGlu | OpKind::Gelu | OpKind::SquaredRelu);
        if !self.quant.native || !producer {
            return None;
        }
        let t = *op.outputs.first()?;
        let c = (*self.quant.reader.get(t)?)?;
        if !matches!(self.graph.ops[c].kind, OpKind::Linear | OpKind::GroupedLinear) || self.graph.ops[c].inputs.first() != Some(&t) {
            return None;
        }
        let plan = self.quant.sites.get(&(c, GemmRole::Forward))?;
        let pa = &plan.activation;
        if !matches!(pa.scaling, Scaling::Delayed { .. }) || self.fault_waits(c, GemmRole::Forward, None) {
            return None;
        }
        let key = (c, GemmRole::Forward, Operand::Activation);
        if !self.native_pair(c, pa, &plan.weight) {
            return None;
        }
        let spec = pa.spec(Some(self.delayed_scale(key, pa)?), self.quant.draws).ok()?;
        matches!(spec, QuantSpec::Tensor { stochastic: None, .. }).then_some((key, spec, Elem::of(pa.format)?))
    }

    /// A quantised copy of value (`grad: false`) or gradient (`grad: true`) `id`, taken
    /// out of its store for the call and put back.
    #[allow(clippy::too_many_arguments)]
    fn quantised_tensor(
        &mut self,
        id: TensorId,
        grad: bool,
        rows: usize,
        cols: usize,
        key: Key,
        plan: &OperandPlan,
        groups: Option<&[usize]>,
    ) -> Result<D::Buffer, ExecError> {
        let store = if grad { &mut self.grads } else { &mut self.vals };
        let Some(b) = store[id].take() else { return Err(self.not_live(key.0, id, grad)) };
        let r = self.quantised(&b, rows, cols, key, plan, groups);
        let store = if grad { &mut self.grads } else { &mut self.vals };
        store[id] = Some(b);
        r
    }

    /// (experts, n, k) of GEMM op `oi`'s weight: (n, k) for a linear (one "expert"),
    /// (E, n, k) for a grouped linear.
    fn weight_shape(&self, oi: usize) -> (usize, usize, usize) {
        let s = &self.graph.tensors[self.graph.ops[oi].inputs[1]].shape;
        match s[..] {
            [e, n, k] => (e as usize, n as usize, k as usize),
            _ => (1, s[0] as usize, s[1] as usize),
        }
    }

    /// The row groups of op `oi`'s weight (E, n, k) seen as (E·n, k): one per expert of a
    /// grouped linear; `None` for a linear.
    fn weight_groups(&self, oi: usize) -> Option<Vec<usize>> {
        let (e, n, _) = self.weight_shape(oi);
        (self.graph.ops[oi].kind == OpKind::GroupedLinear).then(|| (0..=e).map(|i| i * n).collect())
    }

    /// The row groups of a token-major operand (X or dY) of op `oi` under `plan`: each
    /// expert's rows when `oi` is a grouped linear and the plan's blocks span rows or a
    /// Hadamard transform mixes them; `None` (one tensor) otherwise.
    fn token_groups(&mut self, oi: usize, plan: &OperandPlan) -> Result<Option<Vec<usize>>, ExecError> {
        let spans_rows = plan.hadamard > 1 || matches!(plan.scaling, Scaling::Block { rows, .. } if rows > 1);
        if self.graph.ops[oi].kind != OpKind::GroupedLinear || !spans_rows {
            return Ok(None);
        }
        let idx = self.graph.ops[oi].inputs[2];
        if self.plans.for_experts(idx).is_none() {
            // Built as the forward builds it when no dispatch of these indices ran before.
            let indices = self.vals[idx].as_ref().ok_or_else(|| {
                ExecError::State(format!("operation '{}': its routing indices are not live", self.graph.ops[oi].name))
            })?;
            let e = self.weight_shape(oi).0;
            super::ops::plan_for(&self.device, &self.graph, idx, indices, e, &mut self.plans)?;
        }
        let plan = self
            .plans
            .for_experts(idx)
            .ok_or_else(|| ExecError::State(format!("operation '{}': no routing plan", self.graph.ops[oi].name)))?;
        let mut offsets = vec![0];
        for c in self.device.plan_counts(plan)? {
            offsets.push(offsets[offsets.len() - 1] + c);
        }
        Ok(Some(offsets))
    }

    /// The quantised (X, W) of GEMM op `oi`'s forward and its output format, when it has
    /// a plan.
    pub(super) fn forward_operands(&mut self, oi: usize) -> Result<Option<Operands<D::Buffer>>, ExecError> {
        let Some(plan) = self.quant.sites.get(&(oi, GemmRole::Forward)).copied() else { return Ok(None) };
        let (xid, wid) = (self.graph.ops[oi].inputs[0], self.graph.ops[oi].inputs[1]);
        let (e, n, k) = self.weight_shape(oi);
        let m = self.numel_of(xid) / k.max(1);
        let x = Side { id: xid, grad: false, rows: m, cols: k, operand: Operand::Activation };
        let w = Side { id: wid, grad: false, rows: e * n, cols: k, operand: Operand::Weight };
        let (qx, qw) = self.gemm_operands(oi, GemmRole::Forward, &plan, x, w)?;
        Ok(Some((qx, qw, plan.output)))
    }

    /// The quantised operands of GEMM op `oi`'s backward GEMMs (`dy`: its output's
    /// gradient), for the roles with a plan.
    pub(super) fn backward_operands(&mut self, oi: usize, dy: TensorId) -> Result<Option<LinearBackward<D::Buffer>>, ExecError> {
        let dplan = self.quant.sites.get(&(oi, GemmRole::InputGradient)).copied();
        let wplan = self.quant.sites.get(&(oi, GemmRole::WeightGradient)).copied();
        if dplan.is_none() && wplan.is_none() {
            return Ok(None);
        }
        let (xid, wid) = (self.graph.ops[oi].inputs[0], self.graph.ops[oi].inputs[1]);
        let (e, n, k) = self.weight_shape(oi);
        let m = self.numel_of(dy) / n.max(1);
        let mut out = LinearBackward { dgrad: None, wgrad: None };
        if let Some(p) = dplan {
            let g = Side { id: dy, grad: true, rows: m, cols: n, operand: Operand::Gradient };
            let w = Side { id: wid, grad: false, rows: e * n, cols: k, operand: Operand::Weight };
            let (g, w) = self.gemm_operands(oi, GemmRole::InputGradient, &p, g, w)?;
            out.dgrad = Some((g, w, p.output));
        }
        if let Some(p) = wplan
            && self.plan.needs_grad[wid]
        {
            let g = Side { id: dy, grad: true, rows: m, cols: n, operand: Operand::Gradient };
            let x = Side { id: xid, grad: false, rows: m, cols: k, operand: Operand::Activation };
            let (g, x) = self.gemm_operands(oi, GemmRole::WeightGradient, &p, g, x)?;
            let Quantised::One(x) = x else {
                return Err(ExecError::State(format!("operation '{}': its input quantised per expert", self.graph.ops[oi].name)));
            };
            out.wgrad = Some((g, x, p.output));
        }
        Ok(Some(out))
    }

    /// Multiply every weight gradient of the last backward by `s` (gradient clipping, and
    /// the gradient-spike fault).
    ///
    /// # Errors
    /// A device error.
    pub fn scale_grads(&mut self, s: f32) -> Result<(), ExecError> {
        for id in 0..self.graph.tensors.len() {
            if let (true, Some(b)) = (self.grad_written[id], self.grads[id].as_mut()) {
                self.device.scale(b, s)?;
            }
        }
        Ok(())
    }

    /// Sum of squares and finiteness of each weight gradient the last backward wrote, by
    /// weight name.
    ///
    /// # Errors
    /// A device error.
    pub fn grad_sums(&self) -> Result<Vec<(String, f64, bool)>, ExecError> {
        let mut out = Vec::new();
        for (id, t) in self.graph.tensors.iter().enumerate() {
            if !self.grad_written[id] {
                continue;
            }
            if let Some(b) = self.grads[id].as_ref() {
                let v = self.device.read_f32(b)?;
                let ss: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
                out.push((t.name.clone(), ss, v.iter().all(|x| x.is_finite())));
            }
        }
        Ok(out)
    }

    /// The training state a rollback returns to: weights, AdamW moments, Muon's momentum
    /// and the step count, and the amax histories.
    ///
    /// # Errors
    /// An FSDP rank (its shards are not snapshotted), or a device error.
    pub fn snapshot(&self) -> Result<Snapshot, ExecError> {
        if self.fsdp.resting.is_some() {
            return Err(ExecError::State("snapshots of FSDP ranks are not supported".into()));
        }
        let mut weights = Vec::new();
        let mut moments = Vec::new();
        let mut momentum = Vec::new();
        for (id, t) in self.graph.tensors.iter().enumerate() {
            if !t.kind.is_param() {
                continue;
            }
            if let Some(b) = &self.vals[id] {
                weights.push((id, self.device.read_f32(b)?));
            }
            if let Some((m, v)) = &self.moments[id] {
                moments.push((id, self.device.read_f32(m)?, self.device.read_f32(v)?));
            }
            if let Some(b) = &self.momentum[id] {
                momentum.push((id, self.device.read_f32(b)?));
            }
        }
        Ok(Snapshot { weights, moments, momentum, optimizer: self.optimizer.name(), adam_step: self.adam_step, history: self.quant.history.clone() })
    }

    /// Return to `s` (taken from this executor, or one of the same graph and optimizer).
    ///
    /// # Errors
    /// A snapshot of another graph or optimizer, or a device error.
    pub fn restore(&mut self, s: &Snapshot) -> Result<(), ExecError> {
        if s.optimizer != self.optimizer.name() {
            return Err(ExecError::State(format!(
                "a snapshot of {} training restored into an executor training with {}; choose the same optimizer (Executor::set_optimizer) before restoring",
                s.optimizer,
                self.optimizer.name()
            )));
        }
        for (id, w) in &s.weights {
            let b = self.vals.get_mut(*id).and_then(Option::as_mut).filter(|b| b.len() == w.len());
            let b = b.ok_or_else(|| ExecError::State("snapshot of another graph".into()))?;
            self.device.write_f32(b, w)?;
        }
        for (id, m, v) in &s.moments {
            let pair = self.moments.get_mut(*id).and_then(Option::as_mut);
            let (mb, vb) = pair.ok_or_else(|| ExecError::State(format!("snapshot of another graph, or of AdamW restored under {}", self.optimizer.name())))?;
            self.device.write_f32(mb, m)?;
            self.device.write_f32(vb, v)?;
        }
        for (id, m) in &s.momentum {
            let b = self.momentum.get_mut(*id).and_then(Option::as_mut).filter(|b| b.len() == m.len());
            let b = b.ok_or_else(|| ExecError::State(format!("snapshot of another graph, or of Muon restored under {}", self.optimizer.name())))?;
            self.device.write_f32(b, m)?;
        }
        self.adam_step = s.adam_step;
        self.quant.history = s.history.clone();
        self.quant_stats.clear();
        self.quant.step.clear();
        self.backward_done = false;
        self.forward_done = false;
        Ok(())
    }
}
