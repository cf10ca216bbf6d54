//! A collective sweep as `runner bench collectives` measures it (nccl-tests' rows:
//! op, size, time, algbw, busbw, with the run's ranks, nodes and device), and the fit
//! of a GPU profile's network tier to it: the α–β law of [`crate::comm::Fabric::time`]
//! run backwards.
//!
//! Which tier a run measures follows from where its ranks sat: all on one node, the
//! NVLink domain (scale-up); spread over nodes, the NICs (scale-out), with the run's
//! ranks per node as the members per domain that share the rails (a node of several
//! NVLink domains whose run spans them is scale-out too, as the projection prices such a
//! group). Where the profile's NVLink domain spans nodes (NVL72), a multi-node run could
//! be either, and the caller must say ([`Tier`]).
//!
//! The fit: per row, the projection's time is steps·α + X·β, with steps = ⌈log2 n⌉ and
//! X the bytes the tier's bandwidth carries (the bus bytes S·factor inside a domain;
//! across domains the bus bytes over the members per domain, or for an all-to-all the
//! share bound for other domains, after its NVLink share at the profile's rate). α and
//! β minimise the squared relative time errors; the tier's efficiency is 1/(β·its
//! bandwidth) and its per-step latency α. On the scale-out tier the all-to-all rows get
//! a line of their own, which sets `scale_out_a2a` (the NIC share an all-to-all reaches),
//! while the rings and trees set `scale_out` and the per-step latency. Broadcast and send/recv rows are shown but not
//! fitted: the projection's collectives are all-reduce, all-gather, reduce-scatter and
//! all-to-all (its pipeline send/recv is one peer, not nccl-tests' ring shift).

use serde::{Deserialize, Serialize};

use runner_contract::text::number;
use runner_graph::OpKind;

use crate::comm::bus_factor;
use crate::measured::relative_fit;
use crate::profile::{Efficiency, GpuProfile};

/// One row of `bench collectives` (nccl-tests' out-of-place columns, plus the run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollRow {
    pub op: String,
    /// nccl-tests' S: the buffer (all-reduce, broadcast), the gathered output
    /// (all-gather), the per-rank input (reduce-scatter, all-to-all, send/recv).
    pub size_bytes: u64,
    pub count: u64,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Wrong values of the check; `None` where nothing was checked (nccl-tests' `N/A`,
    /// `-c 0`). Written as `null`, and required: a file without it is not this format.
    #[serde(deserialize_with = "Option::deserialize")]
    pub wrong: Option<u64>,
    pub ranks: usize,
    /// Nodes the ranks ran on: the ranks whose launcher-given local rank is 0.
    pub nodes: usize,
    /// "nccl", or "tcp" for CPU ranks.
    pub transport: String,
    /// Rank 0's device, as the runner names it.
    pub device: String,
}

/// The projection's collective for an nccl-tests op name; `None` for the ones it does
/// not model (broadcast, sendrecv).
///
/// # Errors
/// An op name nccl-tests does not have.
pub fn kind_of(op: &str) -> Result<Option<OpKind>, String> {
    Ok(match op {
        "all_reduce" => Some(OpKind::AllReduce),
        "all_gather" => Some(OpKind::AllGather),
        "reduce_scatter" => Some(OpKind::ReduceScatter),
        "alltoall" => Some(OpKind::AllToAll),
        "broadcast" | "sendrecv" => None,
        other => {
            return Err(format!(
                "op '{other}' is not one of all_reduce, all_gather, reduce_scatter, alltoall, broadcast, sendrecv"
            ));
        }
    })
}

/// nccl-tests' bus-bandwidth factor of an op name over `n` ranks (1 for broadcast and
/// send/recv).
pub fn bus_factor_of(op: &str, n: usize) -> Result<f64, String> {
    Ok(kind_of(op)?.map_or(1.0, |k| bus_factor(k, u32::try_from(n).unwrap_or(u32::MAX))))
}

/// Read a `bench collectives` JSON file, or nccl-tests' own output (one test's log or
/// several in one file, each line tagged by the launcher or not, [`crate::nccl_tests`]);
/// `origin` names it in messages.
///
/// # Errors
/// JSON syntax (line and column), a missing or unknown field, an nccl-tests log the
/// reader cannot place, a row with wrong values, a busbw that does not follow from size,
/// time and the bus factor, or rows of different runs; each names the row and the fix.
pub fn parse(text: &str, origin: &str) -> Result<Vec<CollRow>, String> {
    // A log run under `srun -l` or `mpirun --tag-output`: each line tagged with its rank.
    let untagged = crate::nccl_tests::untagged(text).filter(|t| crate::nccl_tests::looks_like(t));
    let text = untagged.as_deref().unwrap_or(text);
    let rows = if crate::nccl_tests::looks_like(text) { crate::nccl_tests::rows(text, origin)? } else { from_json(text, origin)? };
    check(&rows, origin)?;
    Ok(rows)
}

/// Several files' rows (each read by [`parse`]) as one sweep: nccl-tests writes one
/// log per test binary.
///
/// # Errors
/// Files of different runs (ranks, nodes, device, transport), or one op and size in two
/// files.
pub fn join(files: Vec<(String, Vec<CollRow>)>) -> Result<Vec<CollRow>, String> {
    let mut out: Vec<CollRow> = Vec::new();
    // Which file measured each (op, size): looked up, not scanned (a file may hold many rows).
    let mut from: std::collections::HashMap<(String, u64), &str> = std::collections::HashMap::new();
    let first_origin = files.first().map_or("", |f| f.0.as_str());
    for (origin, rows) in &files {
        for r in rows {
            if let Some((what, a, b)) = out.first().and_then(|first| other_run(r, first)) {
                return Err(format!("{origin}: {what} is {a} but {first_origin}'s is {b}: the files are of different runs; fit one run at a time"));
            }
            match from.insert((r.op.clone(), r.size_bytes), origin) {
                Some(other) if other != origin => {
                    return Err(format!(
                        "{origin}: {} of {} B is in {other} too: the files measure it twice; give each test's log once",
                        r.op, r.size_bytes
                    ));
                }
                _ => {}
            }
            out.push(r.clone());
        }
    }
    Ok(out)
}

/// What makes `r` another run's than `first`: the field, `r`'s value and `first`'s.
fn other_run(r: &CollRow, first: &CollRow) -> Option<(&'static str, String, String)> {
    [
        ("ranks", r.ranks.to_string(), first.ranks.to_string()),
        ("nodes", r.nodes.to_string(), first.nodes.to_string()),
        ("device", r.device.clone(), first.device.clone()),
        ("transport", r.transport.clone(), first.transport.clone()),
    ]
    .into_iter()
    .find(|(_, a, b)| a != b)
}

/// A `bench collectives` JSON file's rows, unchecked.
fn from_json(text: &str, origin: &str) -> Result<Vec<CollRow>, String> {
    serde_json::from_str(text).map_err(|e| {
        if let Some(m) = crate::file_kind::misplaced(text, origin, crate::file_kind::Reader::Collectives) {
            return m;
        }
        let hint = if text.contains(crate::measured::FORMAT) {
            " (a `runner measure` file: use it with --ops)"
        } else {
            crate::measured::not_a_number_hint(text, e.line(), e.column())
        };
        format!(
            "{origin}: line {} column {}: {}{hint}; write the file with `runner bench collectives ... -o FILE.json` (this version), or give nccl-tests' own output",
            e.line(),
            e.column(),
            crate::measured::json_message(&e)
        )
    })
}

/// The rows' values and that they are one run's.
fn check(rows: &[CollRow], origin: &str) -> Result<(), String> {
    let Some(first) = rows.first() else {
        return Err(format!("{origin}: no rows: sweep at least two sizes with `runner bench collectives -b 1M -e 1G -f 4`"));
    };
    for (i, r) in rows.iter().enumerate() {
        let at = format!("{origin}: row {i} ({} of {} B)", r.op, r.size_bytes);
        let factor = bus_factor_of(&r.op, r.ranks).map_err(|e| format!("{at}: {e}"))?;
        if !(r.time_us.is_finite() && r.time_us > 0.0) || r.size_bytes == 0 {
            return Err(format!("{at}: time_us must be a finite number > 0 and size_bytes > 0"));
        }
        if r.ranks == 0 || r.nodes == 0 || r.nodes > r.ranks {
            return Err(format!("{at}: ranks ({}) and nodes ({}) must be at least 1, nodes at most ranks", r.ranks, r.nodes));
        }
        if let Some(wrong) = r.wrong.filter(|w| *w > 0) {
            return Err(format!("{at}: {wrong} wrong values: a run with wrong results is broken, not slow; fix it and sweep again"));
        }
        let busbw = r.size_bytes as f64 / (r.time_us * 1e-6) / 1e9 * factor;
        if !busbw.is_finite() {
            return Err(format!("{at}: time_us {} is too small for {} B to be a time: fix the row or sweep again", number(r.time_us), r.size_bytes));
        }
        if (r.busbw_gbps - busbw).abs() > 0.01 * busbw + 0.005 {
            return Err(format!(
                "{at}: busbw_gbps {} is not size / time x the bus factor ({}): the row was edited or comes from \
                 another tool; fix the row or sweep again",
                number(r.busbw_gbps),
                number((busbw * 1e3).round() / 1e3)
            ));
        }
        if let Some((what, a, b)) = other_run(r, first) {
            return Err(format!("{at}: {what} is {a} but row 0's is {b}: the file mixes runs; fit one run at a time"));
        }
    }
    Ok(())
}

/// A network tier of the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Inside one NVLink domain.
    ScaleUp,
    /// Across domains, through the NICs.
    ScaleOut,
}

