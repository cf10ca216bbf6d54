//! Muon: momentum orthogonalised by a Newton–Schulz iteration, for the hidden 2-D
//! matrices; AdamW for every other trained weight.
//!
//! Sources: Keller Jordan, "Muon: An optimizer for hidden layers in neural networks"
//! (2024, <https://kellerjordan.github.io/posts/muon/>, code at
//! <https://github.com/KellerJordan/Muon>), and Moonshot AI, "Muon is Scalable for LLM
//! Training" (arXiv:2502.16982, Moonlight, <https://github.com/MoonshotAI/Moonlight>).
//!
//! For a trained matrix W (m × n) with gradient G, one step is
//!
//! - momentum B ← μ·B + G, Nesterov U = G + μ·B (μ = 0.95; Keller's current code lerps,
//!   B ← μ·B + (1 − μ)·G, which scales U by (1 − μ) and so orthogonalises to the same O);
//! - O = NewtonSchulz5(U): X = U / (‖U‖_F + 1e-7), on the side where rows ≤ cols, then 5
//!   times A = X·Xᵀ, B' = b·A + c·A·A, X = a·X + B'·X with Keller's quintic
//!   (a, b, c) = (3.4445, −4.7750, 2.0315), which pushes every singular value into about
//!   [0.68, 1.13] rather than exactly to 1;
//! - Moonlight's update, W ← W·(1 − lr·wd) − lr·0.2·√max(m, n)·O: the 0.2·√max(m, n)
//!   brings the update's RMS to AdamW's typical 0.2 to 0.4, so AdamW's learning rate and
//!   weight decay carry over (the step's [`AdamW`](runner_kernels::cpu::adamw::AdamW) gives both).
//!
//! Which weights are matrices Muon takes is read off the graph ([`muon_weights`]): a
//! trained 2-D weight whose every reader is a `Linear` reading it as its weight, and none
//! of those linears the output head (its output reaches a `CrossEntropy` as the logits,
//! directly or through collectives). So the embedding table (read by `Embedding`), a tied
//! embedding (read by both), the output head and the multi-token-prediction heads, norm
//! gains, biases, convolution and scan parameters, and 3-D expert stacks take AdamW, as
//! both references do (Keller's `MuonWithAuxAdam` param groups; Moonlight's
//! `ndim >= 2 and "embed" not in name and "lm_head" not in name`).
//!
//! Everything runs as [`Device`] kernels (GEMM, scale, add_assign, copy, and two of
//! Muon's own, `kernels/cuda/muon.cu`), so every backend runs it, with no host read: the
//! Frobenius norm is a 1 × 1 GEMM that [`Device::scale_by_inverse_norm`] reads on the
//! device, and the update reads the learning rate and decay from AdamW's step scalars
//! ([`Device::muon_apply`]), so a recorded CUDA graph (`--cuda-graph`) replays a Muon
//! step with each step's learning rate. Where every rank holds
//! whole matrices after the gradient reduction (unsharded, data parallel, pipeline
//! stages, context and expert parallel) each rank could run Muon on the same reduced
//! gradient; instead the ranks of a data-parallel all-reduce (`dp`, `edp`) deal the
//! matrices between them by their Newton–Schulz work ([`Owner`], Megatron's layer-wise
//! distributed optimizer, which its `dist_muon` runs under and the projection models):
//! a matrix's owner alone keeps its momentum, runs its update and broadcasts the new
//! weight over the group, so each rank orthogonalises about 1/dp of the matrices and
//! holds their momentum only, for one broadcast of each matrix a step. The result is
//! the same bit for bit: every rank holds the same reduced gradient.
//! A tensor-parallel rank holds a row block (column-parallel linears) or a column block
//! (row-parallel) of a matrix, which Newton–Schulz cannot orthogonalise piecewise: its
//! Nesterov update is all-gathered over `tp` into the whole matrix (a column block's
//! rank-major pieces transposed into place; kv projections replicated over more ranks
//! than kv heads taken once per part); the tp ranks deal the matrices between them by
//! the same rule, and the one a matrix falls to runs Newton–Schulz on the whole and
//! broadcasts the result, of which each rank keeps its own block ([`MuonSplit`]). So
//! each matrix is orthogonalised once per data-parallel group, where Megatron-Core's
//! tensor-parallel mode "duplicated" runs it on every tp rank: one broadcast of the
//! whole more, 1/tp of the iterations. That is [`MuonTpMode::Exact`], the default;
//! [`MuonTpMode::Blockwise`] is Megatron-Core's default `muon_tp_mode`: each tp rank
//! runs Newton–Schulz on its own block alone and scales the update by the block's
//! shape, with no tp communication (ranks holding the same kv block compute the same
//! update), an approximation whose effect on the loss the two modes measure. The
//! data-parallel and FSDP deals below hold under either. An FSDP rank keeps a flat piece of each
//! unit (`fsdp.rs`), which cuts across the matrices, and Muon's momentum on the piece:
//! each rank's piece of a matrix's Nesterov update (elementwise, so the piece's update is
//! the whole's) goes into its equal-length chunk of the unit's padded flat layout, which
//! is all-gathered over the unit's group; every rank then holds every whole matrix's
//! update. The group's ranks deal the matrices by the same rule: the one a matrix falls
//! to runs Newton–Schulz on it (a tensor-parallel block gathered further over `tp` and
//! dealt there, [`orthogonalise_split`]) and broadcasts it over the group, and each
//! rank applies its own range, scaled for the whole matrix
//! (`Executor::fsdp_muon_step`). That costs one all-gather of a unit's flat buffer per
//! step (AdamW's elements travel as zeros) and one broadcast of each matrix (under
//! blockwise, its tp block orthogonalised by the owner alone, with no tp gather). So
//! under every layout each matrix is orthogonalised on one rank of its data-parallel ×
//! tensor-parallel group, or under blockwise each tp block on one rank of its
//! data-parallel group ([`Executor::orthogonalises`]). Every gather and broadcast
//! counts in the step's communication time (`StepProfile::communication_s`).

