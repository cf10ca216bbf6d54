//! A training step recorded once as a CUDA graph and replayed every step after
//! (`ExecOptions::cuda_graph`).
//!
//! A small model's step is thousands of short kernels, and launching each one from the
//! host costs microseconds in which the GPU idles. Recorded once (CUDA stream capture,
//! [`Device::begin_capture`]), the whole step replays with one launch. What a replay
//! cannot do decides what may be recorded:
//!
//! - **No host transfer inside the step.** Before each launch the inputs are uploaded
//!   into the buffers the recording baked in, and AdamW's step-dependent scalars into
//!   theirs ([`Device::adamw`] reads them on the device); the loss gradient's seed is a
//!   device copy of a constant; the step copies its loss into a buffer kept for it,
//!   read after the launch.
//! - **The same kernels on the same shapes every step.** Expert (MoE) layers size their
//!   grouped GEMMs from per-expert row counts read on the host, FP8 plans take their
//!   scales from amax histories the host keeps and read statistics after each pass,
//!   and a sharded rank's collectives run over host transports (NCCL's capture is not
//!   wired in): [`Executor::graph_blocker`] refuses them before anything is recorded,
//!   naming the reason. Per-op profiling is refused too: a recording has no clock.
//! - **Nothing the step allocates outlives it.** The recording ends by dropping the
//!   step's activations, so the graph frees everything it allocated; weights, their
//!   gradients and moments, inputs and the two constant buffers predate it. A buffer
//!   from before the recording that the step frees is kept alive by the recording (the
//!   device's part, `cuda/mod.rs`).
//!
//! The first step runs eagerly (kernels loaded, GEMM plans chosen, memory pools grown:
//! none of that may happen inside a recording); the second is recorded, then launched;
//! each later step uploads and launches. Its phases and ops are not timed (the caller
//! times whole steps: `timing.rs`). Gradients and activations cannot be read between
//! steps in this mode (the recording freed them); weights can.

use runner_graph::OpKind;
use runner_kernels::cpu::adamw::AdamW;

use super::{Executor, Input};
use crate::device::{Device, Elem, ExecError, no_graphs, write_adamw_scalars};

/// Where graph mode stands.
pub(super) enum GraphState<D: Device> {
    /// No step yet: the first runs eagerly, so kernels are loaded, GEMM plans chosen and
    /// memory pools grown before anything is recorded (none of that may be recorded).
    Cold,
    /// One eager step done: the next is recorded.
    Warm,
    /// The recorded step and the buffer it leaves its loss in.
    Recorded { graph: D::Graph, loss: D::Buffer },
}

/// The error of a forward, backward or optimizer call made on its own in graph mode.
pub(super) fn whole_steps_only(call: &str) -> ExecError {
    ExecError::State(format!(
        "{call}: with cuda_graph on the executor runs whole steps (Executor::step), which a CUDA graph records as \
         one launch; turn cuda_graph off to run the passes one by one"
    ))
}

impl<D: Device> Executor<D> {
    /// Why this executor's step cannot be recorded as a CUDA graph (`None`: it can).
    pub fn graph_blocker(&self) -> Option<String> {
        if !self.collectives.is_empty() || !self.comm.step.is_empty() {
            return Some(
                "a sharded rank's collectives are not recorded (host transports cannot be, and NCCL's graph capture is \
                 not wired in yet): record an unsharded step"
                    .into(),
            );
        }
        let routed = [OpKind::Router, OpKind::MoeDispatch, OpKind::GroupedLinear, OpKind::MoeCombine];
        if let Some(op) = self.graph.ops.iter().find(|o| routed.contains(&o.kind)) {
            return Some(format!(
                "op '{}' belongs to an expert (MoE) layer, whose grouped GEMMs are sized each step from per-expert row \
                 counts read on the host",
                op.name
            ));
        }
        if !self.quant.sites.is_empty() {
            return Some(
                "a precision plan quantises GEMM operands: their scales come from amax histories the host keeps and \
                 their statistics are read after each pass; record the step without a plan (f32 or BF16 storage)"
                    .into(),
            );
        }
        if self.options.profile {
            return Some("per-op profiling records events around every op, and a recording has no clock".into());
        }
        if !self.device.records() {
            return Some(no_graphs(&self.device.name()));
        }
        None
    }

    /// Whether steps are recorded and replayed as a CUDA graph.
    pub fn cuda_graph(&self) -> bool {
        self.options.cuda_graph
    }

