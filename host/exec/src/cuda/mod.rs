//! The CUDA backend: [`Cuda`] implements [`Device`] on one GPU through cudarc, with the
//! CUDA libraries loaded at run time (a binary built here runs on any machine with a
//! driver; none is needed to build it).
//!
//! - Kernels: `kernels/cuda/*.cu`, compiled with NVRTC for the device's architecture when
//!   it opens ([`kernels`]); GEMMs through cuBLASLt with cached plans ([`gemm`]).
//! - One stream per device: every call is queued on it in order, so buffers need no
//!   cross-stream synchronisation (cudarc's event tracking is off). Reads back to the
//!   host wait for the stream.
//! - Buffers are raw device allocations of their element type; an FP8 buffer carries 4
//!   device floats [scale, 1/scale, amax, 0] beside its codes, so scales never travel
//!   through the host.
//! - Events are CUDA events on the stream ([`Device::record`]).
//! - A step can be recorded as a CUDA graph (stream capture, [`Device::begin_capture`])
//!   and replayed with one launch ([`CudaRecording`]); allocations made while recording
//!   are the graph's own, and buffers from before it that it frees live as long as the
//!   graph (the executor's side: `executor/graph.rs`).
//! - MoE routing plans are built on the host from the downloaded indices (one
//!   synchronisation per MoE layer) and uploaded (order and its inverse).
//!
//! - [`Cuda::emulated`] is the same backend with no GPU: its kernels built for the CPU
//!   and run on host memory ([`emulated`]); every raw driver call goes through one helper
//!   per operation (`mem`, `memset`, `dtod`, ...) that picks the GPU or the host.
//!
//! Opening a device first checks that the driver, cuBLASLt and NVRTC libraries load and
//! that the device exists ([`probe`]), because cudarc panics when a library is missing.
//! Nothing here has run on a GPU in this repository's CI (none is available there); the
//! kernels' compilation is checked there, their results by `scripts/gpu-check.sh`.

mod emulated;
pub use emulated::under_address_sanitizer;
mod gemm;
pub mod kernels;
pub mod nccl;

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, result as dr, sys as cu};
use runner_graph::DType;
use runner_kernels::cpu::attention::Attn;
use runner_kernels::cpu::matmul::Gemm;
use runner_kernels::cpu::moe::{Router, ScoreFn};
use runner_kernels::cpu::precision::Fp8Format;
use runner_kernels::cpu::quant::{self, QuantReport, QuantSpec};
use runner_kernels::cpu::rope::Rope;
use runner_kernels::cpu::ssm::{Conv1d, Ssm, SsmGrads, SsmInputs};

use crate::device::{CastProducer, ConcatShapes, Device, DeviceBuffer, Elem, ExecError, ExpertWeights, MemStats};
use kernels::Arg;

/// What [`probe`] found: a usable device.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaInfo {
    pub ordinal: usize,
    pub name: String,
    pub devices: usize,
}

fn loadable(present: unsafe fn() -> bool) -> bool {
    // SAFETY: cudarc's presence checks only try to dlopen library names.
    unsafe { present() }
}

/// Check, without panicking, that GPU `ordinal` can be opened: the driver library loads
/// and initialises, the device exists, and cuBLASLt and NVRTC load. The error names what
/// is missing and what to do.
///
/// # Errors
/// [`ExecError::NoCuda`] with the reason.
pub fn probe(ordinal: usize) -> Result<CudaInfo, ExecError> {
    if !loadable(cudarc::driver::sys::is_culib_present) {
        return Err(ExecError::NoCuda(
            "no NVIDIA driver: libcuda.so.1 is not on the loader path (install the NVIDIA \
             driver, or run on a machine with a GPU)"
                .into(),
        ));
    }
    dr::init().map_err(|e| {
        ExecError::NoCuda(format!(
            "the NVIDIA driver did not initialise ({e}): no GPU visible to this process, or a \
             driver/kernel-module mismatch (see nvidia-smi)"
        ))
    })?;
    let count = dr::device::get_count().map_err(|e| ExecError::NoCuda(format!("cuDeviceGetCount failed: {e}")))?;
    let count = count.max(0) as usize;
    if count == 0 {
        return Err(ExecError::NoCuda(format!(
            "no CUDA device visible (CUDA_VISIBLE_DEVICES={})",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        )));
    }
    if ordinal >= count {
        return Err(ExecError::NoCuda(format!(
            "cuda:{ordinal} asked for, but {count} device(s) are visible (cuda:0..cuda:{})",
            count - 1
        )));
    }
    // Below the driver's count, an int: exact.
    let dev = dr::device::get(ordinal as i32).map_err(|e| ExecError::NoCuda(format!("cuDeviceGet: {e}")))?;
    let name = dr::device::get_name(dev).unwrap_or_else(|_| "unknown GPU".into());
    for (lib, present, fix) in [
        (
            "cuBLASLt (libcublasLt.so)",
            cudarc::cublaslt::sys::is_culib_present as unsafe fn() -> bool,
            "install the CUDA toolkit's cuBLAS, or `pip install nvidia-cublas`, and put its lib directory on LD_LIBRARY_PATH",
        ),
        (
            "NVRTC (libnvrtc.so)",
            cudarc::nvrtc::sys::is_culib_present,
            "install the CUDA toolkit's NVRTC, or `pip install nvidia-cuda-nvrtc`, and put its lib directory on LD_LIBRARY_PATH",
        ),
    ] {
        if !loadable(present) {
            return Err(ExecError::NoCuda(format!("{name} found, but {lib} is not on the loader path: {fix}")));
        }
    }
    Ok(CudaInfo {
        ordinal,
        name,
        devices: count,
    })
}

/// The attention shape as the kernels' `Shape` struct (kernels/cuda/attention.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    b: i64,
    t: i64,
    tk: i64,
    h: i32,
    hkv: i32,
    d: i32,
    dv: i32,
    causal: i32,
    window: i32,
    scale: f32,
    cp: i32,
    cp_rank: i32,
}

// SAFETY: a plain #[repr(C)] struct of integers and floats, laid out as the C struct.
unsafe impl cudarc::driver::DeviceRepr for AttnShape {}

/// Byte accounting of one device, and the recording open on it.
#[derive(Default)]
struct Tracker {
    current: AtomicU64,
    peak: AtomicU64,
    allocations: AtomicU64,
    /// Id of the open recording ([`Device::begin_capture`]); 0: none.
    recording: AtomicU64,
    /// Ids handed out so far.
    recordings: AtomicU64,
    capture: Mutex<Capture>,
}

/// What the open recording holds.
#[derive(Default)]
struct Capture {
    /// Buffers allocated while recording and not yet freed: each must be freed before
    /// the recording ends (the graph owns their memory, and frees it when it runs).
    born_alive: usize,
    /// Allocations from before the recording that it freed: the graph still reads or
    /// writes them, so they live as long as the graph, not just until the free.
    kept: Vec<Mem>,
}

impl Tracker {
    fn capture(&self) -> std::sync::MutexGuard<'_, Capture> {
        self.capture.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Free a buffer's memory, allocated under recording `born` (0: none).
    fn release(&self, born: u64, mem: Mem, meta: Option<Mem>) {
        let open = self.recording.load(Ordering::Acquire);
        if born == 0 && open == 0 {
            return; // dropped here: freed on the stream
        }
        if born != 0 && born != open {
            // Graph memory of a recording that has ended: it failed, or this buffer
            // outlived it, which `end_capture` refused. The graph owns that memory (or it
            // never existed): freeing it here would be an error, so the handle is
            // forgotten. An error path only; it leaks a reference to the stream.
            std::mem::forget(mem);
            std::mem::forget(meta);
            return;
        }
        let mut c = self.capture();
        if born == open {
            // Allocated and freed inside the recording: a free node of the graph.
            c.born_alive = c.born_alive.saturating_sub(1);
            drop(c);
            return;
        }
        c.kept.push(mem);
        c.kept.extend(meta);
    }
}

/// A recorded step ([`Device::end_capture`]): the instantiated CUDA graph, and the
/// allocations from before the recording that it freed and still uses. Fields drop in
/// order: the graph before the memory it uses.
pub struct CudaRecording {
    graph: CudaGraph,
    _kept: Vec<Mem>,
}

/// A point in the stream's work ([`Device::record`]): a CUDA event, or on the emulated
/// device the host clock (its work is done when queued).
pub enum CudaStamp {
    Event(CudaEvent),
    Host(std::time::Instant),
}

// SAFETY: CUDA requires graph objects to be used from one thread at a time, not from a
// particular thread; a recording is owned by one executor and launched through it.
unsafe impl Send for CudaRecording {}

/// One open device.
struct Inner {
    ordinal: usize,
    label: String,
    engine: Engine,
    tracker: Arc<Tracker>,
    /// Concat's shape tables on the device, by their words: uploaded once per distinct
    /// shape, so a recorded step (which may not copy from the host) finds them there.
    concat_shapes: Mutex<HashMap<Vec<u32>, Mem>>,
}

/// What runs the work: a GPU, or the kernels emulated on the CPU ([`Cuda::emulated`]).
enum Engine {
    Gpu(Gpu),
    Emulated(Arc<emulated::Emulator>),
}

/// A GPU's context, its one stream, its compiled kernels and cuBLASLt.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: kernels::Kernels,
    lt: gemm::Lt,
    workspace: CudaSlice<u8>,
}

impl Gpu {
    /// The stream's handle for a raw driver call, with the device's context made current
    /// on the calling thread first: cudarc's own calls do that, raw ones do not, and a
    /// `Cuda` may be used from a thread that has never touched the device.
    fn raw_stream(&self) -> Result<cu::CUstream, DriverError> {
        self.ctx.bind_to_thread()?;
        Ok(self.stream.cu_stream())
    }
}

/// Device memory: a CUDA allocation, or (emulated device) host memory.
struct Mem {
    /// The address kernels and copies use.
    ptr: u64,
    _owner: Owner,
}

/// What frees the memory when dropped (held, never read).
#[allow(dead_code)]
enum Owner {
    Gpu(CudaSlice<u8>),
    Host(emulated::HostMem),
}

/// A CUDA device (cheap to clone: the clones share the GPU's context and stream).
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
}

/// A device allocation of `len` elements of `elem`.
pub struct CudaBuffer {
    /// Taken out on drop (see [`Tracker::release`]).
    mem: ManuallyDrop<Mem>,
    len: usize,
    elem: Elem,
    /// FP8: [scale, 1/scale, amax, 0] on the device.
    meta: Option<Mem>,
    tracker: Arc<Tracker>,
    /// The recording this buffer was allocated under (0: none).
    born: u64,
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        self.tracker
            .current
            .fetch_sub((self.len * self.elem.bytes()) as u64, Ordering::Relaxed);
        // SAFETY: `mem` is taken once, here, and not touched after.
        let mem = unsafe { ManuallyDrop::take(&mut self.mem) };
        self.tracker.release(self.born, mem, self.meta.take());
    }
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn elem(&self) -> Elem {
        self.elem
    }
}

/// A routing plan: rows per expert on the host (the grouped GEMMs' row ranges), `order`
/// (sorted row → slot) and its inverse on the device.
pub struct CudaPlan {
    offsets: Vec<usize>,
    k: usize,
    order: CudaBuffer,
    inv: CudaBuffer,
}

/// Elements per thread block of the element-wise kernels.
const BLOCK: u32 = 256;