use runner_graph::shard::WeightSplit;
use runner_graph::{Graph, OpKind, Role, TensorId, TensorKind};
use runner_kernels::cpu::matmul::Gemm;

use super::Executor;
use super::comm::Timed;
use crate::device::{Device, DeviceBuffer, Elem, ExecError};

/// Muon's own settings; the learning rate and weight decay are the step's [`AdamW`](runner_kernels::cpu::adamw::AdamW)'s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Muon {
    /// Momentum μ (Nesterov).
    pub momentum: f32,
    /// Newton–Schulz iterations.
    pub ns_steps: u32,
    /// How a tensor-parallel rank's block of a matrix is orthogonalised.
    pub tp_mode: MuonTpMode,
}

/// Keller Jordan's and Moonlight's defaults: μ 0.95, 5 iterations; tensor-parallel
/// blocks orthogonalised exactly ([`MuonTpMode::Exact`]).
pub const MUON_DEFAULT: Muon = Muon { momentum: 0.95, ns_steps: 5, tp_mode: MuonTpMode::Exact };

/// How Muon orthogonalises a matrix split over the tensor-parallel ranks (a row block
/// of a column-parallel linear, a column block of a row-parallel one). Without tensor
/// parallelism (or for a matrix every tp rank holds whole) both are the same update,
/// bit for bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MuonTpMode {
    /// The whole matrix's Newton–Schulz: the blocks all-gathered over `tp`, one tp rank
    /// orthogonalises the whole and broadcasts it, each keeps its block, and the update
    /// is scaled by the whole's 0.2·√max(m, n) (the same update as without tensor
    /// parallelism; [`orthogonalise_split`]).
    #[default]
    Exact,
    /// Megatron-Core's `muon_tp_mode = "blockwise"` (its `OptimizerConfig` default):
    /// each tp rank runs Newton–Schulz on its own block alone, with no tp
    /// communication, and scales the update by its block's 0.2·√max(m_b, n_b). An
    /// approximation of the whole's orthogonalisation, each tp rank iterating on its
    /// block rather than one on the whole. Megatron-LM `megatron/core/optimizer/muon.py`
    /// (`TensorParallelMuon.orthogonalize`, @ 025c931ad09f6235cd531a795e58b5661797df10)
    /// passes `partition_dim = None` under "blockwise", so `newton_schulz_tp` falls
    /// back to NVIDIA Emerging-Optimizers' local `newton_schulz` on the block, and
    /// `scale_factor_fn_tp(grad.size(0), grad.size(1), None)` takes the spectral scale
    /// √max of the block's own shape (only a `partition_dim` multiplies the split
    /// side by the tp size).
    Blockwise,
}

impl MuonTpMode {
    /// `exact` or `blockwise`.
    pub fn name(self) -> &'static str {
        match self {
            MuonTpMode::Exact => "exact",
            MuonTpMode::Blockwise => "blockwise",
        }
    }

    /// `exact` or `blockwise`, in any case.
    ///
    /// # Errors
    /// Any other name, with the two.
    pub fn parse(s: &str) -> Result<MuonTpMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "exact" => Ok(MuonTpMode::Exact),
            "blockwise" => Ok(MuonTpMode::Blockwise),
            _ => Err(format!("unknown Muon tensor-parallel mode '{s}': use exact or blockwise")),
        }
    }
}

/// Keller Jordan's quintic Newton–Schulz coefficients (a, b, c).
pub const NS_COEFFS: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);

/// Added to ‖U‖_F before dividing, so a zero update stays zero.
pub const NS_EPS: f32 = 1e-7;

/// Moonlight's update RMS matching: the orthogonalised update is scaled by this times
/// √max(m, n).
pub const MOONLIGHT_SCALE: f32 = 0.2;

/// The optimizer an executor's step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Optimizer {
    /// AdamW on every trained weight.
    #[default]
    AdamW,
    /// Muon on the hidden matrices ([`muon_weights`]), AdamW on the rest.
    Muon(Muon),
}

