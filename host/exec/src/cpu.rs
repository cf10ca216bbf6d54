//! The CPU backend: [`Cpu`] implements [`Device`] with the f32 kernels of
//! `runner-kernels`, on rayon's current thread pool (set `RAYON_NUM_THREADS`).
//!
//! Each method unpacks its buffers into slices and calls the kernel of the same name;
//! the mapping from graph ops to kernels is the executor's (`executor/ops.rs`). Buffers
//! of the narrow float types store their bits (bf16, f16, FP8 codes with the tensor's
//! scale); kernels other than [`Device::matmul`] and the conversions take f32, and
//! [`Device::matmul`] widens narrow operands to f32 exactly before the product, so the
//! CPU computes what a GPU's low-precision GEMM computes (exact products, f32
//! accumulation) up to summation order. Events are host clocks: every kernel has
//! finished when it returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use moe::DispatchPlan;
use runner_graph::DType;
use runner_kernels::KernelError;
use runner_kernels::cpu::adamw::{Scalars, adamw_with};
use runner_kernels::cpu::muon;
use runner_kernels::cpu::attention::{Attn, attention_backward, attention_forward};
use runner_kernels::cpu::matmul::{self, Gemm};
use runner_kernels::cpu::moe::{self, Router};
use runner_kernels::cpu::precision::{self as prec, Fp8Format};
use runner_kernels::cpu::quant::{self, QuantReport, QuantSpec};
use runner_kernels::cpu::rope::{self, Rope};
use runner_kernels::cpu::ssm::{self, Conv1d, Ssm, SsmGrads, SsmInputs};
use runner_kernels::cpu::{activation, embedding, loss, norm};

use crate::device::{ConcatShapes, Device, DeviceBuffer, Elem, ExecError, ExpertWeights, MemStats, NoGraph};

/// Byte accounting shared by every buffer of one [`Cpu`] device, and the pool that
/// dropped buffers go back to.
#[derive(Debug, Default)]
struct Tracker {
    current: AtomicU64,
    peak: AtomicU64,
    allocations: AtomicU64,
    pool: Mutex<Pool>,
    /// [`Cpu::host_transfers`].
    transfers: AtomicU64,
}

/// Storage of dropped buffers, by (element type, length), for the next allocation of
/// the same size.
///
/// A training step allocates and frees the same activation and gradient buffers every
/// step (about 250 MiB for the 4-layer bench model). From the allocator those come
/// back as fresh pages: the buffers of 128 KiB and more are `mmap`ed and unmapped on
/// free, so each step page-faulted ~65k times and had the kernel zero the memory
/// (~8% of the step). Reusing them skips both. Pooled bytes are not live: they do not
/// count in [`MemStats`], and the pool holds at most the device's peak live bytes.
#[derive(Debug, Default)]
struct Pool {
    free: HashMap<(Elem, usize), Vec<CpuData>>,
    bytes: u64,
}

/// Buffers below this many bytes go back to the allocator (cheap to get again).
const POOL_MIN_BYTES: usize = 64 << 10;

impl Tracker {
    fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }
    fn sub(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }
    /// Keep `data` for reuse if it is big enough and the pool has room.
    fn recycle(&self, elem: Elem, data: CpuData) {
        let len = data.len();
        let bytes = (len * elem.bytes()) as u64;
        if (bytes as usize) < POOL_MIN_BYTES {
            return;
        }
        let cap = self.peak.load(Ordering::Relaxed);
        if let Ok(mut p) = self.pool.lock()
            && p.bytes + bytes <= cap
        {
            p.bytes += bytes;
            p.free.entry((elem, len)).or_default().push(data);
        }
    }
    /// A pooled buffer of this type and length, if there is one (contents arbitrary).
    fn reuse(&self, elem: Elem, len: usize) -> Option<CpuData> {
        if len * elem.bytes() < POOL_MIN_BYTES {
            return None;
        }
        let mut p = self.pool.lock().ok()?;
        let data = p.free.get_mut(&(elem, len))?.pop()?;
        p.bytes -= (len * elem.bytes()) as u64;
        Some(data)
    }
}

/// The contents of a CPU buffer: f32 values, int32 ids, 16-bit float bits (bf16 or
/// f16) or FP8 codes.
#[derive(Debug)]
pub enum CpuData {
    F32(Vec<f32>),
    U32(Vec<u32>),
    U16(Vec<u16>),
    U8(Vec<u8>),
}

impl CpuData {
    fn len(&self) -> usize {
        match self {
            CpuData::F32(v) => v.len(),
            CpuData::U32(v) => v.len(),
            CpuData::U16(v) => v.len(),
            CpuData::U8(v) => v.len(),
        }
    }
    /// Storage for `len` elements of `elem`, filled with `poison`'s pattern or zeros.
    fn new(elem: Elem, len: usize, poison: bool) -> CpuData {
        match (elem, poison) {
            (Elem::F32, true) => CpuData::F32(vec![f32::NAN; len]),
            (Elem::F32, false) => CpuData::F32(vec![0.0; len]),
            (Elem::I32, true) => CpuData::U32(vec![u32::MAX; len]),
            (Elem::I32, false) => CpuData::U32(vec![0; len]),
            // 0x7FC0 is a bf16 NaN, 0x7E00 an f16 NaN, 0x7F an FP8 NaN in both formats.
            (Elem::BF16, true) => CpuData::U16(vec![0x7FC0; len]),
            (Elem::F16, true) => CpuData::U16(vec![0x7E00; len]),
            (Elem::BF16 | Elem::F16, false) => CpuData::U16(vec![0; len]),
            (Elem::F8E4M3 | Elem::F8E5M2, true) => CpuData::U8(vec![0x7F; len]),
            (Elem::F8E4M3 | Elem::F8E5M2, false) => CpuData::U8(vec![0; len]),
        }
    }
    fn poison(&mut self, elem: Elem) {
        match self {
            CpuData::F32(v) => v.fill(f32::NAN),
            CpuData::U32(v) => v.fill(u32::MAX),
            CpuData::U16(v) => v.fill(if elem == Elem::F16 { 0x7E00 } else { 0x7FC0 }),
            CpuData::U8(v) => v.fill(0x7F),
        }
    }
}

/// A host-memory buffer that reports its size to its device's tracker on drop.
#[derive(Debug)]
pub struct CpuBuffer {
    data: CpuData,
    elem: Elem,
    /// FP8 buffers: the tensor's scale (`x ≈ decode(q) / scale`); 1 otherwise.
    scale: f32,
    /// FP8 buffers: max |x| of the last write, before quantisation.
    amax: f32,
    tracker: Arc<Tracker>,
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        self.tracker.sub(self.bytes());
        let data = std::mem::replace(&mut self.data, CpuData::F32(Vec::new()));
        self.tracker.recycle(self.elem, data);
    }
}

impl CpuBuffer {
    fn bytes(&self) -> u64 {
        (self.len() * self.elem.bytes()) as u64
    }
    /// The f32 contents (empty for a buffer of another type).
    pub fn f32(&self) -> &[f32] {
        match &self.data {
            CpuData::F32(v) => v,
            _ => &[],
        }
    }
    /// The ids of an int32 buffer (empty for a buffer of another type).
    pub fn u32(&self) -> &[u32] {
        match &self.data {
            CpuData::U32(v) => v,
            _ => &[],
        }
    }
    fn u32_mut(&mut self) -> &mut [u32] {
        match &mut self.data {
            CpuData::U32(v) => v,
            _ => &mut [],
        }
    }
}

impl DeviceBuffer for CpuBuffer {
    fn len(&self) -> usize {
        self.data.len()
    }
    fn elem(&self) -> Elem {
        self.elem
    }
}

/// The CPU device.
#[derive(Debug, Default, Clone)]
pub struct Cpu {
    tracker: Arc<Tracker>,
}

impl Cpu {
    pub fn new() -> Cpu {
        Cpu::default()
    }

    /// Host reads, writes, waits and events so far: what a recorded step (a CUDA graph,
    /// `executor/graph.rs`) may not contain, counted so the tests can check it does not.
    pub fn host_transfers(&self) -> u64 {
        self.tracker.transfers.load(Ordering::Relaxed)
    }

    fn transfer(&self) {
        self.tracker.transfers.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether fresh buffers are filled with NaN / u32::MAX. Debug and test builds only:
/// the fill costs a pass over memory that a release benchmark should not pay.
const POISON: bool = cfg!(debug_assertions);

/// A kernel's refusal, named by the kernel (the executor renames it to the graph op).
fn kerr(kernel: &'static str) -> impl FnOnce(KernelError) -> ExecError {
    move |source| ExecError::Kernel {
        op: kernel.into(),
        source,
    }
}

/// The f32 slice of `b`, or an error naming the kernel that needs it.
fn f<'a>(b: &'a CpuBuffer, kernel: &str) -> Result<&'a [f32], ExecError> {
    match &b.data {
        CpuData::F32(v) => Ok(v),
        _ => Err(wrong_type(kernel, b.elem, Elem::F32)),
    }
}
fn fm<'a>(b: &'a mut CpuBuffer, kernel: &str) -> Result<&'a mut [f32], ExecError> {
    let elem = b.elem;
    match &mut b.data {
        CpuData::F32(v) => Ok(v),
        _ => Err(wrong_type(kernel, elem, Elem::F32)),
    }
}
fn ids<'a>(b: &'a CpuBuffer, kernel: &str) -> Result<&'a [u32], ExecError> {
    match &b.data {
        CpuData::U32(v) => Ok(v),
        _ => Err(wrong_type(kernel, b.elem, Elem::I32)),
    }
}
fn wrong_type(kernel: &str, got: Elem, want: Elem) -> ExecError {
    ExecError::State(format!(
        "kernel {kernel} takes {} buffers, got {}",
        want.name(),
        got.name()
    ))
}