impl Tier {
    /// `scale-up` (or `nvlink`), `scale-out` (or `network`).
    ///
    /// # Errors
    /// Another name.
    pub fn parse(s: &str) -> Result<Tier, String> {
        match s.to_ascii_lowercase().as_str() {
            "scale-up" | "scaleup" | "nvlink" => Ok(Tier::ScaleUp),
            "scale-out" | "scaleout" | "network" => Ok(Tier::ScaleOut),
            _ => Err(format!("tier '{s}': use scale-up (one NVLink domain) or scale-out (across nodes)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::ScaleUp => "scale-up",
            Tier::ScaleOut => "scale-out",
        }
    }
}

/// The tier a run of `ranks` ranks on `nodes` nodes measured on `gpu`'s cluster, and
/// the members per domain of its group (all the ranks inside one domain; the ranks per
/// node across nodes).
///
/// # Errors
/// One rank; ranks not spread evenly; a forced tier the layout cannot have measured; a
/// multi-node run on a profile whose NVLink domain spans nodes, without `forced`.
pub fn tier_of(ranks: usize, nodes: usize, gpu: &GpuProfile, forced: Option<Tier>) -> Result<(Tier, u32), String> {
    if ranks < 2 {
        return Err("a run of one rank moves nothing: run two or more (-g N, or under a launcher)".into());
    }
    if !ranks.is_multiple_of(nodes) {
        return Err(format!("{ranks} ranks on {nodes} nodes are not spread evenly: run the same number of ranks on every node"));
    }
    let per_node = u32::try_from(ranks / nodes).unwrap_or(u32::MAX);
    let n = u32::try_from(ranks).unwrap_or(u32::MAX);
    let spans_nodes = gpu.scale_up_domain > gpu.gpus_per_node;
    // A node of several NVLink domains (scale_up_domain below gpus_per_node: NVLink
    // pairs, or PCIe alone) whose run spans them crossed domains without leaving the
    // node: the projection prices such a group on the scale-out tier, so it is fitted
    // there.
    let across_in_node = nodes == 1 && n > gpu.scale_up_domain && n <= gpu.gpus_per_node;
    // More ranks on one node than the profile's node has GPUs (its NVLink domain smaller
    // than the run): the node is not the profile's, and the ranks crossed domains only
    // in the profile's terms. Either tier is a guess: the caller says which. One rule
    // for both the default and a forced tier: these ranks sat in more than one domain.
    let beyond_node = nodes == 1 && n > gpu.scale_up_domain && n > gpu.gpus_per_node;
    let tier = match forced {
        Some(t) => t,
        None if across_in_node => Tier::ScaleOut,
        None if beyond_node => {
            return Err(format!(
                "{ranks} ranks ran on one node, where {}'s node has {} GPU(s) (gpus_per_node) and its NVLink domain {} \
                 (scale_up_domain): the run's node is not the profile's; pass --tier scale-out to fit what joined the \
                 ranks as the network between domains, or fix the profile's gpus_per_node and scale_up_domain to the \
                 machine the run was on",
                gpu.name, gpu.gpus_per_node, gpu.scale_up_domain
            ));
        }
        None if nodes == 1 => Tier::ScaleUp,
        None if spans_nodes => {
            return Err(format!(
                "{}'s NVLink domain ({} GPUs) spans nodes of {}: a run over {nodes} nodes may have stayed inside it; pass \
                 --tier scale-up if every rank sat in one NVLink domain, --tier scale-out if not",
                gpu.name, gpu.scale_up_domain, gpu.gpus_per_node
            ));
        }
        None => Tier::ScaleOut,
    };
    match tier {
        Tier::ScaleUp if n > gpu.scale_up_domain => Err(format!(
            "{ranks} ranks cannot sit in one NVLink domain of {} ({} GPUs, scale_up_domain): the run crossed the network; \
             fit it as scale-out (--tier scale-out)",
            gpu.name, gpu.scale_up_domain
        )),
        Tier::ScaleUp if nodes > 1 && !spans_nodes => Err(format!(
            "the run spans {nodes} nodes and {}'s NVLink domain is one node: it crossed the network; fit it as scale-out",
            gpu.name
        )),
        Tier::ScaleUp => Ok((Tier::ScaleUp, n)),
        Tier::ScaleOut if nodes == 1 && !across_in_node && !beyond_node => Err(
            "every rank ran on one node: the run never left NVLink; sweep across nodes (one or more ranks per node) to fit the network"
                .into(),
        ),
        Tier::ScaleOut => Ok((Tier::ScaleOut, per_node.min(gpu.scale_up_domain).max(1))),
    }
}

/// α and β of a set of rows, and how well they fit.
#[derive(Clone, Debug, Serialize)]
pub struct LineFit {
    /// The op, or "all" for the pooled fit.
    pub op: String,
    pub rows: usize,
    /// 1/β: bytes per second the tier carries per GPU (scale-up) or per NIC (scale-out),
    /// as GB/s.
    pub gbs: f64,
    /// α: latency per step (⌈log2 n⌉ steps per call), microseconds.
    pub latency_us: f64,
    /// Largest relative time error of a row under the fit.
    pub max_error: f64,
    /// Share of the largest size's time spent moving data under the fit.
    pub transfer_share: f64,
}

/// The fit of one tier.
#[derive(Clone, Debug, Serialize)]
pub struct CollFit {
    pub gpu: String,
    pub tier: Tier,
    pub ranks: usize,
    pub nodes: usize,
    /// Members per domain of the run's group.
    pub local: u32,
    pub device: String,
    pub transport: String,
    /// The tier's pooled line: every row inside a domain; across domains the rings and
    /// trees (the all-to-all rows where there are no others).
    pub pooled: LineFit,
    pub per_op: Vec<LineFit>,
    /// (parameter, before, fitted).
    pub params: Vec<(String, f64, f64)>,
    pub efficiency: Efficiency,
    pub notes: Vec<String>,
}

/// One modelled row: steps, the bytes the fitted bandwidth carries, the time left for
/// them and the latency (seconds), the measured time.
struct Modelled {
    op: String,
    kind: OpKind,
    size: f64,
    steps: f64,
    x: f64,
    y: f64,
    t: f64,
}

fn line(op: &str, rows: &[&Modelled]) -> Result<LineFit, String> {
    let mut sizes: Vec<f64> = rows.iter().map(|r| r.size).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    // The pooled line's "all" is no op name a user wrote.
    let rows_of = if op == "all" { "the rows".to_string() } else { format!("the {op} rows") };
    if sizes.len() < 2 {
        return Err(format!("{rows_of} have one size only: α and β need a sweep (e.g. -b 1M -e 1G -f 4)"));
    }
    let fr: Vec<(f64, f64, f64)> = rows.iter().map(|r| (r.steps, r.x, r.y)).collect();
    let (a, b) = relative_fit(&fr);
    if !(b.is_finite() && b > 0.0) {
        return Err(format!("{rows_of}' times do not grow with size: sweep into the bandwidth regime (e.g. -b 1M -e 1G -f 2)"));
    }
    let model = |r: &Modelled| r.t - r.y + a * r.steps + b * r.x;
    let max_error = rows.iter().map(|r| (model(r) / r.t - 1.0).abs()).fold(0.0, f64::max);
    let largest = rows.iter().max_by(|p, q| p.size.total_cmp(&q.size)).map_or(0.0, |r| b * r.x / model(r));
    Ok(LineFit { op: op.into(), rows: rows.len(), gbs: 1.0 / b / 1e9, latency_us: a * 1e6, max_error, transfer_share: largest })
}

/// Fit `gpu`'s tier to `rows` (one run: [`parse`]), `forced` to choose the tier where
/// the layout cannot.
///
/// # Errors
/// As [`tier_of`]; fewer than two sizes; times that do not grow with size; a fitted
/// efficiency outside (0, 1] (wrong GPU, or the profile's bandwidth too low); a
/// multi-node run bound by NVLink rather than the NICs.
/// Each op's rows of one data type and reduction op: nccl-tests' `-d all` and `-o all`
/// measure every size once per type (and op), and the bytes of a size take about the same
/// time whatever their type, so fitting them all would count each size several times.
/// Kept: bfloat16 (the gradients' type in the projection), else half, else float, else
/// the first type; the sum, else the first op. A note says which, when there was a choice.
fn one_type_per_op<'a>(rows: &'a [CollRow], notes: &mut Vec<String>) -> Vec<&'a CollRow> {
    let rank = |r: &CollRow| {
        let t = ["bfloat16", "bf16", "half", "fp16", "float", "fp32"].iter().position(|t| *t == r.dtype).map_or(3, |i| i / 2);
        (t, usize::from(r.redop != "sum"))
    };
    // Each value once, in the log's order.
    let distinct = |values: &mut dyn Iterator<Item = &'a str>| {
        let mut seen: Vec<&'a str> = Vec::new();
        for v in values {
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        seen
    };
    let mut kept = Vec::new();
    for op in distinct(&mut rows.iter().map(|r| r.op.as_str())) {
        let mine: Vec<&CollRow> = rows.iter().filter(|r| r.op == op).collect();
        // The first row of the best rank: min_by_key keeps the first of equals.
        let Some(best) = mine.iter().copied().min_by_key(|r| rank(r)) else { continue };
        let same = |r: &CollRow| r.dtype == best.dtype && r.redop == best.redop;
        let types = distinct(&mut mine.iter().map(|r| r.dtype.as_str()));
        let redops = distinct(&mut mine.iter().map(|r| r.redop.as_str()));
        if types.len() > 1 || redops.len() > 1 {
            let what = match (types.len() > 1, redops.len() > 1) {
                (true, true) => format!("{} data types and {} reduction ops (nccl-tests -d all -o all)", types.len(), redops.len()),
                (true, false) => format!("{} data types (nccl-tests -d all)", types.len()),
                _ => format!("{} reduction ops (nccl-tests -o all)", redops.len()),
            };
            notes.push(format!(
                "{op} measured in {what}: fitted its {} {} rows only (bfloat16, the projection's gradient type, where \
                 the log has it, else half, else float; {} more left out)",
                best.dtype,
                best.redop,
                mine.iter().filter(|r| !same(r)).count()
            ));
        }
        kept.extend(mine.into_iter().filter(|r| same(r)));
    }
    kept
}