fn ew_cfg(n: usize) -> LaunchConfig {
    // At most 2^20 blocks (the kernels stride over the rest): the cast is exact.
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The device's default memory pool, where stream-ordered allocations come from.
fn default_pool(ctx: &CudaContext) -> Option<cu::CUmemoryPool> {
    let mut pool: cu::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the driver writes `pool` before it is read; the device handle is the
    // context's own.
    let r = unsafe { cu::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    (r == cu::CUresult::CUDA_SUCCESS).then_some(pool)
}

/// One block per row; no rows, no blocks ([`Cuda::run`] then launches nothing). More
/// rows than a grid holds are `op`'s error: the row kernels do not stride over rows.
fn rows_cfg(op: &str, rows: usize) -> Result<LaunchConfig, ExecError> {
    Ok(LaunchConfig {
        grid_dim: grid(op, rows, 1, 1)?,
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// A kernel's refusal of its arguments, as the CPU kernel words it.
fn refused(kernel: &str) -> impl Fn(runner_kernels::KernelError) -> ExecError + '_ {
    move |source| ExecError::Kernel { op: kernel.into(), source }
}

fn kerr(kernel: &str, what: String) -> ExecError {
    ExecError::Kernel {
        op: kernel.into(),
        source: runner_kernels::KernelError::ShapeMismatch(what),
    }
}

/// Lengths a kernel needs: (what, got, want).
fn lens(kernel: &str, checks: &[(&str, usize, usize)]) -> Result<(), ExecError> {
    for &(what, got, want) in checks {
        if got != want {
            return Err(kerr(kernel, format!("{what} has {got} elements, expected {want}")));
        }
    }
    Ok(())
}

/// A size or index taken from a shape or an attribute, as a kernel's `int` argument. A
/// value past `i32::MAX` would reach the kernel wrapped (a negative or small size: wrong
/// results, or reads and writes out of bounds on the GPU), so it is refused here, naming
/// the operation, what the value is, the value and the limit. Call it before anything is
/// allocated or launched.
///
/// A launch's `i64` arguments are buffer lengths or counts derived from them, exact as
/// `as i64`: no allocation holds more than `isize::MAX` bytes ([`Device::alloc`] refuses
/// more); those that come from a shape or attribute go through [`i64_arg`].
fn i32_arg(op: &str, what: &str, v: usize) -> Result<i32, ExecError> {
    i32::try_from(v).map_err(|_| past_limit(op, what, v, "int", i32::MAX as u64))
}

/// As [`i32_arg`], for a kernel's `i64` argument.
fn i64_arg(op: &str, what: &str, v: usize) -> Result<i64, ExecError> {
    i64::try_from(v).map_err(|_| past_limit(op, what, v, "i64", i64::MAX as u64))
}

fn past_limit(op: &str, what: &str, v: usize, ty: &str, limit: u64) -> ExecError {
    kerr(op, format!("{what} {v} is past the CUDA kernels' limit of {limit} (an {ty})"))
}

/// The product of a shape's `dims` (an element count), or the operation's error when it
/// overflows (unchecked, it would wrap to a small count that a small buffer can match).
fn numel(op: &str, dims: &[usize]) -> Result<usize, ExecError> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| kerr(op, format!("the shape {dims:?} holds more elements than a usize counts")))
}

/// Grid dimension x (at most 2^31 - 1 blocks), y and z (at most 65535 each), or the
/// operation's error naming the dimension that does not fit.
fn grid(op: &str, x: usize, y: usize, z: usize) -> Result<(u32, u32, u32), ExecError> {
    let dim = |v: usize, axis: &str, limit: u32| {
        u32::try_from(v).ok().filter(|&b| b <= limit).ok_or_else(|| kerr(op, format!("{v} thread blocks along grid {axis} are past the limit of {limit}")))
    };
    Ok((dim(x, "x", i32::MAX as u32)?, dim(y, "y", 65_535)?, dim(z, "z", 65_535)?))
}

/// Expert `e`'s matrix of `per` elements in a grouped GEMM's weights: its buffer and
/// the element where it starts.
fn expert_weight<'a>(kernel: &str, w: &ExpertWeights<'a, CudaBuffer>, e: usize, per: usize) -> Result<(&'a CudaBuffer, usize), ExecError> {
    w.expert(e, per).ok_or_else(|| kerr(kernel, format!("no {per}-element weight matrix for expert {e}")))
}

fn need(kernel: &str, b: &CudaBuffer, e: Elem) -> Result<(), ExecError> {
    if b.elem != e {
        return Err(ExecError::State(format!(
            "kernel {kernel} takes {} buffers, got {}",
            e.name(),
            b.elem.name()
        )));
    }
    Ok(())
}

/// 4-byte words of a quantisation's statistics record: the saturated, underflowed and
/// non-finite counts (3 x u64), the amax, and the current-scaling amax of the input.
const STATS_WORDS: usize = 8;
/// Byte offsets of the amax and the current-scaling amax in the record.
const STATS_AMAX: u64 = 24;
const STATS_CUR: u64 = 28;

/// Which producer a fused cast runs (the activation code `activation_forward_codes` takes).
#[derive(Clone, Copy)]
enum CastKind {
    RmsNorm,
    SwiGlu,
    GeGlu,
    Gelu,
    SquaredRelu,
}

impl CastKind {
    fn of<B>(p: &CastProducer<'_, B>) -> CastKind {
        match p {
            CastProducer::RmsNorm { .. } => CastKind::RmsNorm,
            CastProducer::SwiGlu { .. } => CastKind::SwiGlu,
            CastProducer::GeGlu { .. } => CastKind::GeGlu,
            CastProducer::Gelu { .. } => CastKind::Gelu,
            CastProducer::SquaredRelu { .. } => CastKind::SquaredRelu,
        }
    }
}

/// Where a quantisation's scale comes from once its record is read.
#[derive(Clone, Copy, Debug)]
enum ScaleFrom {
    Given(f32),
    /// Transformer Engine's `max / amax / 2^margin` from the record's input amax.
    Current { format: quant::Format, margin: i32 },
    /// The block holding the record's amax (NVFP4: the tensor's `1 / s_global`).
    Blocks(quant::BlockSpec),
}

/// A quantisation's statistics, still in device memory: read with
/// [`Device::read_quant`], once per pass, so quantising never waits for the device.
pub struct CudaQuantStats {
    rec: CudaBuffer,
    scale: ScaleFrom,
    elements: usize,
}

impl CudaQuantStats {
    /// The report from the record's words (`runner_kernels::cpu::quant::quantize`'s).
    fn report(&self, w: &[u32; STATS_WORDS]) -> QuantReport {
        let count = |i: usize| u64::from(w[2 * i]) | (u64::from(w[2 * i + 1]) << 32);
        let amax = f32::from_bits(w[6]);
        let scale = match self.scale {
            ScaleFrom::Given(s) => s,
            ScaleFrom::Current { format, margin } => quant::tensor_scale(f32::from_bits(w[7]), format, margin),
            ScaleFrom::Blocks(b) => {
                let global = if b.tensor_scale { quant::tensor_scale_of_blocks(amax, b.format) } else { 1.0 };
                if b.tensor_scale {
                    quant::encode_scale_of_blocks(global)
                } else {
                    quant::block_scale(amax, &b, global).0
                }
            }
        };
        QuantReport { amax, scale, saturated: count(0), underflowed: count(1), nonfinite: count(2), elements: self.elements as u64 }
    }
}

fn fmt_code(f: Fp8Format) -> i32 {
    match f {
        Fp8Format::E4M3 => 0,
        Fp8Format::E5M2 => 1,
    }
}

impl Cuda {
    /// Open GPU `ordinal`: check it ([`probe`]), create its context and stream, compile
    /// the kernels for its architecture and create the cuBLASLt handle.
    ///
    /// # Errors
    /// [`ExecError::NoCuda`] naming what is missing, or a CUDA error.
    pub fn new(ordinal: usize) -> Result<Cuda, ExecError> {
        let info = probe(ordinal)?;
        let derr = |what: &str, e: dr::DriverError| ExecError::Device {
            device: format!("cuda:{ordinal}"),
            what: format!("{what}: {e}"),
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| derr("context", e))?;
        // One stream per device and every call ordered on it: no event tracking needed.
        // SAFETY: no buffer exists yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| derr("stream", e))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| derr("compute capability", e))?;
        let arch = kernels::arch_of(major, minor)?;
        let kernels = kernels::Kernels::load(&ctx, arch)?;
        // Stream-ordered allocations come from the device's default pool, which by default
        // hands freed memory back to the driver at every synchronisation: each timed
        // sample after an event wait would start by growing the pool again. Keep it.
        if let Some(pool) = default_pool(&ctx) {
            let mut keep = u64::MAX;
            // SAFETY: a live pool; the attribute takes a u64.
            let _ = unsafe { cu::cuMemPoolSetAttribute(pool, cu::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut keep as *mut u64).cast()) };
        }
        let lt = gemm::Lt::new().map_err(ExecError::NoCuda)?;
        // SAFETY: the workspace is only written by cuBLASLt.
        let workspace = unsafe { stream.alloc::<u8>(gemm::WORKSPACE_BYTES) }.map_err(|e| derr("workspace", e))?;
        Ok(Cuda::open(ordinal, format!("cuda:{ordinal} ({}, sm_{major}{minor})", info.name), Engine::Gpu(Gpu { ctx, stream, kernels, lt, workspace })))
    }

    /// The CUDA backend with no GPU: the kernels of `kernels/cuda` built for the CPU
    /// (a C++20 compiler runs, once per process) and run on host memory, GEMMs computed
    /// as cuBLASLt's contract reads ([`emulated`]). Everything above the driver is the
    /// backend's own code, so the kernel check and training steps on it check the
    /// backend's launches without a GPU. Slow (one CPU thread runs every CUDA thread in
    /// turn; GEMMs are plain loops); no CUDA graphs, no NCCL, no timing that means
    /// anything.
    ///
    /// # Errors
    /// [`ExecError::NoCuda`]: no C++ compiler, or the kernels do not build.
    pub fn emulated() -> Result<Cuda, ExecError> {
        let emu = emulated::Emulator::get().map_err(|e| ExecError::NoCuda(format!("the emulated CUDA device: {e}")))?;
        Ok(Cuda::open(0, "cuda-emulated (the CUDA backend, its kernels emulated on the CPU)".into(), Engine::Emulated(emu)))
    }

    fn open(ordinal: usize, label: String, engine: Engine) -> Cuda {
        Cuda {
            inner: Arc::new(Inner {
                ordinal,
                label,
                engine,
                tracker: Arc::new(Tracker::default()),
                concat_shapes: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The GPU, for what only a GPU does (graphs, NCCL, events); an error naming `what`
    /// on the emulated device.
    fn gpu(&self, what: &str) -> Result<&Gpu, ExecError> {
        match &self.inner.engine {
            Engine::Gpu(g) => Ok(g),
            Engine::Emulated(_) => Err(ExecError::State(format!("{what} needs a GPU: {} runs no CUDA driver", self.inner.label))),
        }
    }

    /// cuBLASLt plans cached so far.
    pub fn gemm_plans(&self) -> usize {
        match &self.inner.engine {
            Engine::Gpu(g) => g.lt.cached(),
            Engine::Emulated(_) => 0,
        }
    }

    /// `bytes` of device memory (at least one), uninitialised.
    fn mem(&self, bytes: usize) -> Result<Mem, ExecError> {
        let bytes = bytes.max(1);
        match &self.inner.engine {
            Engine::Gpu(g) => {
                // SAFETY: the memory is uninitialised; every kernel writes what it reads back.
                let slice = unsafe { g.stream.alloc::<u8>(bytes) }.map_err(|e| self.derr(&format!("allocating {bytes} bytes"), e))?;
                let ptr = slice.device_ptr(&g.stream).0;
                Ok(Mem { ptr, _owner: Owner::Gpu(slice) })
            }
            Engine::Emulated(_) => {
                let host = emulated::HostMem::new(bytes).map_err(|e| self.derr(&format!("allocating {bytes} bytes"), e))?;
                Ok(Mem { ptr: host.addr(), _owner: Owner::Host(host) })
            }
        }
    }

    /// Zero `bytes` at `p`, in stream order.
    ///
    /// # Safety
    /// `p` addresses `bytes` of this device's memory.
    unsafe fn memset(&self, p: u64, bytes: usize) -> Result<(), DriverError> {
        match &self.inner.engine {
            // SAFETY: the caller's.
            Engine::Gpu(g) => unsafe { dr::memset_d8_async(p, 0, bytes, g.raw_stream()?) },
            Engine::Emulated(_) => {
                // SAFETY: the caller's; host memory.
                unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes) };
                Ok(())
            }
        }
    }

    /// Set the 4-byte words at `p` to `words`, in stream order.
    ///
    /// # Safety
    /// `p` addresses `words.len()` words of this device's memory.
    unsafe fn set_words(&self, p: u64, words: &[u32]) -> Result<(), DriverError> {
        match &self.inner.engine {
            Engine::Gpu(g) => {
                let st = g.raw_stream()?;
                let mut at = 0;
                for run in words.chunk_by(|a, b| a == b) {
                    // SAFETY: the caller's: the run's words are inside the range.
                    unsafe { cu::cuMemsetD32Async(p + 4 * at as u64, run[0], run.len(), st) }.result()?;
                    at += run.len();
                }
                Ok(())
            }
            Engine::Emulated(_) => {
                // SAFETY: the caller's; host memory.
                unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), p as *mut u32, words.len()) };
                Ok(())
            }
        }
    }

    /// Copy `bytes` from `src` to `dst` on the device, in stream order.
    ///
    /// # Safety
    /// Both address `bytes` of this device's memory, not overlapping.
    unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<(), DriverError> {
        match &self.inner.engine {
            // SAFETY: the caller's.
            Engine::Gpu(g) => unsafe { dr::memcpy_dtod_async(dst, src, bytes, g.raw_stream()?) },
            Engine::Emulated(_) => {
                // SAFETY: the caller's; host memory.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            }
        }
    }

    /// Copy `data` from the host to `p`, in stream order (staged before this returns).
    ///
    /// # Safety
    /// `p` addresses `data.len()` elements of T of this device's memory.
    unsafe fn htod<T: Copy>(&self, p: u64, data: &[T]) -> Result<(), DriverError> {
        match &self.inner.engine {
            // SAFETY: the caller's; pageable memory is staged before the call returns.
            Engine::Gpu(g) => unsafe { dr::memcpy_htod_async(p, data, g.raw_stream()?) },
            Engine::Emulated(_) => {
                // SAFETY: the caller's; host memory.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut T, data.len()) };
                Ok(())
            }
        }
    }

    /// Copy from `p` into `out` on the host, and wait for the stream.
    ///
    /// # Safety
    /// `p` addresses `out.len()` elements of T of this device's memory.
    unsafe fn dtoh<T: Copy>(&self, p: u64, out: &mut [T]) -> Result<(), DriverError> {
        match &self.inner.engine {
            Engine::Gpu(g) => {
                if !out.is_empty() {
                    // SAFETY: the caller's; the stream is synchronised before `out` is read.
                    unsafe { dr::memcpy_dtoh_async(out, p, g.raw_stream()?) }?;
                }
                g.stream.synchronize()
            }
            Engine::Emulated(_) => {
                // SAFETY: the caller's; host memory.
                unsafe { std::ptr::copy_nonoverlapping(p as *const T, out.as_mut_ptr(), out.len()) };
                Ok(())
            }
        }
    }

    /// Launch kernel `name` (its arguments checked against its C signature; an empty
    /// grid launches nothing).
    fn run(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), ExecError> {
        let g = match &self.inner.engine {
            Engine::Gpu(g) => g,
            Engine::Emulated(e) => return e.launch(name, cfg, args).map_err(|e| kerr(name, e)),
        };
        let k = g.kernels.get(name)?;
        k.check(name, args)?;
        if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
            return Ok(());
        }
        if cfg.shared_mem_bytes > 48 << 10 {
            // Past the default 48 KiB the kernel must be allowed more; the driver refuses
            // what the device lacks. (run_shared keeps the size to an int.)
            k.f.set_attribute(cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, cfg.shared_mem_bytes as i32)
                .map_err(|e| self.derr(&format!("{name}: {} bytes of shared memory", cfg.shared_mem_bytes), e))?;
        }
        kernels::launch(&g.stream, k, cfg, args).map_err(|e| self.derr(name, e))
    }

    fn derr(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        let e = e.to_string();
        // A kernel's fault is sticky and surfaces at the next call on the context, under
        // that call's name: say so, and how to find the kernel.
        const STICKY: [&str; 6] = ["ILLEGAL_ADDRESS", "LAUNCH_FAILED", "MISALIGNED_ADDRESS", "ILLEGAL_INSTRUCTION", "HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT"];
        let hint = if STICKY.iter().any(|s| e.contains(s)) {
            " (a kernel launched earlier faulted, not necessarily this call: rerun with CUDA_LAUNCH_BLOCKING=1 to stop at the kernel)"
        } else {
            ""
        };
        ExecError::Device {
            device: format!("cuda:{}", self.inner.ordinal),
            what: format!("{what}: {e}{hint}"),
        }
    }

    /// The device address of a buffer.
    pub(crate) fn ptr(&self, b: &CudaBuffer) -> u64 {
        b.mem.ptr
    }

    /// An FP8 buffer's scale words set to [1, 1, 0, 0].
    fn init_meta(&self, m: &Mem) -> Result<(), ExecError> {
        self.set_meta(m.ptr, 1.0)
    }

    /// The FP8 meta at `p` set to [scale, 1/scale, 0, 0] by memsets on the stream: device
    /// work, so it may be recorded, and never waits (a copy from pageable host memory
    /// may synchronise with the stream).
    fn set_meta(&self, p: u64, scale: f32) -> Result<(), ExecError> {
        // SAFETY: `p` points at an FP8 buffer's 4 meta words.
        unsafe { self.set_words(p, &[scale.to_bits(), (1.0 / scale).to_bits(), 0, 0]) }.map_err(|e| self.derr("FP8 scale", e))
    }

    /// Host transfers cannot be recorded: one inside a recording is refused by name here
    /// rather than by the driver's capture error.
    fn not_recording(&self, what: &str) -> Result<(), ExecError> {
        if self.inner.tracker.recording.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        Err(ExecError::State(format!("{}: {what} inside a recorded step (a CUDA graph holds device work only)", self.name())))
    }

    /// An FP8 destination takes its source's scale with its codes.
    fn copy_meta(&self, dst: &CudaBuffer, src: &CudaBuffer, what: &str) -> Result<(), ExecError> {
        if let (Some(d), Some(s)) = (&dst.meta, &src.meta) {
            // SAFETY: both metas hold 4 floats.
            unsafe { self.dtod(d.ptr, s.ptr, 16) }.map_err(|e| self.derr(what, e))?;
        }
        Ok(())
    }

    fn meta_ptr(&self, b: &CudaBuffer) -> Result<u64, ExecError> {
        let m = b
            .meta
            .as_ref()
            .ok_or_else(|| ExecError::State(format!("a {} buffer has no FP8 scale", b.elem.name())))?;
        Ok(m.ptr)
    }

    /// An element-wise kernel over `n` elements (its last argument is n).
    fn ew(&self, name: &str, n: usize, args: &[Arg]) -> Result<(), ExecError> {
        if n == 0 {
            return Ok(());
        }
        self.run(name, ew_cfg(n), args)
    }

    fn p(&self, b: &CudaBuffer) -> Arg {
        Arg::P(self.ptr(b))
    }

    fn f32_scratch(&self, len: usize) -> Result<CudaBuffer, ExecError> {
        self.alloc(Elem::F32, len)
    }

    /// Upload host f32 into an f32 buffer.
    fn upload_f32(&self, buf: &CudaBuffer, data: &[f32]) -> Result<(), ExecError> {
        if data.is_empty() {
            return Ok(());
        }
        self.not_recording("a copy from the host")?;
        // SAFETY: the buffer holds at least data.len() f32 (checked by the callers); the
        // copy from pageable memory is staged before the call returns.
        unsafe { self.htod(self.ptr(buf), data) }.map_err(|e| self.derr("upload", e))
    }

    fn download<T: Default + Copy>(&self, ptr: u64, len: usize) -> Result<Vec<T>, ExecError> {
        self.not_recording("a read back to the host")?;
        let mut out = vec![T::default(); len];
        // SAFETY: `ptr` addresses at least `len` elements of T.
        unsafe { self.dtoh(ptr, &mut out) }.map_err(|e| self.derr("download", e))?;
        Ok(out)
    }

    /// A per-tensor FP8 `spec` for the codes of `dst`, as the codes kernels take it:
    /// (format code, format, given scale or `None` for current scaling, margin, saturate).
    /// Anything else (block scales, stochastic rounding, a format other than `dst`'s, a
    /// scale that is not finite and positive) is refused.
    #[allow(clippy::type_complexity)]
    fn codes_spec(&self, k: &str, dst: &CudaBuffer, spec: &QuantSpec) -> Result<(i32, quant::Format, Option<f32>, i32, bool), ExecError> {
        let fmt = fmt_code(dst.elem.fp8().ok_or_else(|| ExecError::State(format!("{k} into a {} buffer", dst.elem.name())))?);
        match *spec {
            QuantSpec::Tensor { format, scale, margin, saturate, stochastic: None }
                if ((format, fmt) == (quant::Format::E4M3, 0) || (format, fmt) == (quant::Format::E5M2, 1))
                    && scale.is_none_or(|s| quant::check_scale(s).is_ok()) =>
            {
                Ok((fmt, format, scale, margin, saturate))
            }
            _ => Err(ExecError::State(format!("{k}: {spec:?} into a {} buffer", dst.elem.name()))),
        }
    }

    /// A zeroed statistics record for one quantisation (see [`CudaQuantStats`]).
    fn stats_record(&self) -> Result<CudaBuffer, ExecError> {
        let rec = self.alloc(Elem::I32, STATS_WORDS)?;
        // SAFETY: the record holds STATS_WORDS 4-byte words.
        unsafe { self.memset(self.ptr(&rec), 4 * STATS_WORDS) }
            .map_err(|e| self.derr("memset", e))?;
        Ok(rec)
    }

    /// The FP8 meta of `codes` set to [scale, 1/scale, 0, 0] (the kernels overwrite the
    /// scale when they take a current one); its pointer.
    fn codes_meta(&self, codes: &CudaBuffer, scale: f32) -> Result<u64, ExecError> {
        let meta = self.meta_ptr(codes)?;
        self.set_meta(meta, scale)?;
        Ok(meta)
    }

    /// Copy the amax a codes kernel left in an FP8 buffer's meta into the statistics
    /// record (the buffer may be gone before the record is read).
    fn keep_amax(&self, rec: &CudaBuffer, meta: u64) -> Result<(), ExecError> {
        // SAFETY: 4 bytes from meta[2] into the record's amax word; both live on this
        // stream until the copy has run.
        unsafe { self.dtod(self.ptr(rec) + STATS_AMAX, meta + 8, 4) }
            .map_err(|e| self.derr("copy", e))
    }

    /// Current-scaling FP8 quantisation of the f32 buffer `x` into `q`: amax, scale and
    /// codes all computed on the device.
    fn quantize_current(&self, q: &mut CudaBuffer, x: &CudaBuffer) -> Result<(), ExecError> {
        let fmt = fmt_code(q.elem.fp8().ok_or_else(|| ExecError::State("quantize into a non-FP8 buffer".into()))?);
        let meta = self.meta_ptr(q)?;
        // SAFETY: meta holds 4 floats; zero them, amax accumulates into meta[2].
        unsafe { self.memset(meta, 16) }.map_err(|e| self.derr("memset", e))?;
        let n = x.len;
        self.ew("amax_f32", n, &[Arg::P(meta + 8), self.p(x), Arg::I(n as i64)])?;
        self.run("fp8_scale_from_amax", LaunchConfig::for_num_elems(1), &[Arg::P(meta), Arg::I32(fmt)])?;
        self.ew("fp8_quantize", n, &[self.p(q), self.p(x), Arg::P(meta), Arg::I(n as i64), Arg::I32(fmt)])
    }

    /// `x` widened to a fresh f32 buffer on the device (itself when it is f32).
    fn widen(&self, x: &CudaBuffer) -> Result<Option<CudaBuffer>, ExecError> {
        let n = x.len as i64;
        let kernel = match x.elem {
            Elem::F32 => return Ok(None),
            Elem::BF16 => "bf16_to_f32_kernel",
            Elem::F16 => "f16_to_f32_kernel",
            Elem::F8E4M3 | Elem::F8E5M2 => {
                let out = self.f32_scratch(x.len)?;
                let fmt = fmt_code(x.elem.fp8().unwrap_or(Fp8Format::E4M3));
                self.ew("fp8_dequantize", x.len, &[self.p(&out), self.p(x), Arg::P(self.meta_ptr(x)?), Arg::I(n), Arg::I32(fmt)])?;
                return Ok(Some(out));
            }
            Elem::I32 => return Err(ExecError::State("widen of an int32 buffer".into())),
        };
        let out = self.f32_scratch(x.len)?;
        self.ew(kernel, x.len, &[self.p(&out), self.p(x), Arg::I(n)])?;
        Ok(Some(out))
    }

    /// Column sums over rows (bias and norm weight gradients), added into `dst`:
    /// norm.cu's two-stage column_partials / column_finish.
    #[allow(clippy::too_many_arguments)]
    fn column_sums(
        &self,
        dst: &CudaBuffer,
        dout: &CudaBuffer,
        x: Option<&CudaBuffer>,
        mean: Option<&CudaBuffer>,
        rstd: Option<&CudaBuffer>,
        rows: usize,
        c: usize,
        mode: i32,
    ) -> Result<(), ExecError> {
        if rows == 0 || c == 0 {
            return Ok(());
        }
        let chunks = rows.clamp(1, 128);
        let per = rows.div_ceil(chunks);
        // At most 128 chunks: exact as an int.
        let chunks = rows.div_ceil(per);
        let ci = i32_arg("column_partials", "the row width", c)?;
        let cols = grid("column_partials", c.div_ceil(BLOCK as usize), chunks, 1)?;
        let partial = self.f32_scratch(numel("column_partials", &[chunks, c])?)?;
        let opt = |b: Option<&CudaBuffer>| b.map_or(Arg::P(0), |b| self.p(b));
        self.run(
            "column_partials",
            LaunchConfig {
                grid_dim: cols,
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                self.p(&partial),
                self.p(dout),
                opt(x),
                opt(mean),
                opt(rstd),
                Arg::I(rows as i64),
                Arg::I32(ci),
                Arg::I(per as i64),
                Arg::I32(mode),
            ],
        )?;
        self.run(
            "column_finish",
            LaunchConfig {
                grid_dim: (cols.0, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            &[self.p(dst), self.p(&partial), Arg::I32(chunks as i32), Arg::I32(ci)],
        )
    }

    /// The kernels' shape of a checked attention ([`Cuda::attn_check`]: h up to 65535,
    /// hkv dividing it, d and dv up to 256, the cp rank below the cp size, so those casts
    /// are exact).
    fn attn_shape(kernel: &str, a: &Attn) -> Result<AttnShape, ExecError> {
        let tk = a.kv_len();
        Ok(AttnShape {
            b: i64_arg(kernel, "the batch", a.b)?,
            t: i64_arg(kernel, "the sequence length", a.t)?,
            tk: i64_arg(kernel, "the key length", tk)?,
            h: a.h as i32,
            hkv: a.hkv as i32,
            d: a.d as i32,
            dv: a.dv as i32,
            causal: a.causal as i32,
            window: match a.window {
                // A window past i32 that covers every key masks nothing: none.
                Some(w) if w > i32::MAX as usize && w >= tk => 0,
                Some(w) => i32_arg(kernel, "the attention window", w)?,
                None => 0,
            },
            scale: a.scale,
            cp: a.cp.map_or(Ok(1), |c| i32_arg(kernel, "the cp group size", c.size))?,
            cp_rank: a.cp.map_or(0, |c| c.rank as i32),
        })
    }

    fn attn_check(&self, kernel: &str, a: &Attn) -> Result<(), ExecError> {
        // The CPU's rules (heads, dims, window, the cp shard's rank and even T), then the
        // kernels' own limits: head dims up to 256, and grid y and z (heads, batch) up to
        // 65535.
        runner_kernels::cpu::attention::check_shape(a).map_err(refused(kernel))?;
        if a.d > 256 || a.dv > 256 {
            return Err(kerr(kernel, format!("attention head dims {} / {}: the CUDA kernels take up to 256", a.d, a.dv)));
        }
        if a.h > 65_535 || a.b > 65_535 {
            return Err(kerr(kernel, format!("attention over {} heads and a batch of {}: the CUDA kernels take up to 65535 of each", a.h, a.b)));
        }
        Ok(())
    }

    /// Launch an attention kernel with `floats` of dynamic shared memory.
    fn run_attn(&self, name: &str, grid: (u32, u32, u32), floats: usize, args: &[Arg]) -> Result<(), ExecError> {
        self.run_shared(name, grid, 128, floats, args)
    }

    /// Launch `name` with `threads` per block and `floats` of dynamic shared memory (past
    /// the default 48 KiB the kernel is allowed more; the driver refuses what the device
    /// lacks).
    fn run_shared(&self, name: &str, grid: (u32, u32, u32), threads: u32, floats: usize, args: &[Arg]) -> Result<(), ExecError> {
        // The driver takes the size as an int (cuFuncSetAttribute).
        let bytes = floats.checked_mul(4).and_then(|b| i32::try_from(b).ok()).ok_or_else(|| kerr(name, format!("{floats} floats of shared memory")))? as u32;
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (threads, 1, 1),
            shared_mem_bytes: bytes,
        };
        self.run(name, cfg, args)
    }

    /// The lengths of a scan's inputs, then of other buffers, against its shape: (what,
    /// buffer length, which of [`Ssm::lens`]).
    fn ssm_lens(kernel: &str, s: &Ssm, inputs: SsmInputs<usize>, bufs: &[(&str, usize, usize)]) -> Result<(), ExecError> {
        s.check_lens("input", inputs).map_err(refused(kernel))?;
        let want = s.lens().map_err(refused(kernel))?;
        let checks: Vec<(&str, usize, usize)> = bufs.iter().map(|&(what, got, kind)| (what, got, want[kind])).collect();
        lens(kernel, &checks)
    }

    /// The chunk length as the kernels take it: a chunk past the sequence is the
    /// sequence (the same single chunk); a sequence past an int is refused.
    fn chunk_arg(kernel: &str, s: &Ssm) -> Result<i32, ExecError> {
        i32_arg(kernel, "the scan's chunk", s.chunk.min(s.t.max(1)))
    }

    /// A causal convolution's shape arguments after the buffers: B, T, C, K.
    fn conv_dims(kernel: &str, s: &Conv1d) -> Result<[Arg; 4], ExecError> {
        Ok([
            Arg::I(i64_arg(kernel, "the batch", s.b)?),
            Arg::I(i64_arg(kernel, "the sequence length", s.t)?),
            Arg::I32(i32_arg(kernel, "the channels", s.c)?),
            Arg::I32(i32_arg(kernel, "the kernel width", s.k)?),
        ])
    }

    /// The scan's shape arguments after the buffers: T, H, P, G, N.
    fn ssm_dims(kernel: &str, s: &Ssm) -> Result<[Arg; 5], ExecError> {
        Ok([
            Arg::I(i64_arg(kernel, "the sequence length", s.t)?),
            Arg::I32(i32_arg(kernel, "the heads", s.h)?),
            Arg::I32(i32_arg(kernel, "the head dim", s.p)?),
            Arg::I32(i32_arg(kernel, "the groups", s.g)?),
            Arg::I32(i32_arg(kernel, "the state size", s.n)?),
        ])
    }
}