impl Optimizer {
    /// `adamw` or `muon`.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::AdamW => "adamw",
            Optimizer::Muon(_) => "muon",
        }
    }

    /// Muon's tensor-parallel mode; `None` under AdamW.
    pub fn muon_tp_mode(self) -> Option<MuonTpMode> {
        match self {
            Optimizer::Muon(m) => Some(m.tp_mode),
            Optimizer::AdamW => None,
        }
    }
}

/// Per tensor of `g`: whether Muon updates it (see the module's documentation), given
/// which weights train (`needs_grad`, the backward plan's).
pub fn muon_weights(g: &Graph, needs_grad: &[bool]) -> Vec<bool> {
    // Tensors that reach a loss's logits through collectives only (an all-gather of
    // vocab shards, a send to the last stage's loss does not: the head is on that stage).
    let mut logits = vec![false; g.tensors.len()];
    for op in g.ops.iter().rev() {
        let reaches = match op.kind {
            OpKind::CrossEntropy => {
                if let Some(&l) = op.inputs.first() {
                    logits[l] = true;
                }
                continue;
            }
            OpKind::AllGather | OpKind::AllReduce | OpKind::ReduceScatter | OpKind::AllToAll => op.outputs.iter().any(|&o| logits[o]),
            _ => false,
        };
        if reaches {
            for &i in &op.inputs {
                logits[i] = true;
            }
        }
    }
    let mut read_as_matrix = vec![false; g.tensors.len()];
    let mut other_reader = vec![false; g.tensors.len()];
    for op in &g.ops {
        // A vocab-parallel linear is a head: its logits reach the loss through the
        // vocab-parallel statistics, not a CrossEntropy.
        let head = op.kind == OpKind::Linear && (op.role == Role::VocabParallel || op.outputs.iter().any(|&o| logits[o]));
        for (slot, &i) in op.inputs.iter().enumerate() {
            if op.kind == OpKind::Linear && slot == 1 && !head {
                read_as_matrix[i] = true;
            } else {
                other_reader[i] = true;
            }
        }
    }
    g.tensors
        .iter()
        .enumerate()
        .map(|(id, t)| t.kind == TensorKind::Weight && needs_grad.get(id) == Some(&true) && t.shape.len() == 2 && read_as_matrix[id] && !other_reader[id])
        .collect()
}

/// Elements of the scratch buffers one Muon update of an m × n matrix allocates: U and
/// the product B'·X (m·n each), A and A·A (min(m, n)² each), and the norm (1).
pub fn scratch_elems(m: usize, n: usize) -> usize {
    let s = m.min(n);
    2 * m * n + 2 * s * s + 1
}

/// How a Muon matrix is split over the tensor-parallel ranks: this rank holds part
/// `rank / rep` of `parts` equal blocks along `axis` (0: rows, a column-parallel
/// linear's; 1: columns, a row-parallel one's) of the whole `full` (rows, cols) matrix;
/// `rep` consecutive ranks hold the same part (kv projections when tp exceeds the kv
/// heads). `ns_rank`: the tp rank that runs the whole's Newton–Schulz and broadcasts it
/// (the tp ranks deal the matrices between them, [`deal`]); `None`: every tp rank runs
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MuonSplit {
    axis: usize,
    parts: usize,
    rep: usize,
    pub(super) full: (usize, usize),
    ns_rank: Option<usize>,
}

impl MuonSplit {
    /// The split of weight `name` (this rank's shape `local`) that `split` describes, on
    /// a tensor-parallel group of `tp` ranks; `None` for a whole matrix.
    ///
    /// # Errors
    /// A split Muon cannot gather: over another group or two axes, a vocabulary's rows,
    /// or one that does not fit the shape or the group.
    fn of(name: &str, local: &[u64], split: Option<&WeightSplit>, tp: usize) -> Result<Option<MuonSplit>, String> {
        let Some(split) = split else { return Ok(None) };
        let ([a], [r, c], [fr, fc]) = (&split.axes[..], local, &split.full[..]) else {
            return Err(format!("weight '{name}' {local:?} is split from {:?} along {} axes", split.full, split.axes.len()));
        };
        if a.group != "tp" || a.per_rank || a.axis > 1 {
            return Err(format!("weight '{name}' is split over group '{}' (axis {}), which Muon does not gather", a.group, a.axis));
        }
        let (l, f) = if a.axis == 0 { (*r, *fr) } else { (*c, *fc) };
        let parts = f.checked_div(l).unwrap_or(0) as usize;
        if parts == 0 || l * parts as u64 != f || !tp.is_multiple_of(parts) || (a.axis == 0 && c != fc) || (a.axis == 1 && r != fr) {
            return Err(format!("weight '{name}' {local:?} is not a block of {:?} split over {tp} tp ranks", split.full));
        }
        Ok(Some(MuonSplit { axis: a.axis, parts, rep: tp / parts, full: (*fr as usize, *fc as usize), ns_rank: None }))
    }
}

