//! The CUDA backend on the CPU ([`super::Cuda::emulated`]): the kernels of
//! `kernels/cuda` built as C++ under the thread-block emulation of
//! `runner_kernels::cuda::emulation` and loaded as a shared library, host memory standing
//! in for device memory, and cuBLASLt's GEMM contract computed here. Everything of the
//! backend above the driver runs as on a GPU: its launch sequences (grids, argument
//! lists, scratch), buffer and FP8 scale handling, statistics records and checks. So
//! `devcheck` compares the backend itself with the CPU backend on a machine without a
//! GPU (`host/exec/tests/emulated_cuda.rs`, in CI).
//!
//! What it cannot show: timing, the real compiler and GPU arithmetic (see emu.h),
//! cuBLASLt itself (the GEMM here is this file's reading of its contract: column-major
//! operands, the FP8 scale pointers, an FP8 output's scale and amax), CUDA graphs and NCCL
//! (refused: [`super::Cuda::records`] is false).

use std::collections::HashMap;
use std::ffi::{CString, c_char};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::LaunchConfig;
use runner_kernels::cpu::precision::{self, Fp8Format};

use super::gemm;
use super::kernels::{self, Arg, Kind};
use crate::device::Elem;

/// One launch argument as the library's C `Arg` (launcher.cpp asserts the layout).
#[repr(C)]
struct EmuArg {
    p: u64,
    i: i64,
    f: f32,
    /// Aligns `raw` to 8 bytes, as the attention shape it carries needs.
    _pad: u32,
    raw: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<EmuArg>() == 152 && std::mem::offset_of!(EmuArg, raw) == 24);

type LaunchFn = unsafe extern "C" fn(*const c_char, u32, u32, u32, u32, u64, *mut EmuArg) -> i32;

/// The loaded library and the kernels' parameter kinds.
pub(super) struct Emulator {
    launch: LaunchFn,
    params: HashMap<String, Vec<Kind>>,
    /// Keeps `launch` valid.
    _lib: libloading::Library,
}

/// The emulation's block barriers are globals of the library: one launch at a time.
static ONE_LAUNCH: Mutex<()> = Mutex::new(());

impl Emulator {
    /// The library, built once per process into a directory of its own (removed once
    /// loaded: nothing is reused from an earlier process or another user).
    pub(super) fn get() -> Result<Arc<Emulator>, String> {
        static ONE: OnceLock<Result<Arc<Emulator>, String>> = OnceLock::new();
        ONE.get_or_init(|| Emulator::build().map(Arc::new)).clone()
    }

