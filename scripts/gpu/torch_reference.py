#!/usr/bin/env python3
"""PyTorch references for scripts/gpu-check.sh, on the same shapes as the runner's
device benches, timed the same way (CUDA events around back-to-back calls, median of
samples), printed as one JSON object.

- gemm: c (n,n) = a (n,n) @ b (n,n)^T for each size: bf16 with `torch.matmul` (bf16 out);
  FP8 E4M3 with `torch._scaled_mm` (per-tensor scales, bf16 out, no fast accumulation);
  f32 with TF32 off. As `runner bench gemm --dtype ...`.
- memory: a 1 GiB f32 device-to-device copy (`copy_`), bytes read + written, as
  `runner bench memory --device cuda`'s first row.

    python3 scripts/gpu/torch_reference.py --sizes 4096,8192
"""

import argparse
import json
import statistics
import sys

import torch


def timed(fn, samples=7, calls=3):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / calls)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,8192")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "gemm": [], "memory": {}}
    for n in [int(s) for s in args.sizes.split(",")]:
        flops = 2.0 * n ** 3
        calls = max(3, min(1000, int(25e12 / flops)))
        a = torch.randn(n, n, device=dev)
        b = torch.randn(n, n, device=dev)
        for dtype in ["f32", "bf16", "fp8-e4m3"]:
            # One format failing (an FP8 API this PyTorch lacks) must not lose the others'
            # figures on a one-shot run: say why on stderr and go on.
            try:
                t = gemm_times(dtype, a, b, calls)
            except Exception as e:
                print(f"gemm {dtype} {n}: {e!r}", file=sys.stderr)
                continue
            res["gemm"].append({"n": n, "dtype": dtype, "tflops": flops / statistics.median(t) / 1e12,
                                "best_tflops": flops / min(t) / 1e12})
    try:
        src = torch.zeros(1 << 28, device=dev)
        dst = torch.empty_like(src)
        t = timed(lambda: dst.copy_(src))
        moved = 2.0 * src.numel() * 4
        res["memory"] = {"kernel": "device copy", "gbps": moved / statistics.median(t) / 1e9,
                         "best_gbps": moved / min(t) / 1e9}
    except Exception as e:
        print(f"memory: {e!r}", file=sys.stderr)
    print(json.dumps(res))


def gemm_times(dtype, a, b, calls):
    """Seconds per call of c = a @ b^T in `dtype`, one per sample."""
    if dtype == "f32":
        fn = lambda: torch.matmul(a, b.t())
    elif dtype == "bf16":
        ah, bh = a.bfloat16(), b.bfloat16()
        fn = lambda: torch.matmul(ah, bh.t())
    else:
        sa = (448.0 / a.abs().max()).float()
        sb = (448.0 / b.abs().max()).float()
        a8 = (a * sa).to(torch.float8_e4m3fn)
        b8 = (b * sb).to(torch.float8_e4m3fn)
        inv_a, inv_b = (1.0 / sa).reshape(()), (1.0 / sb).reshape(())
        fn = lambda: torch._scaled_mm(a8, b8.t(), scale_a=inv_a, scale_b=inv_b, out_dtype=torch.bfloat16)
    return timed(fn, calls=calls)


if __name__ == "__main__":
    main()