fn len_err(what: &str, got: usize, want: usize) -> ExecError {
    ExecError::State(format!("{what}: {got} elements into a buffer of {want}"))
}

fn last(s: &[u64]) -> usize {
    s.last().copied().unwrap_or(1) as usize
}

/// Element-wise loops share the kernels' grain (2^15 elements per task).
const GRAIN: usize = 1 << 15;

impl Cpu {
    fn scratch(&self, len: usize) -> Result<CpuBuffer, ExecError> {
        self.alloc(Elem::F32, len)
    }

    /// The values of a float buffer as f32, borrowed when it is f32 already.
    fn widen<'a>(&self, b: &'a CpuBuffer) -> Result<std::borrow::Cow<'a, [f32]>, ExecError> {
        match &b.data {
            CpuData::F32(v) => Ok(std::borrow::Cow::Borrowed(v)),
            _ => self.read_f32(b).map(std::borrow::Cow::Owned),
        }
    }

    /// A grouped linear's expert weights as one f32 (E, n, k) tensor.
    fn widen_experts<'a>(&self, w: ExpertWeights<'a, CpuBuffer>) -> Result<std::borrow::Cow<'a, [f32]>, ExecError> {
        match w {
            ExpertWeights::Stacked(b) => self.widen(b),
            ExpertWeights::Each(bs) => {
                let mut all = Vec::with_capacity(w.len());
                for b in bs {
                    all.extend_from_slice(&self.widen(b)?);
                }
                Ok(std::borrow::Cow::Owned(all))
            }
        }
    }
}

impl Device for Cpu {
    type Buffer = CpuBuffer;
    type Plan = DispatchPlan;
    type Event = Instant;
    type QuantStats = QuantReport;
    type Graph = NoGraph;

    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn alloc(&self, elem: Elem, len: usize) -> Result<CpuBuffer, ExecError> {
        let data = match self.tracker.reuse(elem, len) {
            Some(mut d) => {
                if POISON {
                    d.poison(elem);
                }
                d
            }
            None => CpuData::new(elem, len, POISON),
        };
        let buf = CpuBuffer {
            data,
            elem,
            scale: 1.0,
            amax: 0.0,
            tracker: self.tracker.clone(),
        };
        self.tracker.add(buf.bytes());
        Ok(buf)
    }

    fn zero(&self, buf: &mut CpuBuffer) -> Result<(), ExecError> {
        match &mut buf.data {
            CpuData::F32(v) => v.fill(0.0),
            CpuData::U32(v) => v.fill(0),
            CpuData::U16(v) => v.fill(0),
            CpuData::U8(v) => v.fill(0),
        }
        buf.scale = 1.0;
        buf.amax = 0.0;
        Ok(())
    }

    fn write_f32(&self, buf: &mut CpuBuffer, data: &[f32]) -> Result<(), ExecError> {
        self.transfer();
        if buf.len() != data.len() || !buf.elem.is_float() {
            return Err(ExecError::State(format!(
                "write of {} f32 into a buffer of {} {}",
                data.len(),
                buf.len(),
                buf.elem.name()
            )));
        }
        let elem = buf.elem;
        match &mut buf.data {
            CpuData::F32(v) => v.copy_from_slice(data),
            CpuData::U16(v) if elem == Elem::BF16 => {
                for (o, &x) in v.iter_mut().zip(data) {
                    *o = prec::bf16_bits(x);
                }
            }
            CpuData::U16(v) => {
                for (o, &x) in v.iter_mut().zip(data) {
                    *o = half::f16::from_f32(x).to_bits();
                }
            }
            CpuData::U8(v) => {
                let fmt = elem.fp8().unwrap_or(Fp8Format::E4M3);
                let amax = data.iter().fold(0f32, |m, x| m.max(x.abs()));
                let scale = prec::fp8_current_scale(amax, fmt);
                prec::fp8_quantize(v, data, scale, fmt, true).map_err(kerr("cast"))?;
                buf.scale = scale;
                buf.amax = amax;
            }
            CpuData::U32(_) => unreachable!("checked above: float buffer"),
        }
        Ok(())
    }

    fn write_u32(&self, buf: &mut CpuBuffer, data: &[u32]) -> Result<(), ExecError> {
        self.transfer();
        match &mut buf.data {
            CpuData::U32(v) if v.len() == data.len() => {
                v.copy_from_slice(data);
                Ok(())
            }
            _ => Err(ExecError::State(format!(
                "write of {} u32 into a buffer of {} {}",
                data.len(),
                buf.len(),
                buf.elem.name()
            ))),
        }
    }

    fn read_f32(&self, buf: &CpuBuffer) -> Result<Vec<f32>, ExecError> {
        self.transfer();
        match &buf.data {
            CpuData::F32(v) => Ok(v.clone()),
            CpuData::U16(v) if buf.elem == Elem::BF16 => {
                Ok(v.iter().map(|&b| prec::bf16_from_bits(b)).collect())
            }
            CpuData::U16(v) => Ok(v.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect()),
            CpuData::U8(q) => {
                let mut out = vec![0f32; q.len()];
                let fmt = buf.elem.fp8().unwrap_or(Fp8Format::E4M3);
                prec::fp8_dequantize(&mut out, q, buf.scale, fmt).map_err(kerr("cast"))?;
                Ok(out)
            }
            CpuData::U32(_) => Err(ExecError::State("read_f32 of an int32 buffer".into())),
        }
    }

    fn read_u32(&self, buf: &CpuBuffer) -> Result<Vec<u32>, ExecError> {
        self.transfer();
        match &buf.data {
            CpuData::U32(v) => Ok(v.clone()),
            _ => Err(ExecError::State(format!(
                "read_u32 of a {} buffer",
                buf.elem.name()
            ))),
        }
    }

    fn copy(
        &self,
        dst: &mut CpuBuffer,
        dst_at: usize,
        src: &CpuBuffer,
        src_at: usize,
        len: usize,
    ) -> Result<(), ExecError> {
        let ok = dst.elem == src.elem
            && dst_at.checked_add(len).is_some_and(|e| e <= dst.len())
            && src_at.checked_add(len).is_some_and(|e| e <= src.len());
        if !ok {
            return Err(ExecError::State(format!(
                "copy of {len} {} from {src_at} of {} into {} {} at {dst_at}",
                src.elem.name(),
                src.len(),
                dst.len(),
                dst.elem.name()
            )));
        }
        let (d, s) = (dst_at..dst_at + len, src_at..src_at + len);
        match (&mut dst.data, &src.data) {
            (CpuData::F32(a), CpuData::F32(b)) => a[d].copy_from_slice(&b[s]),
            (CpuData::U32(a), CpuData::U32(b)) => a[d].copy_from_slice(&b[s]),
            (CpuData::U16(a), CpuData::U16(b)) => a[d].copy_from_slice(&b[s]),
            (CpuData::U8(a), CpuData::U8(b)) => a[d].copy_from_slice(&b[s]),
            _ => return Err(ExecError::State("copy between storage kinds".into())),
        }
        dst.scale = src.scale;
        dst.amax = src.amax;
        Ok(())
    }

    fn transpose_outer(
        &self,
        dst: &mut CpuBuffer,
        src: &CpuBuffer,
        a: usize,
        b: usize,
        c: usize,
    ) -> Result<(), ExecError> {
        let n = a * b * c;
        if dst.elem != src.elem || dst.len() != n || src.len() != n {
            return Err(ExecError::State(format!(
                "transpose_outer ({a},{b},{c}) of {} {} into {} {}",
                src.len(),
                src.elem.name(),
                dst.len(),
                dst.elem.name()
            )));
        }
        fn go<T: Copy>(d: &mut [T], s: &[T], a: usize, b: usize, c: usize) {
            for i in 0..a {
                for j in 0..b {
                    let (from, to) = ((i * b + j) * c, (j * a + i) * c);
                    d[to..to + c].copy_from_slice(&s[from..from + c]);
                }
            }
        }
        match (&mut dst.data, &src.data) {
            (CpuData::F32(d), CpuData::F32(s)) => go(d, s, a, b, c),
            (CpuData::U32(d), CpuData::U32(s)) => go(d, s, a, b, c),
            (CpuData::U16(d), CpuData::U16(s)) => go(d, s, a, b, c),
            (CpuData::U8(d), CpuData::U8(s)) => go(d, s, a, b, c),
            _ => return Err(ExecError::State("transpose between storage kinds".into())),
        }
        dst.scale = src.scale;
        dst.amax = src.amax;
        Ok(())
    }