    fn build() -> Result<Emulator, String> {
        let params = kernels::all_signatures()?;
        let dir = private_dir()?;
        let sanitize = under_address_sanitizer();
        let loaded = runner_kernels::cuda::emulation::build_library(&dir, sanitize).and_then(|lib| {
            // SAFETY: the library was built just now from the kernel sources in a
            // directory only this process writes; loading runs no initialiser of ours
            // beyond the C++ runtime's.
            let lib = unsafe { libloading::Library::new(&lib) }.map_err(|e| format!("loading the emulated kernels: {e}"))?;
            // SAFETY: launcher.cpp defines emu_launch with this signature.
            let launch = unsafe { lib.get::<LaunchFn>(b"emu_launch\0") }.map(|f| *f).map_err(|e| format!("emu_launch: {e}"))?;
            Ok(Emulator { launch, params, _lib: lib })
        });
        if sanitize && loaded.is_ok() {
            // The sanitizer's reports name a kernel only while its library can be read.
            eprintln!("emulated CUDA kernels under the address sanitizer: {} (kept for its reports; remove it afterwards)", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        loaded
    }

    /// Launch kernel `name` (its arguments checked against its C signature first).
    pub(super) fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<(), String> {
        let params = self.params.get(name).ok_or_else(|| format!("no CUDA kernel named {name}"))?;
        kernels::check_args(name, params, args)?;
        let (gx, gy, gz) = cfg.grid_dim;
        if gx == 0 || gy == 0 || gz == 0 {
            return Ok(());
        }
        let threads = cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2;
        if cfg.block_dim.1 != 1 || cfg.block_dim.2 != 1 || threads == 0 || threads > 1024 || !threads.is_multiple_of(32) {
            return Err(format!("{name}: blocks of {:?} threads (the emulation runs 1-D blocks of whole warps)", cfg.block_dim));
        }
        let mut packed: Vec<EmuArg> = args
            .iter()
            .map(|a| {
                let mut e = EmuArg { p: 0, i: 0, f: 0.0, _pad: 0, raw: [0; 128] };
                match *a {
                    Arg::P(p) => e.p = p,
                    Arg::I(v) => e.i = v,
                    Arg::I32(v) => e.i = i64::from(v),
                    Arg::F(v) => e.f = v,
                    Arg::Attn(s) => {
                        // SAFETY: a #[repr(C)] struct of plain integers and floats, read as
                        // its bytes (smaller than `raw`: checked below).
                        let bytes = unsafe { std::slice::from_raw_parts((&s as *const super::AttnShape).cast::<u8>(), std::mem::size_of_val(&s)) };
                        e.raw[..bytes.len()].copy_from_slice(bytes);
                    }
                }
                e
            })
            .collect();
        let cname = CString::new(name).map_err(|_| format!("kernel name {name:?}"))?;
        let smem_floats = u64::from(cfg.shared_mem_bytes).div_ceil(4);
        let _one = ONE_LAUNCH.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: the arguments match the kernel's C signature (checked above) and every
        // pointer among them is host memory of this process that the backend sized for
        // the launch, as it would device memory.
        let r = unsafe { (self.launch)(cname.as_ptr(), gx, gy, gz, threads, smem_floats, packed.as_mut_ptr()) };
        if r != 0 {
            return Err(format!("the emulated kernels have no kernel named {name}"));
        }
        Ok(())
    }
}

const _: () = assert!(std::mem::size_of::<super::AttnShape>() <= 128);

/// Whether this process runs with the address sanitizer's run time (started with
/// `LD_PRELOAD` naming libasan): then the library is built under the sanitizers, and a
/// kernel reading or writing past a buffer the backend allocated stops the process with
/// the sanitizer's report (`scripts/emulated-asan.sh`; the emulated-backend tests run so).
pub fn under_address_sanitizer() -> bool {
    #[cfg(unix)]
    {
        // SAFETY: looking a symbol up in the running program runs no code.
        let this = libloading::os::unix::Library::this();
        unsafe { this.get::<unsafe extern "C" fn()>(b"__asan_init\0") }.is_ok()
    }
    #[cfg(not(unix))]
    false
}

/// A fresh directory only this process uses.
fn private_dir() -> Result<PathBuf, String> {
    use std::hash::{BuildHasher, Hasher};
    let salt = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let dir = std::env::temp_dir().join(format!("runner-emulated-cuda-{}-{salt:016x}", std::process::id()));
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Host memory standing in for a device allocation: exactly the bytes asked for (so
/// the address sanitizer guards a buffer's very end), 256-byte aligned as the driver's
/// allocations are, and every 4-byte word a NaN until written (a kernel that reads what
/// nothing wrote shows it).
pub(super) struct HostMem {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: an owned allocation, written only through the backend's launches and copies,
// which the backend orders as it orders a stream's.
unsafe impl Send for HostMem {}
// SAFETY: as for Send; `&HostMem` only hands out the address.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// `bytes` (at least one) of host memory, or why not.
    pub(super) fn new(bytes: usize) -> Result<HostMem, String> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 256).map_err(|e| format!("{bytes} bytes: {e}"))?;
        // SAFETY: the layout's size is non-zero.
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(|| format!("out of host memory for {bytes} bytes"))?;
        let nan = f32::NAN.to_le_bytes();
        // SAFETY: `ptr` addresses `layout.size()` bytes just allocated.
        let words = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), layout.size()) };
        for (k, b) in words.iter_mut().enumerate() {
            *b = nan[k % 4];
        }
        Ok(HostMem { ptr, layout })
    }

    /// The allocation's address, as a device pointer.
    pub(super) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Element `i` of an `e` array at `base`, as f32.
///
/// # Safety
/// `base` addresses at least `i + 1` elements of `e`.
unsafe fn load(e: Elem, base: u64, i: usize) -> f32 {
    // SAFETY: the caller's.
    unsafe {
        match e {
            Elem::F32 => *(base as *const f32).add(i),
            Elem::BF16 => precision::bf16_from_bits(*(base as *const u16).add(i)),
            Elem::F16 => half::f16::from_bits(*(base as *const u16).add(i)).to_f32(),
            Elem::F8E4M3 => precision::fp8_decode(*(base as *const u8).add(i), Fp8Format::E4M3),
            Elem::F8E5M2 => precision::fp8_decode(*(base as *const u8).add(i), Fp8Format::E5M2),
            Elem::I32 => *(base as *const i32).add(i) as f32,
        }
    }
}

