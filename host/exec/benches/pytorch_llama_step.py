#!/usr/bin/env python3
"""PyTorch eager baseline for `cargo run --release -p runner-exec --example llama_step`.

The same training step as the Rust executor's benchmark model (`toy::ToyConfig::bench`):
a Llama-style decoder, 4 layers, hidden 256, 8 query heads over 2 KV heads (head dim
32), SwiGLU FFN 688, sequence 256, batch 8, vocabulary 8192, untied lm_head, mean
cross-entropy, AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1) on every
weight. f32, eager mode (no torch.compile), CPU, 2 threads by default.

Shapes (B batch, T sequence, C hidden, H heads, Hkv kv heads, D head dim, F ffn, V vocab):

    tokens (B,T) -> embed (V,C) -> [RMSNorm, q (H*D,C), k/v (Hkv*D,C), rotate-half
    RoPE (theta 500000), causal GQA SDPA, o (C,H*D), +residual, RMSNorm, SwiGLU
    gate/up (F,C), down (C,F), +residual] x L -> RMSNorm -> lm_head (V,C) -> CE

Weights start as the Rust executor's do: N(0, 0.02^2) matrices, norm gains 1 (different
random streams, same distribution). The parameter count is printed; it must equal the
Rust example's `params` line.

Timing: `--warmup` untimed steps, then `--repeats` timed steps, each split into forward
(to the loss), backward (`loss.backward()`) and optimizer (`opt.step()` +
`zero_grad(set_to_none=True)`); the step is their sum (measured as one interval).
Prints median / p10 / p90 (linear interpolation, as runner_exec::timing::Stat) and a
final JSON line.

    python3 host/exec/benches/pytorch_llama_step.py [--repeats 10] [--threads 2]

On a GPU (`--device cuda`, for `runner bench layer --device cuda`; scripts/gpu-check.sh
runs it with the Llama 3.1 8B layer's shapes), every interval is bracketed by
`torch.cuda.synchronize()`, TF32 is off (the runner's f32 GEMMs are exact f32), and the
optimizer is PyTorch's default for CUDA tensors (foreach).
"""

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def quantile(xs, p):
    """Linear interpolation between order statistics (runner_exec::timing::Stat::of)."""
    v = sorted(xs)
    pos = p * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def stat(xs):
    return {
        "median": quantile(xs, 0.5),
        "p10": quantile(xs, 0.1),
        "p90": quantile(xs, 0.9),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        # out = x * rsqrt(mean(x^2) + eps) * w, as kernels/src/cpu/norm.rs
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(t, d, theta):
    """cos, sin (T, D) for rotate-half RoPE (HF Llama), computed in f64 like rope.rs."""
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Block(nn.Module):
    def __init__(self, c, h, hkv, f):
        super().__init__()
        self.h, self.hkv, self.d = h, hkv, c // h
        self.attn_norm = RMSNorm(c)
        self.q = nn.Linear(c, h * self.d, bias=False)
        self.k = nn.Linear(c, hkv * self.d, bias=False)
        self.v = nn.Linear(c, hkv * self.d, bias=False)
        self.o = nn.Linear(h * self.d, c, bias=False)
        self.mlp_norm = RMSNorm(c)
        self.gate = nn.Linear(c, f, bias=False)
        self.up = nn.Linear(c, f, bias=False)
        self.down = nn.Linear(f, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        n = self.attn_norm(x)
        # (B,T,H,D) -> (B,H,T,D)
        q = self.q(n).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(n).view(b, t, self.hkv, self.d).transpose(1, 2)
        v = self.v(n).view(b, t, self.hkv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, c))
        n = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(n)) * self.up(n))


class Llama(nn.Module):
    def __init__(self, layers, c, h, hkv, f, vocab, t, theta):
        super().__init__()
        self.embed = nn.Embedding(vocab, c)
        self.layers = nn.ModuleList(Block(c, h, hkv, f) for _ in range(layers))
        self.final_norm = RMSNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        cos, sin = rope_tables(t, c // h, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=688)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = Llama(
        args.layers, args.hidden, args.heads, args.kv_heads, args.ffn,
        args.vocab, args.seq, args.rope_theta,
    ).to(dev)
    params = sum(p.numel() for p in model.parameters())
    # PyTorch's defaults: the single-tensor loop adamw.rs mirrors on CPU tensors, the
    # fused-over-tensors (foreach) path on CUDA ones.
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
    )
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev)

    def now():
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    where = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
             else f"{torch.get_num_threads()} threads, MKL {torch.backends.mkl.is_available()}")
    print(f"torch       {torch.__version__}, {where}, f32 eager")
    print(f"params      {params}")

    fwd, bwd, optim, step, losses = [], [], [], [], []
    for i in range(args.warmup + args.repeats):
        t0 = now()
        loss = model(tokens, targets)
        t1 = now()
        loss.backward()
        t2 = now()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = now()
        if i >= args.warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            optim.append(t3 - t2)
            step.append(t3 - t0)
            losses.append(loss.item())

    s = {k: stat(v) for k, v in
         (("step", step), ("forward", fwd), ("backward", bwd), ("optimizer", optim))}
    fmt = lambda x: f"median {x['median']:.4f} s (p10 {x['p10']:.4f}, p90 {x['p90']:.4f})"
    print(f"step        {fmt(s['step'])}")
    print(f"  forward   {fmt(s['forward'])}")
    print(f"  backward  {fmt(s['backward'])}")
    print(f"  optimizer {fmt(s['optimizer'])}")
    print(f"losses      {[round(x, 4) for x in losses]}")
    print(json.dumps({
        "impl": "pytorch-eager",
        "device": args.device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "params": params,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "loadavg": os.getloadavg(),
        **s,
    }))


if __name__ == "__main__":
    main()