/// The data-parallel rank that updates a Muon matrix for its whole group (Megatron's
/// layer-wise distributed optimizer, which `dist_muon` runs under): rank `root` of
/// group `group` runs the matrix's momentum step and Newton–Schulz, alone of the group
/// holds its momentum, and broadcasts the updated weight; the others receive it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(super) group: String,
    pub(super) root: usize,
    /// This rank is `root`.
    pub(super) mine: bool,
}

/// Deal `matrices` (a name, Newton–Schulz work) over `ranks` ranks: the most work first
/// (ties by name), each to the rank with the least work dealt so far (ties to the lowest
/// rank). Every rank of a group deals the same list alike, so they agree on the owners
/// without a word.
pub(super) fn deal(mut matrices: Vec<(&str, u128)>, ranks: usize) -> Vec<(&str, usize)> {
    matrices.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut load = vec![0u128; ranks.max(1)];
    matrices
        .into_iter()
        .map(|(name, work)| {
            let r = (0..load.len()).min_by_key(|&r| (load[r], r)).unwrap_or(0);
            load[r] = load[r].saturating_add(work);
            (name, r)
        })
        .collect()
}

/// Newton–Schulz work of one step on a rows × cols matrix, in multiply-adds per
/// iteration: X·Xᵀ and (B'·X) each s·s·l, A·A s³ (s the short side, l the long).
pub(super) fn ns_work((rows, cols): (usize, usize)) -> u128 {
    let (s, l) = (rows.min(cols) as u128, rows.max(cols) as u128);
    s.saturating_mul(s).saturating_mul(l.saturating_mul(2).saturating_add(s))
}

/// The matrix dimensions (rows, cols) of a weight Muon takes.
pub(super) fn dims(g: &Graph, id: TensorId) -> (usize, usize) {
    let s = &g.tensors[id].shape;
    (s[0] as usize, s[1] as usize)
}

/// Orthogonalise `x` (rows × cols, row-major f32) in place: x ← NewtonSchulz(x) with
/// `steps` iterations of [`NS_COEFFS`], on `dev`'s kernels alone. A tall matrix runs
/// the iteration of its transpose written untransposed (A = XᵀX, X ← a·X + X·B', B'
/// symmetric), the same arithmetic without a transposed copy.
///
/// # Errors
/// A length that is not rows × cols, or a device error.
pub fn newton_schulz<D: Device + ?Sized>(dev: &D, x: &mut D::Buffer, rows: usize, cols: usize, steps: u32) -> Result<(), ExecError> {
    let len = rows.checked_mul(cols).filter(|&l| l == x.len() && l > 0);
    let Some(len) = len else {
        return Err(ExecError::State(format!("newton_schulz: a {rows} x {cols} matrix in a buffer of {} elements", x.len())));
    };
    let mut norm = dev.alloc(Elem::F32, 1)?;
    dev.matmul(&mut norm, x, x, Gemm { m: 1, n: 1, k: len, trans_a: false, trans_b: true }, false)?;
    dev.scale_by_inverse_norm(x, &norm, NS_EPS)?;
    let (a, b, c) = NS_COEFFS;
    let wide = rows <= cols;
    let (s, l) = if wide { (rows, cols) } else { (cols, rows) };
    let mut gram = dev.alloc(Elem::F32, s * s)?;
    let mut gram2 = dev.alloc(Elem::F32, s * s)?;
    let mut prod = dev.alloc(Elem::F32, len)?;
    for _ in 0..steps {
        let g = Gemm { m: s, n: s, k: l, trans_a: !wide, trans_b: wide };
        dev.matmul(&mut gram, x, x, g, false)?;
        dev.matmul(&mut gram2, &gram, &gram, Gemm { m: s, n: s, k: s, trans_a: false, trans_b: false }, false)?;
        dev.scale(&mut gram2, c)?;
        dev.scale(&mut gram, b)?;
        dev.add_assign(&mut gram, &gram2)?;
        if wide {
            dev.matmul(&mut prod, &gram, x, Gemm { m: s, n: l, k: s, trans_a: false, trans_b: false }, false)?;
        } else {
            dev.matmul(&mut prod, x, &gram, Gemm { m: l, n: s, k: s, trans_a: false, trans_b: false }, false)?;
        }
        dev.scale(x, a)?;
        dev.add_assign(x, &prod)?;
    }
    Ok(())
}

/// One Muon update of weight `w` (rows × cols) from gradient `grad`, momentum `buf`
/// (μ, Nesterov), learning rate and weight decay read on the device from `scalars`
/// (AdamW's step scalars, [`crate::device::adamw_scalars`]; see the module's
/// documentation).
///
/// # Errors
/// Buffers of other lengths, or a device error.
#[allow(clippy::too_many_arguments)]
pub fn muon_update<D: Device + ?Sized>(dev: &D, w: &mut D::Buffer, grad: &D::Buffer, buf: &mut D::Buffer, rows: usize, cols: usize, mu: &Muon, scalars: &D::Buffer) -> Result<(), ExecError> {
    let mut u = nesterov(dev, w, grad, buf, rows, cols, mu)?;
    newton_schulz(dev, &mut u, rows, cols, mu.ns_steps)?;
    dev.muon_apply(w, &u, scalars, update_scale(rows, cols))
}

