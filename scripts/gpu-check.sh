#!/usr/bin/env bash
# GPU checks of the CUDA backend, for a machine with an NVIDIA GPU, PyTorch and NCCL but
# no Rust toolchain and no network: run against a runner binary built elsewhere
# (`cargo build --release`) and copied over. Finishes in well under 8 minutes on one
# H200; every step has its own time limit, a failed step is recorded and the rest run.
#
#   scripts/gpu-check.sh [RUNNER] [OUT]     (defaults: target/release/runner, ./gpu-check-out)
#
# On the lent machine (the device tool brings back at most 8 files and no links), write OUT
# elsewhere and bring back the bundle and the table:
#   scripts/gpu-check.sh target/release/runner /tmp/gco && cp /tmp/gco.tgz /tmp/gco/summary.md "$OUT"/
# The whole script stops its steps by DEADLINE seconds (default 500) so the summary always
# runs inside the tool's 600-second limit; a step that would start past it is skipped.
#
# The release binary is ~37 MB (~29 MB stripped): build it with `cargo build --release`
# and carry target/release/runner to the GPU machine with the working tree.
#
# 1. every GPU kernel against the CPU backend (runner bench kernels)
# 2. BF16 / FP8 / f32 GEMM TFLOP/s, runner (cuBLASLt) against PyTorch (torch.matmul,
#    torch._scaled_mm) on the same shapes
# 3. HBM copy bandwidth and the memory-bound kernels as a fraction of it
# 4. a Llama 3.1 8B layer's training step (forward, backward, AdamW; with embedding,
#    head and loss), runner against PyTorch eager, f32 both
# 5. NCCL through the runner's collective bench on the local GPU(s) (its all-reduce check a
#    started one: the overlapped gradient buckets' second stream)
# 6. per-op times of Llama 3.1 8B's rank graph in BF16 and FP8 (runner measure), and the
#    GPU profile's GEMM and HBM efficiencies fitted to them (runner calibrate --ops)
# 7. 30 training steps of the tiny Llama in BF16 and FP8 on the device (FP8 linears on
#    cuBLASLt FP8 GEMMs) against the same run on the CPU (emulated): held-out losses
# 8. the layer step at seq 32 recorded once as a CUDA graph and replayed, against the
#    eager step (time, and losses equal bit for bit)
# and last a short table against the targets (GEMM >= 95 % of PyTorch, memory-bound
# kernels >= 80 % of copy bandwidth, layer step within 1.3x of PyTorch eager), also
# written to OUT/summary.md for docs/PERFORMANCE.md.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNNER="$(realpath "${1:-target/release/runner}")"
OUT="$(mkdir -p "${2:-gpu-check-out}" && realpath "${2:-gpu-check-out}")"
SIZES="${GEMM_SIZES:-4096,8192}"
# DEVICE=cpu runs the runner's steps on the CPU (a dry run of this script without a GPU;
# use small GEMM_SIZES and SKIP_LAYER=1 there).
DEVICE="${DEVICE:-cuda}"
DEADLINE=$((SECONDS + ${DEADLINE:-500}))
: > "$OUT/steps.txt"

# The CUDA libraries PyTorch ships (cuBLASLt, NVRTC, NCCL) onto the loader path; NCCL's
# pip wheel has only libnccl.so.2, and the runner's loader asks for libnccl.so: a
# symlink in a private directory answers it.
LIBS="$(python3 - <<'PY'
import glob, os, site
dirs = set()
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for pat in ("nvidia/*/lib", "nvidia/cu*/lib", "torch/lib"):
        for d in glob.glob(os.path.join(root, pat)):
            if any(glob.glob(os.path.join(d, n)) for n in ("libcublasLt.so*", "libnvrtc.so*", "libnccl.so*")):
                dirs.add(d)
