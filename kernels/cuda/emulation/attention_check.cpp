// The attention kernels (kernels/cuda/attention.cu, with the real common.cuh) run under
// emu.h against a double-precision reference of runner-kernels' cpu/attention.rs
// semantics: grouped-query heads, causal and sliding-window masks on global positions,
// context-parallel ranks (the two-chunk layout, K/V gathered in rank order), a value head
// dim unlike the key's. Launched as the CUDA backend launches them (host/exec/src/cuda:
// 128 threads, 16 query rows or keys a block, 32-row tiles). Prints one line per shape
// and exits non-zero when any output is off by more than 1e-4 (relative to 1 + |x|).
#include "emu.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "attention_emu.cu"
#include "emu_runtime.h"

struct Case {
    i64 b, t, h, hkv, d, dv;
    bool causal;
    i64 window;  // 0: none
    float scale;
    i64 cp, rank;  // cp 0: none
};

static i64 kv_len(const Case& a) { return a.cp ? a.cp * a.t : a.t; }
static i64 chunk_pos(i64 cp, i64 rank, i64 t, i64 i) {
    const i64 c = t / 2, chunk = i < c ? rank : 2 * cp - 1 - rank;
    return chunk * c + i % c;
}
static i64 q_global(const Case& a, i64 i) { return a.cp ? chunk_pos(a.cp, a.rank, a.t, i) : i; }
static i64 k_global(const Case& a, i64 j) { return a.cp ? chunk_pos(a.cp, j / a.t, a.t, j % a.t) : j; }
// cpu/attention.rs's keys(): causal i - w < j <= i; otherwise |i - j| < w (or all).
static bool sees(const Case& a, i64 i, i64 j) {
    const i64 tk = kv_len(a);
    const i64 lo = a.window ? std::max<i64>(0, i + 1 - a.window) : 0;
    const i64 hi = a.causal ? i + 1 : (a.window ? std::min(i + a.window, tk) : tk);
    return j >= lo && j < hi;
}

static double worst(const std::vector<float>& got, const std::vector<double>& want) {
    double m = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double e = fabs(got[i] - want[i]) / (1 + fabs(want[i]));
        if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    }
    return m;
}