/// Query rows per attention block (attention.cu's QROWS) and keys per dK/dV block (KROWS).
const ATT_QROWS: usize = 16;
const ATT_KROWS: usize = 16;
const ATT_TILE: usize = 32;

impl Device for Cuda {
    type Buffer = CudaBuffer;
    type Plan = CudaPlan;
    type Event = CudaStamp;
    type QuantStats = CudaQuantStats;
    type Graph = CudaRecording;

    fn name(&self) -> String {
        self.inner.label.clone()
    }

    fn alloc(&self, elem: Elem, len: usize) -> Result<CudaBuffer, ExecError> {
        // At most isize::MAX bytes, as any allocation: a length's byte count, and every
        // buffer length as a kernel's i64, are then exact.
        let bytes = len.checked_mul(elem.bytes()).filter(|&b| isize::try_from(b).is_ok()).ok_or_else(|| {
            ExecError::Device { device: format!("cuda:{}", self.inner.ordinal), what: format!("allocating {len} {} elements: more bytes than an allocation holds", elem.name()) }
        })?;
        let mem = self.mem(bytes)?;
        let meta = if elem.fp8().is_some() {
            // Written at once by init_meta.
            let m = self.mem(16)?;
            self.init_meta(&m)?;
            Some(m)
        } else {
            None
        };
        let t = &self.inner.tracker;
        let now = t.current.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        t.peak.fetch_max(now, Ordering::Relaxed);
        t.allocations.fetch_add(1, Ordering::Relaxed);
        let born = t.recording.load(Ordering::Acquire);
        if born != 0 {
            t.capture().born_alive += 1;
        }
        Ok(CudaBuffer {
            mem: ManuallyDrop::new(mem),
            len,
            elem,
            meta,
            tracker: t.clone(),
            born,
        })
    }

    fn zero(&self, buf: &mut CudaBuffer) -> Result<(), ExecError> {
        let bytes = buf.len * buf.elem.bytes();
        if bytes > 0 {
            // SAFETY: the allocation holds `bytes`.
            unsafe { self.memset(self.ptr(buf), bytes) }
                .map_err(|e| self.derr("memset", e))?;
        }
        if let Some(m) = &buf.meta {
            self.init_meta(m)?;
        }
        Ok(())
    }

    fn write_f32(&self, buf: &mut CudaBuffer, data: &[f32]) -> Result<(), ExecError> {
        if buf.len != data.len() || !buf.elem.is_float() {
            return Err(ExecError::State(format!(
                "write of {} f32 into a buffer of {} {}",
                data.len(),
                buf.len,
                buf.elem.name()
            )));
        }
        if buf.elem == Elem::F32 {
            return self.upload_f32(buf, data);
        }
        let tmp = self.f32_scratch(data.len())?;
        self.upload_f32(&tmp, data)?;
        self.cast(buf, &tmp)
    }

