//! Communication: what each collective of a sharded graph moves ([`comm_volume`], in
//! nccl-tests' conventions) and how long it takes on a cluster ([`Fabric::time`]).
//!
//! Sizes follow nccl-tests (github:NVIDIA/nccl-tests doc/PERFORMANCE.md): S is the buffer for all-reduce, the
//! gathered output for all-gather, the full input for reduce-scatter, the per-rank send
//! total for all-to-all and the message for send/recv; bus bytes = S × the bus factor
//! (AR 2(n−1)/n, AG/RS/A2A (n−1)/n, send/recv 1).
//!
//! Time is an α–β model per tier. A group whose ranks all sit in one scale-up (NVLink)
//! domain runs at the domain's per-GPU bandwidth. A group that spans domains runs NCCL's
//! flat rings, one per NIC (rail-optimised fabric), so its bus bandwidth is
//! min(NVLink, members-per-domain × NIC) (SimAI's `calbusbw`, github:aliyun/SimAI). An
//! all-to-all has no ring to spread over the NICs: the share of its bytes bound for other
//! domains leaves through the rank's own NIC, at the all-to-all's own achieved NIC rate
//! (many peers at once and incast at each receiver reach less of the link than a ring).
//! Latency grows with log2 of the ranks
//! (NCCL's tree and ring latencies are within a factor of two of this at the sizes a
//! training step moves).
//!
//! Group placement follows Megatron's rank order (tp fastest, then cp, dp, pp; for
//! expert layers etp, ep, edp, pp): a group is described by the stride between its
//! ranks and its size ([`Placement`]).

use serde::Serialize;

use runner_graph::{Graph, OpKind, TensorId};
use runner_graph::shard::all_gather_backward_reduces;

/// One collective of a sharded graph, sized for the nccl-tests bus-bandwidth model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommOp {
    /// The op's name in the sharded graph.
    pub op: String,
    pub kind: OpKind,
    pub group: String,
    pub group_size: u32,
    /// nccl-tests S per rank: the buffer for all-reduce, the gathered output for
    /// all-gather, the full input for reduce-scatter, the per-rank send total for
    /// all-to-all, the message for send/recv.
    pub bytes: f64,
    /// busbw/algbw: AR 2(n−1)/n, AG/RS/A2A (n−1)/n, send/recv 1.
    pub bus_factor: f64,
    /// The collective of equal size the backward pass runs for this one (AR ↔ the AR of
    /// a column-parallel input gradient, AG ↔ RS, A2A ↔ A2A, send ↔ recv); `None` for
    /// the loss statistics and for an all-gather read by replicated ops, whose backward
    /// is local ([`all_gather_backward_reduces`]).
    pub backward: Option<OpKind>,
    pub layer: i32,
}

impl CommOp {
    /// Bytes each rank puts on the wire: S·bus_factor.
    pub fn bus_bytes(&self) -> f64 {
        self.bytes * self.bus_factor
    }
}

/// nccl-tests bus-bandwidth factor of `kind` over `n` ranks.
pub fn bus_factor(kind: OpKind, n: u32) -> f64 {
    let n = f64::from(n.max(1));
    match kind {
        OpKind::AllReduce => 2.0 * (n - 1.0) / n,
        OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// Every collective of a sharded graph, in execution order, sized per rank.
pub fn comm_volume(g: &Graph) -> Vec<CommOp> {
    g.ops
        .iter()
        .filter_map(|op| {
            let c = collective(g, op)?;
            Some(CommOp {
                op: op.name.clone(),
                kind: op.kind,
                group: c.group.to_string(),
                group_size: c.group_size,
                bytes: c.bytes,
                bus_factor: bus_factor(op.kind, c.group_size),
                backward: c.backward,
                layer: op.layer,
            })
        })
        .collect()
}

/// What [`comm_volume`] lists for one op, borrowed from it (none for an op that is no
/// collective): its group, the group's size, the bytes S of one call and its backward
/// twin.
pub(crate) struct Collective<'g> {
    pub group: &'g str,
    pub group_size: u32,
    pub bytes: f64,
    pub backward: Option<OpKind>,
}

pub(crate) fn collective<'g>(g: &Graph, op: &'g runner_graph::Op) -> Option<Collective<'g>> {
    let bytes =
        |id: Option<&TensorId>| id.and_then(|&i| g.tensors.get(i)).map_or(0.0, |t| t.numel() as f64 * t.dtype.bytes());
    let n = op.int("group-size").unwrap_or(1).max(1) as u32;
    let stats = op.flag("row-stats").unwrap_or(false);
    let (s, back) = match op.kind {
        OpKind::AllReduce if stats => (bytes(op.outputs.first()), None),
        OpKind::AllReduce => (bytes(op.inputs.first()), Some(OpKind::AllReduce)),
        OpKind::AllGather => (bytes(op.outputs.first()), all_gather_backward_reduces(g, op).then_some(OpKind::ReduceScatter)),
        OpKind::ReduceScatter => (bytes(op.inputs.first()), Some(OpKind::AllGather)),
        OpKind::AllToAll => (bytes(op.inputs.first()), Some(OpKind::AllToAll)),
        OpKind::Send => (bytes(op.inputs.first()), Some(OpKind::Recv)),
        OpKind::Recv => (bytes(op.outputs.first()), Some(OpKind::Send)),
        _ => return None,
    };
    Some(Collective { group: op.text("group").unwrap_or("?"), group_size: n, bytes: s, backward: back })
}