static int run(const Case& a) {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0, 1);
    const i64 tk = kv_len(a), group = a.h / a.hkv;
    auto draw = [&](size_t n, float std) {
        std::vector<float> v(n);
        for (auto& x : v) x = std * normal(rng);
        return v;
    };
    auto q = draw(a.b * a.t * a.h * a.d, 2), k = draw(a.b * tk * a.hkv * a.d, 1), v = draw(a.b * tk * a.hkv * a.dv, 1),
         go = draw(a.b * a.t * a.h * a.dv, 1);
    auto Q = [&](i64 b, i64 i, i64 h) { return &q[((b * a.t + i) * a.h + h) * a.d]; };
    auto K = [&](i64 b, i64 j, i64 g) { return &k[((b * tk + j) * a.hkv + g) * a.d]; };
    auto V = [&](i64 b, i64 j, i64 g) { return &v[((b * tk + j) * a.hkv + g) * a.dv]; };
    std::vector<double> out(a.b * a.t * a.h * a.dv, 0), lse(a.b * a.h * a.t), dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0);
    for (i64 b = 0; b < a.b; b++)
        for (i64 h = 0; h < a.h; h++)
            for (i64 i = 0; i < a.t; i++) {
                const i64 g = h / group;
                std::vector<double> s(tk, -INFINITY), p(tk, 0);
                double m = -INFINITY, z = 0;
                for (i64 j = 0; j < tk; j++)
                    if (sees(a, q_global(a, i), k_global(a, j))) {
                        double dot = 0;
                        for (i64 c = 0; c < a.d; c++) dot += (double)Q(b, i, h)[c] * K(b, j, g)[c];
                        s[j] = dot * a.scale;
                        m = std::max(m, s[j]);
                    }
                for (i64 j = 0; j < tk; j++)
                    if (s[j] > -INFINITY) z += exp(s[j] - m);
                lse[(b * a.h + h) * a.t + i] = m + log(z);
                for (i64 j = 0; j < tk; j++)
                    if (s[j] > -INFINITY) p[j] = exp(s[j] - m) / z;
                double* o = &out[((b * a.t + i) * a.h + h) * a.dv];
                for (i64 j = 0; j < tk; j++)
                    for (i64 c = 0; c < a.dv; c++) o[c] += p[j] * V(b, j, g)[c];
                const float* gy = &go[((b * a.t + i) * a.h + h) * a.dv];
                double delta = 0;
                for (i64 c = 0; c < a.dv; c++) delta += gy[c] * o[c];
                for (i64 j = 0; j < tk; j++) {
                    if (p[j] == 0) continue;
                    double dp = 0;
                    for (i64 c = 0; c < a.dv; c++) dp += gy[c] * V(b, j, g)[c];
                    const double ds = p[j] * (dp - delta);
                    for (i64 c = 0; c < a.dv; c++) dv[((b * tk + j) * a.hkv + g) * a.dv + c] += p[j] * gy[c];
                    for (i64 c = 0; c < a.d; c++) {
                        dq[((b * a.t + i) * a.h + h) * a.d + c] += a.scale * ds * K(b, j, g)[c];
                        dk[((b * tk + j) * a.hkv + g) * a.d + c] += a.scale * ds * Q(b, i, h)[c];
                    }
                }
            }
    Shape s{a.b, a.t, tk, (int)a.h, (int)a.hkv, (int)a.d, (int)a.dv, (int)a.causal, (int)a.window, a.scale,
            (int)(a.cp ? a.cp : 1), (int)a.rank};
    // Outputs start as NaN: an element no thread writes shows.
    std::vector<float> o(out.size(), NAN), l(lse.size(), NAN), gq(q.size(), NAN), gk(k.size(), NAN), gv(v.size(), NAN),
        delta(lse.size(), NAN);
    const unsigned qt = (unsigned)((a.t + 15) / 16), kt = (unsigned)((tk + 15) / 16), H = a.h, Hkv = a.hkv, B = a.b;
    const size_t dp = a.d | 1, vp = a.dv | 1;
    launch({qt, H, B}, 128, 16 * dp + 32 * dp + 32 * vp, [&] { attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), s); });
    launch({(unsigned)std::max<i64>(1, (a.b * a.t * a.h + 3) / 4), 1, 1}, 128, 0,
           [&] { attention_backward_delta(delta.data(), go.data(), o.data(), s); });
    launch({qt, H, B}, 128, 16 * dp + 16 * vp + 32 * dp + 32 * vp, [&] {
        attention_backward_dq(gq.data(), go.data(), q.data(), k.data(), v.data(), l.data(), delta.data(), s);
    });
    launch({kt, Hkv, B}, 128, 32 * dp + 32 * vp + 16 * dp + 16 * vp, [&] {
        attention_backward_dkdv(gk.data(), gv.data(), go.data(), q.data(), k.data(), v.data(), l.data(), delta.data(), s);
    });
    const double e[5] = {worst(o, out), worst(l, lse), worst(gq, dq), worst(gk, dk), worst(gv, dv)};
    const bool ok = *std::max_element(e, e + 5) <= 1e-4;
    printf("%s b%lld t%lld h%lld/%lld d%lld dv%lld causal %d window %lld cp %lld rank %lld: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
           ok ? "ok    " : "FAILED", a.b, a.t, a.h, a.hkv, a.d, a.dv, a.causal, a.window, a.cp, a.rank, e[0], e[1], e[2], e[3], e[4]);
    return ok ? 0 : 1;
}

int main() {
    const std::vector<Case> cases = {
        {1, 1, 1, 1, 4, 4, true, 0, 0.5f, 0, 0},             // a row shorter than a tile
        {2, 7, 6, 2, 8, 8, true, 0, 0.35f, 0, 0},            // GQA, batch 2
        {1, 7, 6, 1, 5, 3, false, 0, 0.45f, 0, 0},           // MQA, not causal, odd dims
        {2, 13, 6, 6, 16, 24, true, 4, 0.25f, 0, 0},         // causal window, dv > d
        {1, 70, 2, 1, 8, 8, true, 0, 0.35f, 0, 0},           // partial tiles, skipped tiles
        {1, 100, 2, 2, 8, 4, false, 30, 0.35f, 0, 0},        // a window both ways
        {1, 70, 2, 1, 192, 128, true, 0, 0.07f, 0, 0},       // MLA's head dims
        {1, 33, 2, 2, 256, 256, true, 0, 0.0625f, 0, 0},     // the largest head dim
        {1, 35, 2, 2, 33, 31, true, 1, 0.2f, 0, 0},          // window 1: only itself
        {2, 6, 4, 2, 8, 8, true, 0, 0.35f, 2, 1},            // cp rank 1 of 2
        {1, 2, 2, 1, 4, 4, true, 0, 0.5f, 2, 1},             // cp chunks of one row
        {1, 10, 6, 3, 5, 3, true, 4, 0.45f, 3, 1},           // cp 3, a window
        {1, 6, 2, 2, 6, 10, true, 7, 0.4f, 4, 3},            // cp 4, last rank
        {1, 14, 2, 1, 4, 4, false, 9, 0.5f, 2, 1},           // cp, not causal
        {1, 64, 2, 1, 16, 16, true, 20, 0.25f, 2, 0},        // cp, a window, skipped tiles
    };
    int failed = 0;
    for (const auto& c : cases) failed += run(c);
    printf("%d of %zu shapes failed\n", failed, cases.size());
    return failed ? 1 : 0;
}