    fn cast(&self, dst: &mut CpuBuffer, src: &CpuBuffer) -> Result<(), ExecError> {
        let x = self.widen(src)?;
        self.write_f32(dst, &x)
    }

    fn fp8_scale(&self, buf: &CpuBuffer) -> Result<f32, ExecError> {
        self.transfer();
        Ok(buf.scale)
    }

    fn fp8_amax(&self, buf: &CpuBuffer) -> Result<f32, ExecError> {
        self.transfer();
        Ok(if buf.elem.fp8().is_some() { buf.amax } else { 0.0 })
    }

    fn round_to_storage(&self, buf: &mut CpuBuffer, dtype: DType, row: usize) -> Result<(), ExecError> {
        let x = fm(buf, "round_to_storage")?;
        match dtype {
            DType::BF16 => prec::round_to_bf16(x),
            DType::F16 => prec::round_to_f16(x),
            DType::Fp8E4M3 => {
                prec::round_to_fp8_current(x, Fp8Format::E4M3);
            }
            DType::Fp8E5M2 => {
                prec::round_to_fp8_current(x, Fp8Format::E5M2);
            }
            DType::MxFp8 => prec::round_to_mxfp8(x, row).map_err(kerr("round_to_storage"))?,
            DType::F32 | DType::NvFp4 | DType::I32 => {}
        }
        Ok(())
    }

    fn quantize(&self, x: &mut CpuBuffer, rows: usize, cols: usize, spec: &QuantSpec) -> Result<QuantReport, ExecError> {
        quant::quantize(fm(x, "quantize")?, rows, cols, spec).map_err(kerr("quantize"))
    }

    fn read_quant(&self, stats: Vec<QuantReport>) -> Result<Vec<QuantReport>, ExecError> {
        self.transfer();
        Ok(stats)
    }

    fn quantize_fp8_codes(&self, dst: &mut CpuBuffer, src: &CpuBuffer, src_at: usize, spec: &QuantSpec) -> Result<QuantReport, ExecError> {
        let k = "quantize_fp8_codes";
        let fmt = dst.elem.fp8().ok_or_else(|| ExecError::State(format!("{k}: into a {} buffer", dst.elem.name())))?;
        if !matches!((spec, fmt), (QuantSpec::Tensor { format: quant::Format::E4M3, .. }, Fp8Format::E4M3) | (QuantSpec::Tensor { format: quant::Format::E5M2, .. }, Fp8Format::E5M2)) {
            return Err(ExecError::State(format!("{k}: {spec:?} into a {} buffer", dst.elem.name())));
        }
        let x = f(src, k)?;
        let x = src_at.checked_add(dst.len()).and_then(|end| x.get(src_at..end)).ok_or_else(|| {
            ExecError::State(format!("{k}: {} codes from element {src_at} of a {}-element source", dst.len(), x.len()))
        })?;
        let CpuData::U8(q) = &mut dst.data else {
            return Err(ExecError::State(format!("{k}: an FP8 buffer without bytes")));
        };
        let r = quant::quantize_codes(q, x, spec).map_err(kerr(k))?;
        dst.scale = r.scale;
        dst.amax = r.amax;
        Ok(r)
    }

    fn hadamard_rows(&self, x: &mut CpuBuffer, rows: usize, cols: usize, h: usize, seed: u64) -> Result<(), ExecError> {
        quant::hadamard_rows(fm(x, "hadamard_rows")?, rows, cols, h, seed).map_err(kerr("hadamard_rows"))
    }

    fn add_assign(&self, dst: &mut CpuBuffer, src: &CpuBuffer) -> Result<(), ExecError> {
        use rayon::prelude::*;
        let s = f(src, "add_assign")?;
        let d = fm(dst, "add_assign")?;
        if d.len() != s.len() {
            return Err(len_err("add_assign", s.len(), d.len()));
        }
        d.par_chunks_mut(GRAIN)
            .zip(s.par_chunks(GRAIN))
            .for_each(|(d, s)| {
                for (a, b) in d.iter_mut().zip(s) {
                    *a += b;
                }
            });
        Ok(())
    }

    fn scale(&self, buf: &mut CpuBuffer, s: f32) -> Result<(), ExecError> {
        use rayon::prelude::*;
        fm(buf, "scale")?
            .par_chunks_mut(GRAIN)
            .for_each(|c| c.iter_mut().for_each(|x| *x *= s));
        Ok(())
    }

    fn add_forward(&self, out: &mut CpuBuffer, a: &CpuBuffer, b: &CpuBuffer) -> Result<(), ExecError> {
        let k = "add_forward";
        activation::add_forward(fm(out, k)?, f(a, k)?, f(b, k)?).map_err(kerr(k))
    }

    fn add_bias(&self, out: &mut CpuBuffer, bias: &CpuBuffer) -> Result<(), ExecError> {
        let k = "add_bias";
        let b = f(bias, k)?;
        let o = fm(out, k)?;
        if b.is_empty() || !o.len().is_multiple_of(b.len()) {
            return Err(len_err(k, b.len(), o.len()));
        }
        for row in o.chunks_mut(b.len()) {
            for (x, y) in row.iter_mut().zip(b) {
                *x += y;
            }
        }
        Ok(())
    }

    fn bias_backward(&self, dbias: &mut CpuBuffer, dout: &CpuBuffer) -> Result<(), ExecError> {
        let k = "bias_backward";
        let dy = f(dout, k)?;
        let db = fm(dbias, k)?;
        if db.is_empty() || !dy.len().is_multiple_of(db.len()) {
            return Err(len_err(k, dy.len(), db.len()));
        }
        for row in dy.chunks(db.len()) {
            for (d, g) in db.iter_mut().zip(row) {
                *d += g;
            }
        }
        Ok(())
    }

    fn swiglu_forward(&self, out: &mut CpuBuffer, gate: &CpuBuffer, up: &CpuBuffer) -> Result<(), ExecError> {
        let k = "swiglu_forward";
        activation::swiglu_forward(fm(out, k)?, f(gate, k)?, f(up, k)?).map_err(kerr(k))
    }

    fn swiglu_backward(
        &self,
        dgate: &mut CpuBuffer,
        dup: &mut CpuBuffer,
        dout: &CpuBuffer,
        gate: &CpuBuffer,
        up: &CpuBuffer,
    ) -> Result<(), ExecError> {
        let k = "swiglu_backward";
        activation::swiglu_backward(fm(dgate, k)?, fm(dup, k)?, f(dout, k)?, f(gate, k)?, f(up, k)?)
            .map_err(kerr(k))
    }

    fn geglu_forward(&self, out: &mut CpuBuffer, gate: &CpuBuffer, up: &CpuBuffer) -> Result<(), ExecError> {
        let k = "geglu_forward";
        let (g, u) = (f(gate, k)?, f(up, k)?);
        let o = fm(out, k)?;
        activation::gelu_forward(o, g).map_err(kerr(k))?;
        if u.len() != o.len() {
            return Err(len_err(k, u.len(), o.len()));
        }
        for (o, u) in o.iter_mut().zip(u) {
            *o *= u;
        }
        Ok(())
    }

    fn geglu_backward(
        &self,
        dgate: &mut CpuBuffer,
        dup: &mut CpuBuffer,
        dout: &CpuBuffer,
        gate: &CpuBuffer,
        up: &CpuBuffer,
    ) -> Result<(), ExecError> {
        // out = gelu(g)·u: dg = gelu'(g)·(dout·u), du = dout·gelu(g).
        let k = "geglu_backward";
        let (d, g, u) = (f(dout, k)?, f(gate, k)?, f(up, k)?);
        if u.len() != d.len() {
            return Err(len_err(k, u.len(), d.len()));
        }
        let dxu: Vec<f32> = d.iter().zip(u).map(|(a, b)| a * b).collect();
        activation::gelu_backward(fm(dgate, k)?, &dxu, g).map_err(kerr(k))?;
        let du = fm(dup, k)?;
        activation::gelu_forward(du, g).map_err(kerr(k))?;
        for (x, a) in du.iter_mut().zip(d) {
            *x *= a;
        }
        Ok(())
    }

    fn gelu_forward(&self, out: &mut CpuBuffer, x: &CpuBuffer) -> Result<(), ExecError> {
        let k = "gelu_forward";
        activation::gelu_forward(fm(out, k)?, f(x, k)?).map_err(kerr(k))
    }

    fn gelu_backward(&self, dx: &mut CpuBuffer, dout: &CpuBuffer, x: &CpuBuffer) -> Result<(), ExecError> {
        let k = "gelu_backward";
        activation::gelu_backward(fm(dx, k)?, f(dout, k)?, f(x, k)?).map_err(kerr(k))
    }

    fn squared_relu_forward(&self, out: &mut CpuBuffer, x: &CpuBuffer) -> Result<(), ExecError> {
        let k = "squared_relu_forward";
        activation::squared_relu_forward(fm(out, k)?, f(x, k)?).map_err(kerr(k))
    }