/// Moonlight's −0.2·√max(m, n) of an m × n matrix: the update's sign and RMS matching.
pub(super) fn update_scale(rows: usize, cols: usize) -> f32 {
    -MOONLIGHT_SCALE * (rows.max(cols) as f32).sqrt()
}

/// The momentum step, B ← μ·B + G, and the Nesterov update U = G + μ·B it returns, of a
/// weight like `w` (rows × cols here).
fn nesterov<D: Device + ?Sized>(dev: &D, w: &D::Buffer, grad: &D::Buffer, buf: &mut D::Buffer, rows: usize, cols: usize, mu: &Muon) -> Result<D::Buffer, ExecError> {
    let len = w.len();
    if grad.len() != len || buf.len() != len || rows.checked_mul(cols) != Some(len) {
        return Err(ExecError::State(format!(
            "muon: a {rows} x {cols} weight of {len} elements, gradient of {}, momentum of {}",
            grad.len(),
            buf.len()
        )));
    }
    nesterov_elems(dev, grad, buf, mu)
}

/// [`nesterov`] on any run of a weight's elements (an FSDP piece): elementwise, so a
/// piece's update is the same elements of the whole weight's.
pub(super) fn nesterov_elems<D: Device + ?Sized>(dev: &D, grad: &D::Buffer, buf: &mut D::Buffer, mu: &Muon) -> Result<D::Buffer, ExecError> {
    let len = grad.len();
    if buf.len() != len {
        return Err(ExecError::State(format!("muon: a gradient of {len} elements, momentum of {}", buf.len())));
    }
    dev.scale(buf, mu.momentum)?;
    dev.add_assign(buf, grad)?;
    let mut u = dev.alloc(Elem::F32, len)?;
    dev.copy(&mut u, 0, buf, 0, len)?;
    dev.scale(&mut u, mu.momentum)?;
    dev.add_assign(&mut u, grad)?;
    Ok(u)
}

/// Newton–Schulz of Muon matrix `u`, this rank's rows × cols of it: in place where the
/// rank holds it whole (`split` `None`), else gathered over `tp`, the rank's timed `tp`
/// handle ([`orthogonalise_split`]). Returns the whole matrix's (rows, cols), which the
/// update's scale ([`update_scale`]) is of. One rule for whole weights and FSDP pieces
/// (`fsdp.rs`).
pub(super) fn orthogonalise<D: Device>(
    dev: &D,
    tp: Option<&Timed<'_, D>>,
    split: Option<MuonSplit>,
    u: &mut D::Buffer,
    (rows, cols): (usize, usize),
    steps: u32,
) -> Result<(usize, usize), ExecError> {
    let Some(sp) = split else {
        newton_schulz(dev, u, rows, cols, steps)?;
        return Ok((rows, cols));
    };
    let tp = tp.ok_or_else(|| ExecError::State("Muon: a split matrix without a tp group".into()))?;
    orthogonalise_split(dev, tp, u, cols, sp, steps)?;
    Ok(sp.full)
}

/// Trade a weight's optimizer state for the optimizer that updates it (`muon`: Muon):
/// AdamW's first moment becomes Muon's momentum, zeroed, and the second is freed; under
/// AdamW a momentum comes back as two zeroed moments. One rule for whole weights and
/// FSDP pieces (`fsdp.rs`).
pub(super) fn swap_state<D: Device + ?Sized>(dev: &D, muon: bool, moments: &mut Option<(D::Buffer, D::Buffer)>, momentum: &mut Option<D::Buffer>) -> Result<(), ExecError> {
    if muon && let Some((mut b, v)) = moments.take() {
        drop(v);
        dev.zero(&mut b)?;
        *momentum = Some(b);
    } else if !muon && let Some(mut m) = momentum.take() {
        let mut v = dev.alloc(Elem::F32, m.len())?;
        dev.zero(&mut m)?;
        dev.zero(&mut v)?;
        *moments = Some((m, v));
    }
    Ok(())
}