/// Where a group's ranks sit: `size` ranks, `stride` global ranks apart (Megatron's
/// order: a tp group has stride 1, a cp group stride tp, the dense data-parallel group
/// (dp·cp ranks) stride tp, a pipeline group stride tp·cp·dp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub size: u32,
    pub stride: u32,
}

/// The cluster's links as the projection sees them: one scale-up domain size and
/// per-GPU bandwidths (GB/s, one direction) already multiplied by their efficiencies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fabric {
    /// GPUs in one NVLink domain (8 on HGX boards, 72 on NVL72 racks).
    pub domain: u32,
    /// Achieved per-GPU bandwidth inside the domain, bytes/s.
    pub scale_up_bps: f64,
    /// Achieved per-GPU scale-out (NIC) bandwidth, bytes/s: rings and trees (all-reduce,
    /// all-gather, reduce-scatter, send/recv).
    pub scale_out_bps: f64,
    /// Achieved per-GPU NIC bandwidth of an all-to-all's share bound for other domains.
    pub scale_out_a2a_bps: f64,
    /// Latency of one collective step inside a domain and across domains, seconds.
    pub scale_up_latency_s: f64,
    pub scale_out_latency_s: f64,
}

impl Fabric {
    /// Members of a group with this placement that share one domain (1: every member
    /// in a different domain), and whether the whole group fits in one.
    pub fn members_per_domain(&self, p: Placement) -> (u32, bool) {
        let span = u64::from(p.stride) * u64::from(p.size.max(1));
        if span <= u64::from(self.domain) {
            return (p.size.max(1), true);
        }
        let local = if p.stride >= self.domain { 1 } else { (self.domain / p.stride.max(1)).clamp(1, p.size.max(1)) };
        (local, false)
    }

    /// Seconds one call of collective `kind` of nccl-tests size `bytes` takes over a group.
    pub fn time(&self, kind: OpKind, bytes: f64, p: Placement) -> f64 {
        self.time_with(kind, bytes, p, None)
    }

