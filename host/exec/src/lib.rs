//! `runner-exec`: runs a training step of a [`runner_graph::Graph`] with real kernels and
//! times it.
//!
//! A workload plugin hands the host a logical forward graph; [`runner_graph::autodiff`]
//! derives its backward pass as data, and this crate executes forward, backward and an
//! optimizer step (AdamW, or Muon on the hidden matrices: `executor/muon.rs`) on a
//! [`Device`], timing every op.
//!
//! # Brief overview
//!
//! - [`Device`] ([`device`]): one backend trait, in candle's split: device buffers of
//!   every element type (f32, bf16, f16, FP8 with its scale, int32), the kernels of the
//!   operation set on them, and device events for timing. [`cpu::Cpu`] implements it
//!   with `runner-kernels`. Which kernels a graph op runs, with its attributes and its
//!   gradients' write modes, is decided once above the trait (`executor/ops.rs`).
//! - [`Executor`] ([`executor`]): owns weights, activations, saved tensors, gradients and
//!   optimizer state for one graph; `forward`, `backward`, `optimizer_step`, `step`; frees
//!   activations as early as the plan allows and accounts every byte.
//! - [`collective`]: the [`Collective`] trait the executor runs a sharded graph's
//!   communication ops through (on device buffers), [`HostCollective`] for transports
//!   that move host memory, and [`ThreadGroup`], ranks as threads over shared memory
//!   that fail instead of hanging when a rank leaves or a wait times out
//!   ([`Executor::for_rank`]: tensor parallelism with or without SP, context
//!   parallelism (K/V all-gathered over cp, rotary and attention on global positions),
//!   pipeline send/recv including interleaved stages, expert parallelism's dropless all-to-alls (and etp
//!   where it divides tp, without SP), and the step's gradient reduction over dp, edp,
//!   tied embeddings and SP; not FSDP yet).
//! - [`timing`]: warm-up plus repeats, median and p10/p90 per op and per phase.
//! - [`proxy`]: measure a few layers of a model and compose the full-depth step time.
//! - [`linear_time`]: a linear layer's three GEMMs (and FP8 casts) timed at a precision
//!   plan's formats, for `runner measure`.
//! - [`select`]: `--device auto|cpu|cuda[:N]`; [`cuda`] (feature `cuda-13000`, on by
//!   default): the GPU backend (cudarc, cuBLASLt, NVRTC-compiled `kernels/cuda/*.cu`).
//! - [`devcheck`]: every kernel of a device compared with the CPU backend.
//! - [`bench`]: GEMM throughput, the CPU's theoretical and measured f32 peak, and memory
//!   bandwidth.
//! - [`toy`]: small hand-built llama-style, MoE and Mamba-2 graphs for tests and benches.
//!
//! # Example
//!
//! ```
//! use runner_exec::{cpu::Cpu, toy, ExecOptions, Executor, Input};
//! let g = toy::llama(&toy::ToyConfig::tiny());
//! let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default())?;
//! let (tokens, targets) = toy::repeating_batch(&g, 7);
//! let loss = ex.step(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))], &runner_exec::executor::ADAMW_DEFAULT)?;
//! assert!(loss.is_finite());
//! # Ok::<(), runner_exec::ExecError>(())
//! ```

pub mod bench;
pub mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod devcheck;
pub mod device;
pub mod executor;
pub mod linear_time;
pub mod precision;
pub mod proxy;
pub mod select;
#[cfg(test)]
mod reference;
pub mod timing;
pub mod toy;

pub use collective::{Collective, HostCollective, HostInFlight, InFlight, Lane, ReduceOp, Started, ThreadGroup};
pub use device::{Device, DeviceBuffer, Elem, ExecError, MemStats};
pub use executor::{ExecOptions, Executor, Input, MemoryReport};
pub use proxy::{MeasureOptions, MeasuredStep, measure_training_step, measure_training_step_on, measure_training_step_with};
pub use runner_kernels::cpu::adamw::AdamW;
pub use timing::{Stat, StepTiming, TimingOptions};