print(":".join(sorted(dirs)))
PY
)"
SHIM="$OUT/lib"
mkdir -p "$SHIM"
for lib in nccl nvrtc cublasLt; do
    for d in ${LIBS//:/ } /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64; do
        f="$(ls "$d"/lib$lib.so.* 2>/dev/null | grep -v alt | head -n 1)"
        if [ -n "$f" ] && [ ! -e "$SHIM/lib$lib.so" ]; then ln -sf "$f" "$SHIM/lib$lib.so"; fi
    done
done
export LD_LIBRARY_PATH="$SHIM:$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step() { # name, seconds, command...
    local name="$1" secs="$2"
    shift 2
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 10 ]; then
        echo "$name skipped: the script's deadline has passed" | tee -a "$OUT/steps.txt" >&2
        return
    fi
    [ "$secs" -le "$left" ] || secs=$left
    local t0=$SECONDS
    timeout "$secs" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt" >&2
    # Why a step failed reaches the caller even when only stdout comes back.
    if [ "$rc" -ne 0 ]; then tail -n 5 "$OUT/$name.err" | sed "s/^/  $name: /" >&2; fi
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } >"$OUT/device.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" >>"$OUT/device.txt" 2>&1
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$OUT/device.txt"

# The CPU's side of the training comparison (step 7) needs no GPU: it runs in the
# background from the start (6 threads, lowered priority: the GPU steps' hosts keep ten
# cores), so the deadline cannot cut it as the last step.
(
    t0=$SECONDS
    RAYON_NUM_THREADS=6 timeout 300 nice -n 10 "$RUNNER" --device cpu train --compare bf16,fp8 --steps 30 \
        --format json -o "$OUT/train-cpu.json" >"$OUT/train-cpu.out" 2>"$OUT/train-cpu.err"
    echo "train-cpu rc=$? $((SECONDS - t0)) s (in the background)" >>"$OUT/steps.txt"
) &
TRAIN_CPU=$!

step kernels 150 "$RUNNER" --device "$DEVICE" bench kernels --format json -o "$OUT/kernels.json"
for dt in bf16 fp8 f32; do
    step "gemm-$dt" 90 "$RUNNER" --device "$DEVICE" bench gemm --dtype "$dt" --sizes "$SIZES" --format json -o "$OUT/gemm-$dt.json"
done
step memory 60 "$RUNNER" --device "$DEVICE" bench memory --format json -o "$OUT/memory.json"
step torch-ref 120 python3 scripts/gpu/torch_reference.py --sizes "$SIZES"
[ -n "${SKIP_LAYER:-}" ] || step layer 180 "$RUNNER" --device "$DEVICE" bench layer --seq 2048 --batch 1 --repeats 5 --format json -o "$OUT/layer.json"
[ -n "${SKIP_LAYER:-}" ] || step torch-layer 150 python3 host/exec/benches/pytorch_llama_step.py --device cuda --layers 1 --hidden 4096 \
    --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 --seq 2048 --batch 1 --warmup 2 --repeats 5 --threads 16
# The same step recorded once as a CUDA graph and replayed, at a small shape where launch
# overhead counts: eager against graph, and the replays' losses equal the eager ones
# (within 1e-5; bit for bit unless the embedding gradient's atomic adds reorder).
[ "$DEVICE" != cuda ] || step layer-graph 120 "$RUNNER" --device "$DEVICE" bench layer --seq 32 --batch 1 --repeats 20 --cuda-graph --format json -o "$OUT/layer-graph.json"
# The same under Muon: its Newton-Schulz norms and learning rate are read on the device,
# so the recorded step holds the whole optimizer.
[ "$DEVICE" != cuda ] || step layer-graph-muon 90 "$RUNNER" --device "$DEVICE" bench layer --seq 32 --batch 1 --repeats 5 --cuda-graph --optimizer muon --format json -o "$OUT/layer-graph-muon.json"
step collectives 90 "$RUNNER" --device "$DEVICE" bench collectives -b 8M -e 256M -f 4 --format json -o "$OUT/collectives.json"
# The lent machine is an H200; MEASURE_GPU names another GPU's profile.
for p in bf16 fp8; do
    step "measure-$p" 180 "$RUNNER" --device "$DEVICE" measure --model llama3.1-8b --gpu "${MEASURE_GPU:-h200}" --precision "$p" \
        --seq-len 4096 --repeats 5 --format json -o "$OUT/ops-$p.json"
    step "calibrate-$p" 30 "$RUNNER" calibrate --ops "$OUT/ops-$p.json" --format json -o "$OUT/ops-fit-$p.json"
done
# FP8 training: on the GPU, per-tensor FP8 linears run on cuBLASLt FP8 GEMMs (the native
# route); the CPU emulates the same values. The losses must agree (accumulation order
# differs, so not bit for bit): the first step's (same weights, same batch) closely, the
# held-out loss after 30 steps within 1 %; and the GPU's FP8 run must have used FP8 GEMMs.
step train-device 120 "$RUNNER" --device "$DEVICE" train --compare bf16,fp8 --steps 30 --format json -o "$OUT/train-device.json"
wait "$TRAIN_CPU"

