//! What the runner measures on the local device before it projects.
//!
//! Until the executor runs a real training step here, the measurement is the local CPU's
//! f32 GEMM throughput (faer, all threads), reported for context and labelled as such:
//! it does not feed the projection.

use std::time::Instant;

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct LocalMeasurement {
    pub device: String,
    pub what: String,
    pub gflops: f64,
    pub threads: usize,
}

/// Median f32 GEMM GFLOP/s at n x n x n over `reps` runs after one warm-up.
pub fn cpu_gemm_gflops(n: usize, reps: usize) -> LocalMeasurement {
    let a = Mat::<f32>::from_fn(n, n, |i, j| ((i * 7 + j * 3) % 11) as f32 * 0.1);
    let b = Mat::<f32>::from_fn(n, n, |i, j| ((i * 5 + j) % 13) as f32 * 0.1);
    let mut c = Mat::<f32>::zeros(n, n);
    let threads = rayon::current_num_threads();
    let par = if threads > 1 { Par::rayon(threads) } else { Par::Seq };
    let mut times = Vec::with_capacity(reps);
    for i in 0..=reps {
        let t = Instant::now();
        matmul(c.as_mut(), Accum::Replace, a.as_ref(), b.as_ref(), 1.0f32, par);
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    LocalMeasurement {
        device: "cpu".into(),
        what: format!("f32 GEMM {n}x{n}x{n}, median of {reps}"),
        gflops: 2.0 * (n as f64).powi(3) / median / 1e9,
        threads,
    }
}