    fn write_u32(&self, buf: &mut CudaBuffer, data: &[u32]) -> Result<(), ExecError> {
        if buf.len != data.len() || buf.elem != Elem::I32 {
            return Err(ExecError::State(format!(
                "write of {} u32 into a buffer of {} {}",
                data.len(),
                buf.len,
                buf.elem.name()
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.not_recording("a copy from the host")?;
        // SAFETY: the buffer holds data.len() 4-byte elements.
        unsafe { self.htod(self.ptr(buf), data) }.map_err(|e| self.derr("upload", e))
    }

    fn read_f32(&self, buf: &CudaBuffer) -> Result<Vec<f32>, ExecError> {
        match self.widen(buf)? {
            Some(w) => self.download(self.ptr(&w), w.len),
            None => self.download(self.ptr(buf), buf.len),
        }
    }

    fn read_u32(&self, buf: &CudaBuffer) -> Result<Vec<u32>, ExecError> {
        need("read_u32", buf, Elem::I32)?;
        self.download(self.ptr(buf), buf.len)
    }

    fn copy(&self, dst: &mut CudaBuffer, dst_at: usize, src: &CudaBuffer, src_at: usize, len: usize) -> Result<(), ExecError> {
        let ok = dst.elem == src.elem
            && dst_at.checked_add(len).is_some_and(|e| e <= dst.len)
            && src_at.checked_add(len).is_some_and(|e| e <= src.len);
        if !ok {
            return Err(ExecError::State(format!(
                "copy of {len} {} from {src_at} of {} into {} {} at {dst_at}",
                src.elem.name(),
                src.len,
                dst.len,
                dst.elem.name()
            )));
        }
        let w = src.elem.bytes();
        if len > 0 {
            // SAFETY: both ranges are inside their allocations (checked above).
            unsafe { self.dtod(self.ptr(dst) + (dst_at * w) as u64, self.ptr(src) + (src_at * w) as u64, len * w) }
                .map_err(|e| self.derr("copy", e))?;
        }
        self.copy_meta(dst, src, "copy")
    }

    fn transpose_outer(&self, dst: &mut CudaBuffer, src: &CudaBuffer, a: usize, b: usize, c: usize) -> Result<(), ExecError> {
        let k = "transpose_outer";
        let n = numel(k, &[a, b, c])?;
        let dims = [Arg::I(i64_arg(k, "a", a)?), Arg::I(i64_arg(k, "b", b)?), Arg::I(i64_arg(k, "c", c)?)];
        if dst.elem != src.elem || dst.len != n || src.len != n {
            return Err(ExecError::State(format!(
                "transpose_outer ({a},{b},{c}) of {} {} into {} {}",
                src.len,
                src.elem.name(),
                dst.len,
                dst.elem.name()
            )));
        }
        let k = match src.elem.bytes() {
            4 => "transpose_outer_u32",
            2 => "transpose_outer_u16",
            _ => "transpose_outer_u8",
        };
        self.ew(k, n, &[&[self.p(dst), self.p(src)][..], &dims].concat())?;
        self.copy_meta(dst, src, "transpose_outer")
    }

    fn cast(&self, dst: &mut CudaBuffer, src: &CudaBuffer) -> Result<(), ExecError> {
        if dst.len != src.len || !dst.elem.is_float() || !src.elem.is_float() {
            return Err(ExecError::State(format!(
                "cast of {} {} into {} {}",
                src.len,
                src.elem.name(),
                dst.len,
                dst.elem.name()
            )));
        }
        let wide = self.widen(src)?;
        let x = wide.as_ref().unwrap_or(src);
        let n = x.len as i64;
        match dst.elem {
            Elem::F32 => self.copy(dst, 0, x, 0, x.len),
            Elem::BF16 => self.ew("f32_to_bf16_kernel", x.len, &[self.p(dst), self.p(x), Arg::I(n)]),
            Elem::F16 => self.ew("f32_to_f16_kernel", x.len, &[self.p(dst), self.p(x), Arg::I(n)]),
            Elem::F8E4M3 | Elem::F8E5M2 => self.quantize_current(dst, x),
            Elem::I32 => Err(ExecError::State("cast into int32".into())),
        }
    }

    fn quantize_fp8_codes(&self, dst: &mut CudaBuffer, src: &CudaBuffer, src_at: usize, spec: &QuantSpec) -> Result<CudaQuantStats, ExecError> {
        let k = "quantize_fp8_codes";
        need(k, src, Elem::F32)?;
        let (fmt, format, given, margin, saturate) = self.codes_spec(k, dst, spec)?;
        if src_at.checked_add(dst.len).is_none_or(|end| end > src.len) {
            return Err(kerr(k, format!("{} codes from element {src_at} of a {}-element source", dst.len, src.len)));
        }
        let rec = self.stats_record()?;
        let meta = self.codes_meta(dst, given.unwrap_or(1.0))?;
        let scale = match given {
            Some(s) => ScaleFrom::Given(s),
            None => ScaleFrom::Current { format, margin },
        };
        if dst.len > 0 {
            let n = dst.len as i64;
            let from = Arg::P(self.ptr(src) + (src_at * 4) as u64);
            let cur = self.ptr(&rec) + STATS_CUR;
            if given.is_none() {
                self.ew("amax_f32", dst.len, &[Arg::P(cur), from, Arg::I(n)])?;
            }
            let args = [
                self.p(dst),
                Arg::P(meta),
                from,
                Arg::P(cur),
                self.p(&rec),
                Arg::I(n),
                Arg::I32(fmt),
                Arg::F(given.unwrap_or(0.0)),
                Arg::I32(margin),
                Arg::I32(i32::from(saturate)),
            ];
            self.ew("quant_tensor_codes", dst.len, &args)?;
            self.keep_amax(&rec, meta)?;
        }
        Ok(CudaQuantStats { rec, scale, elements: dst.len })
    }

    fn forward_with_cast(&self, producer: CastProducer<'_, CudaBuffer>, codes: &mut CudaBuffer, spec: &QuantSpec) -> Result<CudaQuantStats, ExecError> {
        let k = "forward_with_cast";
        let (fmt, _, given, _, saturate) = self.codes_spec(k, codes, spec)?;
        let scale = given.ok_or_else(|| ExecError::State(format!("{k}: the fused cast takes a given (delayed) scale")))?;
        let rec = self.stats_record()?;
        let meta = self.codes_meta(codes, scale)?;
        let (q, cp) = (self.p(codes), self.p(&rec));
        let sat = Arg::I32(i32::from(saturate));
        let kind = CastKind::of(&producer);
        let n = match producer {
            CastProducer::RmsNorm { out, rstd, x, w, c, eps } => {
                let rows = x.len / c.max(1);
                lens(k, &[("out", out.len, x.len), ("codes", codes.len, x.len), ("rstd", rstd.len, rows), ("w", w.len, c), ("x", rows * c, x.len)])?;
                if rows > 0 {
                    let args = [self.p(out), self.p(rstd), q, Arg::P(meta), cp, self.p(x), self.p(w), Arg::I32(i32_arg(k, "the row width", c)?), Arg::F(eps), Arg::I32(fmt), Arg::F(scale), sat];
                    self.run("rmsnorm_forward_codes", rows_cfg(k, rows)?, &args)?;
                }
                x.len
            }
            CastProducer::SwiGlu { out, gate: a, up: b } | CastProducer::GeGlu { out, gate: a, up: b } => {
                let act = if matches!(kind, CastKind::SwiGlu) { 0 } else { 1 };
                lens(k, &[("gate", a.len, out.len), ("up", b.len, out.len), ("codes", codes.len, out.len)])?;
                let args = [self.p(out), q, Arg::P(meta), cp, self.p(a), self.p(b), Arg::I(out.len as i64), Arg::I32(act), Arg::I32(fmt), Arg::F(scale), sat];
                self.ew("activation_forward_codes", out.len, &args)?;
                out.len
            }
            CastProducer::Gelu { out, x } | CastProducer::SquaredRelu { out, x } => {
                let act = if matches!(kind, CastKind::Gelu) { 2 } else { 3 };
                lens(k, &[("x", x.len, out.len), ("codes", codes.len, out.len)])?;
                let args = [self.p(out), q, Arg::P(meta), cp, self.p(x), self.p(x), Arg::I(out.len as i64), Arg::I32(act), Arg::I32(fmt), Arg::F(scale), sat];
                self.ew("activation_forward_codes", out.len, &args)?;
                out.len
            }
        };
        self.keep_amax(&rec, meta)?;
        Ok(CudaQuantStats { rec, scale: ScaleFrom::Given(scale), elements: n })
    }

    fn read_quant(&self, stats: Vec<CudaQuantStats>) -> Result<Vec<QuantReport>, ExecError> {
        if stats.is_empty() {
            return Ok(Vec::new());
        }
        // Every record gathered into one device buffer behind the pass, then one copy
        // down: a copy into pageable host memory returns only once done, so a copy per
        // record would wait for the device once per record.
        let all = self.alloc(Elem::I32, stats.len() * STATS_WORDS)?;
        let base = self.ptr(&all);
        for (i, s) in stats.iter().enumerate() {
            // SAFETY: each record holds STATS_WORDS words, and `all` one slot of them per record.
            unsafe { self.dtod(base + (i * 4 * STATS_WORDS) as u64, self.ptr(&s.rec), 4 * STATS_WORDS) }
                .map_err(|e| self.derr("statistics", e))?;
        }
        let mut flat = vec![0u32; stats.len() * STATS_WORDS];
        // SAFETY: `all` holds flat.len() words.
        unsafe { self.dtoh(base, &mut flat[..]) }.map_err(|e| self.derr("download", e))?;
        stats
            .iter()
            .zip(flat.chunks_exact(STATS_WORDS))
            .map(|(s, w)| {
                let w: &[u32; STATS_WORDS] = w.try_into().map_err(|_| ExecError::State("statistics record of the wrong size".into()))?;
                Ok(s.report(w))
            })
            .collect()
    }

    fn native_fp8(&self) -> bool {
        true
    }

    fn memory_free(&self) -> Option<u64> {
        let Engine::Gpu(g) = &self.inner.engine else { return None };
        g.ctx.bind_to_thread().ok()?;
        dr::mem_get_info().ok().map(|(free, _total)| free as u64)
    }

    fn fp8_scale(&self, buf: &CudaBuffer) -> Result<f32, ExecError> {
        match &buf.meta {
            Some(_) => Ok(self.download::<f32>(self.meta_ptr(buf)?, 1)?[0]),
            None => Ok(1.0),
        }
    }

    fn fp8_amax(&self, buf: &CudaBuffer) -> Result<f32, ExecError> {
        match &buf.meta {
            Some(_) => Ok(self.download::<f32>(self.meta_ptr(buf)? + 8, 1)?[0]),
            None => Ok(0.0),
        }
    }

    fn round_to_storage(&self, buf: &mut CudaBuffer, dtype: DType, row: usize) -> Result<(), ExecError> {
        need("round_to_storage", buf, Elem::F32)?;
        let n = buf.len as i64;
        match dtype {
            DType::BF16 => self.ew("round_bf16", buf.len, &[self.p(buf), Arg::I(n)]),
            DType::F16 => self.ew("round_f16", buf.len, &[self.p(buf), Arg::I(n)]),
            DType::Fp8E4M3 | DType::Fp8E5M2 => {
                let fmt = if dtype == DType::Fp8E4M3 { 0 } else { 1 };
                let meta = self.f32_scratch(4)?;
                // SAFETY: 4 floats.
                unsafe { self.memset(self.ptr(&meta), 16) }
                    .map_err(|e| self.derr("memset", e))?;
                let mp = self.ptr(&meta);
                self.ew("amax_f32", buf.len, &[Arg::P(mp + 8), self.p(buf), Arg::I(n)])?;
                self.run("fp8_scale_from_amax", LaunchConfig::for_num_elems(1), &[Arg::P(mp), Arg::I32(fmt)])?;
                self.ew("round_fp8", buf.len, &[self.p(buf), Arg::P(mp), Arg::I(n), Arg::I32(fmt)])
            }
            DType::MxFp8 => {
                let rows = runner_kernels::cpu::precision::mx_rows(buf.len, row).map_err(refused("round_to_storage"))?;
                // rows · row is the buffer's length: the product of whole warps is no more.
                let warps = rows * row.div_ceil(32);
                if warps == 0 {
                    return Ok(());
                }
                self.run(
                    "round_mxfp8",
                    LaunchConfig {
                        grid_dim: grid("round_to_storage", warps.div_ceil(8), 1, 1)?,
                        block_dim: (BLOCK, 1, 1),
                        shared_mem_bytes: 0,
                    },
                    &[self.p(buf), Arg::I(rows as i64), Arg::I32(i32_arg("round_to_storage", "the MXFP8 row", row)?)],
                )
            }
            DType::F32 | DType::NvFp4 | DType::I32 => Ok(()),
        }
    }

    fn quantize(&self, x: &mut CudaBuffer, rows: usize, cols: usize, spec: &QuantSpec) -> Result<CudaQuantStats, ExecError> {
        need("quantize", x, Elem::F32)?;
        lens("quantize", &[("x", x.len, rows.saturating_mul(cols))])?;
        let n = x.len as i64;
        // The shape and block as the kernels take them, checked before anything is
        // allocated (the block may be larger than the tensor).
        let (r, c) = (i64_arg("quantize", "the rows", rows)?, i64_arg("quantize", "the columns", cols)?);
        let block = match *spec {
            QuantSpec::Blocks(b) => (i32_arg("quantize", "the block's rows", b.block.0)?, i32_arg("quantize", "the block's columns", b.block.1)?),
            _ => (0, 0),
        };
        let rec = self.stats_record()?;
        let (cp, ap, curp) = (self.ptr(&rec), self.ptr(&rec) + STATS_AMAX, self.ptr(&rec) + STATS_CUR);
        let fmt_of = |f: quant::Format| match f {
            quant::Format::E4M3 => 0,
            quant::Format::E5M2 => 1,
            quant::Format::E2M1 => 2,
        };
        let seed = |s: Option<u64>| (i32::from(s.is_some()), quant::seed32(s).unwrap_or(0));
        let scale = match *spec {
            QuantSpec::Float(f) => {
                let kind = match f {
                    quant::FloatFormat::Bf16 => 0,
                    quant::FloatFormat::F16 => 1,
                    quant::FloatFormat::F32 => 2,
                };
                self.ew("quant_float", x.len, &[self.p(x), Arg::P(cp), Arg::P(ap), Arg::I(n), Arg::I32(kind)])?;
                ScaleFrom::Given(1.0)
            }
            QuantSpec::Tensor { format, scale: given, margin, saturate, stochastic } => {
                if let Some(s) = given {
                    quant::check_scale(s).map_err(refused("quantize"))?;
                }
                if given.is_none() {
                    self.ew("amax_f32", x.len, &[Arg::P(curp), self.p(x), Arg::I(n)])?;
                }
                let (sr, sd) = seed(stochastic);
                let args = [
                    self.p(x),
                    Arg::P(curp),
                    Arg::P(cp),
                    Arg::P(ap),
                    Arg::I(n),
                    Arg::I32(fmt_of(format)),
                    Arg::F(given.unwrap_or(0.0)),
                    Arg::I32(margin),
                    Arg::I32(i32::from(saturate)),
                    Arg::I32(sr),
                    // The seed's 32 bits, as the kernel's int.
                    Arg::I32(sd as i32),
                ];
                self.ew("quant_tensor", x.len, &args)?;
                match given {
                    Some(s) => ScaleFrom::Given(s),
                    None => ScaleFrom::Current { format, margin },
                }
            }
            QuantSpec::Blocks(b) => {
                let (br, bc) = b.block;
                if br == 0 || bc == 0 {
                    return Err(ExecError::State(format!("quantize: block {br}x{bc}")));
                }
                // No more blocks than the tensor's rows · cols (its checked length).
                let nb = rows.div_ceil(br) * cols.div_ceil(bc);
                let bamax = self.f32_scratch(nb.max(1))?;
                let tamax = self.f32_scratch(1)?;
                // SAFETY: 4 bytes.
                unsafe { self.memset(self.ptr(&tamax), 4) }
                    .map_err(|e| self.derr("memset", e))?;
                if b.tensor_scale {
                    self.ew("amax_f32", x.len, &[self.p(&tamax), self.p(x), Arg::I(n)])?;
                }
                self.ew("quant_block_amax", nb, &[self.p(&bamax), self.p(x), Arg::I(r), Arg::I(c), Arg::I32(block.0), Arg::I32(block.1)])?;
                let (sr, sd) = seed(b.stochastic);
                let sf = match b.scale_format {
                    quant::ScaleFormat::Fp32 => 0,
                    quant::ScaleFormat::E8M0 => 1,
                    quant::ScaleFormat::E4M3 => 2,
                };
                let rnd = match b.scale_rounding {
                    quant::ScaleRounding::Exact => 0,
                    quant::ScaleRounding::Pow2Down => 1,
                    quant::ScaleRounding::Pow2Up => 2,
                };
                let args = [
                    self.p(x),
                    self.p(&bamax),
                    self.p(&tamax),
                    Arg::P(cp),
                    Arg::P(ap),
                    Arg::I(r),
                    Arg::I(c),
                    Arg::I32(block.0),
                    Arg::I32(block.1),
                    Arg::I32(fmt_of(b.format)),
                    Arg::I32(sf),
                    Arg::I32(rnd),
                    Arg::I32(i32::from(b.tensor_scale)),
                    Arg::I32(i32::from(b.saturate)),
                    Arg::I32(sr),
                    // The seed's 32 bits, as the kernel's int.
                    Arg::I32(sd as i32),
                ];
                self.ew("quant_blocks", x.len, &args)?;
                ScaleFrom::Blocks(b)
            }
        };
        Ok(CudaQuantStats { rec, scale, elements: x.len })
    }

    fn hadamard_rows(&self, x: &mut CudaBuffer, rows: usize, cols: usize, h: usize, seed: u64) -> Result<(), ExecError> {
        need("hadamard_rows", x, Elem::F32)?;
        lens("hadamard_rows", &[("x", x.len, rows.saturating_mul(cols))])?;
        if !h.is_power_of_two() || h > 256 {
            return Err(ExecError::State(format!("hadamard_rows: size {h} is not a power of two up to 256")));
        }
        if h == 1 {
            return Ok(());
        }
        let s = quant::seed32(Some(seed)).unwrap_or(0);
        let k = "hadamard_rows";
        // h is at most 256 (checked above); the seed's 32 bits pass as the kernel's int.
        self.ew(k, (rows / h) * cols, &[self.p(x), Arg::I(i64_arg(k, "the rows", rows)?), Arg::I(i64_arg(k, "the columns", cols)?), Arg::I32(h as i32), Arg::I32(s as i32)])
    }

    fn add_assign(&self, dst: &mut CudaBuffer, src: &CudaBuffer) -> Result<(), ExecError> {
        lens("add_assign", &[("src", src.len, dst.len)])?;
        need("add_assign", dst, Elem::F32)?;
        need("add_assign", src, Elem::F32)?;
        self.ew("add_assign_f32", dst.len, &[self.p(dst), self.p(src), Arg::I(dst.len as i64)])
    }

    fn scale(&self, buf: &mut CudaBuffer, s: f32) -> Result<(), ExecError> {
        need("scale", buf, Elem::F32)?;
        self.ew("scale_f32", buf.len, &[self.p(buf), Arg::F(s), Arg::I(buf.len as i64)])
    }

    fn add_forward(&self, out: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer) -> Result<(), ExecError> {
        lens("add_forward", &[("a", a.len, out.len), ("b", b.len, out.len)])?;
        self.ew("add_forward", out.len, &[self.p(out), self.p(a), self.p(b), Arg::I(out.len as i64)])
    }

    fn add_bias(&self, out: &mut CudaBuffer, bias: &CudaBuffer) -> Result<(), ExecError> {
        if bias.len == 0 || !out.len.is_multiple_of(bias.len) {
            return Err(kerr("add_bias", format!("{} elements are not rows of {}", out.len, bias.len)));
        }
        let rows = out.len / bias.len;
        self.ew("add_bias", out.len, &[self.p(out), self.p(bias), Arg::I(rows as i64), Arg::I32(i32_arg("add_bias", "the bias length", bias.len)?)])
    }

    fn bias_backward(&self, dbias: &mut CudaBuffer, dout: &CudaBuffer) -> Result<(), ExecError> {
        if dbias.len == 0 || !dout.len.is_multiple_of(dbias.len) {
            return Err(kerr("bias_backward", format!("{} elements are not rows of {}", dout.len, dbias.len)));
        }
        self.column_sums(dbias, dout, None, None, None, dout.len / dbias.len, dbias.len, 0)
    }

    fn swiglu_forward(&self, out: &mut CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer) -> Result<(), ExecError> {
        lens("swiglu_forward", &[("gate", gate.len, out.len), ("up", up.len, out.len)])?;
        self.ew("swiglu_forward", out.len, &[self.p(out), self.p(gate), self.p(up), Arg::I(out.len as i64)])
    }

    fn swiglu_backward(&self, dgate: &mut CudaBuffer, dup: &mut CudaBuffer, dout: &CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer) -> Result<(), ExecError> {
        let n = dout.len;
        lens("swiglu_backward", &[("dgate", dgate.len, n), ("dup", dup.len, n), ("gate", gate.len, n), ("up", up.len, n)])?;
        self.ew("swiglu_backward", n, &[self.p(dgate), self.p(dup), self.p(dout), self.p(gate), self.p(up), Arg::I(n as i64)])
    }

    fn geglu_forward(&self, out: &mut CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer) -> Result<(), ExecError> {
        lens("geglu_forward", &[("gate", gate.len, out.len), ("up", up.len, out.len)])?;
        self.ew("geglu_forward", out.len, &[self.p(out), self.p(gate), self.p(up), Arg::I(out.len as i64)])
    }

    fn geglu_backward(&self, dgate: &mut CudaBuffer, dup: &mut CudaBuffer, dout: &CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer) -> Result<(), ExecError> {
        let n = dout.len;
        lens("geglu_backward", &[("dgate", dgate.len, n), ("dup", dup.len, n), ("gate", gate.len, n), ("up", up.len, n)])?;
        self.ew("geglu_backward", n, &[self.p(dgate), self.p(dup), self.p(dout), self.p(gate), self.p(up), Arg::I(n as i64)])
    }

    fn gelu_forward(&self, out: &mut CudaBuffer, x: &CudaBuffer) -> Result<(), ExecError> {
        lens("gelu_forward", &[("x", x.len, out.len)])?;
        self.ew("gelu_forward", out.len, &[self.p(out), self.p(x), Arg::I(out.len as i64)])
    }

    fn gelu_backward(&self, dx: &mut CudaBuffer, dout: &CudaBuffer, x: &CudaBuffer) -> Result<(), ExecError> {
        lens("gelu_backward", &[("dout", dout.len, dx.len), ("x", x.len, dx.len)])?;
        self.ew("gelu_backward", dx.len, &[self.p(dx), self.p(dout), self.p(x), Arg::I(dx.len as i64)])
    }

    fn squared_relu_forward(&self, out: &mut CudaBuffer, x: &CudaBuffer) -> Result<(), ExecError> {
        lens("squared_relu_forward", &[("x", x.len, out.len)])?;
        self.ew("squared_relu_forward", out.len, &[self.p(out), self.p(x), Arg::I(out.len as i64)])
    }

    fn squared_relu_backward(&self, dx: &mut CudaBuffer, dout: &CudaBuffer, x: &CudaBuffer) -> Result<(), ExecError> {
        lens("squared_relu_backward", &[("dout", dout.len, dx.len), ("x", x.len, dx.len)])?;
        self.ew("squared_relu_backward", dx.len, &[self.p(dx), self.p(dout), self.p(x), Arg::I(dx.len as i64)])
    }

    fn concat_forward(&self, out: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, s: ConcatShapes<'_>) -> Result<(), ExecError> {
        let k = "concat_forward";
        let (la, lb, lo) = s.dims(k, out.len, Some(a.len), Some(b.len))?;
        let (la, lb) = (i32_arg(k, "a's last axis", la)?, i32_arg(k, "b's last axis", lb)?);
        let (shapes, rank) = self.concat_meta(k, s)?;
        let rows = out.len / lo.max(1);
        self.ew(k, out.len, &[self.p(out), self.p(a), self.p(b), Arg::P(shapes), Arg::I32(rank), Arg::I(rows as i64), Arg::I32(la), Arg::I32(lb)])
    }

    fn concat_backward(&self, da: Option<&mut CudaBuffer>, db: Option<&mut CudaBuffer>, dout: &CudaBuffer, s: ConcatShapes<'_>) -> Result<(), ExecError> {
        let k = "concat_backward";
        let (la, lb, lo) = s.dims(k, dout.len, da.as_ref().map(|t| t.len), db.as_ref().map(|t| t.len))?;
        // Each column count (la + lb = lo, so la, lb and b's first column are no more
        // than lo) fits the kernel's ints; concat_meta checks the rank.
        let lo_arg = i32_arg(k, "the last axis", lo)?;
        let (shapes, rank) = self.concat_meta(k, s)?;
        for (which, t, lx, col0) in [(1, da, la, 0), (2, db, lb, la)] {
            if let Some(t) = t {
                let rows_src = t.len / lx.max(1);
                self.ew(
                    "concat_backward",
                    t.len,
                    &[
                        self.p(t),
                        self.p(dout),
                        Arg::P(shapes),
                        Arg::I32(rank),
                        Arg::I32(which),
                        Arg::I(rows_src as i64),
                        Arg::I32(lx as i32),
                        Arg::I32(col0 as i32),
                        Arg::I32(lo_arg),
                    ],
                )?;
            }
        }
        Ok(())
    }

    fn matmul(&self, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, g: Gemm, accumulate: bool) -> Result<(), ExecError> {
        self.gemm(c, a, b, g, accumulate)
    }

    fn embedding_forward(&self, out: &mut CudaBuffer, tokens: &CudaBuffer, table: &CudaBuffer, c: usize, vocab_start: Option<usize>) -> Result<(), ExecError> {
        need("embedding_forward", tokens, Elem::I32)?;
        let k = "embedding_forward";
        lens(k, &[("out", out.len, numel(k, &[tokens.len, c])?)])?;
        let rows = table.len / c.max(1);
        self.ew(
            "embedding_forward",
            out.len,
            &[self.p(out), self.p(tokens), self.p(table), Arg::I(tokens.len as i64), Arg::I32(i32_arg(k, "the row width", c)?), Arg::I(rows as i64), Arg::I(i64_arg(k, "the vocabulary start", vocab_start.unwrap_or(0))?)],
        )
    }

    fn embedding_backward(&self, dtable: &mut CudaBuffer, dout: &CudaBuffer, tokens: &CudaBuffer, c: usize, vocab_start: Option<usize>) -> Result<(), ExecError> {
        need("embedding_backward", tokens, Elem::I32)?;
        let k = "embedding_backward";
        lens(k, &[("dout", dout.len, numel(k, &[tokens.len, c])?)])?;
        let rows = dtable.len / c.max(1);
        self.ew(
            "embedding_backward",
            dout.len,
            &[self.p(dtable), self.p(dout), self.p(tokens), Arg::I(tokens.len as i64), Arg::I32(i32_arg(k, "the row width", c)?), Arg::I(rows as i64), Arg::I(i64_arg(k, "the vocabulary start", vocab_start.unwrap_or(0))?)],
        )
    }

    fn rmsnorm_forward(&self, out: &mut CudaBuffer, rstd: &mut CudaBuffer, x: &CudaBuffer, w: &CudaBuffer, c: usize, eps: f32) -> Result<(), ExecError> {
        let rows = x.len / c.max(1);
        lens("rmsnorm_forward", &[("out", out.len, x.len), ("rstd", rstd.len, rows), ("w", w.len, c), ("x", rows * c, x.len)])?;
        self.run("rmsnorm_forward", rows_cfg("rmsnorm_forward", rows)?, &[self.p(out), self.p(rstd), self.p(x), self.p(w), Arg::I32(i32_arg("rmsnorm_forward", "the row width", c)?), Arg::F(eps)])
    }

    fn rmsnorm_backward(&self, dx: &mut CudaBuffer, dw: &mut CudaBuffer, dout: &CudaBuffer, x: &CudaBuffer, w: &CudaBuffer, rstd: &CudaBuffer, c: usize) -> Result<(), ExecError> {
        let rows = x.len / c.max(1);
        lens("rmsnorm_backward", &[("dx", dx.len, x.len), ("dout", dout.len, x.len), ("dw", dw.len, c), ("w", w.len, c), ("rstd", rstd.len, rows), ("x", rows * c, x.len)])?;
        self.run("rmsnorm_backward_dx", rows_cfg("rmsnorm_backward", rows)?, &[self.p(dx), self.p(dout), self.p(x), self.p(w), self.p(rstd), Arg::I32(i32_arg("rmsnorm_backward", "the row width", c)?)])?;
        self.column_sums(dw, dout, Some(x), None, Some(rstd), rows, c, 1)
    }

    fn layernorm_forward(&self, out: &mut CudaBuffer, mean: &mut CudaBuffer, rstd: &mut CudaBuffer, x: &CudaBuffer, w: &CudaBuffer, b: &CudaBuffer, c: usize, eps: f32) -> Result<(), ExecError> {
        let rows = x.len / c.max(1);
        lens("layernorm_forward", &[("out", out.len, x.len), ("mean", mean.len, rows), ("rstd", rstd.len, rows), ("w", w.len, c), ("b", b.len, c), ("x", rows * c, x.len)])?;
        self.run(
            "layernorm_forward",
            rows_cfg("layernorm_forward", rows)?,
            &[self.p(out), self.p(mean), self.p(rstd), self.p(x), self.p(w), self.p(b), Arg::I32(i32_arg("layernorm_forward", "the row width", c)?), Arg::F(eps)],
        )
    }

    fn layernorm_backward(&self, dx: &mut CudaBuffer, dw: &mut CudaBuffer, db: &mut CudaBuffer, dout: &CudaBuffer, x: &CudaBuffer, w: &CudaBuffer, mean: &CudaBuffer, rstd: &CudaBuffer, c: usize) -> Result<(), ExecError> {
        let rows = x.len / c.max(1);
        lens(
            "layernorm_backward",
            &[("dx", dx.len, x.len), ("dout", dout.len, x.len), ("dw", dw.len, c), ("db", db.len, c), ("w", w.len, c), ("mean", mean.len, rows), ("rstd", rstd.len, rows), ("x", rows * c, x.len)],
        )?;
        self.run(
            "layernorm_backward_dx",
            rows_cfg("layernorm_backward", rows)?,
            &[self.p(dx), self.p(dout), self.p(x), self.p(w), self.p(mean), self.p(rstd), Arg::I32(i32_arg("layernorm_backward", "the row width", c)?)],
        )?;
        self.column_sums(dw, dout, Some(x), Some(mean), Some(rstd), rows, c, 2)?;
        self.column_sums(db, dout, None, None, None, rows, c, 0)
    }

    fn rope_forward(&self, out: &mut CudaBuffer, x: &CudaBuffer, r: Rope) -> Result<(), ExecError> {
        self.rope(out, x, r, 1.0, "rope_forward")
    }

    fn rope_backward(&self, dx: &mut CudaBuffer, dout: &CudaBuffer, r: Rope) -> Result<(), ExecError> {
        self.rope(dx, dout, r, -1.0, "rope_backward")
    }

    fn attention_forward(&self, out: &mut CudaBuffer, lse: &mut CudaBuffer, q: &CudaBuffer, k: &CudaBuffer, v: &CudaBuffer, a: Attn) -> Result<(), ExecError> {
        let kn = "attention_forward";
        self.attn_check(kn, &a)?;
        let tk = a.kv_len();
        lens(
            kn,
            &[
                ("q", q.len, numel(kn, &[a.b, a.t, a.h, a.d])?),
                ("k", k.len, numel(kn, &[a.b, tk, a.hkv, a.d])?),
                ("v", v.len, numel(kn, &[a.b, tk, a.hkv, a.dv])?),
                ("out", out.len, numel(kn, &[a.b, a.t, a.h, a.dv])?),
                ("lse", lse.len, numel(kn, &[a.b, a.h, a.t])?),
            ],
        )?;
        let s = Self::attn_shape(kn, &a)?;
        let floats = ATT_QROWS * (a.d | 1) + ATT_TILE * (a.d | 1) + ATT_TILE * (a.dv | 1);
        let blocks = grid(kn, a.t.div_ceil(ATT_QROWS), a.h, a.b)?;
        self.run_attn(kn, blocks, floats, &[self.p(out), self.p(lse), self.p(q), self.p(k), self.p(v), Arg::Attn(s)])
    }

    fn attention_backward(&self, dq: &mut CudaBuffer, dk: &mut CudaBuffer, dv: &mut CudaBuffer, dout: &CudaBuffer, q: &CudaBuffer, k: &CudaBuffer, v: &CudaBuffer, out: &CudaBuffer, lse: &CudaBuffer, a: Attn) -> Result<(), ExecError> {
        let kn = "attention_backward";
        self.attn_check(kn, &a)?;
        let tk = a.kv_len();
        lens(
            kn,
            &[
                ("dq", dq.len, q.len),
                ("dk", dk.len, k.len),
                ("dv", dv.len, v.len),
                ("dout", dout.len, out.len),
                ("q", q.len, numel(kn, &[a.b, a.t, a.h, a.d])?),
                ("k", k.len, numel(kn, &[a.b, tk, a.hkv, a.d])?),
                ("v", v.len, numel(kn, &[a.b, tk, a.hkv, a.dv])?),
                ("out", out.len, numel(kn, &[a.b, a.t, a.h, a.dv])?),
                ("lse", lse.len, numel(kn, &[a.b, a.h, a.t])?),
            ],
        )?;
        let s = Self::attn_shape(kn, &a)?;
        // (b, t, h) rows: lse's length, checked above.
        let rows = lse.len;
        let (delta_grid, q_grid, kv_grid) = (grid(kn, rows.div_ceil(4).max(1), 1, 1)?, grid(kn, a.t.div_ceil(ATT_QROWS), a.h, a.b)?, grid(kn, tk.div_ceil(ATT_KROWS), a.hkv, a.b)?);
        let delta = self.f32_scratch(rows)?;
        self.run(
            "attention_backward_delta",
            LaunchConfig {
                grid_dim: delta_grid,
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            },
            &[self.p(&delta), self.p(dout), self.p(out), Arg::Attn(s)],
        )?;
        let fq = ATT_QROWS * (a.d | 1) + ATT_QROWS * (a.dv | 1) + ATT_TILE * (a.d | 1) + ATT_TILE * (a.dv | 1);
        self.run_attn(
            "attention_backward_dq",
            q_grid,
            fq,
            &[self.p(dq), self.p(dout), self.p(q), self.p(k), self.p(v), self.p(lse), self.p(&delta), Arg::Attn(s)],
        )?;
        let fk = ATT_TILE * (a.d | 1) + ATT_TILE * (a.dv | 1) + ATT_KROWS * (a.d | 1) + ATT_KROWS * (a.dv | 1);
        self.run_attn(
            "attention_backward_dkdv",
            kv_grid,
            fk,
            &[self.p(dk), self.p(dv), self.p(dout), self.p(q), self.p(k), self.p(v), self.p(lse), self.p(&delta), Arg::Attn(s)],
        )
    }

    fn causal_conv1d_forward(&self, out: &mut CudaBuffer, x: &CudaBuffer, w: &CudaBuffer, bias: &CudaBuffer, s: Conv1d) -> Result<(), ExecError> {
        let kn = "causal_conv1d_forward";
        s.check_lens(&[("out", out.len), ("x", x.len)], w.len, bias.len).map_err(refused(kn))?;
        let dims = Self::conv_dims(kn, &s)?;
        self.ew(kn, out.len, &[&[self.p(out), self.p(x), self.p(w), self.p(bias)][..], &dims].concat())
    }

    fn causal_conv1d_backward(&self, dx: &mut CudaBuffer, dw: &mut CudaBuffer, dbias: &mut CudaBuffer, dout: &CudaBuffer, x: &CudaBuffer, w: &CudaBuffer, bias: &CudaBuffer, s: Conv1d) -> Result<(), ExecError> {
        let kn = "causal_conv1d_backward";
        s.check_lens(&[("dx", dx.len), ("dout", dout.len), ("x", x.len)], w.len, bias.len).map_err(refused(kn))?;
        s.check_lens(&[], dw.len, dbias.len).map_err(refused(kn))?;
        let n = x.len;
        if n == 0 {
            return Ok(());
        }
        let dims = Self::conv_dims(kn, &s)?;
        // dw in two deterministic stages, as column_sums: per-chunk partials, then the
        // chunks in order. (B·T rows of C: x's checked length; C·K: w's.)
        let rows = s.b * s.t;
        let per = rows.div_ceil(rows.clamp(1, 128));
        // At most 128 chunks: exact as an int.
        let chunks = rows.div_ceil(per);
        let cols = s.c * s.k;
        let cols_arg = i32_arg(kn, "the weight's C·K", cols)?;
        let blocks = grid(kn, cols.div_ceil(BLOCK as usize), chunks, 1)?;
        let partial_len = numel(kn, &[chunks, cols])?;
        let du = self.f32_scratch(n)?;
        self.ew("causal_conv1d_backward_du", n, &[&[self.p(&du), self.p(dout), self.p(x), self.p(w), self.p(bias)][..], &dims].concat())?;
        self.ew("causal_conv1d_backward_dx", n, &[&[self.p(dx), self.p(&du), self.p(w)][..], &dims].concat())?;
        let partial = self.f32_scratch(partial_len)?;
        self.run(
            "causal_conv1d_dw_partials",
            LaunchConfig { grid_dim: blocks, block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 },
            &[&[self.p(&partial), self.p(&du), self.p(x), Arg::I(rows as i64)][..], &dims[1..], &[Arg::I(per as i64)]].concat(),
        )?;
        self.run(
            "column_finish",
            LaunchConfig { grid_dim: (blocks.0, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 },
            &[self.p(dw), self.p(&partial), Arg::I32(chunks as i32), Arg::I32(cols_arg)],
        )?;
        self.column_sums(dbias, &du, None, None, None, rows, s.c, 0)
    }

    fn ssm_scan_forward(&self, y: &mut CudaBuffer, states: &mut CudaBuffer, i: SsmInputs<&CudaBuffer>, s: Ssm) -> Result<(), ExecError> {
        let kn = "ssm_scan_forward";
        Self::ssm_lens(kn, &s, i.map(|b| b.len), &[("y", y.len, 0), ("states", states.len, 4)])?;
        if y.len == 0 {
            return Ok(());
        }
        let p = i.try_map(|b| Ok::<_, ExecError>(self.p(b)))?;
        // 1 to 8 warps: exact.
        let warps = s.p.clamp(1, 8) as u32;
        let args = [&[self.p(y), self.p(states), p.x, p.dt, p.bm, p.cm, p.a_log, p.d, p.dt_bias][..], &Self::ssm_dims(kn, &s)?, &[Arg::I32(Self::chunk_arg(kn, &s)?)]].concat();
        self.run_shared(kn, grid(kn, numel(kn, &[s.b, s.h])?, 1, 1)?, 32 * warps, numel(kn, &[s.p, s.n])?, &args)
    }

    fn ssm_scan_backward(&self, g: SsmGrads<&mut CudaBuffer>, dy: &CudaBuffer, i: SsmInputs<&CudaBuffer>, states: &CudaBuffer, s: Ssm) -> Result<(), ExecError> {
        let kn = "ssm_scan_backward";
        s.check_lens("gradient", g.by_input().map(|b| b.len)).map_err(refused(kn))?;
        Self::ssm_lens(kn, &s, i.map(|b| b.len), &[("dy", dy.len, 0), ("states", states.len, 4)])?;
        if i.x.len == 0 {
            // Nothing flows: every overwritten gradient is zero (dB, dC when P = 0).
            for buf in [g.dx, g.ddt, g.dbm, g.dcm] {
                self.zero(buf)?;
            }
            return Ok(());
        }
        let p = i.try_map(|b| Ok::<_, ExecError>(self.p(b)))?;
        let dims = Self::ssm_dims(kn, &s)?;
        let chunk = Arg::I32(Self::chunk_arg(kn, &s)?);
        // Everything sized and checked before the first allocation.
        let (bh, pn) = (numel(kn, &[s.b, s.h])?, numel(kn, &[s.p, s.n])?);
        let (fwd_grid, rev_grid) = (grid(kn, numel(kn, &[bh, s.chunks()])?, 1, 1)?, grid(kn, bh, 1, 1)?);
        let heads_n = numel(kn, &[s.b, s.t, s.h, s.n])?;
        // (B,T) rows of the (B,T,G,N) dB and dC: their lengths, checked.
        let (bt, gn) = (s.b * s.t, s.g * s.n);
        // H, G, N: checked as ints by ssm_dims.
        let group = [Arg::I(bt as i64), Arg::I32(s.h as i32), Arg::I32(s.g as i32), Arg::I32(s.n as i32)];
        let b = i64_arg(kn, "the batch", s.b)?;
        // This head's dC_t and dB_t, (B,T,H,N), before the groups sum them.
        let (dch, dbh) = (self.f32_scratch(heads_n)?, self.f32_scratch(heads_n)?);
        let wpart = self.f32_scratch(numel(kn, &[bh, 3])?)?;
        // 32 to 256 threads: exact.
        let threads = (s.n.div_ceil(32) * 32).clamp(32, 256) as u32;
        self.run_shared(
            "ssm_scan_backward_fwd",
            fwd_grid,
            threads,
            pn,
            &[&[self.p(&dch), self.p(dy), self.p(states), p.x, p.dt, p.bm, p.a_log, p.dt_bias][..], &dims, &[chunk]].concat(),
        )?;
        // 1 to 8 warps: exact.
        let warps = s.p.clamp(1, 8);
        self.run_shared(
            "ssm_scan_backward_rev",
            rev_grid,
            32 * warps as u32,
            // Saturating: a sum past usize is refused as shared memory.
            pn.saturating_add(warps.saturating_mul(s.n)).saturating_add(32),
            &[&[self.p(g.dx), self.p(g.ddt), self.p(&dbh), self.p(&wpart), self.p(dy), self.p(&dch), p.x, p.dt, p.bm, p.cm, p.a_log, p.d, p.dt_bias][..], &dims].concat(),
        )?;
        self.ew("ssm_scan_group_sum", bt * gn, &[&[self.p(g.dbm), self.p(&dbh)][..], &group].concat())?;
        self.ew("ssm_scan_group_sum", bt * gn, &[&[self.p(g.dcm), self.p(&dch)][..], &group].concat())?;
        self.ew("ssm_scan_weights", s.h, &[self.p(g.da_log), self.p(g.dd), self.p(g.ddt_bias), self.p(&wpart), Arg::I(b), Arg::I32(s.h as i32)])
    }

    fn cross_entropy_forward(&self, loss: &mut CudaBuffer, lse: &mut CudaBuffer, logits: &CudaBuffer, targets: &CudaBuffer, v: usize) -> Result<(), ExecError> {
        need("cross_entropy_forward", targets, Elem::I32)?;
        let rows = targets.len;
        if v == 0 && rows > 0 {
            return Err(kerr("cross_entropy_forward", "a vocabulary of 0 classes".into()));
        }
        let k = "cross_entropy_forward";
        lens(k, &[("logits", logits.len, numel(k, &[rows, v])?), ("lse", lse.len, rows), ("loss", loss.len, 1)])?;
        let (cfg, vi) = (rows_cfg(k, rows)?, i32_arg(k, "the vocabulary", v)?);
        let losses = self.f32_scratch(rows)?;
        self.run("cross_entropy_rows", cfg, &[self.p(&losses), self.p(lse), self.p(logits), self.p(targets), Arg::I32(vi)])?;
        self.run("cross_entropy_mean", rows_cfg(k, 1)?, &[self.p(loss), self.p(&losses), self.p(targets), Arg::I(rows as i64)])
    }

    fn cross_entropy_backward(&self, dlogits: &mut CudaBuffer, logits: &CudaBuffer, lse: &CudaBuffer, targets: &CudaBuffer, v: usize, dloss: Option<&CudaBuffer>) -> Result<(), ExecError> {
        self.cross_entropy_shard_backward(dlogits, logits, lse, targets, 0, v, dloss)
    }

    fn row_max_sumexp(&self, max: &mut CudaBuffer, sumexp: &mut CudaBuffer, x: &CudaBuffer, v: usize) -> Result<(), ExecError> {
        let k = "row_max_sumexp";
        lens(k, &[("x", x.len, numel(k, &[max.len, v])?), ("sumexp", sumexp.len, max.len)])?;
        self.run("row_max_sumexp", rows_cfg(k, max.len)?, &[self.p(max), self.p(sumexp), self.p(x), Arg::I32(i32_arg(k, "the vocabulary", v)?)])
    }

    fn sumexp_rescale(&self, sumexp: &mut CudaBuffer, local_max: &CudaBuffer, max: &CudaBuffer) -> Result<(), ExecError> {
        let rows = sumexp.len;
        lens("sumexp_rescale", &[("local max", local_max.len, rows), ("max", max.len, rows)])?;
        self.ew("sumexp_rescale", rows, &[self.p(sumexp), self.p(local_max), self.p(max), Arg::I(rows as i64)])
    }

    fn target_logit(&self, out: &mut CudaBuffer, x: &CudaBuffer, targets: &CudaBuffer, start: usize, v: usize) -> Result<(), ExecError> {
        need("target_logit", targets, Elem::I32)?;
        let k = "target_logit";
        lens(k, &[("x", x.len, numel(k, &[out.len, v])?), ("targets", targets.len, out.len)])?;
        self.ew("target_logit", out.len, &[self.p(out), self.p(x), self.p(targets), Arg::I(out.len as i64), Arg::I32(i32_arg(k, "the vocabulary", v)?), Arg::I(i64_arg(k, "the shard's first class", start)?)])
    }

    fn cross_entropy_from_stats(&self, loss: &mut CudaBuffer, lse: &mut CudaBuffer, max: &CudaBuffer, sumexp: &CudaBuffer, target_logit: &CudaBuffer, targets: &CudaBuffer) -> Result<(), ExecError> {
        let rows = targets.len;
        lens("cross_entropy_from_stats", &[("lse", lse.len, rows), ("max", max.len, rows), ("sumexp", sumexp.len, rows), ("target logit", target_logit.len, rows)])?;
        let losses = self.f32_scratch(rows)?;
        self.ew(
            "cross_entropy_stats_rows",
            rows,
            &[self.p(&losses), self.p(lse), self.p(max), self.p(sumexp), self.p(target_logit), self.p(targets), Arg::I(rows as i64)],
        )?;
        self.run("cross_entropy_mean", rows_cfg("cross_entropy_from_stats", 1)?, &[self.p(loss), self.p(&losses), self.p(targets), Arg::I(rows as i64)])
    }

    fn cross_entropy_shard_backward(&self, dlogits: &mut CudaBuffer, logits: &CudaBuffer, lse: &CudaBuffer, targets: &CudaBuffer, start: usize, v: usize, dloss: Option<&CudaBuffer>) -> Result<(), ExecError> {
        let k = "cross_entropy_backward";
        need(k, targets, Elem::I32)?;
        let rows = targets.len;
        let n = numel(k, &[rows, v])?;
        lens(k, &[("logits", logits.len, n), ("dlogits", dlogits.len, n), ("lse", lse.len, rows)])?;
        let (cfg, vi, first) = (rows_cfg(k, rows)?, i32_arg(k, "the vocabulary", v)?, i64_arg(k, "the shard's first class", start)?);
        let count = self.f32_scratch(1)?;
        self.run("count_valid", rows_cfg(k, 1)?, &[self.p(&count), self.p(targets), Arg::I(rows as i64)])?;
        let dl = dloss.map_or(Arg::P(0), |b| self.p(b));
        self.run(
            "cross_entropy_backward",
            cfg,
            &[self.p(dlogits), self.p(logits), self.p(lse), self.p(targets), dl, self.p(&count), Arg::I(rows as i64), Arg::I32(vi), Arg::I(first)],
        )
    }

    fn router_forward(&self, weights: &mut CudaBuffer, indices: &mut CudaBuffer, probs: &mut CudaBuffer, logits: &CudaBuffer, r: &Router) -> Result<(), ExecError> {
        need("router_forward", indices, Elem::I32)?;
        if r.e == 0 || r.k == 0 || r.k > r.e {
            return Err(kerr("router_forward", format!("need 1 <= k ({}) <= e ({})", r.k, r.e)));
        }
        let kn = "router_forward";
        let (ne, nk) = (numel(kn, &[r.n, r.e])?, numel(kn, &[r.n, r.k])?);
        lens(kn, &[("logits", logits.len, ne), ("probs", probs.len, ne), ("weights", weights.len, nk), ("indices", indices.len, nk)])?;
        self.ew(
            "router_forward",
            r.n,
            &[
                self.p(weights),
                self.p(indices),
                self.p(probs),
                self.p(logits),
                Arg::I(i64_arg(kn, "the tokens", r.n)?),
                Arg::I32(i32_arg(kn, "the experts", r.e)?),
                Arg::I32(i32_arg(kn, "the experts per token", r.k)?),
                Arg::I32(matches!(r.score, ScoreFn::Sigmoid) as i32),
                Arg::I32(r.normalize_topk as i32),
            ],
        )
    }

    fn router_backward(&self, dlogits: &mut CudaBuffer, dweights: &CudaBuffer, probs: &CudaBuffer, indices: &CudaBuffer, r: &Router) -> Result<(), ExecError> {
        need("router_backward", indices, Elem::I32)?;
        let kn = "router_backward";
        let (ne, nk) = (numel(kn, &[r.n, r.e])?, numel(kn, &[r.n, r.k])?);
        lens(kn, &[("dlogits", dlogits.len, ne), ("probs", probs.len, ne), ("dweights", dweights.len, nk), ("indices", indices.len, nk)])?;
        self.ew(
            "router_backward",
            r.n,
            &[
                self.p(dlogits),
                self.p(dweights),
                self.p(probs),
                self.p(indices),
                Arg::I(i64_arg(kn, "the tokens", r.n)?),
                Arg::I32(i32_arg(kn, "the experts", r.e)?),
                Arg::I32(i32_arg(kn, "the experts per token", r.k)?),
                Arg::I32(matches!(r.score, ScoreFn::Sigmoid) as i32),
                Arg::I32(r.normalize_topk as i32),
            ],
        )
    }

    fn dispatch_plan(&self, indices: &CudaBuffer, n: usize, k: usize, e: usize) -> Result<CudaPlan, ExecError> {
        let host = self.read_u32(indices)?;
        let plan = runner_kernels::cpu::moe::dispatch_plan(&host, n, k, e).map_err(refused("dispatch_plan"))?;
        self.upload_plan(plan)
    }

    fn presorted_plan(&self, counts: &[usize]) -> Result<CudaPlan, ExecError> {
        let plan = runner_kernels::cpu::moe::presorted_plan(counts).map_err(refused("presorted_plan"))?;
        self.upload_plan(plan)
    }

    fn plan_counts(&self, plan: &CudaPlan) -> Result<Vec<usize>, ExecError> {
        Ok(plan.offsets.windows(2).map(|w| w[1] - w[0]).collect())
    }

    fn dispatch_forward(&self, x_sorted: &mut CudaBuffer, x: &CudaBuffer, plan: &CudaPlan, c: usize) -> Result<(), ExecError> {
        let k = "dispatch_forward";
        let rows = plan.order.len;
        let n = numel(k, &[rows, c])?;
        lens(k, &[("x_sorted", x_sorted.len, n), ("x", x.len, rows / plan.k.max(1) * c)])?;
        self.ew(k, n, &[self.p(x_sorted), self.p(x), self.p(&plan.order), Arg::I(rows as i64), Arg::I32(i32_arg(k, "the row width", c)?), Arg::I32(i32_arg(k, "the plan's k", plan.k)?)])
    }

    fn dispatch_backward(&self, dx: &mut CudaBuffer, dx_sorted: &CudaBuffer, plan: &CudaPlan, c: usize) -> Result<(), ExecError> {
        let k = "dispatch_backward";
        let tokens = plan.order.len / plan.k.max(1);
        let n = numel(k, &[plan.order.len, c])?;
        lens(k, &[("dx", dx.len, tokens * c), ("dx_sorted", dx_sorted.len, n)])?;
        self.ew(k, tokens * c, &[self.p(dx), self.p(dx_sorted), self.p(&plan.inv), Arg::I(tokens as i64), Arg::I32(i32_arg(k, "the row width", c)?), Arg::I32(i32_arg(k, "the plan's k", plan.k)?)])
    }

    fn grouped_matmul_forward(&self, out: &mut CudaBuffer, x_sorted: &CudaBuffer, w: ExpertWeights<'_, CudaBuffer>, plan: &CudaPlan, k_in: usize, n_out: usize) -> Result<(), ExecError> {
        let rows = plan.order.len;
        let e = plan.offsets.len() - 1;
        let k = "grouped_matmul_forward";
        // Every expert's rows and weights lie inside these checked sizes.
        lens(k, &[("x_sorted", x_sorted.len, numel(k, &[rows, k_in])?), ("w", w.len(), numel(k, &[e, n_out, k_in])?), ("out", out.len, numel(k, &[rows, n_out])?)])?;
        for ex in 0..e {
            let (r0, r1) = (plan.offsets[ex], plan.offsets[ex + 1]);
            if r1 == r0 {
                continue;
            }
            let (we, w_at) = expert_weight("grouped_matmul_forward", &w, ex, n_out * k_in)?;
            let g = Gemm { m: r1 - r0, n: n_out, k: k_in, trans_a: false, trans_b: true };
            self.gemm_at(out, r0 * n_out, x_sorted, r0 * k_in, we, w_at, g, false)?;
        }
        Ok(())
    }

    fn grouped_matmul_backward(&self, dx_sorted: &mut CudaBuffer, dw: &mut CudaBuffer, dout: &CudaBuffer, dout_w: &CudaBuffer, x_sorted: &CudaBuffer, w: ExpertWeights<'_, CudaBuffer>, plan: &CudaPlan, k_in: usize, n_out: usize) -> Result<(), ExecError> {
        let rows = plan.order.len;
        let e = plan.offsets.len() - 1;
        let k = "grouped_matmul_backward";
        // Every expert's rows and weights lie inside these checked sizes.
        let (xs, ws, os) = (numel(k, &[rows, k_in])?, numel(k, &[e, n_out, k_in])?, numel(k, &[rows, n_out])?);
        lens(k, &[("x_sorted", x_sorted.len, xs), ("dx_sorted", dx_sorted.len, xs), ("w", w.len(), ws), ("dw", dw.len, w.len()), ("dout", dout.len, os), ("dout_w", dout_w.len, os)])?;
        for ex in 0..e {
            let (r0, r1) = (plan.offsets[ex], plan.offsets[ex + 1]);
            if r1 == r0 {
                continue;
            }
            let m = r1 - r0;
            let (we, w_at) = expert_weight("grouped_matmul_backward", &w, ex, n_out * k_in)?;
            let gx = Gemm { m, n: k_in, k: n_out, trans_a: false, trans_b: false };
            self.gemm_at(dx_sorted, r0 * k_in, dout, r0 * n_out, we, w_at, gx, false)?;
            // On FP8 codes the contraction over the expert's m rows is padded to 16.
            let gw = Gemm { m: n_out, n: k_in, k: m, trans_a: true, trans_b: false };
            self.gemm_at(dw, ex * n_out * k_in, dout_w, r0 * n_out, x_sorted, r0 * k_in, gw, true)?;
        }
        Ok(())
    }

    fn combine_forward(&self, out: &mut CudaBuffer, y_sorted: &CudaBuffer, weights: &CudaBuffer, plan: &CudaPlan, c: usize) -> Result<(), ExecError> {
        let k = "combine_forward";
        let tokens = plan.order.len / plan.k.max(1);
        let n = numel(k, &[plan.order.len, c])?;
        lens(k, &[("out", out.len, tokens * c), ("y_sorted", y_sorted.len, n), ("weights", weights.len, plan.order.len)])?;
        self.ew(k, tokens * c, &[self.p(out), self.p(y_sorted), self.p(weights), self.p(&plan.inv), Arg::I(tokens as i64), Arg::I32(i32_arg(k, "the row width", c)?), Arg::I32(i32_arg(k, "the plan's k", plan.k)?)])
    }

    fn combine_backward(&self, dy_sorted: &mut CudaBuffer, dweights: &mut CudaBuffer, dout: &CudaBuffer, y_sorted: &CudaBuffer, weights: &CudaBuffer, plan: &CudaPlan, c: usize) -> Result<(), ExecError> {
        let k = "combine_backward";
        let rows = plan.order.len;
        let tokens = rows / plan.k.max(1);
        let n = numel(k, &[rows, c])?;
        lens(k, &[("dy_sorted", dy_sorted.len, n), ("y_sorted", y_sorted.len, n), ("dweights", dweights.len, rows), ("weights", weights.len, rows), ("dout", dout.len, tokens * c)])?;
        let (ci, ki) = (i32_arg(k, "the row width", c)?, i32_arg(k, "the plan's k", plan.k)?);
        // One warp per row: 8 rows per block of 256 threads.
        let dw_grid = grid(k, rows.div_ceil(BLOCK as usize / 32), 1, 1)?;
        self.ew("combine_backward_dy", n, &[self.p(dy_sorted), self.p(dout), self.p(weights), self.p(&plan.order), Arg::I(rows as i64), Arg::I32(ci), Arg::I32(ki)])?;
        if rows == 0 {
            return Ok(());
        }
        self.run(
            "combine_backward_dw",
            LaunchConfig {
                grid_dim: dw_grid,
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            &[self.p(dweights), self.p(dout), self.p(y_sorted), self.p(&plan.inv), Arg::I(rows as i64), Arg::I32(ci), Arg::I32(ki)],
        )
    }

    fn scale_by_inverse_norm(&self, x: &mut CudaBuffer, sumsq: &CudaBuffer, eps: f32) -> Result<(), ExecError> {
        let k = "scale_by_inverse_norm";
        need(k, x, Elem::F32)?;
        need(k, sumsq, Elem::F32)?;
        if sumsq.len == 0 {
            return Err(kerr(k, "an empty sum-of-squares buffer".into()));
        }
        self.ew(k, x.len, &[self.p(x), self.p(sumsq), Arg::F(eps), Arg::I(x.len as i64)])
    }

    fn muon_apply(&self, w: &mut CudaBuffer, o: &CudaBuffer, scalars: &CudaBuffer, k: f32) -> Result<(), ExecError> {
        let n = w.len;
        lens("muon_apply", &[("o", o.len, n), ("scalars", scalars.len, runner_kernels::cpu::adamw::Scalars::WORDS)])?;
        for b in [&*w, o, scalars] {
            need("muon_apply", b, Elem::F32)?;
        }
        self.ew("muon_apply", n, &[self.p(w), self.p(o), self.p(scalars), Arg::F(k), Arg::I(n as i64)])
    }

    fn adamw(&self, param: &mut CudaBuffer, grad: &CudaBuffer, m: &mut CudaBuffer, v: &mut CudaBuffer, scalars: &CudaBuffer) -> Result<(), ExecError> {
        let n = param.len;
        lens("adamw", &[("grad", grad.len, n), ("m", m.len, n), ("v", v.len, n), ("scalars", scalars.len, runner_kernels::cpu::adamw::Scalars::WORDS)])?;
        need("adamw", scalars, Elem::F32)?;
        self.ew("adamw", n, &[self.p(param), self.p(grad), self.p(m), self.p(v), Arg::I(n as i64), self.p(scalars)])
    }

    fn begin_capture(&self) -> Result<(), ExecError> {
        let g = self.gpu("a recorded step (CUDA graph)")?;
        let t = &self.inner.tracker;
        let id = t.recordings.fetch_add(1, Ordering::Relaxed) + 1;
        // Reset under the lock an allocation takes to count itself, so none is lost.
        let mut c = t.capture();
        if t.recording.compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(ExecError::State(format!("{}: a recording is already open", self.name())));
        }
        *c = Capture::default();
        drop(c);
        // Thread-local mode: this thread may not call what a recording cannot hold
        // (synchronous copies, waits); other threads are not affected.
        if let Err(e) = g.stream.begin_capture(cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
            t.recording.store(0, Ordering::Release);
            return Err(self.derr("starting a recording (stream capture)", e));
        }
        Ok(())
    }

    fn end_capture(&self) -> Result<CudaRecording, ExecError> {
        let g = self.gpu("a recorded step (CUDA graph)")?;
        let t = &self.inner.tracker;
        if t.recording.load(Ordering::Acquire) == 0 {
            return Err(ExecError::State(format!("{}: no recording is open", self.name())));
        }
        // cudarc checks (and returns) an error stored by an earlier failed call before it
        // ends the capture: a free that failed inside an invalidated recording would leave
        // the stream capturing. Take that error first, then end the capture.
        let stale = g.ctx.check_err();
        let ended = g.stream.end_capture(cu::CUgraphInstantiate_flags(0));
        let cap = std::mem::take(&mut *t.capture());
        t.recording.store(0, Ordering::Release);
        let graph = ended
            .and_then(|g| stale.map(|()| g))
            .map_err(|e| self.derr("recording the step (something in it was not device work)", e))?
            .ok_or_else(|| ExecError::State("the recording is empty".into()))?;
        if cap.born_alive > 0 {
            return Err(ExecError::State(format!(
                "{} buffer(s) allocated while recording outlive the recording; the graph would free them at its next launch",
                cap.born_alive
            )));
        }
        // The eager steps' memory went back to the default pool, which keeps it; the graph
        // has a pool of its own. Hand the default pool's idle memory back so the step's
        // memory is not held twice.
        if let Some(pool) = default_pool(&g.ctx) {
            // SAFETY: a live pool; trimming only releases memory no allocation holds.
            let _ = unsafe { cu::cuMemPoolTrimTo(pool, 0) };
        }
        Ok(CudaRecording { graph, _kept: cap.kept })
    }

    fn records(&self) -> bool {
        matches!(self.inner.engine, Engine::Gpu(_))
    }

    fn launch(&self, rec: &CudaRecording) -> Result<(), ExecError> {
        rec.graph.launch().map_err(|e| self.derr("launching the recorded step", e))
    }

    fn record(&self) -> Result<CudaStamp, ExecError> {
        match &self.inner.engine {
            Engine::Gpu(g) => g
                .stream
                .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map(CudaStamp::Event)
                .map_err(|e| self.derr("event", e)),
            Engine::Emulated(_) => Ok(CudaStamp::Host(std::time::Instant::now())),
        }
    }

    fn elapsed_s(&self, start: &CudaStamp, end: &CudaStamp) -> Result<f64, ExecError> {
        match (start, end) {
            (CudaStamp::Event(start), CudaStamp::Event(end)) => {
                end.synchronize().map_err(|e| self.derr("event", e))?;
                start.elapsed_ms(end).map(|ms| ms as f64 / 1e3).map_err(|e| self.derr("event", e))
            }
            (CudaStamp::Host(start), CudaStamp::Host(end)) => Ok(end.duration_since(*start).as_secs_f64()),
            _ => Err(ExecError::State("elapsed time between a CUDA event and a host clock reading".into())),
        }
    }

    fn synchronize(&self) -> Result<(), ExecError> {
        let Engine::Gpu(g) = &self.inner.engine else { return Ok(()) };
        g.stream.synchronize().map_err(|e| self.derr("synchronize", e))?;
        g.ctx.check_err().map_err(|e| self.derr("asynchronous error", e))
    }

    fn memory(&self) -> MemStats {
        let t = &self.inner.tracker;
        MemStats {
            current_bytes: t.current.load(Ordering::Relaxed),
            peak_bytes: t.peak.load(Ordering::Relaxed),
            allocations: t.allocations.load(Ordering::Relaxed),
        }
    }

    fn reset_peak(&self) {
        let t = &self.inner.tracker;
        t.peak.store(t.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Cuda {
    fn rope(&self, out: &mut CudaBuffer, x: &CudaBuffer, r: Rope, sign: f32, kernel: &str) -> Result<(), ExecError> {
        // The CPU's rules (rot_dim, theta, the cp shard's rank and even T, lengths).
        runner_kernels::cpu::rope::check(&r, x.len, out.len).map_err(refused(kernel))?;
        // check: b·t·h·d is x's length, pos_offset + t fits an i64, rot_dim <= d and the
        // cp rank is below the cp size (so those casts are exact once d and the size are).
        let n = x.len;
        self.ew(
            "rope",
            n,
            &[
                self.p(out),
                self.p(x),
                Arg::I(i64_arg(kernel, "the batch", r.b)?),
                Arg::I(i64_arg(kernel, "the sequence length", r.t)?),
                Arg::I32(i32_arg(kernel, "the heads", r.h)?),
                Arg::I32(i32_arg(kernel, "the head dim", r.d)?),
                Arg::I32(r.rot_dim as i32),
                Arg::F(r.theta),
                Arg::I(r.pos_offset as i64),
                Arg::I32(r.cp.map_or(Ok(1), |c| i32_arg(kernel, "the cp group size", c.size))?),
                Arg::I32(r.cp.map_or(0, |c| c.rank as i32)),
                Arg::F(sign),
            ],
        )
    }

    /// The concat's leading-axis shapes (out, a, b) on the device (uploaded the first
    /// time this shape is seen): its address and the rank, an int as the kernels take
    /// it. The shapes were checked against the buffers by [`ConcatShapes::dims`], which
    /// gives the last axes.
    fn concat_meta(&self, kernel: &str, s: ConcatShapes<'_>) -> Result<(u64, i32), ExecError> {
        let rank = s.out.len().saturating_sub(1);
        let rank_arg = i32_arg(kernel, "the rank", rank)?;
        let mut host: Vec<u32> = Vec::with_capacity(6 * rank);
        for sh in [s.out, s.a, s.b] {
            for &d in &sh[..rank] {
                // i64 little-endian as two u32 words
                host.push(d as u32);
                host.push((d >> 32) as u32);
            }
        }
        host.resize(host.len().max(2), 0);
        let mut tables = self.inner.concat_shapes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let t = match tables.entry(host) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.not_recording("a concat shape first seen in the recorded step")?;
                let t = self.mem(4 * e.key().len())?;
                // SAFETY: the table holds the key's words.
                unsafe { self.htod(t.ptr, e.key()) }.map_err(|e| self.derr("concat shapes", e))?;
                e.insert(t)
            }
        };
        Ok((t.ptr, rank_arg))
    }

    fn upload_plan(&self, plan: runner_kernels::cpu::moe::DispatchPlan) -> Result<CudaPlan, ExecError> {
        let rows = plan.order.len();
        // The plan's slots are u32 (so are the kernels' row indices): so must its rows be.
        if u32::try_from(rows).is_err() {
            return Err(kerr("dispatch_plan", format!("{rows} routed rows are past the limit of {}", u32::MAX)));
        }
        let mut inv = vec![0u32; rows];
        for (row, &slot) in plan.order.iter().enumerate() {
            if let Some(x) = inv.get_mut(slot as usize) {
                *x = row as u32;
            }
        }
        let mut order = self.alloc(Elem::I32, rows)?;
        self.write_u32(&mut order, &plan.order)?;
        let mut invb = self.alloc(Elem::I32, rows)?;
        self.write_u32(&mut invb, &inv)?;
        Ok(CudaPlan {
            offsets: plan.offsets,
            k: plan.k,
            order,
            inv: invb,
        })
    }

    /// The GEMM of [`Device::matmul`].
    fn gemm(&self, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, g: Gemm, accumulate: bool) -> Result<(), ExecError> {
        let k = "matmul";
        lens(k, &[("a", a.len, numel(k, &[g.m, g.k])?), ("b", b.len, numel(k, &[g.k, g.n])?), ("c", c.len, numel(k, &[g.m, g.n])?)])?;
        self.gemm_at(c, 0, a, 0, b, 0, g, accumulate)
    }

    /// FP8 codes at `src` into `dst` as (rows, k_pad): from (rows, k), or from (k, rows)
    /// when `transposed`, the columns past k zero (`pack_u8`: one block per 32 x 32 tile).
    fn pack_u8(&self, dst: &CudaBuffer, src: u64, rows: usize, k: usize, k_pad: usize, transposed: bool) -> Result<(), ExecError> {
        lens("pack_u8", &[("dst", dst.len, numel("pack_u8", &[rows, k_pad])?)])?;
        // No more 32 x 32 tiles than dst's checked rows · k_pad.
        let tiles = rows.div_ceil(32) * k_pad.div_ceil(32);
        if tiles == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig { grid_dim: grid("pack_u8", tiles, 1, 1)?, block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // rows and k_pad (k is no more) multiply to dst's length: exact as i64.
        self.run("pack_u8", cfg, &[self.p(dst), Arg::P(src), Arg::I(rows as i64), Arg::I(k as i64), Arg::I(k_pad as i64), Arg::I32(i32::from(transposed))])
    }

    /// A GEMM on element offsets of its buffers (the grouped GEMMs' expert slices).
    #[allow(clippy::too_many_arguments)]
    fn gemm_at(&self, c: &CudaBuffer, c_at: usize, a: &CudaBuffer, a_at: usize, b: &CudaBuffer, b_at: usize, g: Gemm, accumulate: bool) -> Result<(), ExecError> {
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        let fp8 = a.elem.fp8().is_some() || b.elem.fp8().is_some();
        let fine = match (a.elem, b.elem) {
            (Elem::F32, Elem::F32) | (Elem::BF16, Elem::BF16) | (Elem::F16, Elem::F16) => true,
            (x, y) => x.fp8().is_some() && y.fp8().is_some() && !(x == Elem::F8E5M2 && y == Elem::F8E5M2),
        };
        if !fine {
            return Err(kerr("matmul", format!("operands {} x {} (f32, bf16, f16 pairs, or FP8 other than e5m2 x e5m2)", a.elem.name(), b.elem.name())));
        }
        if c.elem.fp8().is_some() && (accumulate || !fp8) {
            return Err(kerr("matmul", "an FP8 output needs FP8 operands and no accumulation".into()));
        }
        // FP8 wants cuBLASLt's TN (our b used transposed, a not) and a contraction that
        // is a multiple of 16. An FP8 operand in another layout is packed into scratch
        // first, transposed, and an odd contraction (an expert's rows, in its weight
        // gradient) padded with zeros, which add nothing (Transformer Engine and
        // Megatron pad each expert's tokens to 16 for the same reason).
        let mut keep = Vec::new();
        let (mut a_ptr, mut b_ptr) = (self.ptr(a) + (a_at * a.elem.bytes()) as u64, self.ptr(b) + (b_at * b.elem.bytes()) as u64);
        let (mut ta, mut tb) = (g.trans_a, g.trans_b);
        let k = if fp8 { g.k.next_multiple_of(16) } else { g.k };
        if fp8 && (g.trans_a || k != g.k) {
            // a stored (k, m) (or (m, k) with an odd k): make it (m, k padded).
            let t = self.alloc(a.elem, numel("matmul", &[g.m, k])?)?;
            self.pack_u8(&t, a_ptr, g.m, g.k, k, g.trans_a)?;
            a_ptr = self.ptr(&t);
            ta = false;
            keep.push(t);
        }
        if fp8 && (!g.trans_b || k != g.k) {
            // b stored (k, n) (or (n, k) with an odd k): make it (n, k padded).
            let t = self.alloc(b.elem, numel("matmul", &[g.n, k])?)?;
            self.pack_u8(&t, b_ptr, g.n, g.k, k, !g.trans_b)?;
            b_ptr = self.ptr(&t);
            tb = true;
            keep.push(t);
        }
        let key = gemm::Key {
            m: g.n as u64,
            n: g.m as u64,
            k: k as u64,
            ta: tb,
            tb: ta,
            a: b.elem,
            b: a.elem,
            c: c.elem,
            accumulate,
        };
        // c holds g.m · g.n (checked by the callers).
        let c_scratch = if c.elem.fp8().is_some() { Some(self.alloc(Elem::BF16, g.m * g.n)?) } else { None };
        let scale_inv = |x: &CudaBuffer| -> Result<u64, ExecError> { if x.elem.fp8().is_some() { Ok(self.meta_ptr(x)? + 4) } else { Ok(0) } };
        let (d_scale, d_amax) = if c.elem.fp8().is_some() {
            let m = self.meta_ptr(c)?;
            // The output's amax slot starts at 0: it holds the result's amax after, not
            // the largest of it and what the buffer held before.
            // SAFETY: the meta holds 4 floats; word 2 is the amax.
            unsafe { self.memset(m + 8, 4) }.map_err(|e| self.derr("matmul amax", e))?;
            (m, m + 8)
        } else {
            (0, 0)
        };
        let ops = gemm::Operands {
            a: b_ptr,
            b: a_ptr,
            c: self.ptr(c) + (c_at * c.elem.bytes()) as u64,
            a_scale_inv: scale_inv(b)?,
            b_scale_inv: scale_inv(a)?,
            d_scale,
            d_amax,
            c_scratch: c_scratch.as_ref().map_or(0, |s| self.ptr(s)),
            workspace: 0,
            stream: std::ptr::null_mut(),
        };
        match &self.inner.engine {
            Engine::Gpu(g) => {
                let (workspace, _sync) = g.workspace.device_ptr(&g.stream);
                let stream = g.raw_stream().map_err(|e| self.derr("matmul", e))?;
                g.lt.matmul(key, &gemm::Operands { workspace, stream, ..ops }).map_err(|e| self.derr("matmul", e))?;
            }
            // SAFETY: the operands are this device's buffers, checked against the shape
            // by the callers; the scale and amax pointers address FP8 metas.
            Engine::Emulated(_) => unsafe { emulated::matmul(key, &ops) }.map_err(|e| kerr("matmul", e))?,
        }
        drop(keep);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The helper every narrowing of a size to a kernel's int goes through: i32::MAX
    /// passes, one more is the operation's error naming the size and the limit (an
    /// `as i32` passed it on as i32::MIN). Likewise for i64.
    #[test]
    fn a_kernel_int_argument_takes_up_to_i32_max_and_refuses_one_more() {
        assert_eq!(i32_arg("add_bias", "the bias length", i32::MAX as usize).unwrap(), i32::MAX);
        assert_eq!(i32_arg("add_bias", "the bias length", 0).unwrap(), 0);
        let e = i32_arg("add_bias", "the bias length", i32::MAX as usize + 1).unwrap_err().to_string();
        assert_eq!(e, "operation 'add_bias': shape mismatch: the bias length 2147483648 is past the CUDA kernels' limit of 2147483647 (an int)");
        assert_eq!(i64_arg("target_logit", "the shard's first class", i64::MAX as usize).unwrap(), i64::MAX);
        let e = i64_arg("target_logit", "the shard's first class", i64::MAX as usize + 1).unwrap_err().to_string();
        assert_eq!(e, "operation 'target_logit': shape mismatch: the shard's first class 9223372036854775808 is past the CUDA kernels' limit of 9223372036854775807 (an i64)");
    }

    /// Size products are checked: one that overflows is the operation's error, where an
    /// unchecked product wrapped to a count a small buffer could match.
    #[test]
    fn a_size_product_that_overflows_is_refused() {
        assert_eq!(numel("matmul", &[]).unwrap(), 1);
        assert_eq!(numel("matmul", &[3, 5, 7]).unwrap(), 105);
        assert_eq!(numel("matmul", &[usize::MAX, 1]).unwrap(), usize::MAX);
        assert_eq!(numel("matmul", &[1 << 62, 4, 0]).unwrap_err().to_string(), "operation 'matmul': shape mismatch: the shape [4611686018427387904, 4, 0] holds more elements than a usize counts");
        assert_eq!(numel("matmul", &[0, 1 << 62, 4]).unwrap(), 0, "a zero before the overflow");
        assert!(numel("matmul", &[(1 << 62) + 1, 4]).is_err(), "wraps to 4 unchecked");
    }

    /// Grids: x up to 2^31 - 1 blocks, y and z up to 65535; one more on any axis is the
    /// operation's error (a `div_ceil(..) as u32` wrapped past u32, and the driver's
    /// refusal of the rest named no operation).
    #[test]
    fn grid_dimensions_take_up_to_their_limits_and_refuse_one_more() {
        let x = i32::MAX as usize;
        assert_eq!(grid("k", x, 65_535, 65_535).unwrap(), (i32::MAX as u32, 65_535, 65_535));
        assert_eq!(grid("k", 0, 1, 1).unwrap(), (0, 1, 1));
        let e = grid("attention_forward", x + 1, 1, 1).unwrap_err().to_string();
        assert_eq!(e, "operation 'attention_forward': shape mismatch: 2147483648 thread blocks along grid x are past the limit of 2147483647");
        assert!(grid("k", (1 << 32) + 1, 1, 1).is_err(), "wraps to 1 as u32");
        assert!(grid("k", 1, 65_536, 1).unwrap_err().to_string().contains("65536 thread blocks along grid y are past the limit of 65535"));
        assert!(grid("k", 1, 1, 65_536).unwrap_err().to_string().contains("grid z"));
        assert_eq!(rows_cfg("rmsnorm_forward", x).unwrap().grid_dim, (i32::MAX as u32, 1, 1));
        assert!(rows_cfg("rmsnorm_forward", x + 1).is_err(), "a row per block: more rows than a grid holds");
    }

    /// An attention window past an int: none when it covers every key (as before), the
    /// operation's error when it does not (it used to become "no window" too).
    #[test]
    fn an_attention_window_past_an_int_is_none_only_when_it_covers_every_key() {
        let big = i32::MAX as usize + 1;
        let a = |window: Option<usize>, t: usize| Attn { b: 1, t, h: 2, hkv: 1, d: 8, dv: 8, causal: true, window, scale: 1.0, cp: None };
        assert_eq!(Cuda::attn_shape("attention_forward", &a(Some(big), 64)).unwrap().window, 0);
        assert_eq!(Cuda::attn_shape("attention_forward", &a(Some(i32::MAX as usize), 64)).unwrap().window, i32::MAX);
        assert_eq!(Cuda::attn_shape("attention_forward", &a(Some(5), 64)).unwrap().window, 5);
        assert_eq!(Cuda::attn_shape("attention_forward", &a(None, 64)).unwrap().window, 0);
        let e = Cuda::attn_shape("attention_forward", &a(Some(big), big + 2)).unwrap_err().to_string();
        assert!(e.contains("the attention window 2147483648 is past the CUDA kernels' limit of 2147483647"), "{e}");
        let cp = Attn { cp: Some(runner_kernels::cpu::cp::CpShard { size: big, rank: 0 }), ..a(None, 64) };
        assert!(Cuda::attn_shape("attention_forward", &cp).unwrap_err().to_string().contains("the cp group size 2147483648"));
    }
}