python3 - "$OUT" "$DEVICE" <<'PY'
import json, os, sys, datetime
out, device = sys.argv[1], sys.argv[2]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception as e:
        return None
def last_json(name):
    try:
        lines = [l for l in open(os.path.join(out, name)).read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1])
    except Exception:
        return None
rows = []
def add(what, got, target, ok):
    rows.append((what, got, target, "met" if ok else ("FAILED" if ok is False else "n/a")))
def section(name, target):
    """Run one part of the summary; a missing key or a null figure (a NaN loss is written
    as null) fails that row, not the table."""
    def wrap(fn):
        try:
            fn()
        except Exception as e:
            add(name, f"summary error: {e!r}"[:90], target, False)
        return fn
    return wrap
@section("kernels vs CPU backend", "all")
def kernels():
    k = load("kernels.json")
    if k:
        bad = [r["kernel"] for r in k if not r["ok"]]
        add("kernels vs CPU backend", f"{len(k) - len(bad)}/{len(k)} within tolerance" + (f" (failed: {', '.join(bad[:4])})" if bad else ""), "all", not bad)
    else:
        add("kernels vs CPU backend", "did not run (see kernels.err)", "all", False)
ref = last_json("torch-ref.out")
@section("GEMM vs torch", ">= 95% of torch")
def gemm():
    for dt in ("bf16", "fp8-e4m3", "f32"):
        g = load(f"gemm-{'fp8' if dt.startswith('fp8') else dt}.json")
        if isinstance(g, dict):
            g = g.get("gemm", [])
        for r in (g or []):
            r.setdefault("tflops", r.get("gflops", 0.0) / 1e3)
            t = next((x for x in (ref or {}).get("gemm", []) if x["n"] == r["m"] and x["dtype"] == dt), None)
            if t:
                frac = r["tflops"] / t["tflops"]
                add(f"GEMM {dt} {r['m']}^3", f"{r['tflops']:.0f} vs torch {t['tflops']:.0f} TFLOP/s ({100*frac:.0f}%)", ">= 95% of torch" if dt != "f32" else "info", frac >= 0.95 if dt != "f32" else None)
            else:
                add(f"GEMM {dt} {r['m']}^3", f"{r['tflops']:.0f} TFLOP/s (no torch figure)", ">= 95% of torch", None)
@section("HBM copy and memory-bound kernels", ">= 80% of copy")
def memory():
    m = load("memory.json")
    if not m:
        add("HBM copy and memory-bound kernels", "did not run (see memory.err)", ">= 80% of copy", False)
        return
    copy = m[0]["gbps"]
    tc = (ref or {}).get("memory", {}).get("gbps")
    add("HBM copy", f"{copy:.0f} GB/s" + (f" (torch {tc:.0f})" if tc else ""), "info", None)
    for r in m[1:]:
        add(r["kernel"], f"{r['gbps']:.0f} GB/s ({100*r['gbps']/copy:.0f}% of copy)", ">= 80% of copy", r["gbps"] / copy >= 0.8)
@section("Llama 3.1 8B layer step (f32)", "<= 1.3x torch")
def layer():
    l = load("layer.json")
    tl = last_json("torch-layer.out")
    if l and tl:
        ours, theirs = l["measured"]["timing"]["step"]["median"], tl["step"]["median"]
        add("Llama 3.1 8B layer step (f32)", f"{ours*1e3:.0f} ms vs torch {theirs*1e3:.0f} ms ({ours/theirs:.2f}x)", "<= 1.3x torch", ours / theirs <= 1.3)
    else:
        add("Llama 3.1 8B layer step (f32)", "did not run (see layer.err / torch-layer.err)", "<= 1.3x torch", False)
def graph_row(name, what):
    lg = load(f"{name}.json")
    if lg and lg.get("cuda_graph"):
        e, gr = lg["measured"]["timing"]["step"]["median"], lg["cuda_graph"]["timing"]["step"]["median"]
        same, bits = lg.get("cuda_graph_losses_equal"), lg.get("cuda_graph_losses_bitwise")
        add(what, f"{gr*1e3:.2f} ms vs eager {e*1e3:.2f} ms ({e/gr:.2f}x); losses {('equal bit for bit' if bits else 'equal within 1e-5') if same else 'DIFFER'}", "losses equal, not slower", bool(same) and gr <= e)
    else:
        add(what, f"did not run (see {name}.err)", "losses equal, not slower", False)
