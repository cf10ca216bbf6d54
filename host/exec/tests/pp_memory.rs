//! The memory account of plain data-parallel pipeline ranks (dp = 2, no FSDP) against
//! the peak the device measured.

mod common;

use common::{Data, options, step_memories, with_roles};
use runner_exec::executor::CONSTANT_BYTES;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::ExecOptions;
use runner_graph::shard::Layout;

/// The data-parallel reduction's flat buffers count. The `dp` all-reduce copies the
/// rank's gradients into one buffer as large as its parameters (the `pp-embed` one of a
/// tied embedding runs after it, alone); with `overlap_grad_reduce` each bucket holds
/// its copy from the backward step that finished it (in the last micro-batch's
/// backward) to the reduction, beside what the pass still holds, the copy a pipeline
/// receive's backward makes of its gradient for the mailbox included. The walk left all
/// three out, so every rank whose activations in flight take less than its parameters
/// peaked in the reduction, above the account: dp = 2 without a pipeline, 720264 bytes
/// required against an 825060-byte peak (-12.7 %); pp = 2 over one micro-batch, stage
/// 1: 363496 against 414916 (-12.4 %); vp = 2 over four, stage 1: 377044 against
/// 414916 (-9.1 %), stage 0: 403544 against 412228 (-2.1 %); pp = 4, stage 3 over any
/// count: 201512 against 229316 (-12.1 %). Now every case is 32 bytes (the executor's
/// constants) under the peak. Buckets of 2048 elements start through the backward
/// (those an earlier pass started stay in flight through the later ones).
#[test]
fn dp_pipeline_memory_walk_counts_the_gradient_reduction_buffers() {
    for (pp, vp) in [(1u32, 1u32), (2, 1), (2, 2), (4, 1), (4, 2)] {
        for micro_batches in 1..=4u32 {
            // The interleaved schedule needs the micro-batches a multiple of pp.
            if vp > 1 && micro_batches % pp != 0 {
                continue;
            }
            for tied in [false, true] {
                let g = with_roles(toy::llama(&ToyConfig { layers: (pp * vp).max(4), batch: 1, tied, ..ToyConfig::tiny() }), true);
                let layout = Layout { dp: 2, pp, vp, ..Layout::single(1, 2 * micro_batches) };
                let data: Vec<Data> = (0..micro_batches).map(|k| synthetic_inputs(&g, 5 + u64::from(k))).collect();
                // Overlapped: one bucket (the default size), or buckets of 2048 elements
                // (a few weights each), started through the backward; or not overlapped.
                for (overlap, bucket) in [(true, None), (true, Some(2048)), (false, None)] {
                    let what = format!("pp {pp}, vp {vp}, {micro_batches} micro-batches, tied {tied}, overlap {overlap}, buckets of {bucket:?} elements");
                    let o = ExecOptions { overlap_grad_reduce: overlap, grad_bucket_elems: bucket, ..options() };
                    for (coord, m) in step_memories(&g, &layout, &data, &o) {
                        let at = format!("{what}, stage {} (dp rank {}): {m:?}", coord.pp, coord.dp);
                        assert!(m.peak_bytes <= m.required_bytes + CONSTANT_BYTES, "under-counted: {at}");
                        assert!(m.peak_bytes as f64 >= 0.99 * m.required_bytes as f64, "over-counted: {at}");
                    }
                }
            }
        }
    }
}