/// Newton–Schulz of the whole matrix whose block (of `cols` columns) this
/// tensor-parallel rank holds as `u`, split as `sp` says: the blocks are all-gathered
/// over `tp` into the whole, orthogonalised by `sp.ns_rank`, which broadcasts the
/// result (or by every rank alike, without one), and `u` takes this rank's block of
/// the result. A collective call on `tp`.
fn orthogonalise_split<D: Device>(dev: &D, tp: &Timed<'_, D>, u: &mut D::Buffer, cols: usize, sp: MuonSplit, steps: u32) -> Result<(), ExecError> {
    let piece = u.len();
    let mut all = dev.alloc(Elem::F32, piece * tp.size())?;
    tp.all_gather(u, &mut all)?;
    // Ranks that share a part hold the same block: take the first of each.
    let mut blocks = if sp.rep == 1 {
        all
    } else {
        let mut b = dev.alloc(Elem::F32, piece * sp.parts)?;
        for j in 0..sp.parts {
            dev.copy(&mut b, j * piece, &all, j * sp.rep * piece, piece)?;
        }
        b
    };
    let (fr, fc) = sp.full;
    if sp.ns_rank.is_none_or(|r| r == tp.rank()) {
        if sp.axis == 0 {
            // Row blocks in rank order are the whole matrix, row-major.
            newton_schulz(dev, &mut blocks, fr, fc, steps)?;
        } else {
            // Column blocks (parts, rows, cols/parts) → (rows, parts, cols/parts) = whole.
            let mut whole = dev.alloc(Elem::F32, fr * fc)?;
            dev.transpose_outer(&mut whole, &blocks, sp.parts, fr, cols)?;
            newton_schulz(dev, &mut whole, fr, fc, steps)?;
            dev.transpose_outer(&mut blocks, &whole, fr, sp.parts, cols)?;
        }
    }
    if let Some(root) = sp.ns_rank {
        tp.broadcast(&mut blocks, root)?;
    }
    dev.copy(u, 0, &blocks, tp.rank() / sp.rep * piece, piece)?;
    Ok(())
}

impl<D: Device> Executor<D> {
    /// Choose the optimizer the steps run (AdamW until this is called), before the first
    /// step: Muon's matrices ([`muon_weights`]) trade AdamW's two moments for one
    /// momentum buffer, zeroed (none for a matrix another rank of a data-parallel
    /// group updates, `Owner`; call this after the step collectives are set, as
    /// [`Executor::for_rank`] does), and AdamW's moments come back for them under AdamW.
    /// Under [`MuonTpMode::Blockwise`] a tensor-parallel rank's block of a matrix is
    /// the matrix it orthogonalises: no weight splits are needed or read.
    ///
    /// # Errors
    /// A step already taken; exact Muon on a tensor-parallel rank made without the
    /// sharding's weight splits, or whose split Muon cannot gather; or a device error.
    pub fn set_optimizer(&mut self, opt: Optimizer) -> Result<(), ExecError> {
        if self.adam_step != 0 {
            return Err(ExecError::State(format!(
                "the optimizer is chosen before the first step ({} taken); make a new executor to train with {}",
                self.adam_step,
                opt.name()
            )));
        }
        if let Optimizer::Muon(m) = opt
            && (!(m.momentum.is_finite() && (0.0..1.0).contains(&m.momentum)) || m.ns_steps == 0 || m.ns_steps > 100)
        {
            return Err(ExecError::Input(format!(
                "Muon momentum {} and {} Newton-Schulz steps: use a momentum in [0, 1) and 1..=100 steps (0.95 and 5 are the references')",
                m.momentum, m.ns_steps
            )));
        }
        let takes = match opt {
            Optimizer::AdamW => vec![false; self.graph.tensors.len()],
            Optimizer::Muon(_) => muon_weights(&self.graph, &self.plan.needs_grad),
        };
        let tp = self.collectives.get("tp").map_or(1, |c| c.size());
        // Under blockwise each rank's block is its matrix: no split to gather, no tp
        // deal, and its own shape's Newton–Schulz scratch and update scale.
        let exact = !matches!(opt, Optimizer::Muon(Muon { tp_mode: MuonTpMode::Blockwise, .. }));
        let mut split = vec![None; takes.len()];
        for (id, _) in takes.iter().enumerate().filter(|(_, m)| **m && exact) {
            let t = &self.graph.tensors[id];
            let s = MuonSplit::of(&t.name, &t.shape, self.splits.get(&t.name), tp).map_err(|why| {
                ExecError::Input(format!("Muon orthogonalises whole matrices: {why}; use adamw, or Muon's blockwise tp mode (each block alone)"))
            })?;
            if tp > 1 && self.splits.is_empty() {
                return Err(ExecError::Input(format!(
                    "Muon on a tensor parallel rank (tp {tp}) gathers each matrix's blocks, and needs where they lie: \
                     make the executor with Executor::for_rank, which takes the sharding's weight splits \
                     (or use Muon's blockwise tp mode, which orthogonalises each block alone)"
                )));
            }
            split[id] = s;
        }
        let owner = self.deal_muon_owners(&takes, &split);
        let fsdp_owner = self.deal_fsdp_muon(&takes, &split);
        // The tp ranks deal the split matrices their data-parallel index updates (all
        // of them where none is lent): the same list on every rank of the tp group.
        let ours = (0..split.len()).filter(|&id| {
            split[id].is_some() && owner[id].as_ref().is_none_or(|o| o.mine) && fsdp_owner[id].as_ref().is_none_or(|o| o.mine)
        });
        for (id, r) in self.deal_matrices(ours, &split, tp) {
            if let Some(sp) = split[id].as_mut() {
                sp.ns_rank = Some(r);
            }
        }
        for (id, &muon) in takes.iter().enumerate() {
            // A matrix an earlier call lent to another rank has no state here: make it
            // a momentum again, for swap_state to trade.
            if self.muon_owner.get(id).is_some_and(|o| o.as_ref().is_some_and(|o| !o.mine))
                && let Some(len) = self.vals[id].as_ref().map(DeviceBuffer::len)
            {
                let mut b = self.device.alloc(Elem::F32, len)?;
                self.device.zero(&mut b)?;
                self.momentum[id] = Some(b);
            }
            swap_state(&self.device, muon, &mut self.moments[id], &mut self.momentum[id])?;
            if owner[id].as_ref().is_some_and(|o| !o.mine) {
                self.momentum[id] = None;
            }
        }
        // FSDP's pieces trade their moments the same way (`fsdp.rs`).
        self.fsdp_swap_moments(&takes)?;
        self.muon = takes;
        self.muon_split = split;
        self.muon_owner = owner;
        self.fsdp_muon_owner = fsdp_owner;
        self.optimizer = opt;
        Ok(())
    }