@section("layer step (seq 32) replayed as one CUDA graph", "losses equal, not slower")
def graph():
    graph_row("layer-graph", "layer step (seq 32) replayed as one CUDA graph")
    graph_row("layer-graph-muon", "layer step (seq 32, Muon) replayed as one CUDA graph")
@section("train bf16/fp8 vs CPU", "<= 1%")
def train():
    td, tc = load("train-device.json"), load("train-cpu.json")
    if td and tc:
        for a, b in zip(td["runs"], tc["runs"]):
            if a["policy"] != b["policy"]:
                add("train vs CPU", f"runs out of order: {a['policy']} vs {b['policy']}", "same policies", False)
                continue
            # The first step: the same weights and batch, so only summation order (and,
            # for FP8, the tensor cores' accumulation) differs.
            first, tol = (a["train"][0]["loss"], b["train"][0]["loss"]), (1e-4 if a["policy"] == "bf16" else 1e-3)
            if None in first:
                add(f"train {a['policy']} first-step loss vs CPU", f"{first[0]} vs {first[1]} (not finite)", f"<= {tol:g}", False)
            else:
                d = abs(first[0] / first[1] - 1)
                add(f"train {a['policy']} first-step loss vs CPU", f"{first[0]:.6f} vs {first[1]:.6f} ({d:.1e})", f"<= {tol:g}", d <= tol)
            if device == "cuda" and a["policy"] == "fp8":
                n = a.get("native_fp8_gemms", 0)
                add("train fp8 on FP8 GEMMs (native route)", f"{n} GEMMs on FP8 codes, {a.get('fused_fp8_casts', 0)} operands cast by their producer", "> 0", n > 0)
            x, y = a["final_eval_loss"], b["final_eval_loss"]
            if x is None or y is None:  # a NaN loss is written as null
                add(f"train {a['policy']} 30 steps, held-out loss vs CPU", f"{x} vs {y} (not finite)", "<= 1%", False)
                continue
            d = abs(x / y - 1)
            add(f"train {a['policy']} 30 steps, held-out loss vs CPU", f"{x:.4f} vs {y:.4f} ({100*d:.2f}%)", "<= 1%", d <= 0.01)
    else:
        add("train bf16/fp8 vs CPU", "did not run (see train-device.err / train-cpu.err)", "<= 1%", False)
@section("NCCL collectives", "runs, 0 wrong")
def collectives():
    c = load("collectives.json")
    wrong = sum(r["wrong"] for r in c) if c else 0
    add("NCCL collectives", f"{len(c)} rows, {wrong} wrong values (all-reduce checked as started: second stream)" if c else "did not run (see collectives.err)", "runs, 0 wrong", bool(c) and wrong == 0)
for p in ("bf16", "fp8"):
    @section(f"per-op times, {p} (measure, calibrate --ops)", "runs")
    def ops():
        o, f = load(f"ops-{p}.json"), load(f"ops-fit-{p}.json")
        if o and f and f.get("ops"):
            fit = f["ops"]
            params = ", ".join(f"{n} {b:.3g} -> {a:.3g}" for n, b, a in fit["params"])
            got = f"{len(o['ops'])} ops; {params}; median error {100*fit['before']['median']:.0f}% -> {100*fit['after']['median']:.0f}%"
            add(f"per-op times, {p} (measure, calibrate --ops)", got, "info", None)
        else:
            add(f"per-op times, {p} (measure, calibrate --ops)", f"did not run (see measure-{p}.err / calibrate-{p}.err)", "runs", False)
dev = open(os.path.join(out, "device.txt")).read().splitlines()
head = f"GPU check, {datetime.date.today()}, {dev[0] if dev else 'unknown device'}"
w = [max(len(str(r[i])) for r in rows + [("check", "result", "target", "status")]) for i in range(4)]
lines = [head, ""] + ["| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) + " |" for r in [("check", "result", "target", "status"), tuple("-" * x for x in w)] + rows]
text = "\n".join(lines)
open(os.path.join(out, "summary.md"), "w").write(text + "\n")
print(text)
PY
# Everything in one file beside OUT, for tools that bring back few files.
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null && echo "bundle: $OUT.tgz" >&2
