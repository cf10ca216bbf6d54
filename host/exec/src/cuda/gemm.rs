//! GEMMs through cuBLASLt: f32 (exact f32 compute, not TF32), bf16, f16 and FP8
//! (E4M3/E5M2 with device scale pointers), into f32, bf16 or f16 (or FP8 with an output
//! scale and the output's amax written by cuBLASLt).
//!
//! The executor's GEMMs are row-major `c (m,n) = op(a) · op(b)`; cuBLASLt is
//! column-major, so each call computes cᵀ = op(b)ᵀ · op(a)ᵀ with the operands swapped.
//! The matmul descriptor, the four layouts and the algorithm the heuristic picks are
//! made once per (shape, transposes, types, accumulate) and cached ([`Plan`]); a call
//! then only sets the FP8 scale pointers and runs. FP8 needs cuBLASLt's "TN" layout (the
//! first operand transposed): other layouts transpose the FP8 operands into scratch
//! first (Transformer Engine keeps transposed copies for the same reason).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use crate::device::Elem;

/// Bytes of cuBLASLt workspace (split-K and stream-K algorithms need some).
pub(super) const WORKSPACE_BYTES: usize = 32 << 20;

/// What identifies a cached plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    /// Column-major problem: m_cl = n, n_cl = m of the row-major call.
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Whether cuBLASLt's A (our b) and B (our a) are transposed.
    pub ta: bool,
    pub tb: bool,
    pub a: Elem,
    pub b: Elem,
    pub c: Elem,
    pub accumulate: bool,
}

/// A cached descriptor, its layouts and algorithm.
pub(super) struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    la: sys::cublasLtMatrixLayout_t,
    lb: sys::cublasLtMatrixLayout_t,
    lc: sys::cublasLtMatrixLayout_t,
    ld: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.la);
            let _ = lt::destroy_matrix_layout(self.lb);
            let _ = lt::destroy_matrix_layout(self.lc);
            let _ = lt::destroy_matrix_layout(self.ld);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The cuBLASLt handle and the plan cache of one device.
pub(super) struct Lt {
    handle: sys::cublasLtHandle_t,
    /// Plans by problem and by the alignment of the A, B, C and D pointers.
    plans: Mutex<HashMap<(Key, [u32; 4]), Plan>>,
}

/// The alignment cuBLASLt may assume of device pointer `p`: the largest power of two
/// dividing it, up to 256. Without being told, cuBLASLt assumes 256-byte-aligned
/// operands; an expert's rows inside a grouped GEMM's buffer start wherever the rows
/// before it end (2880 bf16 columns: 5760 bytes per row), so each plan is chosen for the
/// alignment its pointers have (PyTorch and Transformer Engine do the same).
pub(super) fn alignment(p: u64) -> u32 {
    1 << (p | 256).trailing_zeros()
}

// SAFETY: the handle is used under the device's single stream, and the plan cache is
// behind a mutex; cuBLASLt handles may be used from any thread.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        if let Ok(mut p) = self.plans.lock() {
            p.clear();
        }
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

fn data_type(e: Elem) -> sys::cudaDataType {
    match e {
        Elem::F32 => sys::cudaDataType::CUDA_R_32F,
        Elem::BF16 => sys::cudaDataType::CUDA_R_16BF,
        Elem::F16 => sys::cudaDataType::CUDA_R_16F,
        Elem::F8E4M3 => sys::cudaDataType::CUDA_R_8F_E4M3,
        Elem::F8E5M2 => sys::cudaDataType::CUDA_R_8F_E5M2,
        Elem::I32 => sys::cudaDataType::CUDA_R_32I,
    }
}

fn err(what: &str, e: lt::CublasError) -> String {
    format!("cuBLASLt {what}: {e:?}")
}

/// Set a matmul-descriptor attribute from a value.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
unsafe fn set<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<(), String> {
    // SAFETY: the caller's contract; `v` outlives the call.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>()) }
        .map_err(|e| err("descriptor attribute", e))
}

/// Device pointers of one call.
pub(super) struct Operands {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    /// FP8: 1/scale of cuBLASLt's A and B (our b and a) on the device.
    pub a_scale_inv: u64,
    pub b_scale_inv: u64,
    /// FP8 output: its scale and amax slots on the device.
    pub d_scale: u64,
    pub d_amax: u64,
    /// FP8 output: a bf16 scratch of c's size standing in for the unread C operand.
    pub c_scratch: u64,
    pub workspace: u64,
    pub stream: cudarc::driver::sys::CUstream,
}

impl Lt {
    pub(super) fn new() -> Result<Lt, String> {
        let handle = lt::create_handle().map_err(|e| err("handle", e))?;
        Ok(Lt {
            handle,
            plans: Mutex::new(HashMap::new()),
        })
    }

