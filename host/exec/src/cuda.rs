//! The CUDA backend: a placeholder until the later issue that adds it (cudarc, kernels
//! compiled from `kernels/cuda/`). As in candle's `dummy_cuda_backend.rs`, the type
//! exists so call sites build everywhere, and every operation returns
//! [`ExecError::NoCuda`] ("built without CUDA") instead of failing to compile.

use runner_graph::Graph;
use runner_graph::autodiff::BackwardStep;
use runner_kernels::cpu::adamw::AdamW;

use crate::device::{BackwardIo, Device, DeviceBuffer, Elem, ExecError, MemStats, Plans};

/// A CUDA device (not available in this build).
#[derive(Debug, Clone)]
pub struct Cuda {
    /// GPU ordinal the caller asked for.
    pub ordinal: usize,
}

impl Cuda {
    /// Open GPU `ordinal`.
    ///
    /// # Errors
    /// Always [`ExecError::NoCuda`] in this build.
    pub fn new(ordinal: usize) -> Result<Cuda, ExecError> {
        let _ = ordinal;
        Err(ExecError::NoCuda)
    }
}

/// A device buffer (never constructed in this build).
#[derive(Debug)]
pub struct CudaBuffer {
    len: usize,
    elem: Elem,
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn elem(&self) -> Elem {
        self.elem
    }
}

impl Device for Cuda {
    type Buffer = CudaBuffer;
    type Plan = ();

    fn name(&self) -> String {
        format!("cuda:{} (not built)", self.ordinal)
    }
    fn alloc(&self, _elem: Elem, _len: usize) -> Result<CudaBuffer, ExecError> {
        Err(ExecError::NoCuda)
    }
    fn zero(&self, _buf: &mut CudaBuffer) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn write_f32(&self, _buf: &mut CudaBuffer, _data: &[f32]) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn write_u32(&self, _buf: &mut CudaBuffer, _data: &[u32]) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn read_f32(&self, _buf: &CudaBuffer) -> Result<Vec<f32>, ExecError> {
        Err(ExecError::NoCuda)
    }
    fn round_to_storage(&self, _buf: &mut CudaBuffer, _dtype: runner_graph::DType, _row: usize) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn add_assign(&self, _dst: &mut CudaBuffer, _src: &CudaBuffer) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn forward(
        &self,
        _g: &Graph,
        _op: usize,
        _inputs: &[&CudaBuffer],
        _outputs: &mut [CudaBuffer],
        _aux: &mut Vec<CudaBuffer>,
        _plans: &mut Plans<()>,
    ) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn backward(
        &self,
        _g: &Graph,
        _step: &BackwardStep,
        _io: BackwardIo<'_, Self>,
    ) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn plan_counts(&self, _plan: &()) -> Result<Vec<usize>, ExecError> {
        Err(ExecError::NoCuda)
    }
    fn presorted_plan(&self, _counts: &[usize]) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn adamw(
        &self,
        _param: &mut CudaBuffer,
        _grad: &CudaBuffer,
        _m: &mut CudaBuffer,
        _v: &mut CudaBuffer,
        _h: &AdamW,
        _step: u32,
    ) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn synchronize(&self) -> Result<(), ExecError> {
        Err(ExecError::NoCuda)
    }
    fn memory(&self) -> MemStats {
        MemStats::default()
    }
    fn reset_peak(&self) {}
}

#[cfg(test)]
mod tests {
    #[test]
    fn says_built_without_cuda() {
        let e = super::Cuda::new(0).unwrap_err().to_string();
        assert!(e.contains("built without CUDA"), "{e}");
    }
}