    /// The owners of the Muon matrices (`takes`) whose gradients a data-parallel
    /// all-reduce (`dp`, `edp`) of more than one rank covers: each group's matrices
    /// dealt over its ranks by their whole matrix's Newton–Schulz work ([`deal`]; a
    /// tensor-parallel block by the whole's, so the ranks of a tp group, which share a
    /// data-parallel index, own the same matrices and gather their blocks together;
    /// under blockwise, which records no split, a block by its own work, the same on
    /// the ranks of a dp group, which hold the same tp rank's blocks).
    /// FSDP's matrices (reduce-scattered, `fsdp.rs`) and the others stay `None`.
    fn deal_muon_owners(&self, takes: &[bool], split: &[Option<MuonSplit>]) -> Vec<Option<Owner>> {
        let mut owner = vec![None; takes.len()];
        for sc in &self.comm.step {
            let Some(c) = self.collectives.get(&sc.group) else { continue };
            if sc.kind != OpKind::AllReduce || !matches!(sc.group.as_str(), "dp" | "edp") || c.size() < 2 {
                continue;
            }
            let ids: Vec<TensorId> = sc.weights.iter().filter_map(|w| self.graph.tensor_id(w)).filter(|&id| takes[id] && owner[id].is_none()).collect();
            for (id, root) in self.deal_matrices(ids, split, c.size()) {
                owner[id] = Some(Owner { group: sc.group.clone(), root, mine: root == c.rank() });
            }
        }
        owner
    }

    /// Deal Muon matrices `ids` over a group of `ranks` ranks by their whole matrix's
    /// Newton–Schulz work ([`deal`]; a split matrix's whole is `split`'s): each with the
    /// rank it falls to. One rule for the data-parallel, FSDP and tensor-parallel deals.
    pub(super) fn deal_matrices(&self, ids: impl IntoIterator<Item = TensorId>, split: &[Option<MuonSplit>], ranks: usize) -> Vec<(TensorId, usize)> {
        let matrices = ids
            .into_iter()
            .map(|id| (self.graph.tensors[id].name.as_str(), ns_work(split[id].map_or_else(|| dims(&self.graph, id), |sp| sp.full))))
            .collect();
        deal(matrices, ranks).into_iter().filter_map(|(name, r)| self.graph.tensor_id(name).map(|id| (id, r))).collect()
    }

    /// Whether this rank runs the Newton–Schulz iteration of weight `name`: a matrix
    /// Muon updates, unless another rank of its data-parallel all-reduce owns it
    /// (`Owner`; under FSDP, of the unit's group), or, under [`MuonTpMode::Exact`],
    /// another tensor-parallel rank orthogonalises the whole of its block
    /// (`MuonSplit`). Under [`MuonTpMode::Blockwise`] every tp rank of the owning
    /// data-parallel index orthogonalises its own block. False under AdamW.
    pub fn orthogonalises(&self, name: &str) -> bool {
        let Some(id) = self.graph.tensor_id(name).filter(|&id| self.muon.get(id) == Some(&true)) else {
            return false;
        };
        let tp_rank = self.collectives.get("tp").map_or(0, |c| c.rank());
        let mine = |owners: &[Option<Owner>]| owners.get(id).is_none_or(|o| o.as_ref().is_none_or(|o| o.mine));
        mine(&self.muon_owner)
            && mine(&self.fsdp_muon_owner)
            && self.muon_split.get(id).is_none_or(|sp| sp.is_none_or(|sp| sp.ns_rank.is_none_or(|r| r == tp_rank)))
    }

    /// Per tensor: a Muon matrix another data-parallel rank updates ([`Owner`]), so
    /// this rank holds no optimizer state for it.
    pub(super) fn muon_lent(&self) -> Vec<bool> {
        self.muon_owner.iter().map(|o| o.as_ref().is_some_and(|o| !o.mine)).collect()
    }