    fn plan(&self, key: Key, align: [u32; 4]) -> Result<Plan, String> {
        let fp8 = key.a.fp8().is_some();
        let fp8_out = key.c.fp8().is_some();
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(|e| err("descriptor", e))?;
        let op = |t: bool| {
            if t {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // SAFETY: `desc` was just created; the attribute types are cuBLASLt's.
        unsafe {
            set(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &op(key.ta))?;
            set(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &op(key.tb))?;
        }
        // The dims are the executor's usize sizes, checked against buffers that hold at
        // most isize::MAX bytes: a leading dimension is exact as i64.
        let layout = |e: Elem, rows: u64, cols: u64| {
            lt::create_matrix_layout(data_type(e), rows, cols, rows as i64).map_err(|e| err("layout", e))
        };
        // A (m x k after op), B (k x n after op), column-major with ld = rows.
        let (ar, ac) = if key.ta { (key.k, key.m) } else { (key.m, key.k) };
        let (br, bc) = if key.tb { (key.n, key.k) } else { (key.k, key.n) };
        let la = layout(key.a, ar, ac)?;
        let lb = layout(key.b, br, bc)?;
        // With an FP8 output cuBLASLt wants a bf16 C (not read: beta is 0).
        let c_type = if fp8_out { Elem::BF16 } else { key.c };
        let lc = layout(c_type, key.m, key.n)?;
        let ld = layout(key.c, key.m, key.n)?;
        if fp8 || fp8_out {
            // Placeholder pointers so the heuristic sees a scaled FP8 problem; each call
            // sets the real ones.
            let null: u64 = 0;
            // SAFETY: as above.
            unsafe {
                if fp8 {
                    set(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &null)?;
                    set(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &null)?;
                }
                if fp8_out {
                    set(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &null)?;
                    set(desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &null)?;
                }
            }
        }
        let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: all handles are live; the heuristic only reads them.
        let heur = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
            .map_err(|e| err("preference attribute", e))?;
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            for (attr, bytes) in [P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES]
                .into_iter()
                .zip(align)
            {
                lt::set_matmul_pref_attribute(pref, attr, &bytes as *const u32 as *const c_void, std::mem::size_of::<u32>())
                    .map_err(|e| err("alignment preference", e))?;
            }
            let h = lt::get_matmul_algo_heuristic(self.handle, desc, la, lb, lc, ld, pref);
            let _ = lt::destroy_matmul_pref(pref);
            h
        };
        let plan = Plan {
            desc,
            la,
            lb,
            lc,
            ld,
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        match heur {
            Ok(h) => Ok(Plan { algo: h.algo, ..plan }),
            Err(e) => Err(format!(
                "cuBLASLt has no algorithm for a {}x{}x{} GEMM of {} x {} into {} (op {}{}): {e:?}{}",
                key.n,
                key.m,
                key.k,
                key.b.name(),
                key.a.name(),
                key.c.name(),
                if key.tb { "T" } else { "N" },
                if key.ta { "T" } else { "N" },
                if fp8 { "; FP8 needs dimensions that are multiples of 16" } else { "" }
            )),
        }
    }

    /// Run `key` on `o` (alpha 1, beta 1 when accumulating, else 0).
    pub(super) fn matmul(&self, key: Key, o: &Operands) -> Result<(), String> {
        let fp8_out = key.c.fp8().is_some();
        let c_in = if fp8_out { o.c_scratch } else { o.c };
        let align = [o.a, o.b, c_in, o.c].map(alignment);
        let mut plans = self.plans.lock().map_err(|_| "cuBLASLt plan cache poisoned".to_string())?;
        let p = match plans.entry((key, align)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(key, align)?),
        };
        let (alpha, beta) = (1f32, if key.accumulate { 1f32 } else { 0f32 });
        // SAFETY: the plan's handles are live; the pointers are device buffers whose sizes
        // the caller checked against the key's shape.
        unsafe {
            if key.a.fp8().is_some() {
                set(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &o.a_scale_inv)?;
                set(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &o.b_scale_inv)?;
            }
            if fp8_out {
                set(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &o.d_scale)?;
                set(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &o.d_amax)?;
            }
            lt::matmul(
                self.handle,
                p.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                o.a as *const c_void,
                p.la,
                o.b as *const c_void,
                p.lb,
                c_in as *const c_void,
                p.lc,
                o.c as *mut c_void,
                p.ld,
                &p.algo,
                o.workspace as *mut c_void,
                WORKSPACE_BYTES,
                o.stream as _,
            )
            .map_err(|e| err("matmul", e))
        }
    }

    /// Plans cached so far (for tests and reports).
    pub(super) fn cached(&self) -> usize {
        self.plans.lock().map_or(0, |p| p.len())
    }
}

#[cfg(test)]
mod tests {
    use super::alignment;

    #[test]
    fn alignment_is_the_largest_power_of_two_dividing_the_pointer_up_to_256() {
        assert_eq!(alignment(0x7f00_0000_0000), 256);
        assert_eq!(alignment(0x7f00_0000_0000 + 5760), 128);
        assert_eq!(alignment(0x7f00_0000_0000 + 2 * 1408), 256);
        assert_eq!(alignment(0x7f00_0000_0000 + 1408), 128);
        assert_eq!(alignment(0x7f00_0000_0000 + 2), 2);
        assert_eq!(alignment(0x7f00_0000_0000 + 1), 1);
    }
}