    /// [`Executor::step`] in graph mode: upload, record the step if not yet recorded,
    /// launch, read the loss.
    pub(super) fn graph_step(&mut self, inputs: &[(&str, Input<'_>)], h: &AdamW) -> Result<f32, ExecError> {
        if let Some(why) = self.graph_blocker() {
            return Err(ExecError::State(format!("this step cannot be recorded: {why}")));
        }
        if matches!(self.recorded, GraphState::Cold) {
            self.options.cuda_graph = false;
            let r = self.step(inputs, h);
            self.options.cuda_graph = true;
            let loss = r?;
            self.recorded = GraphState::Warm;
            return Ok(loss);
        }
        // Everything the last step left is dropped before recording, so the recording
        // frees only what it allocates.
        self.begin_step(inputs)?;
        let next = self.adam_step.checked_add(1).ok_or_else(|| ExecError::State("AdamW's step count overflowed".into()))?;
        write_adamw_scalars(&self.device, &mut self.adam_scalars, h, next)?;
        if let GraphState::Recorded { graph, .. } = &self.recorded {
            self.device.launch(graph)?;
        } else {
            // Recording ran nothing: its first launch is the step. On failure AdamW's
            // count goes back to before it (the recorded optimizer counted the step).
            let before = self.adam_step;
            let recorded = self
                .record()
                .map_err(|e| ExecError::State(format!("recording the step as a CUDA graph: {e}")))
                .and_then(|(graph, loss)| self.device.launch(&graph).map(|()| GraphState::Recorded { graph, loss }));
            self.adam_step = before;
            self.recorded = recorded?;
        }
        self.adam_step = next;
        let GraphState::Recorded { loss, .. } = &self.recorded else {
            return Err(ExecError::State("graph mode: no recorded step after recording".into()));
        };
        self.loss = self.device.read_f32(loss)?.first().copied().unwrap_or(f32::NAN);
        // The phases are not timed in one launch: none is reported.
        let p = &mut self.profile;
        (p.forward_s, p.backward_s, p.optimizer_s, p.recompute_s, p.communication_s) = (0.0, 0.0, 0.0, 0.0, 0.0);
        Ok(self.loss)
    }

    /// Record the step: the graph, and the buffer it leaves the loss in. On failure the
    /// executor's passes are as before it (the recording ran nothing); AdamW's count is
    /// the caller's to put back.
    fn record(&mut self) -> Result<(D::Graph, D::Buffer), ExecError> {
        let mut loss = self.device.alloc(Elem::F32, 1)?;
        self.device.begin_capture()?;
        let ran = self.record_step(&mut loss);
        // The capture ends whatever happened inside it, so the device stays usable.
        let graph = self.device.end_capture();
        if ran.is_err() || graph.is_err() {
            self.forward_done = false;
            self.backward_done = false;
            self.release_activations();
        }
        ran?;
        Ok((graph?, loss))
    }

    /// The step's device work, in the order [`Executor::step`] runs it, with the loss
    /// copied into `loss` and the step's activations dropped at the end.
    pub(super) fn record_step(&mut self, loss: &mut D::Buffer) -> Result<(), ExecError> {
        self.capturing = true;
        let r = self.step_ops(loss);
        self.capturing = false;
        r
    }

    fn step_ops(&mut self, loss: &mut D::Buffer) -> Result<(), ExecError> {
        self.forward_ops()?;
        self.forward_done = true;
        let l = self.vals[self.graph.loss]
            .as_ref()
            .ok_or_else(|| ExecError::State("loss not produced".into()))?;
        self.device.copy(loss, 0, l, 0, 1)?;
        self.backward_ops(false)?;
        self.reduce_gradients()?;
        self.optimizer_ops()?;
        self.release_activations();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use runner_graph::recompute::RecomputePolicy;

    use super::*;
    use crate::collective::ThreadGroup;
    use crate::cpu::Cpu;
    use crate::executor::{ADAMW_DEFAULT, ExecOptions, MUON_DEFAULT, Optimizer};
    use crate::precision::{GemmRole, OperandPlan, Scaling, SitePlan};
    use crate::toy::{self, ToyConfig};

    fn inputs(data: &[(String, Vec<u32>)]) -> Vec<(&str, Input<'_>)> {
        data.iter().map(|(n, v)| (n.as_str(), Input::U32(v))).collect()
    }

    /// What a CUDA graph records, run on the CPU (which cannot record, so it runs it):
    /// three steps of it equal three eager steps bit for bit (AdamW's bias corrections
    /// come from the scalars buffer, the loss gradient from the device constant), and
    /// none of it reads, writes or waits on the host (the CPU counts those), with
    /// activation recompute and without, and under Muon (its norms and learning rate
    /// read on the device), the learning rate changing every step.
    #[test]
    fn the_recorded_step_is_the_eager_step_without_host_transfers() {
        let g = toy::llama(&ToyConfig::tiny());
        let data = toy::batch_inputs(&g, 0);
        let muon = Optimizer::Muon(MUON_DEFAULT);
        for (recompute, opt) in [(RecomputePolicy::None, Optimizer::AdamW), (RecomputePolicy::Full, Optimizer::AdamW), (RecomputePolicy::None, muon)] {
            let opts = ExecOptions { recompute, ..ExecOptions::default() };
            let mut eager = Executor::new(&g, Cpu::new(), opts.clone()).unwrap();
            let mut rec = Executor::new(&g, Cpu::new(), opts).unwrap();
            eager.set_optimizer(opt).unwrap();
            rec.set_optimizer(opt).unwrap();
            let mut loss = rec.device.alloc(Elem::F32, 1).unwrap();
            for step in 1..=3u32 {
                let h = AdamW { lr: 1e-2 / step as f32, ..ADAMW_DEFAULT };
                let want = eager.step(&inputs(&data), &h).unwrap();
                rec.begin_step(&inputs(&data)).unwrap();
                write_adamw_scalars(&rec.device, &mut rec.adam_scalars, &h, step).unwrap();
                let before = rec.device.host_transfers();
                rec.record_step(&mut loss).unwrap();
                assert_eq!(rec.device.host_transfers(), before, "{recompute:?} {opt:?}: the step touched host memory");
                // Nothing the step allocated outlives it, and the executor times eagerly again.
                let kept: Vec<&str> = rec.graph.tensors.iter().enumerate().filter(|(id, t)| t.kind == runner_graph::TensorKind::Activation && rec.vals[*id].is_some()).map(|(_, t)| t.name.as_str()).collect();
                assert!(kept.is_empty() && !rec.capturing, "{recompute:?}: activations kept after the recorded step: {kept:?}");
                let got = rec.device.read_f32(&loss).unwrap()[0];
                assert_eq!(got.to_bits(), want.to_bits(), "{recompute:?} step {step}: loss {got} vs {want}");
            }
            assert_eq!(rec.steps_taken(), 3);
            for w in eager.trainable() {
                assert_eq!(eager.weight(&w).unwrap(), rec.weight(&w).unwrap(), "{recompute:?} {opt:?}: weight {w}");
            }
            assert!(rec.graph_blocker().is_some_and(|b| b.contains("--device cuda")), "the CPU cannot record");
        }
    }

    /// The CPU cannot record: graph mode says so and names the fix; the passes one by
    /// one are refused in graph mode.
    #[test]
    fn graph_mode_needs_a_gpu_and_whole_steps() {
        let g = toy::llama(&ToyConfig::tiny());
        let data = toy::batch_inputs(&g, 0);
        let opts = ExecOptions { cuda_graph: true, ..ExecOptions::default() };
        let mut ex = Executor::new(&g, Cpu::new(), opts).unwrap();
        let e = ex.step(&inputs(&data), &ADAMW_DEFAULT).unwrap_err().to_string();
        assert!(e.contains("--device cuda"), "{e}");
        assert_eq!(ex.steps_taken(), 0);
        let e = ex.forward(&inputs(&data)).unwrap_err().to_string();
        assert!(e.contains("whole steps"), "{e}");
        // Nothing was left half done: the same executor steps eagerly once graph mode is off.
        ex.options.cuda_graph = false;
        assert!(ex.step(&inputs(&data), &ADAMW_DEFAULT).unwrap().is_finite());
    }

    /// Each kind of step a recording cannot hold is refused before anything runs,
    /// with the reason.
    #[test]
    fn what_cannot_be_recorded_is_refused_with_its_reason() {
        let dense = toy::llama(&ToyConfig::tiny());
        let blocker = |ex: &Executor<Cpu>| ex.graph_blocker().unwrap_or_default();
        let moe = toy::llama(&ToyConfig { layers: 1, moe: Some((4, 2, 32)), ..ToyConfig::tiny() });
        let ex = Executor::new(&moe, Cpu::new(), ExecOptions::default()).unwrap();
        assert!(blocker(&ex).contains("expert (MoE) layer"), "{}", blocker(&ex));

        let mut ex = Executor::new(&dense, Cpu::new(), ExecOptions::default()).unwrap();
        assert!(blocker(&ex).contains("--device cuda"), "{}", blocker(&ex));
        ex.set_profile(true);
        assert!(blocker(&ex).contains("profiling"), "{}", blocker(&ex));
        ex.set_profile(false);
        let fp8 = OperandPlan { format: runner_graph::DType::Fp8E4M3, scaling: Scaling::Current { margin: 0 }, saturate: true, stochastic: false, hadamard: 0 };
        let plan = SitePlan { activation: fp8, weight: fp8, gradient: fp8, output: runner_graph::DType::BF16 };
        let site = dense.ops.iter().find(|o| o.kind == OpKind::Linear).unwrap().name.clone();
        ex.set_precision(&[(site, GemmRole::Forward, plan)]).unwrap();
        assert!(blocker(&ex).contains("amax histories"), "{}", blocker(&ex));

        let group: Vec<(String, Box<dyn crate::collective::Collective<Cpu>>)> =
            ThreadGroup::new(1).into_iter().map(|h| ("dp".to_string(), Box::new(h) as Box<dyn crate::collective::Collective<Cpu>>)).collect();
        let ex = Executor::with_collectives(&dense, Cpu::new(), ExecOptions::default(), group).unwrap();
        assert!(blocker(&ex).contains("sharded rank"), "{}", blocker(&ex));

        let data = toy::batch_inputs(&moe, 0);
        let mut ex = Executor::new(&moe, Cpu::new(), ExecOptions { cuda_graph: true, ..ExecOptions::default() }).unwrap();
        let e = ex.step(&inputs(&data), &ADAMW_DEFAULT).unwrap_err().to_string();
        assert!(e.contains("cannot be recorded") && e.contains("expert"), "{e}");
    }
}