    /// [`Fabric::time`] of `kind` over `p` as a function of the bytes alone, its
    /// placement's tier, latency and bus factor worked out once: the data-parallel
    /// exposure times one placement for every pipeline stage.
    pub fn rate(&self, kind: OpKind, p: Placement) -> Rate<'_> {
        let n = p.size.max(1);
        let (local, inside) = self.members_per_domain(p);
        // Nothing to time for a group of one; the all-to-all across domains splits its
        // bytes by peer and is timed in full.
        let fixed = if n <= 1 || (kind == OpKind::AllToAll && !inside) {
            None
        } else {
            let steps = f64::from(n).log2().ceil().max(1.0);
            let latency = if inside { steps * self.scale_up_latency_s } else { steps * self.scale_out_latency_s };
            let bps = if inside { self.scale_up_bps } else { self.scale_up_bps.min(f64::from(local) * self.scale_out_bps) };
            Some((latency, bus_factor(kind, n), bps))
        };
        Rate { fabric: self, kind, p, fixed }
    }

    /// Seconds of the expert-parallel all-to-all of a routed layer (`top_k` of `experts`
    /// experts per token, balanced routing), as DeepEP's and Megatron's flex dispatchers
    /// move it: a token bound for several experts in one remote scale-up domain crosses
    /// the scale-out network once, to the GPU of the same local index there, which
    /// forwards it over NVLink (the combine reduces inside the domain first and sends
    /// back once). DeepSeek-V3 (arXiv 2412.19437, §3.2.2) describes the scheme;
    /// github:deepseek-ai/DeepEP README ("normal kernels", NVLink-to-RDMA forwarding).
    /// Inside one domain, for top-1, or for other collectives, this is [`Fabric::time`].
    pub fn time_routed(&self, kind: OpKind, bytes: f64, p: Placement, top_k: u32, experts: u32) -> f64 {
        self.time_with(kind, bytes, p, Some((top_k, experts)))
    }

    /// Bytes one call of collective `kind` of nccl-tests size `bytes` moves through each
    /// GPU's NIC per direction, as [`Fabric::time`] and [`Fabric::time_routed`] split it:
    /// none inside one domain; across domains a ring's bus bytes over the `local`
    /// members of a domain whose NICs carry them side by side, or an all-to-all's share
    /// bound for other domains. What shares a host link with the NIC
    /// ([`crate::profile::GpuProfile::nic_shares_host_link`]) loses to it.
    pub fn nic_bytes(&self, kind: OpKind, bytes: f64, p: Placement, routing: Option<(u32, u32)>) -> f64 {
        let n = p.size.max(1);
        let (local, inside) = self.members_per_domain(p);
        if n <= 1 || bytes <= 0.0 || inside {
            return 0.0;
        }
        match kind {
            OpKind::AllToAll => match routing {
                Some((k, e)) if k > 1 => bytes / f64::from(k) * domains_reached(n.div_ceil(local), k, e),
                _ => bytes / f64::from(n) * f64::from(n - local),
            },
            _ => bytes * bus_factor(kind, n) / f64::from(local),
        }
    }

    fn time_with(&self, kind: OpKind, bytes: f64, p: Placement, routing: Option<(u32, u32)>) -> f64 {
        let n = p.size.max(1);
        if n <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let (local, inside) = self.members_per_domain(p);
        let steps = f64::from(n).log2().ceil().max(1.0);
        let latency = if inside {
            steps * self.scale_up_latency_s
        } else {
            steps * self.scale_out_latency_s
        };
        let bus = bytes * bus_factor(kind, n);
        let transfer = match kind {
            OpKind::AllToAll if !inside => {
                // Per rank: (n−1)/n·S leaves; the part for the (local−1) peers in its
                // domain rides NVLink, the rest its NIC: once per remote peer, or, routed,
                // once per remote domain a token's experts reach.
                let per_peer = bytes / f64::from(n);
                let near = per_peer * f64::from(local.saturating_sub(1));
                let far = match routing {
                    Some((k, e)) if k > 1 => bytes / f64::from(k) * domains_reached(n.div_ceil(local), k, e),
                    _ => per_peer * f64::from(n - local),
                };
                near / self.scale_up_bps + far / self.scale_out_a2a_bps
            }
            _ if inside => bus / self.scale_up_bps,
            _ => bus / self.scale_up_bps.min(f64::from(local) * self.scale_out_bps),
        };
        latency + transfer
    }
}

/// One collective over one placement, timed for any bytes as [`Fabric::time`] times it,
/// bit for bit ([`Fabric::rate`]).
#[derive(Clone, Copy, Debug)]
pub struct Rate<'f> {
    fabric: &'f Fabric,
    kind: OpKind,
    p: Placement,
    /// Latency, bus factor and bytes/s where the time is `latency + bytes · factor / bps`.
    fixed: Option<(f64, f64, f64)>,
}

impl Rate<'_> {
    /// Seconds one call of `bytes` takes: [`Fabric::time`]'s.
    #[inline]
    pub fn time(&self, bytes: f64) -> f64 {
        match self.fixed {
            Some(_) if bytes <= 0.0 => 0.0,
            Some((latency, factor, bps)) => latency + bytes * factor / bps,
            None => self.fabric.time(self.kind, bytes, self.p),
        }
    }
}