pub fn fit_collectives(rows: &[CollRow], gpu: &GpuProfile, forced: Option<Tier>, origin: &str) -> Result<CollFit, String> {
    let first = rows.first().ok_or_else(|| format!("{origin}: no rows"))?;
    let (ranks, nodes) = (first.ranks, first.nodes);
    let (tier, local) = tier_of(ranks, nodes, gpu, forced).map_err(|e| format!("{origin}: {e}"))?;
    let n = u32::try_from(ranks).unwrap_or(u32::MAX);
    let steps = f64::from(n).log2().ceil().max(1.0);
    let fabric = gpu.fabric();
    let mut notes = Vec::new();
    let mut modelled = Vec::new();
    let mut skipped: Vec<&str> = Vec::new();
    let rows = one_type_per_op(rows, &mut notes);
    for r in rows {
        let Some(kind) = kind_of(&r.op)? else {
            if !skipped.contains(&r.op.as_str()) {
                skipped.push(&r.op);
            }
            continue;
        };
        let size = r.size_bytes as f64;
        let t = r.time_us * 1e-6;
        let bus = size * bus_factor(kind, n);
        let (x, y) = match (tier, kind) {
            (Tier::ScaleUp, _) => (bus, t),
            (Tier::ScaleOut, OpKind::AllToAll) => {
                let per_peer = size / f64::from(n);
                let near = per_peer * f64::from(local - 1) / fabric.scale_up_bps;
                (per_peer * f64::from(n - local), t - near)
            }
            (Tier::ScaleOut, _) => (bus / f64::from(local), t),
        };
        if y <= 0.0 {
            notes.push(format!("{} of {} B left out: its NVLink share alone takes longer than it did", r.op, r.size_bytes));
            continue;
        }
        modelled.push(Modelled { op: r.op.clone(), kind, size, steps, x, y, t });
    }
    if !skipped.is_empty() {
        notes.push(format!("{} shown by the bench but not fitted: the projection does not use them", skipped.join(", ")));
    }
    // NVLink SHARP (NVLS: NCCL 2.17 and later on NVSwitch systems, on by default) reduces
    // inside the switch, so an all-reduce's busbw passes the link's rate (about 480 GB/s
    // on 8 H100s, whose NVLink carries 450), which no ring or tree over the links
    // reaches. The model's all-reduce is one, so such rows measure the switch, not the
    // links: left out where other ops remain, refused where none do. (NVLS all-gather and
    // reduce-scatter send more per GPU than a ring does and NCCL keeps the ring for them:
    // they stay below the link's rate and are fitted.) The switch still carries each
    // GPU's buffer at most at the link's rate (algbw = busbw / 2(n-1)/n): a busbw above
    // that is no NVLS but another GPU or a wrong profile, refused below as such.
    //
    // Across nodes the network can reduce too: NVLS between nodes (NVLink SHARP in each
    // node joined by IB SHARP or a tree, NCCL's NVLS and NVLSTREE algorithms from 2.18.1:
    // docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-18-1.html) and InfiniBand
    // SHARP through the CollNet plugin (NCCL_COLLNET_ENABLE=1: NVIDIA HPC-X 2.26,
    // "NCCL-RDMA-SHARP Plugins", docs.nvidia.com/networking/display/hpcxv226) send each
    // NIC's share of the buffer once rather than 2(n-1)/n times, so the all-reduce's NIC
    // share passes the NIC's rate, at most by that factor, as inside a node. The same
    // rule holds there, naming both switches off (NCCL's environment variables,
    // docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html; all read 2026-12-07).
    // A scale-out tier of one node (NVLink pairs or PCIe) has no network to reduce in:
    // there, a rate past the NIC's stays a wrong profile.
    let in_network = match tier {
        Tier::ScaleUp => Some((gpu.scale_up_gbs, "NVLink per GPU (scale_up_gbs)")),
        Tier::ScaleOut if nodes > 1 => Some((gpu.scale_out_gbs, "NIC per GPU (scale_out_gbs)")),
        Tier::ScaleOut => None,
    };
    if let Some((rate, link)) = in_network {
        let ar: Vec<&Modelled> = modelled.iter().filter(|m| m.kind == OpKind::AllReduce).collect();
        let busbw = ar.iter().map(|m| m.x / m.t / 1e9).fold(0.0, f64::max);
        let over = line("all_reduce", &ar).map_or(busbw, |l| busbw.max(l.gbs));
        let algbw = over / bus_factor(OpKind::AllReduce, n);
        if !ar.is_empty() && over > rate && algbw <= rate {
            let (carried, how, fix) = match tier {
                Tier::ScaleUp => (
                    "of bus bandwidth",
                    "NVLink SHARP (NVLS, on by default from NCCL 2.17 on NVSwitch systems) reduced in the switch, which the \
                     model's all-reduce (a ring or tree over the links) does not describe",
                    "NCCL_NVLS_ENABLE=0",
                ),
                Tier::ScaleOut => (
                    "per NIC (bus bandwidth over the ranks per node)",
                    "the network reduced it (NVLink SHARP across nodes, NCCL's NVLS and NVLSTREE from 2.18 on NVSwitch \
                     systems, or InfiniBand SHARP through the CollNet plugin), which the model's all-reduce (a ring or \
                     tree over the NICs) does not describe",
                    "NCCL_NVLS_ENABLE=0 NCCL_COLLNET_ENABLE=0",
                ),
            };
            let why = format!("all_reduce carried {over:.1} GB/s {carried} where {}'s {link} is {rate} GB/s: {how}", gpu.name);
            if modelled.iter().all(|m| m.kind == OpKind::AllReduce) {
                return Err(format!(
                    "{origin}: {why}; rerun all_reduce_perf with {fix}, or fit from the other ops' logs \
                     (all_gather_perf, reduce_scatter_perf, alltoall_perf)"
                ));
            }
            notes.push(format!("all_reduce rows left out: {why}; fitted from the other ops (rerun all_reduce_perf with {fix} to fit it too)"));
            modelled.retain(|m| m.kind != OpKind::AllReduce);
        }
    }
    if modelled.is_empty() {
        return Err(format!("{origin}: no all_reduce, all_gather, reduce_scatter or alltoall rows to fit"));
    }
    // Across domains, all-to-all rows measure the NICs under many-peer traffic, which
    // has its own efficiency (scale_out_a2a); the rings and trees fit scale_out.
    let own_a2a = |m: &&Modelled| tier == Tier::ScaleOut && m.kind == OpKind::AllToAll;
    let rings: Vec<&Modelled> = modelled.iter().filter(|m| !own_a2a(m)).collect();
    let a2a: Vec<&Modelled> = modelled.iter().filter(own_a2a).collect();
    let general = if rings.is_empty() { None } else { Some(line("all", &rings).map_err(|e| format!("{origin}: {e}"))?) };
    let a2a_fit = if a2a.is_empty() { None } else { Some(line("alltoall", &a2a).map_err(|e| format!("{origin}: {e}"))?) };
    let pooled = match (&general, &a2a_fit) {
        (Some(g), _) => g.clone(),
        (None, Some(a)) => a.clone(),
        (None, None) => return Err(format!("{origin}: no all_reduce, all_gather, reduce_scatter or alltoall rows to fit")),
    };
    let mut per_op = Vec::new();
    // Each op once, in the order of its first row: rows sorted by size interleave them.
    let mut ops: Vec<&str> = Vec::new();
    for m in &modelled {
        if !ops.contains(&m.op.as_str()) {
            ops.push(&m.op);
        }
    }
    for op in ops {
        let these: Vec<&Modelled> = modelled.iter().filter(|m| m.op == op).collect();
        match line(op, &these) {
            Ok(l) => per_op.push(l),
            Err(e) => notes.push(e),
        }
    }
    if pooled.transfer_share < 0.5 {
        notes.push(format!(
            "the largest size spends only {:.0}% of its time moving data: the bandwidth is poorly determined; sweep larger sizes (-e 1G)",
            100.0 * pooled.transfer_share
        ));
    }
    let before = gpu.efficiency.clone();
    let mut eff = before.clone();
    let (nominal, what) = match tier {
        Tier::ScaleUp => (gpu.scale_up_gbs, "NVLink per GPU (scale_up_gbs)"),
        Tier::ScaleOut => (gpu.scale_out_gbs, "NIC per GPU (scale_out_gbs)"),
    };
    let efficiency_of = |l: &LineFit, field: &str| -> Result<f64, String> {
        let achieved = l.gbs;
        let e = achieved / nominal;
        if !(e.is_finite() && e > 0.0 && e <= 1.0) {
            return Err(format!(
                "{origin}: the run carried {achieved:.1} GB/s where {}'s {what} is {nominal} GB/s ({:.0}%): the run was not on this \
                 cluster, or the profile's {}_gbs is wrong ({field})",
                gpu.name,
                100.0 * e,
                tier.name().replace('-', "_")
            ));
        }
        if tier == Tier::ScaleOut && f64::from(local) * achieved * 1e9 >= fabric.scale_up_bps {
            return Err(format!(
                "{origin}: {local} ranks per node carried {:.1} GB/s together, at least NVLink's achieved {:.1} GB/s: the run is not \
                 bound by the NICs and cannot measure them; sweep with one rank per node",
                f64::from(local) * achieved,
                fabric.scale_up_bps / 1e9
            ));
        }
        Ok(e)
    };
    let mut params = Vec::new();
    match tier {
        Tier::ScaleUp => {
            eff.scale_up = efficiency_of(&pooled, "scale_up")?;
            eff.scale_up_latency_us = pooled.latency_us;
            params.push(("scale_up".to_string(), before.scale_up, eff.scale_up));
            params.push(("scale_up_latency_us".to_string(), before.scale_up_latency_us, eff.scale_up_latency_us));
        }
        Tier::ScaleOut => {
            if let Some(g) = &general {
                eff.scale_out = efficiency_of(g, "scale_out")?;
                params.push(("scale_out".to_string(), before.scale_out, eff.scale_out));
            }
            if let Some(a) = &a2a_fit {
                eff.scale_out_a2a = efficiency_of(a, "scale_out_a2a")?;
                params.push(("scale_out_a2a".to_string(), before.scale_out_a2a, eff.scale_out_a2a));
            }
            // One per-step latency for the tier: the rings' where there are any.
            eff.scale_out_latency_us = pooled.latency_us;
            params.push(("scale_out_latency_us".to_string(), before.scale_out_latency_us, eff.scale_out_latency_us));
        }
    }
    if first.transport == "tcp" {
        notes.push("TCP transport (CPU ranks): this fits the profile to loopback sockets, not to NVLink or a NIC".into());
    }
    Ok(CollFit {
        gpu: gpu.name.clone(),
        tier,
        ranks,
        nodes,
        local,
        device: first.device.clone(),
        transport: first.transport.clone(),
        params,
        pooled,
        per_op,
        efficiency: eff,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Placement;
    use crate::profile::Profiles;

    use crate::profile::test_h100 as h100;

    /// `n` ranks, `local` of them per domain, in the projection's terms.
    fn placement(n: u32, local: u32, domain: u32) -> Placement {
        if local >= n { Placement { size: n, stride: 1 } } else { Placement { size: n, stride: (domain / local.max(1)).max(1) } }
    }

    /// Rows whose times are the projection's own [`crate::comm::Fabric::time`] for `gpu`.
    fn rows(gpu: &GpuProfile, ranks: usize, nodes: usize, ops: &[&str]) -> Vec<CollRow> {
        let fabric = gpu.fabric();
        let n = ranks as u32;
        let local = (ranks / nodes) as u32;
        let p = placement(n, local, fabric.domain);
        let mut out = Vec::new();
        for op in ops {
            for size in [1u64 << 16, 1 << 20, 1 << 24, 1 << 28, 1 << 30] {
                let t = kind_of(op).unwrap().map_or(1e-3, |k| fabric.time(k, size as f64, p));
                let algbw = size as f64 / t / 1e9;
                out.push(CollRow {
                    op: (*op).into(),
                    size_bytes: size,
                    count: size / 4,
                    dtype: "float".into(),
                    redop: "sum".into(),
                    root: -1,
                    time_us: t * 1e6,
                    algbw_gbps: algbw,
                    busbw_gbps: algbw * bus_factor_of(op, ranks).unwrap(),
                    wrong: Some(0),
                    ranks,
                    nodes,
                    transport: "nccl".into(),
                    device: "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)".into(),
                });
            }
        }
        out
    }

    /// H100 with known network efficiencies and latencies (the all-to-all's NIC share
    /// `a2a`), for a fit to find again.
    fn known(a2a: f64) -> GpuProfile {
        with(&h100(), |e| {
            e.scale_up = 0.73;
            e.scale_up_latency_us = 4.2;
            e.scale_out = 0.61;
            e.scale_out_a2a = a2a;
            e.scale_out_latency_us = 11.0;
        })
    }

    /// `rows` as nccl-tests prints them, one test per op with ranks on `hosts` (one per
    /// rank); the column `bench collectives` measures (in place for all_reduce and
    /// broadcast, out of place for the others) holds the rows' figures, the other 1.5x
    /// slower.
    fn as_nccl_tests(rows: &[CollRow], hosts: &[&str]) -> String {
        let mut ops: Vec<&str> = rows.iter().map(|r| r.op.as_str()).collect();
        ops.dedup();
        let mut s = String::from("[node-a:01234] launcher noise\n");
        for op in ops {
            s += "# nccl-tests version 2.18.3 nccl-headers=22703 nccl-library=22703\n";
            s += &format!("# Collective test starting: {op}_perf\n");
            s += "# nThread 1 nGpus 1 minBytes 65536 maxBytes 1073741824 step: 16(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n";
            for (r, h) in hosts.iter().enumerate() {
                s += &format!("#  Rank {r:2} Group  0 Pid {:6} on {h:>8} device {:2} [0000:{:02x}:00] NVIDIA H100 80GB HBM3\n", 4000 + r, r % 8, 16 * (r % 8));
            }
            s += "NCCL version 2.27.3+cuda12.9\n#\n#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
            s += "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n";
            for r in rows.iter().filter(|r| r.op == op) {
                let measured = format!("{:8.2} {:7.2} {:7.2} {:6}", r.time_us, r.algbw_gbps, r.busbw_gbps, 0);
                let other = format!("{:8.2} {:7.2} {:7.2} {:6}", r.time_us * 1.5, r.algbw_gbps / 1.5, r.busbw_gbps / 1.5, "N/A");
                let (out, inp) = if matches!(op, "all_reduce" | "broadcast") { (other, measured) } else { (measured, other) };
                s += &format!("{:12} {:13} {:>9} {:>7} {:7} {out} {inp}\n", r.size_bytes, r.count, r.dtype, r.redop, r.root);
            }
            s += "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 123.4\n#\n";
            s += &format!("# Collective test concluded: {op}_perf\n#\n");
        }
        s
    }

    /// nccl-tests' own output fits as `bench collectives` JSON of the same sweep does:
    /// ranks and nodes from its rank lines, the measured column per op. Within the
    /// rounding of its two-decimal times, on one node and over two.
    #[test]
    fn nccl_tests_output_fits_as_the_same_sweep_in_json() {
        let truth = known(0.55);
        let ops = ["all_reduce", "all_gather", "reduce_scatter", "alltoall"];
        for hosts in [vec!["node-a"; 8], [vec!["node-a"; 8], vec!["node-b"; 8]].concat()] {
            let json = rows(&truth, hosts.len(), if hosts.len() > 8 { 2 } else { 1 }, &ops);
            let text = as_nccl_tests(&json, &hosts);
            let read = parse(&text, "sweep.log").unwrap();
            assert_eq!(read.len(), json.len());
            assert!(read.iter().all(|r| r.ranks == hosts.len() && r.nodes == hosts.len() / 8 && r.device == "NVIDIA H100 80GB HBM3"));
            let a = fit_collectives(&json, &h100(), None, "coll.json").unwrap();
            let b = fit_collectives(&read, &h100(), None, "sweep.log").unwrap();
            assert_eq!((a.tier, a.ranks, a.nodes, a.local), (b.tier, b.ranks, b.nodes, b.local));
            for ((name, _, x), (_, _, y)) in a.params.iter().zip(&b.params) {
                assert!((x / y - 1.0).abs() < 2e-3, "{name}: {x} from JSON, {y} from nccl-tests' text");
            }
        }
    }

    /// An all-reduce under NVLink SHARP (NVLS) on 8 H100s of one node: busbw 480 GB/s
    /// (the switch reduces), above the 450 GB/s NVLink, which the model's ring cannot
    /// carry. Alone, it is refused naming NVLS and NCCL_NVLS_ENABLE=0, not a wrong
    /// scale_up_gbs; beside other ops, left out with a note and the rest fitted. A busbw
    /// above even NVLS's bound (algbw above the link) is still another GPU's.
    #[test]
    fn an_nvls_all_reduce_is_named_and_left_out() {
        let nvls = with(&h100(), |e| {
            e.scale_up = 480.0 / 450.0 / 0.99;
            e.scale_up_latency_us = 6.0;
        });
        let ring = known(0.55);
        let hosts = vec!["node-a"; 8];
        let ar = rows(&nvls, 8, 1, &["all_reduce"]);
        assert!(ar.iter().any(|r| r.busbw_gbps > 470.0), "{ar:?}");
        let alone = parse(&as_nccl_tests(&ar, &hosts), "all_reduce_perf.log").unwrap();
        let e = fit_collectives(&alone, &h100(), None, "all_reduce_perf.log").unwrap_err();
        assert!(e.starts_with("all_reduce_perf.log: all_reduce carried 4"), "{e}");
        assert!(e.contains("NVLink SHARP (NVLS") && e.contains("NCCL_NVLS_ENABLE=0") && !e.contains("the run was not on this cluster"), "{e}");
        let mut both = ar.clone();
        both.extend(rows(&ring, 8, 1, &["all_gather", "reduce_scatter"]));
        let read = parse(&as_nccl_tests(&both, &hosts), "sweep.log").unwrap();
        let f = fit_collectives(&read, &h100(), None, "sweep.log").unwrap();
        assert!((f.efficiency.scale_up - 0.73).abs() < 2e-3, "{:?}", f.params);
        assert!(f.notes.iter().any(|n| n.starts_with("all_reduce rows left out: all_reduce carried") && n.contains("NVLS")), "{:?}", f.notes);
        assert_eq!(f.pooled.rows, 10);
        // Below the link's rate an all-reduce is fitted as before; far above it (algbw
        // over the link), the profile is wrong, whatever NCCL did.
        let f = fit_collectives(&rows(&ring, 8, 1, &["all_reduce", "all_gather"]), &h100(), None, "c.json").unwrap();
        assert!(f.notes.is_empty() && f.pooled.rows == 10, "{:?}", f.notes);
        let mut slow = h100();
        slow.scale_up_gbs = 200.0;
        let e = fit_collectives(&alone, &slow, None, "c.json").unwrap_err();
        assert!(e.contains("the run was not on this cluster") && !e.contains("NVLS"), "{e}");
    }

    /// An all-reduce the network reduced, over two nodes of 8 H100s (NVLink SHARP across
    /// nodes, or IB SHARP through CollNet): its NIC share passes the 50 GB/s NIC, which no
    /// ring or tree over the NICs carries. Alone, it is refused naming both NCCL switches,
    /// not a wrong scale_out_gbs; beside other ops, left out with a note and the rest
    /// fitted. Past even in-network reduction's bound (algbw above the NIC), the profile is
    /// still wrong.
    #[test]
    fn an_in_network_all_reduce_across_nodes_is_named_and_left_out() {
        let ring = known(0.55);
        let hosts = [vec!["node-a"; 8], vec!["node-b"; 8]].concat();
        // The projection's own all-reduce over nodes is bound by NVLink past a NIC share
        // of about 42 GB/s, so the in-network one is the ring's (30.5 GB/s a NIC) 2.2x
        // faster: 67 GB/s, under 2(n-1)/n = 1.875 times the NIC.
        let ar: Vec<CollRow> = rows(&ring, 16, 2, &["all_reduce"])
            .into_iter()
            .map(|r| CollRow { time_us: r.time_us / 2.2, algbw_gbps: r.algbw_gbps * 2.2, busbw_gbps: r.busbw_gbps * 2.2, ..r })
            .collect();
        let alone = parse(&as_nccl_tests(&ar, &hosts), "all_reduce_perf.log").unwrap();
        assert!(alone.iter().all(|r| r.nodes == 2 && r.ranks == 16), "{alone:?}");
        let e = fit_collectives(&alone, &h100(), None, "all_reduce_perf.log").unwrap_err();
        assert!(e.starts_with("all_reduce_perf.log: all_reduce carried 6") && e.contains("H100's NIC per GPU (scale_out_gbs) is 50 GB/s"), "{e}");
        assert!(e.contains("InfiniBand SHARP") && e.contains("NCCL_NVLS_ENABLE=0 NCCL_COLLNET_ENABLE=0"), "{e}");
        assert!(!e.contains("the run was not on this cluster") && !e.contains("not bound by the NICs"), "{e}");
        let mut both = ar.clone();
        both.extend(rows(&ring, 16, 2, &["all_gather", "reduce_scatter"]));
        let read = parse(&as_nccl_tests(&both, &hosts), "sweep.log").unwrap();
        let f = fit_collectives(&read, &h100(), None, "sweep.log").unwrap();
        assert_eq!(f.tier, Tier::ScaleOut);
        assert!((f.efficiency.scale_out - 0.61).abs() < 2e-3, "{:?}", f.params);
        assert!(
            f.notes.iter().any(|n| n.starts_with("all_reduce rows left out: all_reduce carried") && n.contains("NCCL_COLLNET_ENABLE=0 to fit it too")),
            "{:?}",
            f.notes
        );
        assert_eq!(f.pooled.rows, 10);
        // Below the NIC's rate an all-reduce over nodes is fitted as before.
        let f = fit_collectives(&rows(&ring, 16, 2, &["all_reduce", "all_gather"]), &h100(), None, "c.json").unwrap();
        assert!(f.notes.iter().all(|n| !n.contains("left out")) && f.pooled.rows == 10, "{:?}", f.notes);
        let mut slow = h100();
        slow.scale_out_gbs = 20.0;
        let e = fit_collectives(&alone, &slow, None, "c.json").unwrap_err();
        assert!(!e.contains("SHARP"), "{e}");
    }

    /// A log run under `srun -l` (each line `0: `, wide ranks ` 3: `) or `mpirun
    /// --tag-output` (`[1,0]<stdout>:`) reads as the same log untagged; mpirun's own
    /// `[host:pid]` lines and a few untagged lines do not stop it.
    #[test]
    fn launcher_tagged_logs_read_as_untagged() {
        let json = rows(&known(0.55), 8, 1, &["all_reduce", "all_gather"]);
        let plain = as_nccl_tests(&json, &["node-a"; 8]);
        assert!(plain.starts_with("[node-a:01234]"));
        let want = parse(&plain, "sweep.log").unwrap();
        let tag = |f: &dyn Fn(usize) -> String| {
            let mut s = String::from("+ srun all_reduce_perf\n");
            for (i, l) in plain.lines().enumerate() {
                s += &format!("{}{l}\n", f(i));
            }
            s
        };
        for (style, text) in [
            ("srun -l", tag(&|_| "0: ".into())),
            ("srun -l, 16 ranks", tag(&|i| if i % 7 == 3 { format!("{:2}: ", 10 + i % 6) } else { " 0: ".into() })),
            ("mpirun --tag-output", tag(&|i| format!("[1,{}]<std{}>:", i % 3, if i % 5 == 0 { "err" } else { "out" }))),
        ] {
            let read = parse(&text, "sweep.log").unwrap_or_else(|e| panic!("{style}: {e}"));
            assert_eq!(read, want, "{style}");
        }
        // JSON is JSON, and a line of a row is no tag.
        assert_eq!(crate::nccl_tests::untagged(&serde_json::to_string_pretty(&json).unwrap()), None);
        assert_eq!(crate::nccl_tests::untagged("     1048576        262144     float\n"), None);
    }

    /// `bench collectives -c 0` writes `"wrong": null` (nothing checked), which reads
    /// as none; a row without the field is still refused.
    #[test]
    fn an_unchecked_row_reads_and_a_missing_check_does_not() {
        let mut r = rows(&h100(), 8, 1, &["all_reduce"]);
        r[1].wrong = None;
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"wrong\":null"), "{text}");
        assert_eq!(parse(&text, "coll.json").unwrap()[1].wrong, None);
        let e = parse(&text.replacen(",\"wrong\":null", "", 1), "coll.json").unwrap_err();
        assert!(e.contains("missing field `wrong`"), "{e}");
    }

    /// Several files join into one sweep when they are one run's, each op and size once.
    #[test]
    fn files_join_when_they_are_one_runs_sweep() {
        let ar = rows(&h100(), 8, 1, &["all_reduce"]);
        let ag = rows(&h100(), 8, 1, &["all_gather"]);
        let both = join(vec![("ar.log".into(), ar.clone()), ("ag.log".into(), ag.clone())]).unwrap();
        assert_eq!(both.len(), ar.len() + ag.len());
        let e = join(vec![("ar.log".into(), ar.clone()), ("again.log".into(), ar.clone())]).unwrap_err();
        assert!(e.starts_with("again.log: all_reduce of 65536 B is in ar.log too"), "{e}");
        let e = join(vec![("ar.log".into(), ar), ("ag16.log".into(), rows(&h100(), 16, 2, &["all_gather"]))]).unwrap_err();
        assert!(e.starts_with("ag16.log: ranks is 16 but ar.log's is 8"), "{e}");
    }

    /// A row's refused figure is echoed short: `{}` of 1e300 (or of 1e-300) is 300 digits.
    #[test]
    fn a_refused_row_figure_is_echoed_short() {
        let mut r = rows(&h100(), 8, 1, &["all_reduce"]);
        r[0].busbw_gbps = 1e300;
        let e = parse(&serde_json::to_string(&r).unwrap(), "c.json").unwrap_err();
        assert!(e.contains("busbw_gbps 1e300 is not size / time x the bus factor (") && e.len() < 300, "{e}");
        r[0].time_us = 1e-300;
        let e = parse(&serde_json::to_string(&r).unwrap(), "c.json").unwrap_err();
        assert!(e.contains("time_us 1e-300 is too small") && e.len() < 300, "{e}");
    }

    /// Each figure of an nccl-tests log is read from its own column: broadcast's in place
    /// (as all_reduce's), algbw from algbw (the log reader checks the printed figures
    /// against each other, not which column the fit takes), and the device from rank 0
    /// wherever its line sits.
    #[test]
    fn each_figure_of_a_log_is_read_from_its_own_column() {
        let json = rows(&known(0.55), 8, 1, &["broadcast", "all_gather"]);
        let text = as_nccl_tests(&json, &["node-a"; 8]);
        // Rank 7 on another board: the device named is still rank 0's.
        let text: String = text
            .lines()
            .map(|l| if l.starts_with("#  Rank  7") { l.replace("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe") + "\n" } else { format!("{l}\n") })
            .collect();
        assert!(text.contains("NVIDIA H100 PCIe"), "the case the test means");
        let read = parse(&text, "sweep.log").unwrap();
        assert_eq!(read.len(), json.len());
        for (r, j) in read.iter().zip(&json) {
            assert_eq!((r.op.as_str(), r.size_bytes, r.device.as_str()), (j.op.as_str(), j.size_bytes, "NVIDIA H100 80GB HBM3"));
            // Two decimals in the log.
            assert!((r.time_us - j.time_us).abs() <= 0.005 + 1e-9 * j.time_us, "{r:?}\n{j:?}");
            assert!((r.algbw_gbps - j.algbw_gbps).abs() <= 0.005 + 1e-9 * j.algbw_gbps, "{r:?}\n{j:?}");
            assert!((r.busbw_gbps - j.busbw_gbps).abs() <= 0.005 + 1e-9 * j.busbw_gbps, "{r:?}\n{j:?}");
        }
    }

    /// On one node of several NVLink domains (joined over the scale-out tier in the
    /// projection's terms) no network reduces: an all-reduce past the NIC's rate there is
    /// a wrong profile, never NVLink or InfiniBand SHARP.
    #[test]
    fn a_one_node_all_reduce_past_the_nic_is_a_wrong_profile() {
        let mut pairs = h100();
        pairs.scale_up_domain = 4;
        let truth = with(&pairs, |e| {
            e.scale_out = 0.61;
            e.scale_out_latency_us = 11.0;
        });
        // 30.5 GB/s a NIC against 20: past the NIC, though its algbw (/ 1.75) is not.
        let mut slow = pairs.clone();
        slow.scale_out_gbs = 20.0;
        let e = fit_collectives(&rows(&truth, 8, 1, &["all_reduce"]), &slow, None, "c.json").unwrap_err();
        assert!(e.starts_with("c.json: the run carried 30.5 GB/s") && e.contains("scale_out_gbs is wrong") && !e.contains("SHARP"), "{e}");
    }

    /// A fitted efficiency over 1 is refused however little over (here 1.2: the profile's
    /// NVLink rate below what the run carried).
    #[test]
    fn an_efficiency_a_little_over_one_is_refused() {
        let truth = known(0.55);
        let mut low = h100();
        low.scale_up_gbs = truth.scale_up_gbs * 0.73 / 1.2;
        let e = fit_collectives(&rows(&truth, 8, 1, &["all_gather"]), &low, None, "c.json").unwrap_err();
        assert!(e.contains("(120%)") && e.contains("scale_up_gbs is wrong"), "{e}");
    }

    /// Across nodes an all-to-all row quicker than its NVLink share alone leaves nothing
    /// for the NICs: it is left out by name, and the rest fit.
    #[test]
    fn an_all_to_all_row_quicker_than_its_nvlink_share_is_left_out() {
        let truth = known(0.55);
        let mut rs = rows(&truth, 16, 2, &["all_gather", "alltoall"]);
        let quick = rs.iter_mut().find(|r| r.op == "alltoall" && r.size_bytes == 1 << 16).unwrap();
        // Its NVLink share: 65536 / 16 B to each of 7 peers at 0.73 of 450 GB/s, 0.087 us.
        quick.time_us = 0.05;
        let f = fit_collectives(&rs, &h100(), None, "c.json").unwrap();
        assert!(f.notes.iter().any(|n| n == "alltoall of 65536 B left out: its NVLink share alone takes longer than it did"), "{:?}", f.notes);
        assert_eq!(f.per_op.iter().find(|l| l.op == "alltoall").map(|l| l.rows), Some(4));
        assert!((f.efficiency.scale_out_a2a - 0.55).abs() < 5e-3, "{:?}", f.params);
    }

    fn with(gpu: &GpuProfile, f: impl FnOnce(&mut Efficiency)) -> GpuProfile {
        let mut g = gpu.clone();
        f(&mut g.efficiency);
        g
    }

    /// A sweep inside one node whose times follow α–β for known efficiency and latency
    /// is fitted back to them, whatever the profile started from.
    #[test]
    fn a_synthetic_nvlink_sweep_is_fitted_back_to_its_alpha_and_beta() {
        let truth = with(&h100(), |e| {
            e.scale_up = 0.73;
            e.scale_up_latency_us = 4.2;
        });
        let r = rows(&truth, 8, 1, &["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"]);
        let f = fit_collectives(&r, &h100(), None, "coll.json").unwrap();
        assert_eq!((f.tier, f.local), (Tier::ScaleUp, 8));
        assert!((f.efficiency.scale_up - 0.73).abs() < 1e-9, "{:?}", f.params);
        assert!((f.efficiency.scale_up_latency_us - 4.2).abs() < 1e-6, "{:?}", f.params);
        assert!(f.pooled.max_error < 1e-9);
        assert_eq!(f.efficiency.scale_out, h100().efficiency.scale_out, "the other tier is untouched");
        assert!(f.notes.iter().any(|n| n.contains("broadcast")), "{:?}", f.notes);
        assert_eq!(f.per_op.len(), 4);
        // Rows in size order, the ops interleaved: still one line per op.
        let mut by_size = r.clone();
        by_size.sort_by_key(|r| r.size_bytes);
        let f = fit_collectives(&by_size, &h100(), None, "coll.json").unwrap();
        assert_eq!(f.per_op.iter().map(|l| l.op.as_str()).collect::<Vec<_>>(), ["all_reduce", "all_gather", "reduce_scatter", "alltoall"]);
    }

    /// nccl-tests `-d all` / `-o all`: every size once per data type (and reduction op).
    /// Only the bfloat16 sum rows are fitted, with a note; the others, here twice as slow,
    /// would pull the fit off them.
    #[test]
    fn rows_of_several_data_types_fit_the_bfloat16_ones() {
        let truth = with(&h100(), |e| {
            e.scale_up = 0.73;
            e.scale_up_latency_us = 4.2;
        });
        let bf16: Vec<CollRow> = rows(&truth, 8, 1, &["all_reduce"]).into_iter().map(|r| CollRow { dtype: "bfloat16".into(), ..r }).collect();
        let slow = |dtype: &str, redop: &str| -> Vec<CollRow> {
            bf16.iter()
                .map(|r| CollRow { dtype: dtype.into(), redop: redop.into(), time_us: r.time_us * 2.0, algbw_gbps: r.algbw_gbps / 2.0, busbw_gbps: r.busbw_gbps / 2.0, ..r.clone() })
                .collect()
        };
        let mixed: Vec<CollRow> = slow("float", "sum").into_iter().chain(bf16.clone()).chain(slow("bfloat16", "max")).chain(slow("half", "sum")).collect();
        let f = fit_collectives(&mixed, &h100(), None, "ar.log").unwrap();
        assert!((f.efficiency.scale_up - 0.73).abs() < 1e-9, "{:?}", f.params);
        assert_eq!(f.pooled.rows, bf16.len());
        assert_eq!(
            f.notes,
            ["all_reduce measured in 3 data types and 2 reduction ops (nccl-tests -d all -o all): fitted its bfloat16 sum rows \
              only (bfloat16, the projection's gradient type, where the log has it, else half, else float; 15 more left out)"]
        );
        // No bfloat16: half before float.
        let f = fit_collectives(&[slow("float", "sum"), bf16.iter().map(|r| CollRow { dtype: "half".into(), ..r.clone() }).collect()].concat(), &h100(), None, "ar.log").unwrap();
        assert!((f.efficiency.scale_up - 0.73).abs() < 1e-9 && f.notes[0].contains("fitted its half sum rows"), "{:?}", f.notes);
        // One type: no note.
        assert!(fit_collectives(&bf16, &h100(), None, "ar.log").unwrap().notes.is_empty());
    }

    /// Across nodes: 8 ranks per node share the rails (all-reduce and friends), an
    /// all-to-all sends its remote share through each rank's NIC at its own, lower
    /// efficiency; one rank per node is bound by one NIC. Both recover the two NIC
    /// efficiencies and the latency; a sweep of all-to-all rows alone sets only its own.
    #[test]
    fn a_synthetic_multi_node_sweep_is_fitted_back_to_the_nic_tier() {
        let truth = with(&h100(), |e| {
            e.scale_out = 0.61;
            e.scale_out_a2a = 0.27;
            e.scale_out_latency_us = 11.0;
        });
        for (ranks, nodes, want_local) in [(16, 2, 8), (4, 4, 1)] {
            let r = rows(&truth, ranks, nodes, &["all_reduce", "all_gather", "reduce_scatter", "alltoall"]);
            let f = fit_collectives(&r, &h100(), None, "coll.json").unwrap();
            assert_eq!((f.tier, f.local), (Tier::ScaleOut, want_local));
            assert!((f.efficiency.scale_out - 0.61).abs() < 1e-6, "{ranks}/{nodes}: {:?}", f.params);
            assert!((f.efficiency.scale_out_a2a - 0.27).abs() < 1e-6, "{ranks}/{nodes}: {:?}", f.params);
            assert!((f.efficiency.scale_out_latency_us - 11.0).abs() < 1e-3, "{ranks}/{nodes}: {:?}", f.params);
            assert!(f.pooled.max_error < 1e-9, "the rings' line is not polluted by the all-to-all rows");
            let only = rows(&truth, ranks, nodes, &["alltoall"]);
            let f = fit_collectives(&only, &h100(), None, "coll.json").unwrap();
            assert!((f.efficiency.scale_out_a2a - 0.27).abs() < 1e-6, "{ranks}/{nodes}: {:?}", f.params);
            assert_eq!(f.efficiency.scale_out, h100().efficiency.scale_out, "no ring rows: scale_out untouched");
            assert!(f.params.iter().all(|p| p.0 != "scale_out"), "{:?}", f.params);
        }
    }

    /// Rank counts that are not powers of two: the fit counts ⌈log2 n⌉ latency steps per
    /// call, as the projection's α–β law does (comm.rs), so a sweep of 6 ranks on a node
    /// (3 steps) or of 24 over 3 nodes (5 steps) is fitted back to the true per-step
    /// latency, not to 3/2 or 5/4 of it.
    #[test]
    fn rank_counts_between_powers_of_two_keep_the_per_step_latency() {
        let truth = with(&h100(), |e| {
            e.scale_up = 0.73;
            e.scale_up_latency_us = 4.2;
            e.scale_out = 0.61;
            e.scale_out_latency_us = 11.0;
        });
        let f = fit_collectives(&rows(&truth, 6, 1, &["all_reduce", "all_gather"]), &h100(), None, "coll.json").unwrap();
        assert_eq!((f.tier, f.local), (Tier::ScaleUp, 6));
        assert!((f.efficiency.scale_up_latency_us - 4.2).abs() < 1e-6, "{:?}", f.params);
        assert!((f.efficiency.scale_up - 0.73).abs() < 1e-9, "{:?}", f.params);
        let f = fit_collectives(&rows(&truth, 24, 3, &["all_reduce", "reduce_scatter"]), &h100(), None, "coll.json").unwrap();
        assert_eq!((f.tier, f.local), (Tier::ScaleOut, 8));
        assert!((f.efficiency.scale_out_latency_us - 11.0).abs() < 1e-3, "{:?}", f.params);
        assert!((f.efficiency.scale_out - 0.61).abs() < 1e-6, "{:?}", f.params);
    }

    /// Real sweeps are noisy: with every time off by up to ±5 % (a fixed pattern, no
    /// seed to drift), the fit still lands within 1.5 % of the true bandwidth efficiency
    /// and 3 % of the true per-step latency, on one node and across nodes (measured:
    /// 0.3 % and 0.6 % on one node, 0.5 % and 0.7 % over two).
    #[test]
    fn a_noisy_sweep_is_fitted_within_the_stated_tolerance() {
        let truth = known(0.61);
        for (ranks, nodes) in [(8, 1), (16, 2)] {
            let mut r = rows(&truth, ranks, nodes, &["all_reduce", "all_gather", "reduce_scatter", "alltoall"]);
            for (i, row) in r.iter_mut().enumerate() {
                let noise = 1.0 + 0.05 * (i as f64 * 2.399).sin();
                row.time_us *= noise;
                row.algbw_gbps /= noise;
                row.busbw_gbps /= noise;
            }
            let text = serde_json::to_string(&r).unwrap();
            let f = fit_collectives(&parse(&text, "coll.json").unwrap(), &h100(), None, "coll.json").unwrap();
            let (e, l, want_e, want_l) = match f.tier {
                Tier::ScaleUp => (f.efficiency.scale_up, f.efficiency.scale_up_latency_us, 0.73, 4.2),
                Tier::ScaleOut => (f.efficiency.scale_out, f.efficiency.scale_out_latency_us, 0.61, 11.0),
            };
            assert!((e / want_e - 1.0).abs() < 0.015, "{ranks}/{nodes}: efficiency {e} vs {want_e}");
            assert!((l / want_l - 1.0).abs() < 0.03, "{ranks}/{nodes}: latency {l} vs {want_l}");
            assert!(f.pooled.max_error > 0.01 && f.pooled.max_error < 0.12, "{}", f.pooled.max_error);
        }
    }

    /// NaN, negative, zero and huge values give an error or a finite fit, never a panic.
    #[test]
    fn extreme_values_never_panic() {
        let good = rows(&h100(), 8, 1, &["all_reduce"]);
        for v in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e-300, 1e300, f64::MAX] {
            let mut r = good.clone();
            r[1].time_us = v;
            if let Ok(f) = fit_collectives(&r, &h100(), None, "coll.json") {
                assert!(f.efficiency.scale_up.is_finite() && f.efficiency.scale_up_latency_us.is_finite(), "{v}: {:?}", f.params);
            }
            let text = serde_json::to_string(&r).unwrap();
            assert!(parse(&text, "coll.json").is_err(), "{v} accepted");
        }
        let mut r = good.clone();
        r[0].size_bytes = u64::MAX;
        r[0].ranks = usize::MAX;
        let _ = fit_collectives(&r, &h100(), None, "coll.json");
        assert!(parse(&serde_json::to_string(&r).unwrap(), "coll.json").is_err());
        assert!(parse("[{\"time_us\": 1e999}]", "coll.json").unwrap_err().contains("line 1"));
    }

    #[test]
    fn the_tier_follows_the_layout_and_ambiguity_is_refused() {
        let p = Profiles::builtin();
        let (h, gb) = (p.get("h100").unwrap(), p.get("gb200").unwrap());
        assert_eq!(tier_of(8, 1, h, None).unwrap(), (Tier::ScaleUp, 8));
        assert_eq!(tier_of(16, 2, h, None).unwrap(), (Tier::ScaleOut, 8));
        assert!(tier_of(1, 1, h, None).unwrap_err().contains("one rank"));
        assert!(tier_of(16, 1, h, None).unwrap_err().contains("scale-out"), "16 ranks exceed an 8-GPU domain");
        assert!(tier_of(8, 1, h, Some(Tier::ScaleOut)).unwrap_err().contains("never left NVLink"));
        assert!(tier_of(8, 2, gb, None).unwrap_err().contains("--tier"));
        assert_eq!(tier_of(8, 2, gb, Some(Tier::ScaleUp)).unwrap(), (Tier::ScaleUp, 8));
        assert!(tier_of(6, 4, h, None).unwrap_err().contains("evenly"));
    }

    #[test]
    fn bad_files_and_impossible_fits_name_the_problem() {
        let good = rows(&h100(), 8, 1, &["all_reduce"]);
        let text = serde_json::to_string(&good).unwrap();
        let back = parse(&text, "coll.json").unwrap();
        assert_eq!(back.len(), good.len());
        assert!(back.iter().zip(&good).all(|(a, b)| a.op == b.op && (a.time_us / b.time_us - 1.0).abs() < 1e-12));
        let bad = |text: &str, want: &str| {
            let e = parse(text, "coll.json").unwrap_err();
            assert!(e.contains("coll.json") && e.contains(want), "want '{want}': {e}");
        };
        bad("[{", "line 1");
        bad("[]", "no rows");
        bad(&text.replacen("\"wrong\":0", "\"wrong\":3", 1), "3 wrong values");
        bad(&text.replacen("\"op\":\"all_reduce\"", "\"op\":\"allreduce2\"", 1), "allreduce2");
        bad(&text.replacen("\"ranks\":8", "\"ranks\":4", 1), "bus factor");
        bad(&text.replacen(",\"nodes\":1", "", 1), "nodes");
        // nccl-tests prints busbw to two decimals: a rounded value is the row as written, a
        // value 3 % off is an edited row (the check allows 1 %).
        let mut rounded = good.clone();
        rounded[1].busbw_gbps = (rounded[1].busbw_gbps * 100.0).round() / 100.0;
        assert!(parse(&serde_json::to_string(&rounded).unwrap(), "coll.json").is_ok());
        let mut edited = good.clone();
        edited[1].busbw_gbps *= 1.03;
        bad(&serde_json::to_string(&edited).unwrap(), "busbw_gbps");
        let mut mixed = good.clone();
        mixed[2].device = "cuda:0 (NVIDIA B200)".into();
        bad(&serde_json::to_string(&mixed).unwrap(), "mixes runs");
        // Faster than the link the profile names: another GPU, or a wrong profile.
        let fast = with(&h100(), |e| e.scale_up = 1.0);
        let mut slow = h100();
        slow.scale_up_gbs = 100.0;
        let e = fit_collectives(&rows(&fast, 8, 1, &["all_reduce"]), &slow, None, "coll.json").unwrap_err();
        assert!(e.contains("scale_up_gbs"), "{e}");
        // One size cannot separate α from β.
        let one: Vec<CollRow> = good.iter().filter(|r| r.size_bytes == 1 << 20).cloned().collect();
        let e = fit_collectives(&one, &h100(), None, "coll.json").unwrap_err();
        assert!(e.contains("coll.json: the rows have one size only"), "{e}");
        // JSON has no NaN: serde says "expected value", the hint says why.
        let at = text.find("\"time_us\":").unwrap() + "\"time_us\":".len();
        let end = at + text[at..].find(',').unwrap();
        bad(&format!("{}NaN{}", &text[..at], &text[end..]), "NaN and Infinity are not JSON numbers");
    }

    /// nccl-tests' names map to the projection's collectives; broadcast and send/recv,
    /// which it does not model, keep nccl-tests' bus factor of 1. The tier's names are
    /// read in any case.
    #[test]
    fn op_and_tier_names() {
        assert_eq!(kind_of("reduce_scatter"), Ok(Some(OpKind::ReduceScatter)));
        assert_eq!(kind_of("all_gather"), Ok(Some(OpKind::AllGather)));
        for op in ["broadcast", "sendrecv"] {
            assert_eq!(kind_of(op), Ok(None));
            assert_eq!(bus_factor_of(op, 8), Ok(1.0));
        }
        assert_eq!(bus_factor_of("all_reduce", 8), Ok(1.75));
        for (s, t) in [("scale-up", Tier::ScaleUp), ("NVLink", Tier::ScaleUp), ("Scale-Out", Tier::ScaleOut), ("network", Tier::ScaleOut)] {
            assert_eq!(Tier::parse(s), Ok(t), "{s}");
        }
        assert!(Tier::parse("pcie").is_err());
    }

    /// Rows no run writes are refused, each naming why: an empty buffer, more nodes than
    /// ranks or none, any wrong value, a busbw that does not follow from size and time (too
    /// low as much as too high), rows of another run (ranks, nodes, transport).
    #[test]
    fn rows_no_run_writes_are_refused() {
        let good = rows(&h100(), 8, 1, &["all_reduce"]);
        let refused = |edit: &dyn Fn(&mut CollRow), want: &str| {
            let mut r = good.clone();
            edit(&mut r[1]);
            let e = parse(&serde_json::to_string(&r).unwrap(), "coll.json").unwrap_err();
            assert!(e.contains(want), "want '{want}': {e}");
        };
        refused(
            &|r| {
                r.size_bytes = 0;
                r.algbw_gbps = 0.0;
                r.busbw_gbps = 0.0;
            },
            "size_bytes > 0",
        );
        refused(&|r| r.nodes = 16, "nodes at most ranks");
        refused(&|r| r.nodes = 0, "must be at least 1");
        refused(&|r| r.wrong = Some(1), "1 wrong values");
        refused(&|r| r.busbw_gbps *= 0.97, "busbw_gbps");
        refused(&|r| r.nodes = 2, "nodes is 2 but row 0's is 1");
        refused(&|r| r.transport = "tcp".into(), "transport is tcp but row 0's is nccl");
        refused(
            &|r| {
                r.ranks = 4;
                r.busbw_gbps = r.algbw_gbps * 1.5;
            },
            "ranks is 4 but row 0's is 8",
        );
    }

    /// A node of one GPU and no NVLink (gpus_per_node = scale_up_domain = 1): 2 ranks run
    /// on one machine fit neither tier by themselves, and the message names the profile's
    /// fields and --tier; --tier scale-out is then taken, and --tier scale-up points back to
    /// it. (It said "fit it as scale-out", then, with --tier scale-out, "never left NVLink".)
    #[test]
    fn a_run_on_a_node_larger_than_the_profiles_gets_one_answer() {
        let mut one = h100();
        one.gpus_per_node = 1;
        one.scale_up_domain = 1;
        let e = tier_of(2, 1, &one, None).unwrap_err();
        assert!(e.contains("1 GPU(s) (gpus_per_node)") && e.contains("NVLink domain 1 (scale_up_domain)") && e.contains("--tier scale-out"), "{e}");
        assert_eq!(tier_of(2, 1, &one, Some(Tier::ScaleOut)).unwrap(), (Tier::ScaleOut, 1));
        assert!(tier_of(2, 1, &one, Some(Tier::ScaleUp)).unwrap_err().contains("(--tier scale-out)"));
        // Across nodes it is the network, as before.
        assert_eq!(tier_of(2, 2, &one, None).unwrap(), (Tier::ScaleOut, 1));
    }

    /// A run over nodes forced into an NVLink domain of one node is refused; across
    /// nodes, a domain smaller than the node bounds the members per domain.
    #[test]
    fn a_forced_tier_and_a_domain_smaller_than_the_node() {
        let e = tier_of(8, 2, &h100(), Some(Tier::ScaleUp)).unwrap_err();
        assert!(e.contains("spans 2 nodes"), "{e}");
        let mut pairs = h100();
        pairs.scale_up_domain = 4;
        assert_eq!(tier_of(16, 2, &pairs, None).unwrap(), (Tier::ScaleOut, 4));
        // On one node of two such domains, 8 ranks crossed between them, as a group of 8
        // on it does in the projection (4 members a domain, the two domains joined over the
        // scale-out tier): fitted there, not refused as scale-up ("fit it as scale-out")
        // and then as scale-out ("never left NVLink"). 4 ranks stayed in one domain.
        assert_eq!(pairs.fabric().members_per_domain(Placement { size: 8, stride: 1 }), (4, false));
        assert_eq!(tier_of(8, 1, &pairs, None).unwrap(), (Tier::ScaleOut, 4));
        assert_eq!(tier_of(8, 1, &pairs, Some(Tier::ScaleOut)).unwrap(), (Tier::ScaleOut, 4));
        assert!(tier_of(8, 1, &pairs, Some(Tier::ScaleUp)).unwrap_err().contains("fit it as scale-out"));
        assert_eq!(tier_of(4, 1, &pairs, None).unwrap(), (Tier::ScaleUp, 4));
        assert!(tier_of(4, 1, &pairs, Some(Tier::ScaleOut)).unwrap_err().contains("never left NVLink"));
        // A single-node sweep on such a node is fitted back to the NIC tier it prices.
        let truth = with(&pairs, |e| {
            e.scale_out = 0.61;
            e.scale_out_latency_us = 11.0;
        });
        let f = fit_collectives(&rows(&truth, 8, 1, &["all_reduce", "all_gather"]), &pairs, None, "coll.json").unwrap();
        assert_eq!((f.tier, f.local), (Tier::ScaleOut, 4));
        assert!((f.efficiency.scale_out - 0.61).abs() < 1e-6, "{:?}", f.params);
        assert!((f.efficiency.scale_out_latency_us - 11.0).abs() < 1e-3, "{:?}", f.params);
    }

    /// What comes with the fitted parameters. Inside a domain the pooled line holds every
    /// row; across domains only the rings', and they alone set the tier's latency (here
    /// the all-to-all rows carry 30 µs a step, the rings 11). The transfer share is the
    /// largest size's under the fit, β·X / (⌈log2 n⌉·α + β·X): for 1 GiB all-reduced over
    /// 8 ranks, X = 7/4 GiB at 0.73 of the NVLink rate against 3 steps of 4.2 µs. A sweep
    /// that stops at 1 MiB is latency-bound and says so; an op of one size is noted, not
    /// fitted, and two ops of one size each fit nothing; the ops not fitted are named once;
    /// the run's errors name its file; TCP ranks are named; 8 ranks a node carrying
    /// 8 x 30.5 GB/s across nodes cannot be bound by the NICs on a profile whose NVLink
    /// carries at most 100 GB/s.
    #[test]
    fn the_pooled_line_its_transfer_share_and_the_notes() {
        let truth = with(&h100(), |e| {
            e.scale_up = 0.73;
            e.scale_up_latency_us = 4.2;
            e.scale_out = 0.61;
        });
        let ops = ["all_reduce", "all_gather", "reduce_scatter", "alltoall"];
        let f = fit_collectives(&rows(&truth, 8, 1, &ops), &h100(), None, "coll.json").unwrap();
        assert_eq!((f.pooled.op.as_str(), f.pooled.rows), ("all", 20));
        // The fit takes the all-to-all's NVLink share at the profile's rate: leave it be.
        let net = with(&h100(), |e| {
            e.scale_out = 0.61;
            e.scale_out_a2a = 0.27;
            e.scale_out_latency_us = 11.0;
        });
        let slow_a2a = with(&net, |e| e.scale_out_latency_us = 30.0);
        let mut r = rows(&net, 16, 2, &ops[..3]);
        r.extend(rows(&slow_a2a, 16, 2, &["alltoall"]));
        let f = fit_collectives(&r, &h100(), None, "coll.json").unwrap();
        assert_eq!((f.pooled.op.as_str(), f.pooled.rows), ("all", 15));
        assert!((f.efficiency.scale_out_latency_us - 11.0).abs() < 1e-3, "{:?}", f.params);
        assert!((f.efficiency.scale_out_a2a - 0.27).abs() < 1e-6, "{:?}", f.params);

        let ar = rows(&truth, 8, 1, &["all_reduce"]);
        let f = fit_collectives(&ar, &h100(), None, "coll.json").unwrap();
        let transfer = 1.75 * 2f64.powi(30) / (truth.scale_up_gbs * 1e9 * 0.73);
        let share = transfer / (3.0 * 4.2e-6 + transfer);
        assert!((f.pooled.transfer_share - share).abs() < 1e-9, "{} vs {share}", f.pooled.transfer_share);
        assert!(f.notes.is_empty(), "{:?}", f.notes);
        let small: Vec<CollRow> = ar.iter().filter(|r| r.size_bytes <= 1 << 20).cloned().collect();
        let f = fit_collectives(&small, &h100(), None, "coll.json").unwrap();
        assert!(f.notes.iter().any(|n| n.contains("poorly determined")), "{:?}", f.notes);

        let mut r = ar.clone();
        r.extend(rows(&truth, 8, 1, &["all_gather"]).into_iter().filter(|r| r.size_bytes == 1 << 20));
        let f = fit_collectives(&r, &h100(), None, "coll.json").unwrap();
        assert_eq!(f.per_op.len(), 1);
        assert!(f.notes.iter().any(|n| n.contains("the all_gather rows have one size only")), "{:?}", f.notes);
        // Two ops at one size each are still one size: α and β are not told apart.
        let one: Vec<CollRow> = rows(&truth, 8, 1, &["all_reduce", "all_gather"]).into_iter().filter(|r| r.size_bytes == 1 << 20).collect();
        let e = fit_collectives(&one, &h100(), None, "coll.json").unwrap_err();
        assert!(e.contains("the rows have one size only"), "{e}");
        // The ops the bench shows and the projection does not use, each named once.
        let f = fit_collectives(&rows(&truth, 8, 1, &["all_reduce", "broadcast", "sendrecv"]), &h100(), None, "coll.json").unwrap();
        assert_eq!(f.notes, ["broadcast, sendrecv shown by the bench but not fitted: the projection does not use them"]);
        let e = fit_collectives(&ar, &h100(), Some(Tier::ScaleOut), "coll.json").unwrap_err();
        assert!(e.starts_with("coll.json: every rank ran on one node"), "{e}");
        let tcp: Vec<CollRow> = ar.iter().map(|r| CollRow { transport: "tcp".into(), ..r.clone() }).collect();
        let f = fit_collectives(&tcp, &h100(), None, "coll.json").unwrap();
        assert!(f.notes.iter().any(|n| n.contains("TCP transport")), "{:?}", f.notes);

        let mut thin = h100();
        thin.scale_up_gbs = 100.0;
        let e = fit_collectives(&rows(&truth, 16, 2, &["all_reduce"]), &thin, None, "coll.json").unwrap_err();
        assert!(e.contains("not bound by the NICs"), "{e}");
    }
}