/// Store `v` as element `i` of an `e` array at `base` (rounded to nearest even; FP8
/// saturating, as cuBLASLt's FP8 outputs).
///
/// # Safety
/// `base` addresses at least `i + 1` elements of `e`.
unsafe fn store(e: Elem, base: u64, i: usize, v: f32) {
    // SAFETY: the caller's.
    unsafe {
        match e {
            Elem::F32 => *(base as *mut f32).add(i) = v,
            Elem::BF16 => *(base as *mut u16).add(i) = precision::bf16_bits(v),
            Elem::F16 => *(base as *mut u16).add(i) = half::f16::from_f32(v).to_bits(),
            Elem::F8E4M3 => *(base as *mut u8).add(i) = precision::fp8_encode(v, Fp8Format::E4M3, true),
            Elem::F8E5M2 => *(base as *mut u8).add(i) = precision::fp8_encode(v, Fp8Format::E5M2, true),
            Elem::I32 => *(base as *mut i32).add(i) = v as i32,
        }
    }
}

/// cuBLASLt's matmul as [`gemm::Lt::matmul`] sets it up, on host memory: column-major
/// D (m, n) = sa·sb·op(A)·op(B) (+ C when accumulating), A stored (m, k) or, transposed,
/// (k, m) with its rows as leading dimension (likewise B); FP8 operands scaled by the
/// 1/scale words their scale pointers address; an FP8 D multiplied by its scale, its amax
/// (before the scale) written. Accumulates in f64.
///
/// FP8 problems are refused as cuBLASLt refuses them, so the emulated device catches a
/// call the real one would fail: the "TN" layout (A transposed, B not), k and m
/// multiples of 16, and A and B 16-byte aligned (cuBLASLt's FP8 requirements; PyTorch's
/// `_scaled_mm` checks the same of its row-major operands).
///
/// # Safety
/// The operands address host memory of the sizes `key` implies.
pub(super) unsafe fn matmul(key: gemm::Key, o: &gemm::Operands) -> Result<(), String> {
    let (m, n, k) = (key.m as usize, key.n as usize, key.k as usize);
    if key.a.fp8().is_some() && !(key.ta && !key.tb && k.is_multiple_of(16) && m.is_multiple_of(16) && o.a.is_multiple_of(16) && o.b.is_multiple_of(16)) {
        return Err(format!(
            "cuBLASLt refuses an FP8 GEMM of {m}x{n}x{k} with op {}{} (it needs TN, k and m multiples of 16, A and B 16-byte aligned)",
            if key.ta { "T" } else { "N" },
            if key.tb { "T" } else { "N" }
        ));
    }
    // SAFETY: the caller's: scale pointers address an FP8 buffer's meta words.
    let (sa, sb) = unsafe {
        if key.a.fp8().is_some() { (*(o.a_scale_inv as *const f32), *(o.b_scale_inv as *const f32)) } else { (1.0, 1.0) }
    };
    let fp8_out = key.c.fp8().is_some();
    let mut amax = 0f32;
    for j in 0..n {
        for i in 0..m {
            let mut acc = 0f64;
            for l in 0..k {
                let ai = if key.ta { l + i * k } else { i + l * m };
                let bi = if key.tb { j + l * n } else { l + j * k };
                // SAFETY: indices inside the operands' (m, k) and (k, n) extents.
                acc += unsafe { f64::from(load(key.a, o.a, ai)) * f64::from(load(key.b, o.b, bi)) };
            }
            let mut v = (acc * f64::from(sa) * f64::from(sb)) as f32;
            if key.accumulate {
                // SAFETY: D is (m, n); accumulation reads it as C.
                v += unsafe { load(key.c, o.c, i + j * m) };
            }
            if fp8_out {
                amax = amax.max(v.abs());
                // SAFETY: the output scale pointer addresses the FP8 meta's scale word.
                v *= unsafe { *(o.d_scale as *const f32) };
            }
            // SAFETY: D is (m, n).
            unsafe { store(key.c, o.c, i + j * m, v) };
        }
    }
    if fp8_out {
        // SAFETY: the amax pointer addresses the FP8 meta's amax word.
        unsafe { *(o.d_amax as *mut f32) = amax };
    }
    Ok(())
}