/// Remote scale-up domains one token reaches when it picks `top_k` of `experts` experts
/// spread evenly over `domains` domains: a token misses a given remote domain with
/// probability P0 = C(E − E/D, k)/C(E, k), so it reaches (D − 1)(1 − P0) of them where a
/// copy per expert would send k(D − 1)/D.
fn domains_reached(domains: u32, top_k: u32, experts: u32) -> f64 {
    let d = f64::from(domains.max(1));
    let (e, k) = (f64::from(experts.max(top_k)), f64::from(top_k));
    // P0 = prod_{i<k} (E − E/D − i)/(E − i); past a few thousand picks (only a plugin's
    // made-up router gets there) the loop would cost more than the step it prices, and
    // drawing with replacement, (1 − 1/D)^k, is as good.
    let miss = if top_k <= 4096 {
        (0..top_k).map(f64::from).map(|i| ((e - e / d - i) / (e - i)).max(0.0)).product::<f64>()
    } else {
        (1.0 - 1.0 / d).powf(k)
    };
    (d - 1.0) * (1.0 - miss)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Fabric {
        Fabric {
            domain: 8,
            scale_up_bps: 450e9,
            scale_out_bps: 50e9,
            scale_out_a2a_bps: 50e9,
            scale_up_latency_s: 0.0,
            scale_out_latency_s: 0.0,
        }
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(bus_factor(OpKind::AllReduce, 8), 1.75);
        assert_eq!(bus_factor(OpKind::AllGather, 4), 0.75);
        assert_eq!(bus_factor(OpKind::AllToAll, 2), 0.5);
        assert_eq!(bus_factor(OpKind::Send, 2), 1.0);
        // No ranks count as one: nothing crosses the bus, not a negative or infinite factor.
        assert_eq!(bus_factor(OpKind::AllReduce, 0), 0.0);
    }

    /// What crosses a GPU's NIC per direction for one call: nothing inside a domain; a
    /// ring's bus bytes over the domain members whose NICs carry them side by side (dp 16
    /// of tp 1 on 8-GPU domains: 8 a domain, (16−1)/16 of the bytes over 8; dp 16 of tp
    /// 8: one a domain, all of them); an all-to-all's share bound for other domains (the
    /// 8 of 16 peers outside, 8/16 of the bytes), which the time's far part moves.
    #[test]
    fn nic_bytes_are_a_gpus_share_of_the_scale_out_traffic() {
        let f = h100();
        let s = 1.6e9;
        assert_eq!(f.nic_bytes(OpKind::AllGather, s, Placement { size: 8, stride: 1 }, None), 0.0);
        assert_eq!(f.nic_bytes(OpKind::AllGather, s, Placement { size: 16, stride: 1 }, None), s * 15.0 / 16.0 / 8.0);
        assert_eq!(f.nic_bytes(OpKind::ReduceScatter, s, Placement { size: 16, stride: 8 }, None), s * 15.0 / 16.0);
        assert_eq!(f.nic_bytes(OpKind::AllReduce, s, Placement { size: 2, stride: 8 }, None), s);
        let a2a = Placement { size: 16, stride: 1 };
        assert_eq!(f.nic_bytes(OpKind::AllToAll, s, a2a, None), s / 2.0);
        let (latency, near) = (4.0 * f.scale_out_latency_s, s / 16.0 * 7.0 / f.scale_up_bps);
        let far = f.time(OpKind::AllToAll, s, a2a) - latency - near;
        assert!((far * f.scale_out_a2a_bps / f.nic_bytes(OpKind::AllToAll, s, a2a, None) - 1.0).abs() < 1e-9, "the time's far part");
        assert_eq!(f.nic_bytes(OpKind::AllGather, s, Placement { size: 1, stride: 8 }, None), 0.0);
    }

    #[test]
    fn placement_picks_the_tier() {
        let f = h100();
        // tp=8 inside one node.
        assert_eq!(f.members_per_domain(Placement { size: 8, stride: 1 }), (8, true));
        // dp over 16 nodes with tp·cp = 8: one member per node.
        assert_eq!(f.members_per_domain(Placement { size: 16, stride: 8 }), (1, false));
        // dp over 64 GPUs with tp = 2: 4 members per node.
        assert_eq!(f.members_per_domain(Placement { size: 32, stride: 2 }), (4, false));
    }

    /// 1 GB all-reduce over 8 GPUs of one node at 450 GB/s: 2·7/8 GB / 450 GB/s.
    /// The same over 16 nodes (one member each): bound by one 50 GB/s NIC; with 8
    /// members per node the 8 rails add up to 400 GB/s.
    #[test]
    fn all_reduce_by_hand() {
        let f = h100();
        let t = f.time(OpKind::AllReduce, 1e9, Placement { size: 8, stride: 1 });
        assert!((t - 1.75e9 / 450e9).abs() < 1e-12);
        let t = f.time(OpKind::AllReduce, 1e9, Placement { size: 16, stride: 8 });
        assert!((t - 2.0 * 15.0 / 16.0 * 1e9 / 50e9).abs() < 1e-12);
        let t = f.time(OpKind::AllReduce, 1e9, Placement { size: 128, stride: 1 });
        assert!((t - 2.0 * 127.0 / 128.0 * 1e9 / 400e9).abs() < 1e-12);
    }

    /// An all-to-all over 16 ranks, 8 per node: 7/16 of S over NVLink, 8/16 over the NIC.
    #[test]
    fn all_to_all_across_nodes_uses_the_nic_for_remote_peers() {
        let f = h100();
        let t = f.time(OpKind::AllToAll, 16e6, Placement { size: 16, stride: 1 });
        assert!((t - (7e6 / 450e9 + 8e6 / 50e9)).abs() < 1e-15);
        // Inside one node it is the plain bus formula.
        let t = f.time(OpKind::AllToAll, 8e6, Placement { size: 8, stride: 1 });
        assert!((t - 7e6 / 450e9).abs() < 1e-15);
    }

    /// DeepSeek-V3's dispatch over 4 HGX nodes (EP32, 256 experts, top-8): a token
    /// reaches 3·(1 − P0) ≈ 2.71 remote nodes instead of 8·3/4 = 6 copies. Top-1, or a
    /// group inside one node, is the plain all-to-all.
    #[test]
    fn routed_all_to_all_sends_once_per_remote_domain() {
        let f = h100();
        let p = Placement { size: 32, stride: 1 };
        let s = 32e6;
        let miss: f64 = (0..8).map(|i| (192.0 - f64::from(i)) / (256.0 - f64::from(i))).product();
        let far = s / 8.0 * 3.0 * (1.0 - miss);
        let want = s / 32.0 * 7.0 / 450e9 + far / 50e9;
        assert!((f.time_routed(OpKind::AllToAll, s, p, 8, 256) - want).abs() < 1e-12);
        assert!(f.time_routed(OpKind::AllToAll, s, p, 8, 256) < 0.5 * f.time(OpKind::AllToAll, s, p));
        assert_eq!(f.time_routed(OpKind::AllToAll, s, p, 1, 256), f.time(OpKind::AllToAll, s, p));
        let node = Placement { size: 8, stride: 1 };
        assert_eq!(f.time_routed(OpKind::AllToAll, s, node, 8, 256), f.time(OpKind::AllToAll, s, node));
        // A hostile router (billions of experts, top-k in the billions) is priced at once.
        let t = f.time_routed(OpKind::AllToAll, s, p, u32::MAX, u32::MAX);
        assert!(t.is_finite() && t > 0.0, "{t}");
    }

    /// The all-to-all's remote share runs at its own NIC rate; rings across nodes, and
    /// the all-to-all's NVLink share, do not see it.
    #[test]
    fn all_to_all_has_its_own_nic_rate() {
        let f = Fabric { scale_out_a2a_bps: 20e9, ..h100() };
        let t = f.time(OpKind::AllToAll, 16e6, Placement { size: 16, stride: 1 });
        assert!((t - (7e6 / 450e9 + 8e6 / 20e9)).abs() < 1e-15);
        let p = Placement { size: 32, stride: 1 };
        let slow = f.time_routed(OpKind::AllToAll, 32e6, p, 8, 256) - 32e6 / 32.0 * 7.0 / 450e9;
        let fast = h100().time_routed(OpKind::AllToAll, 32e6, p, 8, 256) - 32e6 / 32.0 * 7.0 / 450e9;
        assert!((slow / fast - 2.5).abs() < 1e-9, "{slow} vs {fast}");
        let ring = Placement { size: 16, stride: 8 };
        assert_eq!(f.time(OpKind::AllReduce, 1e9, ring), h100().time(OpKind::AllReduce, 1e9, ring));
        assert_eq!(f.time(OpKind::AllToAll, 8e6, Placement { size: 8, stride: 1 }), 7e6 / 450e9);
    }

    /// Latency: one step per doubling of the ranks, ⌈log2 n⌉ (the α term of the module's
    /// α–β model), at the domain's latency inside it and the network's across domains;
    /// an empty buffer costs nothing.
    #[test]
    fn latency_grows_with_log2_of_the_ranks() {
        let f = Fabric { scale_up_bps: f64::INFINITY, scale_out_bps: f64::INFINITY, scale_out_a2a_bps: f64::INFINITY, scale_up_latency_s: 1e-6, scale_out_latency_s: 1e-5, ..h100() };
        for (n, steps) in [(2u32, 1.0), (3, 2.0), (4, 2.0), (5, 3.0), (8, 3.0)] {
            assert_eq!(f.time(OpKind::AllReduce, 1e6, Placement { size: n, stride: 1 }), steps * 1e-6, "{n} ranks in a node");
        }
        // 16 ranks, one per node: 4 steps over the network.
        assert_eq!(f.time(OpKind::AllGather, 1e6, Placement { size: 16, stride: 8 }), 4.0 * 1e-5);
        assert_eq!(f.time(OpKind::AllReduce, 0.0, Placement { size: 8, stride: 1 }), 0.0);
    }

    /// Across domains a ring per NIC (rail) carries the bus bytes at members-per-domain x
    /// the NIC rate, but never faster than a GPU's NVLink feeds it (SimAI's `calbusbw`,
    /// github:aliyun/SimAI): with 100 GB/s NICs, 8 members per node would reach 800 GB/s,
    /// above NVLink's 450, which bounds them; 2 per node reach 200.
    #[test]
    fn rings_across_domains_are_bound_by_nvlink_or_the_nics() {
        let f = Fabric { scale_out_bps: 100e9, ..h100() };
        let t = f.time(OpKind::AllReduce, 1e9, Placement { size: 16, stride: 1 });
        assert!((t - 2.0 * 15.0 / 16.0 * 1e9 / 450e9).abs() < 1e-12, "{t}");
        let t = f.time(OpKind::AllReduce, 1e9, Placement { size: 16, stride: 4 });
        assert!((t - 2.0 * 15.0 / 16.0 * 1e9 / 200e9).abs() < 1e-12, "{t}");
    }

    /// A group of one waits for no peer: no bytes and no latency step, wherever its one
    /// rank sits and whatever the collective.
    #[test]
    fn a_group_of_one_moves_nothing() {
        let f = Fabric { scale_up_latency_s: 1e-6, scale_out_latency_s: 1e-5, ..h100() };
        for stride in [1, 4, 8, 16] {
            let one = Placement { size: 1, stride };
            for kind in [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllToAll, OpKind::Send] {
                assert_eq!(f.time(kind, 1e9, one), 0.0, "{kind:?} at stride {stride}");
            }
            assert_eq!(f.time_routed(OpKind::AllToAll, 1e9, one, 8, 256), 0.0);
        }
    }

    /// A rate times every collective, placement and size as `time` does, bit for bit:
    /// inside a domain and across, a group of one, the all-to-all, empty buffers.
    #[test]
    fn a_rate_is_time_bit_for_bit() {
        let fabrics = [
            h100(),
            Fabric { scale_out_bps: 100e9, scale_up_latency_s: 2e-6, scale_out_latency_s: 7e-6, ..h100() },
            Fabric { domain: 72, scale_up_bps: 900e9, scale_out_a2a_bps: 30e9, scale_up_latency_s: 3e-6, scale_out_latency_s: 1e-5, ..h100() },
        ];
        let kinds = [OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllToAll, OpKind::Send];
        let mut checked = 0;
        for f in &fabrics {
            for kind in kinds {
                for size in [0, 1, 2, 3, 7, 8, 12, 16, 64, 100, 1024] {
                    for stride in [1, 2, 3, 4, 8, 16, 72, 144] {
                        let p = Placement { size, stride };
                        let rate = f.rate(kind, p);
                        for bytes in [0.0, -1.0, 1.0, 3.7e3, 1.23456789e9, 6.02e11] {
                            assert_eq!(rate.time(bytes).to_bits(), f.time(kind, bytes, p).to_bits(), "{kind:?} {p:?} {bytes}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 5000);
    }

    /// An expert-parallel group that fills one 8-GPU node and half the next (12 ranks):
    /// 8 members share a domain and the group touches two. Top-1 is the plain
    /// all-to-all, 7/12 of S over NVLink and the 4/12 bound for the other node over the
    /// NIC; top-8 of 256 experts still crosses to the other node, once per token that
    /// reaches it, so less than a copy per remote peer but more than nothing.
    #[test]
    fn routed_all_to_all_over_a_partly_filled_domain() {
        let f = h100();
        let p = Placement { size: 12, stride: 1 };
        assert_eq!(f.members_per_domain(p), (8, false));
        let s = 12e6;
        let near = 7e6 / 450e9;
        let plain = near + 4e6 / 50e9;
        assert!((f.time(OpKind::AllToAll, s, p) - plain).abs() < 1e-15);
        assert!((f.time_routed(OpKind::AllToAll, s, p, 1, 64) - plain).abs() < 1e-15, "top-1 is the plain all-to-all");
        let routed = f.time_routed(OpKind::AllToAll, s, p, 8, 256);
        assert!(routed > near + 1e6 / 50e9 && routed < plain, "{routed} vs NVLink alone {near}, a copy per peer {plain}");
    }

    /// What `comm_volume` lists for all-gathers over tp (2 ranks) of a (1, 4, 8) BF16 shard
    /// into (1, 8, 8): S is the gathered output, 8 x 8 x 2 B = 128 B, at (n-1)/n = 1/2. The
    /// backward reduce-scatters only where every reader leaves a partial gradient (a
    /// column-parallel linear, as under sequence parallelism); a gather a replicated op also
    /// reads (as the etp gather of the routing indices is) keeps its part and moves nothing.
    /// Kills: every all-gather given a backward reduce-scatter, which priced a reduce-scatter
    /// for the replicated readers' gathers with every projection test passing.
    #[test]
    fn an_all_gathers_backward_reduces_only_under_partial_readers() {
        use runner_graph::{Attr, DType, NamedOp, Role, Tensor, TensorKind};
        let t = |name: &str, shape: &[u64], kind| Tensor { name: name.into(), shape: shape.to_vec(), dtype: DType::BF16, kind };
        let a = TensorKind::Activation;
        let ag = [("group", Attr::Text("tp".into())), ("group-size", Attr::Int(2))];
        let g = Graph::new(
            vec![
                t("x", &[1, 4, 8], TensorKind::Input),
                t("y", &[1, 8, 8], a),
                t("w", &[4, 8], TensorKind::Weight),
                t("z", &[1, 8, 4], a),
                t("u", &[1, 8, 8], a),
                t("v", &[1, 8, 8], a),
                t("s", &[1, 8, 8], a),
            ],
            vec![
                // Read by a column-parallel linear only: its backward sums the ranks' parts.
                NamedOp::of("ag-sp", OpKind::AllGather, &["x"], &["y"], &ag, 0, Role::Replicated),
                NamedOp::of("lin", OpKind::Linear, &["y", "w"], &["z"], &[], 0, Role::ColumnParallel),
                // Read by the linear and a replicated add: every rank holds the whole gradient.
                NamedOp::of("ag-rep", OpKind::AllGather, &["x"], &["u"], &ag, 0, Role::Replicated),
                NamedOp::of("lin2", OpKind::Linear, &["u", "w"], &["v"], &[], 0, Role::ColumnParallel),
                NamedOp::of("add", OpKind::Add, &["u", "u"], &["s"], &[], 0, Role::Replicated),
            ],
            "s",
        )
        .unwrap();
        let ops = comm_volume(&g);
        let got: Vec<(&str, f64, f64, Option<OpKind>)> = ops.iter().map(|c| (c.op.as_str(), c.bytes, c.bus_bytes(), c.backward)).collect();
        assert_eq!(got, [("ag-sp", 128.0, 64.0, Some(OpKind::ReduceScatter)), ("ag-rep", 128.0, 64.0, None)]);
    }
}
