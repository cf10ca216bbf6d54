use runner_kernels::cpu::{matmul::*, attention::*, norm::*, loss::*, activation::*};
use std::time::Instant;
fn t<F: FnMut()>(name: &str, flops: f64, mut f: F) {
    f();
    let s = Instant::now(); let n = 3; for _ in 0..n { f(); }
    let dt = s.elapsed().as_secs_f64() / n as f64;
    println!("{name}: {:.2} ms, {:.1} GFLOP/s", dt * 1e3, flops / dt / 1e9);
}
#[test]
fn perf() {
    let n = 1024;
    let a: Vec<f32> = (0..n*n).map(|i| (i % 7) as f32 * 0.1).collect();
    let b = a.clone(); let mut c = vec![0.0; n*n];
    t("matmul 1024^3", 2.0*(n*n*n) as f64, || matmul(&mut c, &a, &b, Gemm{m:n,n:n,k:n,trans_a:false,trans_b:true}, false).unwrap());
    t("matmul 1024^3 ta", 2.0*(n*n*n) as f64, || matmul(&mut c, &a, &b, Gemm{m:n,n:n,k:n,trans_a:true,trans_b:false}, true).unwrap());
    let at = Attn{b:1,t:2048,h:8,hkv:2,d:64,dv:64,causal:true,window:None,scale:0.125};
    let q: Vec<f32> = (0..2048*8*64).map(|i| ((i*37%101) as f32 - 50.0)*0.01).collect();
    let k: Vec<f32> = (0..2048*2*64).map(|i| ((i*53%97) as f32 - 48.0)*0.01).collect();
    let v = k.clone();
    let mut o = vec![0.0; q.len()]; let mut l = vec![0.0; 2048*8];
    let fl = 8.0*2048.0*2048.0/2.0*64.0*4.0;
    t("attn fwd T=2048 H=8 D=64", fl, || attention_forward(&mut o, &mut l, &q, &k, &v, at).unwrap());
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    t("attn bwd", 2.5*fl, || attention_backward(&mut dq, &mut dk, &mut dv, &o, &q, &k, &v, &o, &l, at).unwrap());
    let x: Vec<f32> = (0..4096*4096).map(|i| (i%13) as f32 * 0.1).collect();
    let mut out = vec![0.0; x.len()]; let mut rs = vec![0.0; 4096]; let w = vec![1.0; 4096];
    t("rmsnorm 4096x4096 (GB/s as GFLOP)", 8.0*x.len() as f64, || rmsnorm_forward(&mut out, &mut rs, &x, &w, 4096, 1e-5).unwrap());
    let mut dx = vec![0.0; x.len()]; let mut dw = vec![0.0; 4096];
    t("rmsnorm bwd", 12.0*x.len() as f64, || rmsnorm_backward(&mut dx, &mut dw, &x, &x, &w, &rs, 4096).unwrap());
    t("gelu 16M", x.len() as f64, || gelu_forward(&mut out, &x).unwrap());
    let tg: Vec<u32> = (0..128).map(|i| i * 7).collect();
    let lg = &x[..128*32768];
    let (mut ls, mut lz) = (vec![0.0; 128], vec![0.0; 128]);
    t("xent 128x32768 (Gelem/s)", lg.len() as f64, || { cross_entropy_forward(&mut ls, &mut lz, lg, &tg, 32768).unwrap(); });
}