    /// Muon's update of weight `id` where a data-parallel group shares the work
    /// ([`Owner`]): the owner updates it ([`Executor::muon_step`]) and broadcasts it
    /// over the group, the others receive it; a collective call on that group, in
    /// the weights' order on every rank. Elsewhere [`Executor::muon_step`] alone.
    pub(super) fn muon_shared_step(&mut self, id: TensorId) -> Result<bool, ExecError> {
        let Some(Some(o)) = self.muon_owner.get(id) else {
            return self.muon_step(id);
        };
        let (group, root) = (o.group.clone(), o.root);
        if o.mine && !self.muon_step(id)? {
            return Err(ExecError::State(format!("Muon: '{}' is this rank's to update, but has no gradient or momentum", self.graph.tensors[id].name)));
        }
        let c = self.collectives.get(&group).ok_or_else(|| ExecError::State(format!("Muon: no handle for group '{group}'")))?;
        let w = self.vals[id].as_mut().ok_or_else(|| ExecError::State(format!("Muon: '{}' has no value to receive", self.graph.tensors[id].name)))?;
        self.comm.timed(c.as_ref(), &self.device).broadcast(w, root)?;
        Ok(true)
    }

    /// The optimizer the steps run.
    pub fn optimizer(&self) -> Optimizer {
        self.optimizer
    }

    /// Whether Muon updates weight `name` (false under AdamW, or for a weight AdamW
    /// updates under Muon).
    pub fn takes_muon(&self, name: &str) -> bool {
        self.graph.tensor_id(name).is_some_and(|id| self.muon.get(id) == Some(&true))
    }

    /// Muon's update of weight `id` (it has a momentum buffer), or `Ok(false)` when the
    /// weight is AdamW's.
    /// The learning rate and decay are read from `adam_scalars` on the device, written
    /// for this step beforehand.
    pub(super) fn muon_step(&mut self, id: TensorId) -> Result<bool, ExecError> {
        let Optimizer::Muon(mu) = self.optimizer else {
            return Ok(false);
        };
        let (Some(p), Some(gr), Some(b)) = (self.vals[id].as_mut(), self.grads[id].as_ref(), self.momentum[id].as_mut()) else {
            return Ok(false);
        };
        let (rows, cols) = dims(&self.graph, id);
        let mut u = nesterov(&self.device, p, gr, b, rows, cols, &mu)?;
        let split = self.muon_split.get(id).copied().flatten();
        let tp = self.collectives.get("tp").map(|c| self.comm.timed(c.as_ref(), &self.device));
        let (fr, fc) = orthogonalise(&self.device, tp.as_ref(), split, &mut u, (rows, cols), mu.ns_steps)?;
        self.device.muon_apply(p, &u, &self.adam_scalars, update_scale(fr, fc))?;
        Ok(true)
    }

    /// Elements of the largest Muon update's scratch ([`scratch_elems`], of the whole matrix
    /// and the gathered blocks for a split one (a blockwise block's own, unsplit), and an FSDP unit's gathered updates for
    /// a covered one; 0 under AdamW and for the matrices other ranks update).
    pub(super) fn muon_scratch_elems(&self) -> usize {
        let lent = self.muon_lent();
        let tp_rank = self.collectives.get("tp").map_or(0, |c| c.rank());
        self.muon
            .iter()
            .enumerate()
            .filter(|&(id, m)| *m && lent.get(id) != Some(&true))
            .map(|(id, _)| {
                let (r, c) = dims(&self.graph, id);
                // An FSDP unit's flat chunk and its gathered copy (`fsdp.rs`); its
                // whole copy of the matrix is the update U. Where another rank of the
                // unit's group orthogonalises it, the copy receives the result, and
                // then this rank's piece of it.
                let fsdp = self.fsdp_muon_extra(id);
                if self.fsdp_muon_owner.get(id).is_some_and(|o| o.as_ref().is_some_and(|o| !o.mine)) {
                    return fsdp + r * c + self.fsdp_piece_len(id);
                }
                let Some(sp) = self.muon_split.get(id).copied().flatten() else {
                    return fsdp + scratch_elems(r, c);
                };
                // A split matrix: this rank's block of U, the gathered blocks, their
                // first copies (replicated parts); on the tp rank that runs its
                // Newton–Schulz, the transposed whole (column blocks) and the
                // iteration's own scratch of the whole (the product, the two Gram
                // matrices and the norm: its U is the gathered whole).
                // Where another tp rank runs it, the blocks only.
                let (piece, (fr, fc)) = (r * c, sp.full);
                let gathered = fsdp + piece + piece * sp.parts * sp.rep + if sp.rep > 1 { piece * sp.parts } else { 0 };
                if sp.ns_rank.is_some_and(|r| r != tp_rank) {
                    return gathered;
                }
                gathered + if sp.axis == 1 { fr * fc } else { 0 } + scratch_elems(fr, fc) - fr * fc
            })
            .max()
            .unwrap_or(0)
    }
}