    fn squared_relu_backward(&self, dx: &mut CpuBuffer, dout: &CpuBuffer, x: &CpuBuffer) -> Result<(), ExecError> {
        let k = "squared_relu_backward";
        activation::squared_relu_backward(fm(dx, k)?, f(dout, k)?, f(x, k)?).map_err(kerr(k))
    }

    fn concat_forward(&self, out: &mut CpuBuffer, a: &CpuBuffer, b: &CpuBuffer, s: ConcatShapes<'_>) -> Result<(), ExecError> {
        let k = "concat_forward";
        let (la, lb, lo) = s.dims(k, out.len(), Some(a.len()), Some(b.len()))?;
        let r = s.out.len().saturating_sub(1);
        let (xa, xb) = (f(a, k)?, f(b, k)?);
        let o = fm(out, k)?;
        for (row, dst) in o.chunks_mut(lo).enumerate() {
            let ra = runner_kernels::cpu::broadcast_row(&s.out[..r], &s.a[..r], row);
            let rb = runner_kernels::cpu::broadcast_row(&s.out[..r], &s.b[..r], row);
            dst[..la].copy_from_slice(&xa[ra * la..(ra + 1) * la]);
            dst[la..].copy_from_slice(&xb[rb * lb..(rb + 1) * lb]);
        }
        Ok(())
    }

    fn concat_backward(
        &self,
        da: Option<&mut CpuBuffer>,
        db: Option<&mut CpuBuffer>,
        dout: &CpuBuffer,
        s: ConcatShapes<'_>,
    ) -> Result<(), ExecError> {
        let k = "concat_backward";
        let lens = (da.as_ref().map(|t| t.len()), db.as_ref().map(|t| t.len()));
        let (_, _, lo) = s.dims(k, dout.len(), lens.0, lens.1)?;
        let d = f(dout, k)?;
        let r = s.out.len().saturating_sub(1);
        let mut col0 = 0;
        for (t, ss) in [(da, s.a), (db, s.b)] {
            let ls = last(ss);
            if let Some(t) = t {
                let dx = fm(t, k)?;
                // Broadcast leading axes sum their gradient over the copies.
                for (row, src) in d.chunks(lo).enumerate() {
                    let rs = runner_kernels::cpu::broadcast_row(&s.out[..r], &ss[..r], row);
                    for (a, b) in dx[rs * ls..(rs + 1) * ls].iter_mut().zip(&src[col0..col0 + ls]) {
                        *a += b;
                    }
                }
            }
            col0 += ls;
        }
        Ok(())
    }

    fn matmul(&self, c: &mut CpuBuffer, a: &CpuBuffer, b: &CpuBuffer, g: Gemm, accumulate: bool) -> Result<(), ExecError> {
        let k = "matmul";
        if a.elem != b.elem && !(a.elem.fp8().is_some() && b.elem.fp8().is_some()) {
            return Err(ExecError::State(format!("{k}: operands {} x {}", a.elem.name(), b.elem.name())));
        }
        if a.elem == Elem::F8E5M2 && b.elem == Elem::F8E5M2 {
            return Err(ExecError::State(format!("{k}: e5m2 x e5m2 (cuBLASLt has no such FP8 GEMM)")));
        }
        let (xa, xb) = (self.widen(a)?, self.widen(b)?);
        if let Some(fmt) = c.elem.fp8() {
            if accumulate || a.elem.fp8().is_none() {
                return Err(ExecError::State(format!("{k}: an FP8 output needs FP8 operands and no accumulation")));
            }
            let mut acc = vec![0.0; c.len()];
            matmul::matmul(&mut acc, &xa, &xb, g, false).map_err(kerr(k))?;
            let amax = acc.iter().filter(|x| !x.is_nan()).fold(0f32, |m, x| m.max(x.abs()));
            let scale = c.scale;
            if let CpuData::U8(q) = &mut c.data {
                prec::fp8_quantize(q, &acc, scale, fmt, true).map_err(kerr(k))?;
            }
            c.amax = amax;
            return Ok(());
        }
        match c.elem {
            Elem::F32 => matmul::matmul(fm(c, k)?, &xa, &xb, g, accumulate).map_err(kerr(k)),
            Elem::BF16 | Elem::F16 => {
                let mut acc = if accumulate { self.read_f32(c)? } else { vec![0.0; c.len()] };
                matmul::matmul(&mut acc, &xa, &xb, g, accumulate).map_err(kerr(k))?;
                self.write_f32(c, &acc)
            }
            e => Err(ExecError::State(format!("{k}: output type {} (f32, bf16 or f16)", e.name()))),
        }
    }

    fn embedding_forward(
        &self,
        out: &mut CpuBuffer,
        tokens: &CpuBuffer,
        table: &CpuBuffer,
        c: usize,
        vocab_start: Option<usize>,
    ) -> Result<(), ExecError> {
        let k = "embedding_forward";
        let (t, w) = (ids(tokens, k)?, f(table, k)?);
        match vocab_start {
            None => embedding::embedding_forward(fm(out, k)?, t, w, c),
            Some(s) => embedding::embedding_shard_forward(fm(out, k)?, t, w, c, s),
        }
        .map_err(kerr(k))
    }

    fn embedding_backward(
        &self,
        dtable: &mut CpuBuffer,
        dout: &CpuBuffer,
        tokens: &CpuBuffer,
        c: usize,
        vocab_start: Option<usize>,
    ) -> Result<(), ExecError> {
        let k = "embedding_backward";
        let (d, t) = (f(dout, k)?, ids(tokens, k)?);
        match vocab_start {
            None => embedding::embedding_backward(fm(dtable, k)?, d, t, c),
            Some(s) => embedding::embedding_shard_backward(fm(dtable, k)?, d, t, c, s),
        }
        .map_err(kerr(k))
    }

    fn rmsnorm_forward(
        &self,
        out: &mut CpuBuffer,
        rstd: &mut CpuBuffer,
        x: &CpuBuffer,
        w: &CpuBuffer,
        c: usize,
        eps: f32,
    ) -> Result<(), ExecError> {
        let k = "rmsnorm_forward";
        norm::rmsnorm_forward(fm(out, k)?, fm(rstd, k)?, f(x, k)?, f(w, k)?, c, eps).map_err(kerr(k))
    }

    fn rmsnorm_backward(
        &self,
        dx: &mut CpuBuffer,
        dw: &mut CpuBuffer,
        dout: &CpuBuffer,
        x: &CpuBuffer,
        w: &CpuBuffer,
        rstd: &CpuBuffer,
        c: usize,
    ) -> Result<(), ExecError> {
        let k = "rmsnorm_backward";
        norm::rmsnorm_backward(fm(dx, k)?, fm(dw, k)?, f(dout, k)?, f(x, k)?, f(w, k)?, f(rstd, k)?, c)
            .map_err(kerr(k))
    }

    fn layernorm_forward(
        &self,
        out: &mut CpuBuffer,
        mean: &mut CpuBuffer,
        rstd: &mut CpuBuffer,
        x: &CpuBuffer,
        w: &CpuBuffer,
        b: &CpuBuffer,
        c: usize,
        eps: f32,
    ) -> Result<(), ExecError> {
        let k = "layernorm_forward";
        norm::layernorm_forward(fm(out, k)?, fm(mean, k)?, fm(rstd, k)?, f(x, k)?, f(w, k)?, f(b, k)?, c, eps)
            .map_err(kerr(k))
    }

    fn layernorm_backward(
        &self,
        dx: &mut CpuBuffer,
        dw: &mut CpuBuffer,
        db: &mut CpuBuffer,
        dout: &CpuBuffer,
        x: &CpuBuffer,
        w: &CpuBuffer,
        mean: &CpuBuffer,
        rstd: &CpuBuffer,
        c: usize,
    ) -> Result<(), ExecError> {
        let k = "layernorm_backward";
        norm::layernorm_backward(
            fm(dx, k)?,
            fm(dw, k)?,
            fm(db, k)?,
            f(dout, k)?,
            f(x, k)?,
            f(w, k)?,
            f(mean, k)?,
            f(rstd, k)?,
            c,
        )
        .map_err(kerr(k))
    }

    fn rope_forward(&self, out: &mut CpuBuffer, x: &CpuBuffer, r: Rope) -> Result<(), ExecError> {
        let k = "rope_forward";
        rope::rope_forward(fm(out, k)?, f(x, k)?, r).map_err(kerr(k))
    }

    fn rope_backward(&self, dx: &mut CpuBuffer, dout: &CpuBuffer, r: Rope) -> Result<(), ExecError> {
        let k = "rope_backward";
        rope::rope_backward(fm(dx, k)?, f(dout, k)?, r).map_err(kerr(k))
    }

    fn attention_forward(
        &self,
        out: &mut CpuBuffer,
        lse: &mut CpuBuffer,
        q: &CpuBuffer,
        kk: &CpuBuffer,
        v: &CpuBuffer,
        a: Attn,
    ) -> Result<(), ExecError> {
        let k = "attention_forward";
        attention_forward(fm(out, k)?, fm(lse, k)?, f(q, k)?, f(kk, k)?, f(v, k)?, a).map_err(kerr(k))
    }

