#!/usr/bin/env python3
"""The runner's f32 GEMM against PyTorch's (MKL on x86) on the same machine, side by side.

For each size N (C = A·B, all N x N, f32) the script alternates, for --rounds rounds:
`runner bench gemm --sizes N --format json` (median GFLOP/s of its samples) and the
reference library's median GFLOP/s over --samples timed products of at least 50 ms each,
with the same thread count. It prints the median over the rounds of each side and their
ratio (the issue's target: runner >= 95 % of PyTorch from 1024 up).

The reference is torch.matmul when PyTorch is installed, else numpy.matmul (whose BLAS,
OpenBLAS in the PyPI wheels, the table names): say which in any figure quoted.

    python3 scripts/gemm-vs-pytorch.py --runner target/release/runner --sizes 1024,2048,4096 --threads 2

On machines where OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set (older OpenBLAS builds need
them), the script removes both from the reference's environment only when
--unset-openblas-env is given, and reports the kernel OpenBLAS then picks.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def reference(threads):
    """(name, matmul(n) -> seconds per product)."""
    try:
        import torch

        torch.set_num_threads(threads)
        name = f"PyTorch {torch.__version__} ({'MKL' if torch.backends.mkl.is_available() else 'no MKL'}) torch.matmul"

        def run(n, samples):
            a = torch.randn(n, n, dtype=torch.float32)
            b = torch.randn(n, n, dtype=torch.float32)
            torch.matmul(a, b)
            return timed(lambda: torch.matmul(a, b), samples)

        return name, run
    except ImportError:
        import numpy as np

        blas = "BLAS unknown"
        try:
            import threadpoolctl

            info = threadpoolctl.threadpool_info()
            blas = ", ".join(f"{i['internal_api']} {i['version']} ({i.get('architecture')})" for i in info if i["user_api"] == "blas")
        except ImportError:
            pass
        name = f"numpy {np.__version__} matmul ({blas}); PyTorch is not installed"

        def run(n, samples):
            rng = np.random.default_rng(0)
            a = rng.standard_normal((n, n), dtype=np.float32)
            b = rng.standard_normal((n, n), dtype=np.float32)
            a @ b
            return timed(lambda: a @ b, samples)

        return name, run


def timed(f, samples, min_s=0.05):
    out = []
    for _ in range(samples):
        t0, calls = time.perf_counter(), 0
        while True:
            f()
            calls += 1
            e = time.perf_counter() - t0
            if e >= min_s:
                break
        out.append(e / calls)
    return statistics.median(out)


def runner_gflops(runner, n, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run(
        [runner, "--device", "cpu", "bench", "gemm", "--sizes", str(n), "--format", "json", "-q"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    rows = json.loads(out)
    if isinstance(rows, dict):
        rows = rows.get("gemm") or rows.get("rows")
    return rows[0]["gflops"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runner", default="target/release/runner")
    p.add_argument("--sizes", default="1024,2048,4096")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=9)
    p.add_argument("--unset-openblas-env", action="store_true")
    a = p.parse_args()
    if a.unset_openblas_env:
        for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            os.environ.pop(k, None)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(a.threads))
    name, ref = reference(a.threads)
    print(f"reference: {name}; {a.threads} threads; {a.rounds} alternating rounds, median of {a.samples} samples each")
    print(f"{'M=N=K':>6}  {'runner GFLOP/s':>14}  {'reference GFLOP/s':>17}  {'runner / reference':>18}")
    worst = None
    for n in [int(s) for s in a.sizes.split(",")]:
        ours, theirs = [], []
        for _ in range(a.rounds):
            theirs.append(2 * n**3 / ref(n, a.samples) / 1e9)
            ours.append(runner_gflops(a.runner, n, a.threads))
        o, t = statistics.median(ours), statistics.median(theirs)
        ratio = o / t
        worst = ratio if worst is None else min(worst, ratio)
        print(f"{n:>6}  {o:>14.1f}  {t:>17.1f}  {100 * ratio:>17.1f}%")
    print(f"lowest ratio {100 * worst:.1f}% (target >= 95% of PyTorch/MKL from 1024 up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