    fn attention_backward(
        &self,
        dq: &mut CpuBuffer,
        dk: &mut CpuBuffer,
        dv: &mut CpuBuffer,
        dout: &CpuBuffer,
        q: &CpuBuffer,
        kk: &CpuBuffer,
        v: &CpuBuffer,
        out: &CpuBuffer,
        lse: &CpuBuffer,
        a: Attn,
    ) -> Result<(), ExecError> {
        let k = "attention_backward";
        attention_backward(
            fm(dq, k)?,
            fm(dk, k)?,
            fm(dv, k)?,
            f(dout, k)?,
            f(q, k)?,
            f(kk, k)?,
            f(v, k)?,
            f(out, k)?,
            f(lse, k)?,
            a,
        )
        .map_err(kerr(k))
    }

    fn causal_conv1d_forward(&self, out: &mut CpuBuffer, x: &CpuBuffer, w: &CpuBuffer, bias: &CpuBuffer, s: Conv1d) -> Result<(), ExecError> {
        let k = "causal_conv1d_forward";
        ssm::causal_conv1d_forward(fm(out, k)?, f(x, k)?, f(w, k)?, f(bias, k)?, s).map_err(kerr(k))
    }

    fn causal_conv1d_backward(
        &self,
        dx: &mut CpuBuffer,
        dw: &mut CpuBuffer,
        dbias: &mut CpuBuffer,
        dout: &CpuBuffer,
        x: &CpuBuffer,
        w: &CpuBuffer,
        bias: &CpuBuffer,
        s: Conv1d,
    ) -> Result<(), ExecError> {
        let k = "causal_conv1d_backward";
        ssm::causal_conv1d_backward(fm(dx, k)?, fm(dw, k)?, fm(dbias, k)?, f(dout, k)?, f(x, k)?, f(w, k)?, f(bias, k)?, s)
            .map_err(kerr(k))
    }

    fn ssm_scan_forward(&self, y: &mut CpuBuffer, states: &mut CpuBuffer, i: SsmInputs<&CpuBuffer>, s: Ssm) -> Result<(), ExecError> {
        let k = "ssm_scan_forward";
        let i = i.try_map(|b| f(b, k))?;
        ssm::ssm_scan_forward(fm(y, k)?, fm(states, k)?, i, s).map_err(kerr(k))
    }

    fn ssm_scan_backward(
        &self,
        g: SsmGrads<&mut CpuBuffer>,
        dy: &CpuBuffer,
        i: SsmInputs<&CpuBuffer>,
        states: &CpuBuffer,
        s: Ssm,
    ) -> Result<(), ExecError> {
        let k = "ssm_scan_backward";
        let (g, i) = (g.try_map(|b| fm(b, k))?, i.try_map(|b| f(b, k))?);
        ssm::ssm_scan_backward(g, f(dy, k)?, i, f(states, k)?, s).map_err(kerr(k))
    }

    fn cross_entropy_forward(
        &self,
        loss_out: &mut CpuBuffer,
        lse: &mut CpuBuffer,
        logits: &CpuBuffer,
        targets: &CpuBuffer,
        v: usize,
    ) -> Result<(), ExecError> {
        let k = "cross_entropy_forward";
        let rows = lse.len();
        let mut losses = self.scratch(rows)?;
        let mean = loss::cross_entropy_forward(fm(&mut losses, k)?, fm(lse, k)?, f(logits, k)?, ids(targets, k)?, v)
            .map_err(kerr(k))?;
        match fm(loss_out, k)?.first_mut() {
            Some(l) => *l = mean,
            None => return Err(len_err(k, 1, 0)),
        }
        Ok(())
    }

    fn cross_entropy_backward(
        &self,
        dlogits: &mut CpuBuffer,
        logits: &CpuBuffer,
        lse: &CpuBuffer,
        targets: &CpuBuffer,
        v: usize,
        dloss: Option<&CpuBuffer>,
    ) -> Result<(), ExecError> {
        let k = "cross_entropy_backward";
        let dl = match dloss {
            Some(b) => f(b, k)?.first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        loss::cross_entropy_backward(fm(dlogits, k)?, f(logits, k)?, f(lse, k)?, ids(targets, k)?, v, dl)
            .map_err(kerr(k))
    }

    fn row_max_sumexp(&self, max: &mut CpuBuffer, sumexp: &mut CpuBuffer, x: &CpuBuffer, v: usize) -> Result<(), ExecError> {
        let k = "row_max_sumexp";
        loss::row_max_sumexp(fm(max, k)?, fm(sumexp, k)?, f(x, k)?, v).map_err(kerr(k))
    }

    fn sumexp_rescale(&self, sumexp: &mut CpuBuffer, local_max: &CpuBuffer, max: &CpuBuffer) -> Result<(), ExecError> {
        let k = "sumexp_rescale";
        loss::sumexp_rescale(fm(sumexp, k)?, f(local_max, k)?, f(max, k)?).map_err(kerr(k))
    }

    fn target_logit(
        &self,
        out: &mut CpuBuffer,
        x: &CpuBuffer,
        targets: &CpuBuffer,
        start: usize,
        v: usize,
    ) -> Result<(), ExecError> {
        let k = "target_logit";
        loss::target_logit(fm(out, k)?, f(x, k)?, ids(targets, k)?, start, v).map_err(kerr(k))
    }

    fn cross_entropy_from_stats(
        &self,
        loss_out: &mut CpuBuffer,
        lse: &mut CpuBuffer,
        max: &CpuBuffer,
        sumexp: &CpuBuffer,
        target_logit: &CpuBuffer,
        targets: &CpuBuffer,
    ) -> Result<(), ExecError> {
        let k = "cross_entropy_from_stats";
        let mean = loss::cross_entropy_from_stats(
            fm(lse, k)?,
            f(max, k)?,
            f(sumexp, k)?,
            f(target_logit, k)?,
            ids(targets, k)?,
        )
        .map_err(kerr(k))?;
        match fm(loss_out, k)?.first_mut() {
            Some(l) => *l = mean,
            None => return Err(len_err(k, 1, 0)),
        }
        Ok(())
    }

    fn cross_entropy_shard_backward(
        &self,
        dlogits: &mut CpuBuffer,
        logits: &CpuBuffer,
        lse: &CpuBuffer,
        targets: &CpuBuffer,
        start: usize,
        v: usize,
        dloss: Option<&CpuBuffer>,
    ) -> Result<(), ExecError> {
        let k = "cross_entropy_shard_backward";
        let dl = match dloss {
            Some(b) => f(b, k)?.first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        loss::cross_entropy_shard_backward(fm(dlogits, k)?, f(logits, k)?, f(lse, k)?, ids(targets, k)?, start, v, dl)
            .map_err(kerr(k))
    }

    fn router_forward(
        &self,
        weights: &mut CpuBuffer,
        indices: &mut CpuBuffer,
        probs: &mut CpuBuffer,
        logits: &CpuBuffer,
        r: &Router,
    ) -> Result<(), ExecError> {
        let k = "router_forward";
        if indices.elem != Elem::I32 {
            return Err(wrong_type(k, indices.elem, Elem::I32));
        }
        moe::router_forward(fm(weights, k)?, indices.u32_mut(), fm(probs, k)?, f(logits, k)?, r).map_err(kerr(k))
    }

    fn router_backward(
        &self,
        dlogits: &mut CpuBuffer,
        dweights: &CpuBuffer,
        probs: &CpuBuffer,
        indices: &CpuBuffer,
        r: &Router,
    ) -> Result<(), ExecError> {
        let k = "router_backward";
        moe::router_backward(fm(dlogits, k)?, f(dweights, k)?, f(probs, k)?, ids(indices, k)?, r).map_err(kerr(k))
    }

    fn dispatch_plan(&self, indices: &CpuBuffer, n: usize, k: usize, e: usize) -> Result<DispatchPlan, ExecError> {
        let kn = "dispatch_plan";
        moe::dispatch_plan(ids(indices, kn)?, n, k, e).map_err(kerr(kn))
    }

    fn presorted_plan(&self, counts: &[usize]) -> Result<DispatchPlan, ExecError> {
        moe::presorted_plan(counts).map_err(kerr("presorted_plan"))
    }

    fn plan_counts(&self, plan: &DispatchPlan) -> Result<Vec<usize>, ExecError> {
        self.transfer();
        Ok(plan.offsets.windows(2).map(|w| w[1] - w[0]).collect())
    }

    fn dispatch_forward(&self, x_sorted: &mut CpuBuffer, x: &CpuBuffer, plan: &DispatchPlan, c: usize) -> Result<(), ExecError> {
        let k = "dispatch_forward";
        moe::dispatch_forward(fm(x_sorted, k)?, f(x, k)?, plan, c).map_err(kerr(k))
    }

    fn dispatch_backward(&self, dx: &mut CpuBuffer, dx_sorted: &CpuBuffer, plan: &DispatchPlan, c: usize) -> Result<(), ExecError> {
        let k = "dispatch_backward";
        moe::dispatch_backward(fm(dx, k)?, f(dx_sorted, k)?, plan, c).map_err(kerr(k))
    }

    fn grouped_matmul_forward(
        &self,
        out: &mut CpuBuffer,
        x_sorted: &CpuBuffer,
        w: ExpertWeights<'_, CpuBuffer>,
        plan: &DispatchPlan,
        k_in: usize,
        n_out: usize,
    ) -> Result<(), ExecError> {
        let k = "grouped_matmul_forward";
        let (x, w) = (self.widen(x_sorted)?, self.widen_experts(w)?);
        moe::grouped_matmul_forward(fm(out, k)?, &x, &w, plan, k_in, n_out).map_err(kerr(k))
    }

    fn grouped_matmul_backward(
        &self,
        dx_sorted: &mut CpuBuffer,
        dw: &mut CpuBuffer,
        dout: &CpuBuffer,
        dout_w: &CpuBuffer,
        x_sorted: &CpuBuffer,
        w: ExpertWeights<'_, CpuBuffer>,
        plan: &DispatchPlan,
        k_in: usize,
        n_out: usize,
    ) -> Result<(), ExecError> {
        let k = "grouped_matmul_backward";
        let (d, dw_in, x, w) = (self.widen(dout)?, self.widen(dout_w)?, self.widen(x_sorted)?, self.widen_experts(w)?);
        moe::grouped_matmul_backward(
            fm(dx_sorted, k)?,
            fm(dw, k)?,
            &d,
            &dw_in,
            &x,
            &w,
            plan,
            k_in,
            n_out,
        )
        .map_err(kerr(k))
    }

    fn combine_forward(
        &self,
        out: &mut CpuBuffer,
        y_sorted: &CpuBuffer,
        weights: &CpuBuffer,
        plan: &DispatchPlan,
        c: usize,
    ) -> Result<(), ExecError> {
        let k = "combine_forward";
        moe::combine_forward(fm(out, k)?, f(y_sorted, k)?, f(weights, k)?, plan, c).map_err(kerr(k))
    }

    fn combine_backward(
        &self,
        dy_sorted: &mut CpuBuffer,
        dweights: &mut CpuBuffer,
        dout: &CpuBuffer,
        y_sorted: &CpuBuffer,
        weights: &CpuBuffer,
        plan: &DispatchPlan,
        c: usize,
    ) -> Result<(), ExecError> {
        let k = "combine_backward";
        moe::combine_backward(
            fm(dy_sorted, k)?,
            fm(dweights, k)?,
            f(dout, k)?,
            f(y_sorted, k)?,
            f(weights, k)?,
            plan,
            c,
        )
        .map_err(kerr(k))
    }

    fn adamw(
        &self,
        param: &mut CpuBuffer,
        grad: &CpuBuffer,
        m: &mut CpuBuffer,
        v: &mut CpuBuffer,
        scalars: &CpuBuffer,
    ) -> Result<(), ExecError> {
        let k = "adamw";
        let s = Scalars::from_words(f(scalars, k)?).map_err(kerr("(optimizer)"))?;
        adamw_with(fm(param, k)?, f(grad, k)?, fm(m, k)?, fm(v, k)?, &s).map_err(kerr("(optimizer)"))
    }

    fn scale_by_inverse_norm(&self, x: &mut CpuBuffer, sumsq: &CpuBuffer, eps: f32) -> Result<(), ExecError> {
        let k = "scale_by_inverse_norm";
        let s = *f(sumsq, k)?.first().ok_or_else(|| ExecError::State(format!("{k}: an empty sum-of-squares buffer")))?;
        muon::scale_by_inverse_norm(fm(x, k)?, s, eps);
        Ok(())
    }

    fn muon_apply(&self, w: &mut CpuBuffer, o: &CpuBuffer, scalars: &CpuBuffer, k: f32) -> Result<(), ExecError> {
        let name = "muon_apply";
        let s = Scalars::from_words(f(scalars, name)?).map_err(kerr("(optimizer)"))?;
        muon::muon_apply(fm(w, name)?, f(o, name)?, &s, k).map_err(kerr("(optimizer)"))
    }

    fn record(&self) -> Result<Instant, ExecError> {
        self.transfer();
        Ok(Instant::now())
    }

    fn elapsed_s(&self, start: &Instant, end: &Instant) -> Result<f64, ExecError> {
        self.transfer();
        Ok(end.saturating_duration_since(*start).as_secs_f64())
    }

    fn synchronize(&self) -> Result<(), ExecError> {
        self.transfer();
        Ok(())
    }

    fn memory(&self) -> MemStats {
        MemStats {
            current_bytes: self.tracker.current.load(Ordering::Relaxed),
            peak_bytes: self.tracker.peak.load(Ordering::Relaxed),
            allocations: self.tracker.allocations.load(Ordering::Relaxed),
        }
    }

    fn reset_peak(&self) {
        self.tracker.peak.store(
            self.tracker.current.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grouped GEMM's expert weights: expert e of a stacked (E, n, k) tensor starts at
    /// e·n·k; per-expert tensors are each their own; an expert past the stack, or a
    /// tensor of another size, is `None` (the kernels' error, not an out-of-bounds read),
    /// and quantize_fp8_codes refuses a range past its source.
    #[test]
    fn expert_weights_name_each_experts_matrix_or_none() {
        let dev = Cpu::new();
        let stacked = dev.alloc(Elem::F32, 3 * 8).unwrap();
        let w = ExpertWeights::Stacked(&stacked);
        assert_eq!(w.expert(2, 8).map(|(_, at)| at), Some(16));
        assert!(w.expert(3, 8).is_none());
        assert!(w.expert(usize::MAX, 8).is_none());
        let each = [dev.alloc(Elem::F8E4M3, 8).unwrap(), dev.alloc(Elem::F8E4M3, 7).unwrap()];
        let w = ExpertWeights::Each(&each);
        assert_eq!(w.len(), 15);
        assert_eq!(w.expert(0, 8).map(|(_, at)| at), Some(0));
        assert!(w.expert(1, 8).is_none(), "a 7-element expert where 8 are asked for");
        assert!(w.expert(2, 8).is_none());
        let spec = QuantSpec::Tensor { format: quant::Format::E4M3, scale: Some(1.0), margin: 0, saturate: true, stochastic: None };
        let mut q = dev.alloc(Elem::F8E4M3, 8).unwrap();
        assert!(dev.quantize_fp8_codes(&mut q, &stacked, 16, &spec).is_ok());
        let e = dev.quantize_fp8_codes(&mut q, &stacked, 17, &spec).unwrap_err().to_string();
        assert!(e.contains("from element 17"), "{e}");
        assert!(dev.quantize_fp8_codes(&mut q, &stacked, usize::MAX, &spec).is_err());
    }

    /// Every narrow type stores what its conversion rounds to, and reads back exactly
    /// that; FP8 keeps the tensor's current scale.
    #[test]
    fn narrow_buffers_round_on_write_and_widen_exactly() {
        let dev = Cpu::new();
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.173).collect();
        for (elem, dtype) in [
            (Elem::BF16, DType::BF16),
            (Elem::F16, DType::F16),
            (Elem::F8E4M3, DType::Fp8E4M3),
            (Elem::F8E5M2, DType::Fp8E5M2),
        ] {
            let mut b = dev.alloc(elem, x.len()).unwrap();
            dev.write_f32(&mut b, &x).unwrap();
            let mut want = dev.alloc(Elem::F32, x.len()).unwrap();
            dev.write_f32(&mut want, &x).unwrap();
            dev.round_to_storage(&mut want, dtype, 64).unwrap();
            assert_eq!(dev.read_f32(&b).unwrap(), want.f32(), "{elem:?}");
            assert!(b.len() * elem.bytes() < x.len() * 4);
        }
        let mut q = dev.alloc(Elem::F8E4M3, 2).unwrap();
        dev.write_f32(&mut q, &[2.0, -1.0]).unwrap();
        assert_eq!(dev.fp8_scale(&q).unwrap(), 224.0);
    }

    /// A GEMM of narrow operands equals the f32 GEMM of their widened values.
    #[test]
    fn narrow_matmul_is_the_f32_product_of_the_stored_values() {
        let dev = Cpu::new();
        let (m, n, k) = (3, 4, 5);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.91).cos()).collect();
        let g = Gemm { m, n, k, trans_a: false, trans_b: true };
        for elem in [Elem::BF16, Elem::F8E4M3] {
            let (mut qa, mut qb) = (dev.alloc(elem, a.len()).unwrap(), dev.alloc(elem, b.len()).unwrap());
            dev.write_f32(&mut qa, &a).unwrap();
            dev.write_f32(&mut qb, &b).unwrap();
            let mut c = dev.alloc(Elem::F32, m * n).unwrap();
            dev.matmul(&mut c, &qa, &qb, g, false).unwrap();
            let mut want = vec![0.0; m * n];
            matmul::matmul(&mut want, &dev.read_f32(&qa).unwrap(), &dev.read_f32(&qb).unwrap(), g, false).unwrap();
            assert_eq!(c.f32(), want, "{elem:?}");
            // and not the f32 product of the unrounded inputs
            let mut exact = vec![0.0; m * n];
            matmul::matmul(&mut exact, &a, &b, g, false).unwrap();
            assert_ne!(c.f32(), exact, "{elem:?}");
        }
    }

    /// An FP8 output keeps its scale (delayed scaling) and records the f32 result's
    /// amax; what it stores is that result quantised at that scale.
    #[test]
    fn fp8_output_uses_its_scale_and_records_amax() {
        let dev = Cpu::new();
        let g = Gemm { m: 2, n: 2, k: 2, trans_a: false, trans_b: true };
        let (mut a, mut b) = (dev.alloc(Elem::F8E4M3, 4).unwrap(), dev.alloc(Elem::F8E4M3, 4).unwrap());
        dev.write_f32(&mut a, &[1.0, 2.0, -4.0, 0.5]).unwrap();
        dev.write_f32(&mut b, &[1.0, 0.0, 0.0, 1.0]).unwrap();
        let mut c = dev.alloc(Elem::F8E4M3, 4).unwrap();
        dev.write_f32(&mut c, &[8.0, 0.0, 0.0, 0.0]).unwrap();
        let scale = dev.fp8_scale(&c).unwrap();
        assert_eq!(scale, 56.0);
        dev.matmul(&mut c, &a, &b, g, false).unwrap();
        assert_eq!(dev.fp8_scale(&c).unwrap(), scale);
        assert_eq!(dev.fp8_amax(&c).unwrap(), 4.0);
        assert_eq!(dev.read_f32(&c).unwrap(), [1.0, 2.0, -4.0, 0.5]);
        assert!(dev.matmul(&mut c, &a, &b, g, true).is_err());
    }

    #[test]
    fn transpose_outer_swaps_the_outer_axes() {
        let dev = Cpu::new();
        let mut s = dev.alloc(Elem::F32, 12).unwrap();
        dev.write_f32(&mut s, &(0..12).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        let mut d = dev.alloc(Elem::F32, 12).unwrap();
        dev.transpose_outer(&mut d, &s, 2, 3, 2).unwrap();
        assert_eq!(d.f32(), [0.0, 1.0, 6.0, 7.0, 2.0, 3.0, 8.0, 9.0, 4.0, 5.0, 10.0, 11.0]);
    }

    fn put(dev: &Cpu, v: &[f32]) -> CpuBuffer {
        let mut b = dev.alloc(Elem::F32, v.len()).unwrap();
        dev.write_f32(&mut b, v).unwrap();
        b
    }

    fn put_ids(dev: &Cpu, v: &[u32]) -> CpuBuffer {
        let mut b = dev.alloc(Elem::I32, v.len()).unwrap();
        dev.write_u32(&mut b, v).unwrap();
        b
    }

    /// n distinct values in (-1, 1), a different sequence per `seed`.
    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * seed).sin()).collect()
    }

    /// An FP8 buffer's values are its codes and its scale together: a copy carries the
    /// scale and amax, zeroing resets them to a fresh buffer's (1, 0), and a write
    /// saturates an Inf to ±448 (current scaling: the amax is Inf, so the scale is 1), as
    /// `round_to_storage` does. A copy between two types of one storage kind (f16 into
    /// bf16) is refused.
    #[test]
    fn fp8_copies_carry_the_scale_and_zero_resets_it() {
        let dev = Cpu::new();
        let mut a = dev.alloc(Elem::F8E4M3, 3).unwrap();
        dev.write_f32(&mut a, &[2.0, -1.0, 0.5]).unwrap();
        let mut b = dev.alloc(Elem::F8E4M3, 3).unwrap();
        dev.copy(&mut b, 0, &a, 0, 3).unwrap();
        assert_eq!(dev.read_f32(&b).unwrap(), [2.0, -1.0, 0.5]);
        assert_eq!((dev.fp8_scale(&b).unwrap(), dev.fp8_amax(&b).unwrap()), (224.0, 2.0));
        dev.zero(&mut b).unwrap();
        assert_eq!((dev.fp8_scale(&b).unwrap(), dev.fp8_amax(&b).unwrap()), (1.0, 0.0));
        assert_eq!(dev.read_f32(&b).unwrap(), [0.0; 3]);
        dev.write_f32(&mut a, &[1.0, f32::INFINITY, f32::NEG_INFINITY]).unwrap();
        assert_eq!(dev.read_f32(&a).unwrap(), [1.0, 448.0, -448.0]);
        let (h, mut bf) = (dev.alloc(Elem::F16, 3).unwrap(), dev.alloc(Elem::BF16, 3).unwrap());
        assert!(dev.copy(&mut bf, 0, &h, 0, 3).is_err());
    }

    /// Mismatched lengths, shapes and types are errors, not truncated loops or panics.
    #[test]
    fn mismatched_arguments_are_refused() {
        let dev = Cpu::new();
        let zeros = |n: usize| put(&dev, &vec![0.0; n]);
        let (x6, x5, x4) = (put(&dev, &[1.0; 6]), put(&dev, &[1.0; 5]), put(&dev, &[1.0; 4]));
        assert!(dev.add_assign(&mut zeros(6), &x5).is_err());
        assert!(dev.add_bias(&mut zeros(6), &x4).is_err());
        assert!(dev.add_bias(&mut zeros(6), &zeros(0)).is_err());
        assert!(dev.bias_backward(&mut zeros(4), &x6).is_err());
        assert!(dev.bias_backward(&mut zeros(0), &x6).is_err());
        assert!(dev.geglu_forward(&mut zeros(6), &x6, &x5).is_err());
        let s = ConcatShapes { out: &[2, 4], a: &[2, 2], b: &[2, 1] };
        assert!(dev.concat_forward(&mut zeros(8), &x4, &put(&dev, &[1.0; 2]), s).is_err());
        // Concat buffers that disagree with their shapes (these used to panic on a slice
        // or, for a leading axis neither 1 nor the output's, read past a row).
        let s = ConcatShapes { out: &[2, 4], a: &[2, 2], b: &[1, 2] };
        assert!(dev.concat_forward(&mut zeros(8), &x4, &x4, s).is_err(), "b of 4 for a [1, 2]");
        assert!(dev.concat_forward(&mut zeros(8), &x5, &put(&dev, &[1.0; 2]), s).is_err(), "a of 5 for a [2, 2]");
        assert!(dev.concat_forward(&mut zeros(6), &x4, &put(&dev, &[1.0; 2]), s).is_err(), "out of 6 for a [2, 4]");
        assert!(dev.concat_forward(&mut zeros(8), &x4, &put(&dev, &[1.0; 2]), s).is_ok());
        let s3 = ConcatShapes { out: &[2, 4], a: &[3, 2], b: &[1, 2] };
        assert!(dev.concat_forward(&mut zeros(8), &x6, &put(&dev, &[1.0; 2]), s3).is_err(), "a leading axis of 3 against 2");
        assert!(dev.concat_backward(Some(&mut zeros(4)), None, &x6, s).is_err(), "dout of 6 for a [2, 4]");
        assert!(dev.concat_backward(None, Some(&mut zeros(4)), &put(&dev, &[1.0; 8]), s).is_err(), "db of 4 for a [1, 2]");
        assert!(dev.concat_backward(Some(&mut zeros(4)), Some(&mut zeros(2)), &put(&dev, &[1.0; 8]), s).is_ok());
        // GEMM operands of two types (two FP8 formats excepted), E5M2 x E5M2, and an FP8
        // output of f32 operands.
        let g = Gemm { m: 2, n: 2, k: 2, trans_a: false, trans_b: false };
        let typed = |elem| {
            let mut b = dev.alloc(elem, 4).unwrap();
            dev.write_f32(&mut b, &[1.0; 4]).unwrap();
            b
        };
        let mm = |a: Elem, b: Elem, c: Elem| dev.matmul(&mut dev.alloc(c, 4).unwrap(), &typed(a), &typed(b), g, false);
        assert!(mm(Elem::BF16, Elem::F16, Elem::F32).is_err());
        assert!(mm(Elem::F8E5M2, Elem::F8E5M2, Elem::F32).is_err());
        assert!(mm(Elem::F8E4M3, Elem::F8E5M2, Elem::F32).is_ok());
        assert!(mm(Elem::F32, Elem::F32, Elem::F8E4M3).is_err());
        // A loss into an empty buffer.
        let (logits, targets) = (put(&dev, &vals(6, 0.3)), put_ids(&dev, &[0, 2]));
        assert!(dev.cross_entropy_forward(&mut zeros(0), &mut zeros(2), &logits, &targets, 3).is_err());
        // FP8 codes of the other format.
        let spec = QuantSpec::Tensor { format: quant::Format::E5M2, scale: Some(1.0), margin: 0, saturate: true, stochastic: None };
        assert!(dev.quantize_fp8_codes(&mut dev.alloc(Elem::F8E4M3, 4).unwrap(), &x4, 0, &spec).is_err());
        // MXFP8 rounding of a buffer that is not whole rows (6 elements, rows of 4).
        let mut y = put(&dev, &[1.1; 6]);
        let e = dev.round_to_storage(&mut y, DType::MxFp8, 4).unwrap_err().to_string();
        assert!(e.contains("not whole rows of 4"), "{e}");
        assert_eq!(y.f32(), [1.1; 6]);
    }

    /// Each method calls its kernel with the arguments in their places: the device's
    /// results equal the kernel's own on inputs that tell every argument apart
    /// (dout vs x, dw vs db, dout vs dout_w, a shard's start, ...).
    #[test]
    fn methods_pass_their_arguments_to_the_kernels_in_order() {
        let dev = Cpu::new();
        let (n, c) = (3, 4);
        let (x, d, w, bias) = (vals(n * c, 0.7), vals(n * c, 1.3), vals(c, 0.4), vals(c, 2.1));

        let mut dx = put(&dev, &vec![0.0; n * c]);
        dev.squared_relu_backward(&mut dx, &put(&dev, &d), &put(&dev, &x)).unwrap();
        let mut want = vec![0.0; n * c];
        activation::squared_relu_backward(&mut want, &d, &x).unwrap();
        assert_eq!(dx.f32(), want, "squared_relu_backward");

        let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        norm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &bias, c, 1e-5).unwrap();
        let (mut dx, mut dw, mut db) = (put(&dev, &vec![0.0; n * c]), put(&dev, &[0.0; 4]), put(&dev, &[0.0; 4]));
        let buf = |v: &[f32]| put(&dev, v);
        dev.layernorm_backward(&mut dx, &mut dw, &mut db, &buf(&d), &buf(&x), &buf(&w), &buf(&mean), &buf(&rstd), c).unwrap();
        let (mut wdx, mut wdw, mut wdb) = (vec![0.0; n * c], vec![0.0; c], vec![0.0; c]);
        norm::layernorm_backward(&mut wdx, &mut wdw, &mut wdb, &d, &x, &w, &mean, &rstd, c).unwrap();
        assert_eq!((dx.f32(), dw.f32(), db.f32()), (&wdx[..], &wdw[..], &wdb[..]), "layernorm_backward");

        // A vocabulary shard of 3 rows from row 2 of 6; tokens in and out of it.
        let (tokens, start) = ([1u32, 2, 4], 2);
        let mut dt = put(&dev, &vec![0.0; 3 * c]);
        dev.embedding_backward(&mut dt, &buf(&d), &put_ids(&dev, &tokens), c, Some(start)).unwrap();
        let mut want = vec![0.0; 3 * c];
        embedding::embedding_shard_backward(&mut want, &d, &tokens, c, start).unwrap();
        assert_eq!(dt.f32(), want, "embedding_backward of a shard");

        let (v, logits, lse) = (c, x.clone(), vals(n, 0.9));
        let mut got = put(&dev, &vec![0.0; n * v]);
        let ids = put_ids(&dev, &tokens);
        dev.cross_entropy_shard_backward(&mut got, &buf(&logits), &buf(&lse), &ids, start, v, Some(&buf(&[0.5]))).unwrap();
        let mut want = vec![0.0; n * v];
        loss::cross_entropy_shard_backward(&mut want, &logits, &lse, &tokens, start, v, 0.5).unwrap();
        assert_eq!(got.f32(), want, "cross_entropy_shard_backward");
        // No gradient of the loss is a zero gradient (the Device doc).
        dev.cross_entropy_backward(&mut got, &buf(&logits), &buf(&lse), &put_ids(&dev, &[0, 1, 3]), v, None).unwrap();
        assert!(got.f32().iter().all(|&g| g == 0.0), "cross_entropy_backward without dloss");

        let mut got = put(&dev, &[0.0; 3]);
        dev.target_logit(&mut got, &buf(&logits), &ids, start, v).unwrap();
        let mut want = vec![0.0; 3];
        loss::target_logit(&mut want, &logits, &tokens, start, v).unwrap();
        assert_eq!(got.f32(), want, "target_logit");

        let (s0, local, max) = (vals(3, 0.2), vec![1.0, -2.0, 0.5], vec![1.5, 0.0, 0.5]);
        let mut got = buf(&s0);
        dev.sumexp_rescale(&mut got, &buf(&local), &buf(&max)).unwrap();
        let mut want = s0.clone();
        loss::sumexp_rescale(&mut want, &local, &max).unwrap();
        assert_eq!(got.f32(), want, "sumexp_rescale");

        // Concat backward into b alone: b's columns of dout, after a's.
        let s = ConcatShapes { out: &[3, 4], a: &[3, 1], b: &[3, 3] };
        let mut db = put(&dev, &[0.0; 9]);
        dev.concat_backward(None, Some(&mut db), &buf(&d), s).unwrap();
        let want: Vec<f32> = d.chunks(4).flat_map(|r| r[1..].to_vec()).collect();
        assert_eq!(db.f32(), want, "concat_backward of b alone");

        // Grouped GEMM backward, two experts of 2 and 1 rows (k_in 2, n_out 3).
        let plan = dev.presorted_plan(&[2, 1]).unwrap();
        assert_eq!(dev.plan_counts(&plan).unwrap(), [2, 1]);
        let (xs, ws, dy, dyw) = (vals(6, 0.5), vals(12, 0.8), vals(9, 1.7), vals(9, 0.6));
        let (mut gdx, mut gdw) = (put(&dev, &[0.0; 6]), put(&dev, &[0.0; 12]));
        let wb = buf(&ws);
        dev.grouped_matmul_backward(&mut gdx, &mut gdw, &buf(&dy), &buf(&dyw), &buf(&xs), ExpertWeights::Stacked(&wb), &plan, 2, 3).unwrap();
        let (mut wdx, mut wdw) = (vec![0.0; 6], vec![0.0; 12]);
        moe::grouped_matmul_backward(&mut wdx, &mut wdw, &dy, &dyw, &xs, &ws, &plan, 2, 3).unwrap();
        assert_eq!((gdx.f32(), gdw.f32()), (&wdx[..], &wdw[..]), "grouped_matmul_backward");

        // A bf16 output accumulates: c = bf16(c + a·b).
        let g = Gemm { m: 2, n: 2, k: 2, trans_a: false, trans_b: false };
        let mut cb = dev.alloc(Elem::BF16, 4).unwrap();
        dev.write_f32(&mut cb, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        dev.matmul(&mut cb, &buf(&[1.0, 0.0, 0.0, 1.0]), &buf(&[0.5, 0.25, 8.0, 16.0]), g, true).unwrap();
        assert_eq!(dev.read_f32(&cb).unwrap(), [1.5, 2.25, 11.0, 20.0]);

        // FP8 codes at a given scale keep it: they read back as the rounded values.
        let spec = QuantSpec::Tensor { format: quant::Format::E4M3, scale: Some(2.0), margin: 0, saturate: true, stochastic: None };
        let mut q = dev.alloc(Elem::F8E4M3, 4).unwrap();
        dev.quantize_fp8_codes(&mut q, &buf(&[1.0, -3.0, 0.25, 96.0]), 0, &spec).unwrap();
        assert_eq!(dev.fp8_scale(&q).unwrap(), 2.0);
        assert_eq!(dev.read_f32(&q).unwrap(), [1.0, -3.0, 0.25, 96.0]);

        // MXFP8 rounds blocks of 32 within rows of 40 (the last block of each row 8
        // long), which differ from the blocks of one row of 80.
        let xs: Vec<f32> = (0..80i32).map(|i| (i as f32 * 0.37).sin() * 2f32.powi(i / 8 % 5 * 3)).collect();
        let mut got = buf(&xs);
        dev.round_to_storage(&mut got, DType::MxFp8, 40).unwrap();
        let (mut want, mut flat) = (xs.clone(), xs.clone());
        prec::round_to_mxfp8(&mut want, 40).unwrap();
        prec::round_to_mxfp8(&mut flat, 80).unwrap();
        assert_eq!(got.f32(), want, "round_to_storage MXFP8");
        assert_ne!(want, flat);
    }

    /// Memory statistics: `reset_peak` brings the peak down to what is live; a buffer
    /// from the pool comes back poisoned, as a fresh one is, in debug builds (what
    /// shows a kernel reading an output it has not written).
    #[test]
    fn pooled_buffers_come_back_poisoned_and_reset_peak_drops_to_live() {
        let dev = Cpu::new();
        let n = POOL_MIN_BYTES / 4;
        let keep = dev.alloc(Elem::F32, 10).unwrap();
        let mut a = dev.alloc(Elem::F32, n).unwrap();
        assert_eq!(a.f32()[0].is_nan(), cfg!(debug_assertions));
        dev.write_f32(&mut a, &vec![1.0; n]).unwrap();
        drop(a);
        assert_eq!(dev.memory().current_bytes, 40);
        assert_eq!(dev.memory().peak_bytes, 40 + 4 * n as u64);
        dev.reset_peak();
        assert_eq!(dev.memory().peak_bytes, 40);
        let b = dev.alloc(Elem::F32, n).unwrap();
        if cfg!(debug_assertions) {
            assert!(b.f32().iter().all(|x| x.is_nan()), "a pooled buffer not poisoned");
        }
        drop((keep, b));
    }
}
