//! The projection seen from the runner: installed workload plugins as graph sources
//! (a model found by its variant name), precision plans from plugins or built in, the
//! GPU profiles with the user's `--profile` file merged in, and the published reference
//! layouts that fill in what a command line leaves out. The model itself is
//! `runner_project`'s.

use std::path::Path;

use anyhow::Result;

use runner_graph::recompute::RecomputePolicy;
use runner_graph::{Graph, OpKind};
use runner_project::model::{GraphSource, Model};
use runner_project::precision::{GemmRole, Plan, Recipe};
use runner_project::profile::{GemmFormat, GpuProfile, Profiles};
use runner_project::published::Resolver;
use runner_project::step::Optimizer;

use crate::plugin::workload::{GraphRequest, RecomputeGranularity, ReferenceLayout, TrainingPrecision, Variant, Workload};
use crate::plugin::{self, Kind, Limits};

/// A workload plugin's graphs of one variant at one sequence length.
pub struct PluginSource {
    workload: Workload,
    variant: String,
    seq_len: u32,
}

impl GraphSource for PluginSource {
    fn graph(&mut self, micro_batch: u32) -> Result<Graph, String> {
        self.workload
            .graph(&GraphRequest::training(&self.variant, self.seq_len, micro_batch, 0))
            .map_err(|e| e.to_string())
    }
}

/// A model variant found among the installed workload plugins.
pub struct Found {
    /// The plugin (name, contract, source, sha256) and how to load it.
    pub info: plugin::PluginInfo,
    pub spec: String,
    pub family: String,
    pub variant: Variant,
}

/// Every installed plugin of `kind`, one per name, as a spec `plugin::load` takes
/// (plugin directories first, then embedded).
pub fn installed_specs(kind: Kind) -> Vec<String> {
    installed(kind).specs
}

/// The installed plugins of one kind ([`installed_specs`]) and the plugin files that
/// failed to load and may be of that kind ([`Broken::of`]): a consumer of the installed
/// set names each of those, not only the plugins that load.
pub struct Installed {
    pub specs: Vec<String>,
    pub broken: Vec<Broken>,
}

/// Every installed plugin of `kind` and every file that failed to load that may be one.
pub fn installed(kind: Kind) -> Installed {
    let mut specs = Vec::new();
    let mut broken = Vec::new();
    for (path, info, shadowed) in plugin::list_with_files() {
        if shadowed {
            continue;
        }
        match info {
            Ok(info) if info.kind == kind => specs.push(match &info.source {
                plugin::Source::Path(p) => p.display().to_string(),
                plugin::Source::Embedded => info.name.clone(),
            }),
            Ok(_) => {}
            Err(e) => broken.extend(Broken::of(path, &e, kind)),
        }
    }
    Installed { specs, broken }
}

/// An installed plugin that failed to load: its file (`None` for an embedded one) and
/// the load error. Its kind is in the bytes that could not be read, so it may be a
/// plugin of any kind; one named after an embedded plugin hides that one, and is of its
/// kind.
pub struct Broken {
    pub path: Option<std::path::PathBuf>,
    pub name: String,
    pub error: String,
    /// Whether it hides the embedded plugin of its name.
    pub hides_embedded: bool,
}

impl Broken {
    /// The plugin that failed to load, as one that a consumer of `kind` would have used:
    /// `None` where it hides an embedded plugin of another kind.
    pub fn of(path: Option<std::path::PathBuf>, e: &plugin::PluginError, kind: Kind) -> Option<Broken> {
        let embedded = path.as_ref().and_then(|_| plugin::embedded().iter().find(|(n, _, _)| *n == e.plugin));
        if embedded.is_some_and(|(_, k, _)| *k != kind.name()) {
            return None;
        }
        Some(Broken { path, name: e.plugin.clone(), error: e.to_string(), hides_embedded: embedded.is_some() })
    }

    /// What failed and the fix, for a note: "FILE, a plugin file that cannot be loaded:
    /// ERROR; fix or remove FILE".
    pub fn text(&self) -> String {
        let Some(path) = &self.path else {
            return format!("{}, an embedded plugin that cannot be loaded: {}", self.name, self.error);
        };
        let path = path.display();
        let hides = if self.hides_embedded { format!(" (it hides the embedded {})", self.name) } else { String::new() };
        format!("{path}, a plugin file that cannot be loaded{hides}: {}; fix or remove {path}", self.error)
    }
}

/// Why the plugin `spec` (of `kind`) that resolves cannot be used in place of a built-in
/// fallback: it fails to load, or it is of another kind. `None` where no plugin of that
/// name is installed, or it loads as one of `kind`.
pub fn unusable(spec: &str, kind: Kind) -> Option<String> {
    let (_, source) = plugin::locate(spec).ok()?;
    let (what, fix) = match &source {
        plugin::Source::Path(p) => (format!("the plugin file {}", p.display()), format!("; fix or remove {}", p.display())),
        plugin::Source::Embedded => (format!("the embedded plugin {spec}"), String::new()),
    };
    match plugin::load(spec) {
        Ok(p) if p.info.kind == kind => None,
        Ok(p) => Some(format!("{what} is a {} plugin, not a {} plugin{fix}", p.info.kind.name(), kind.name())),
        Err(e) => Some(format!("{what} cannot be loaded: {e}{fix}")),
    }
}

/// Why the tensor, pipeline and context degrees a user fixed (`[tp, pp, cp]`, `where_`
/// saying where they were given) lay out no run of `gpus` GPUs: their product does not
/// divide the count. `None` where it does. The reason `project` gives before any search,
/// and `explore` where its fixed layout divides none of the counts.
/// How `explore` and `project` count MFU, said once for both (F5): the FLOP convention,
/// the peak it divides by, and how much higher the same speed reads counted over all keys,
/// as NVIDIA's DGX Cloud benchmark READMEs count it (their Llama 3.1 70B tables use 3.94
/// PFLOP a 8,192-token sequence, 481 GFLOP a token, where the causal count gives 449).
pub fn flops_note(convention: &runner_graph::count::Convention, all_keys_ratio: f64, seq_len: u32) -> String {
    format!(
        "FLOPs: {convention}; MFU against the dense peak of the plan's low-precision format (FP8 rows against the FP8 peak, \
         so they read lower than BF16 rows of the same speed). Counted over all keys, as NVIDIA's DGX Cloud benchmark \
         READMEs do, this model's FLOPs and MFU are {:.1} % higher at seq {seq_len}",
        100.0 * (all_keys_ratio - 1.0)
    )
}

/// Model FLOPs counted over all keys against the causal count the runner reports: the
/// factor that turns its MFU into NVIDIA's DGX Cloud READMEs' (1 without attention).
pub fn all_keys_ratio(graph: &Graph) -> f64 {
    use runner_graph::count::{Convention, model_flops_per_step};
    let causal = model_flops_per_step(graph, &Convention::CAUSAL);
    if causal > 0.0 { model_flops_per_step(graph, &Convention::FULL) / causal } else { 1.0 }
}

pub fn fixed_degrees_refusal(degrees: [Option<u32>; 3], gpus: u32, where_: &str) -> Option<String> {
    let given: u64 = degrees.iter().map(|d| u64::from(d.unwrap_or(1))).product();
    (given == 0 || !u64::from(gpus).is_multiple_of(given))
        .then(|| format!("tp·pp·cp = {given} ({where_}) does not divide the {gpus} GPUs; choose degrees whose product divides {gpus}"))
}

/// Why the search found nothing, from its closest families (as it ranks them) and a count
/// of the rest: the full list (40 families for an MoE model) is `runner search`'s.
/// Families refused for the same reason share it (a flag every family breaks, such as
/// DualPipeV at pp 1, gave the one reason three times over).
pub fn closest_families(families: &[runner_project::search::Family]) -> String {
    const SHOWN: usize = 3;
    if families.is_empty() {
        return "no layout family applies to the flags given at this GPU count (FSDP, for one, needs dp·cp > 1)".into();
    }
    // (names, reason), in the order of each reason's closest family.
    let mut groups: Vec<(Vec<&str>, String)> = Vec::new();
    for f in families {
        let why = verdict_text(&f.verdict);
        match groups.iter_mut().find(|g| g.1 == why) {
            Some(g) => g.0.push(&f.name),
            None => groups.push((vec![&f.name], why)),
        }
    }
    let names = |n: &[&str]| match n {
        [one] => one.to_string(),
        _ if n.len() <= SHOWN => n.join(", "),
        _ => format!("{} and {} more", n[..SHOWN].join(", "), n.len() - SHOWN),
    };
    let shown = &groups[..groups.len().min(SHOWN)];
    let mut text = shown.iter().map(|(n, why)| format!("{}: {why}", names(n))).collect::<Vec<_>>().join("; ");
    let rest: usize = groups[shown.len()..].iter().map(|g| g.0.len()).sum();
    if rest > 0 {
        text += &format!("; and {rest} more {} (`runner search` lists each)", if rest == 1 { "family" } else { "families" });
    }
    text
}

/// A family's verdict in words: "divisibility: REASON", "memory: needs at least ...".
pub fn verdict_text(v: &runner_project::search::Verdict) -> String {
    use runner_project::search::Verdict;
    match v {
        Verdict::Best { layout, step_time_s } => format!("best ({layout}, {step_time_s:.2} s)"),
        // A near tie in percent: "1.00x slower" reads as no loss.
        Verdict::Speed { layout, slower, .. } if *slower < 1.1 => {
            format!("speed: {} % slower at best ({layout})", crate::report::fixed_or_significant(100.0 * (slower - 1.0), 1))
        }
        Verdict::Speed { layout, slower, .. } => format!("speed: {slower:.2}x slower at best ({layout})"),
        Verdict::Memory { layout, need_gib, have_gib } => {
            format!("memory: needs at least {need_gib:.0} GiB of {have_gib:.0} ({layout})")
        }
        Verdict::HostMemory { layout, need_gib, have_gib } => {
            format!("host memory: fits the GPU only by offloading {need_gib:.0} GiB of activations per GPU to {have_gib:.0} GiB of host memory ({layout})")
        }
        Verdict::Divisibility { reason, .. } => format!("divisibility: {reason}"),
    }
}

/// Find the plugin that provides variant `name`.
///
/// # Errors
/// No installed plugin provides it (the message lists the names that exist), or a
/// plugin failed to describe itself.
pub fn find_model(name: &str, limits: Limits) -> Result<Found> {
    lookup(name, limits).map_err(|m| anyhow::anyhow!(m.message(name)))
}

/// The plugin files that failed to load, each hiding any plugin of its name after it in
/// the search order (an embedded one included), as a sentence to add to a "not found".
fn broken_plugins() -> String {
    let broken: Vec<String> = plugin::list()
        .into_iter()
        .filter_map(|(info, shadowed)| match info {
            Err(e) if !shadowed => Some(e.to_string()),
            _ => None,
        })
        .collect();
    if broken.is_empty() {
        String::new()
    } else {
        format!(". These plugin files failed to load and hide any plugin of their name (the embedded ones included): {}", broken.join("; "))
    }
}

/// Why no installed plugin provides a variant: the variants there are, and the plugins
/// that failed to describe theirs.
struct Missing {
    known: Vec<String>,
    failed: Vec<String>,
    /// The host could not map a plugin's memory (`ulimit -v`): no plugin can be asked.
    host: Option<String>,
}

impl Missing {
    /// The installed names a mistyped `name` likely meant, as " (did you mean ...?)": those
    /// it begins (`llama3.1`: its sizes), else the nearest by spelling; empty when none is
    /// near, or when it begins too many to be a guess.
    fn suggestion(&self, name: &str) -> String {
        const MAX: usize = 5;
        let known: Vec<&str> = self.known.iter().map(String::as_str).collect();
        let lower = name.trim().to_lowercase();
        let begun: Vec<&str> = known.iter().copied().filter(|k| !lower.is_empty() && k.to_lowercase().starts_with(&lower)).collect();
        let near = if begun.is_empty() { crate::input::nearest(name.trim(), &known) } else { begun };
        if near.is_empty() || near.len() > MAX {
            return String::new();
        }
        format!(" (did you mean {}?)", near.join(" or "))
    }

    /// The "not found" of `name`: what is installed, what was likely meant, what failed;
    /// or only the host's own failure, where it could ask no plugin.
    fn message(&self, name: &str) -> String {
        let shown = runner_contract::text::shown(name);
        match &self.host {
            Some(host) => format!("cannot look for {shown}: {host}"),
            None => format!(
                "no installed workload plugin provides {shown}{}; installed models: {}{}",
                self.suggestion(name),
                self.known.join(", "),
                self.failures()
            ),
        }
    }

    /// The plugins that failed (to load, or to describe their models) as a sentence to
    /// add to a "not found"; empty when none did.
    fn failures(&self) -> String {
        let mut s = broken_plugins();
        if !self.failed.is_empty() {
            s += &format!("; and none of what these plugins would list, which failed: {}", self.failed.join("; "));
        }
        s
    }
}

/// The plugin that provides variant `name`, or what is there instead (one broken plugin
/// must not hide the others' models). Names are one in any case, as GPU and precision
/// names are (`LLAMA3.1-8B`); a variant of exactly that spelling comes first.
fn lookup(name: &str, limits: Limits) -> std::result::Result<Found, Missing> {
    let mut known = Vec::new();
    let mut failed = Vec::new();
    let mut other_case = None;
    for spec in installed_specs(Kind::Workload) {
        let described = plugin::load(&spec).and_then(|p| {
            let info = p.workload(limits)?.describe()?;
            Ok((p, info))
        });
        let (p, info) = match described {
            Ok(d) => d,
            // Memory the host itself could not map fails every plugin alike: said once.
            Err(e) if matches!(e.failure, plugin::Failure::HostMemory(_)) => {
                return Err(Missing { known: Vec::new(), failed: Vec::new(), host: Some(e.to_string()) });
            }
            Err(e) => {
                failed.push(e.to_string());
                continue;
            }
        };
        for v in info.variants {
            if v.name == name {
                return Ok(Found { info: p.info.clone(), spec, family: info.family.clone(), variant: v });
            }
            if other_case.is_none() && same_model_name(&v.name, name) {
                other_case = Some(Found { info: p.info.clone(), spec: spec.clone(), family: info.family.clone(), variant: v.clone() });
            }
            known.push(v.name);
        }
    }
    other_case.ok_or(Missing { known, failed, host: None })
}

/// Whether two spellings name one model: in any case, as GPU and precision names are.
fn same_model_name(a: &str, b: &str) -> bool {
    a.to_lowercase() == b.to_lowercase()
}

/// The variant of one plugin's `variants` that `name` names: exactly that spelling first,
/// then in any case ([`find_model`]'s rule, for a run file's `variant`).
pub fn variant_named<'v>(variants: &'v [Variant], name: &str) -> Option<&'v Variant> {
    variants.iter().find(|v| v.name == name).or_else(|| variants.iter().find(|v| same_model_name(&v.name, name)))
}

/// A graph source for a found variant.
///
/// # Errors
/// The plugin cannot be loaded.
pub fn source(found: &Found, seq_len: u32, limits: Limits) -> Result<PluginSource> {
    let workload = plugin::load(&found.spec)?.workload(limits)?;
    Ok(PluginSource { workload, variant: found.variant.name.clone(), seq_len })
}

/// Where Megatron-Core's pp/vp flags cannot build a layout's split: the
/// `pipeline_model_parallel_layout` string that does, for a note.
pub fn layout_string_note(layout: &runner_project::step::LayoutSpec, text: &str) -> String {
    if layout.pipeline == runner_project::step::PipelineKind::DualPipeV {
        // The V's stages in order, written as a layout string writes chunks; MindSpeed's
        // DualPipeV takes its split from its own flags, so the string is the split's
        // notation, not a flag known to configure it.
        return format!(
            "{}: the split of the layers over 2·pp = {} stages, in a pipeline_model_parallel_layout's notation: \
             \"{text}\" (stages in order down the V and back up; Megatron-Core's flags do not build it)",
            layout.short(),
            layout.pipeline.chunks(layout.pp, 1)
        );
    }
    format!(
        "{}: Megatron-Core builds this split of the layers over pp·vp = {} chunks only from \
         pipeline_model_parallel_layout = \"{text}\" (its flags need the layers, with the embedding and loss \
         counted or not, to divide by pp and each stage's share by vp)",
        layout.short(),
        layout.pipeline.chunks(layout.pp, layout.vp.max(1))
    )
}

/// Why `seq_len` is past the variant's context (its max position), if it is. A model with
/// learned positions refuses it in its plugin; a RoPE model still builds the graph (the
/// rotation extends), so a projection there is a context-extension run's, and a published
/// row there is a typo.
pub fn beyond_context(variant: &Variant, seq_len: u32) -> Option<String> {
    let max = variant.hyper.max_position;
    (max > 0 && seq_len > max).then(|| format!("seq-len {seq_len} is past {}'s context of {max} tokens (its max position)", variant.name))
}

/// The optimizer a projection of `variant` trains with: `given` (a flag or a run file's
/// `[layout] optimizer`), else the one the workload plugin names where the projection
/// models it (AdamW or Muon), else AdamW. A note says which, unless it is AdamW by
/// choice or by the plugin's word: a Muon-trained model projected with AdamW's 12 bytes
/// of state per parameter and its gradient reduce-scatter would be another run.
pub fn optimizer(given: Option<Optimizer>, variant: &Variant, notes: &mut Vec<String>) -> Optimizer {
    let named = &variant.defaults.optimizer;
    match (given, Optimizer::parse(named)) {
        (Some(o), _) => o,
        (None, Ok(Optimizer::AdamW)) => Optimizer::AdamW,
        (None, Ok(o)) => {
            notes.push(format!("optimizer: {o:?}, as {} names it (--optimizer adamw projects AdamW)", variant.name));
            o
        }
        (None, Err(_)) => {
            notes.push(format!(
                "optimizer: {} names {}, which the projection does not model: projected with AdamW (--optimizer muon for Muon)",
                variant.name,
                crate::report::visible(named)
            ));
            Optimizer::AdamW
        }
    }
}

/// Refuses the first of `given` (a flag or run-file key, and whether it was given) for a
/// model without routed experts: they shape the experts' kernels and changed nothing on a
/// dense model, unsaid (`fused_grouped_mlp` even labelled its layouts FUSED-MLP), as
/// `--etp` is refused.
///
/// # Errors
/// Names the setting and the model, and says to leave it out.
pub fn refuse_moe_settings_without_experts(given: &[(&str, bool)], model: &str, experts: u64) -> Result<()> {
    match given.iter().find(|(_, on)| *on) {
        Some((name, _)) if experts == 0 => {
            anyhow::bail!("{name} applies to the routed experts of a mixture-of-experts model; {model} has none: leave it out")
        }
        _ => Ok(()),
    }
}

/// Resolves calibration-file model names through the installed plugins.
pub struct PluginResolver {
    pub limits: Limits,
}

impl Resolver for PluginResolver {
    fn resolve(&mut self, model: &str, seq_len: u32) -> Result<(String, Box<dyn GraphSource>), String> {
        // Many points of one file may name the same missing model: each says so in a
        // line, and `runner models` lists what is installed.
        let found = lookup(model, self.limits).map_err(|m| {
            format!(
                "no installed workload plugin provides {}{} (`runner models` lists the installed ones){}",
                runner_contract::text::shown(model),
                m.suggestion(model),
                m.failures()
            )
        })?;
        if let Some(why) = beyond_context(&found.variant, seq_len) {
            return Err(format!("{why}: no published run trains past it; check the row's seq_len or its model"));
        }
        let src = source(&found, seq_len, self.limits).map_err(|e| format!("{e:#}"))?;
        Ok((found.family, Box::new(src)))
    }
}

/// The GPU profiles: built in, with `--profile FILE` merged over them.
///
/// # Errors
/// The file cannot be read or does not parse (the message names the field).
pub fn profiles(file: Option<&Path>) -> Result<Profiles> {
    match file {
        None => Ok(Profiles::builtin()),
        Some(path) => {
            let text = crate::input::read_text(path, "profile file", crate::input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
            Profiles::with_overrides(&text, &path.display().to_string()).map_err(anyhow::Error::msg)
        }
    }
}

/// The precision plan for `recipe` over `model`'s graph: the precision plugin named
/// after the recipe (`bf16.wasm`, `fp8.wasm`, ...) when one is installed, otherwise the
/// built-in plan of that name (`Plan::source` says which; the plugin's info comes back to
/// be recorded). A plugin that plans formats the recipe does not name is refused: asking
/// for FP8 from a policy that plans BF16 is an error, not a note.
///
/// # Errors
/// The plugin fails or plans another precision than asked.
pub fn plan(recipe: Recipe, variant: &Variant, gpu: &GpuProfile, graph: &Graph, limits: Limits) -> Result<(Plan, Option<plugin::PluginInfo>)> {
    let spec = format!("{}.wasm", recipe.name());
    match plugin::load(&spec) {
        Ok(p) if p.info.kind == Kind::Precision => {
            let (plan, info) = plan_from_plugin(recipe, &spec, variant, gpu, graph, limits)?;
            Ok((plan, Some(info)))
        }
        _ => Ok((Plan::builtin(recipe, graph), None)),
    }
}

/// The format a GEMM computes in from its two operands' formats: low precision only when
/// both are in the same low-precision family.
fn gemm_format(a: plugin::precision::Dtype, b: plugin::precision::Dtype) -> Option<GemmFormat> {
    use plugin::precision::Dtype as D;
    let f = |d: D| match d {
        D::Bf16 | D::Fp16 | D::Fp32 => Some(GemmFormat::Bf16),
        D::Fp8E4m3 | D::Fp8E5m2 => Some(GemmFormat::Fp8),
        D::Mxfp8 => Some(GemmFormat::Mxfp8),
        D::Nvfp4 => Some(GemmFormat::Nvfp4),
        D::Int32 => None,
    };
    let (x, y) = (f(a)?, f(b)?);
    Some(if x == y { x } else { GemmFormat::Bf16 })
}

/// Every GEMM site of `graph` a precision plan covers, with the index of its op: each
/// linear and grouped (expert) linear, in graph order, in three roles (forward, input
/// gradient, weight gradient), with the GEMM's m, n, k. LoRA adapters are left out: they
/// run in BF16 ([`runner_graph::peft::is_adapter`]).
pub fn gemm_sites(graph: &Graph) -> Vec<(usize, plugin::precision::GemmSite)> {
    use plugin::precision::{GemmRole as W, GemmSite};
    let mut sites = Vec::new();
    let gemm = |o: &runner_graph::Op| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear) && !runner_graph::peft::is_adapter(o);
    for (oi, op) in graph.ops.iter().enumerate().filter(|(_, o)| gemm(o)) {
        let w = graph.tensor(op.inputs[1]);
        let (n, k) = (w.shape[w.shape.len() - 2], w.shape[w.shape.len() - 1]);
        let m = graph.tensor(op.inputs[0]).numel() / k.max(1);
        for role in [W::Forward, W::InputGradient, W::WeightGradient] {
            sites.push((oi, GemmSite { layer: op.layer, name: op.name.clone(), role, m, n, k }));
        }
    }
    sites
}

/// What `gpu` offers a precision plan: the formats its profile gives a peak for, so a GPU
/// a user's profile adds (or gives an FP8 peak) is planned as it runs, not by its name
/// (the plugin host's table knows the built-in names alone: a new GPU with an FP8 peak was
/// refused every FP8 recipe); the compute capability is the table's (0 for a name it does
/// not know). The built-in GPUs get what the table gives them: their peaks say the same.
pub fn plan_device(gpu: &GpuProfile) -> plugin::precision::DeviceCapabilities {
    use plugin::precision::Dtype;
    let mut device = plugin::precision::device_capabilities(&gpu.name);
    let mut native = vec![Dtype::Fp32, Dtype::Bf16, Dtype::Fp16];
    for (format, dtypes) in
        [(GemmFormat::Fp8, &[Dtype::Fp8E4m3, Dtype::Fp8E5m2][..]), (GemmFormat::Mxfp8, &[Dtype::Mxfp8]), (GemmFormat::Nvfp4, &[Dtype::Nvfp4])]
    {
        if gpu.peak_tflops.get(format).is_some() {
            native.extend_from_slice(dtypes);
        }
    }
    device.name.clone_from(&gpu.name);
    device.native_formats = native;
    device.emulated_formats.clear();
    device
}

/// The device a training run's precision plan is made for (`runner train --plan-for`):
/// a GPU of the profiles (built-in, and `--profile`'s) as [`plan_device`] gives it, else
/// a device the plugin host's table knows (cpu, and GPUs without a profile such as L40S).
///
/// # Errors
/// A name neither knows: it would be planned with the high-precision formats alone.
pub fn plan_for(name: &str, profiles: &Profiles) -> Result<plugin::precision::DeviceCapabilities> {
    if !name.eq_ignore_ascii_case("cpu")
        && let Ok(gpu) = profiles.get(name)
    {
        return Ok(plan_device(gpu));
    }
    if plugin::precision::known_device(name) {
        return Ok(plugin::precision::device_capabilities(name));
    }
    let gpus: Vec<&str> = profiles.gpus.iter().map(|g| g.name.as_str()).collect();
    anyhow::bail!(
        "--plan-for {}: no such device; name a GPU ({}, L40S, ...; or one your --profile adds) or cpu",
        crate::report::visible(name),
        gpus.join(", ")
    )
}

/// Ask precision plugin `spec` for a plan over every GEMM site of `graph`, for the GPU the
/// run projects onto.
///
/// # Errors
/// The plugin fails, or its plan's low-precision format is not `recipe`'s.
pub fn plan_from_plugin(
    recipe: Recipe,
    spec: &str,
    variant: &Variant,
    gpu: &GpuProfile,
    graph: &Graph,
    limits: Limits,
) -> Result<(Plan, plugin::PluginInfo)> {
    use plugin::precision::{GemmRole as W, GemmSite, PlanRequest};
    let p = plugin::load(spec)?;
    let source = format!("{} (sha256 {})", p.info.name, &p.info.sha256[..12]);
    let mut policy = p.precision(limits)?;
    let sites: Vec<GemmSite> = gemm_sites(graph).into_iter().map(|(_, s)| s).collect();
    let names: Vec<(String, GemmRole)> = sites
        .iter()
        .map(|s| {
            let ours = match s.role {
                W::Forward => GemmRole::Forward,
                W::InputGradient => GemmRole::InputGradient,
                W::WeightGradient => GemmRole::WeightGradient,
            };
            (s.name.clone(), ours)
        })
        .collect();
    let answer = policy.plan(&PlanRequest {
        model: variant.name.clone(),
        layers: variant.hyper.layers,
        device: plan_device(gpu),
        sites,
        state: Vec::new(),
    })?;
    let mut answers = Vec::new();
    for ((name, role), site) in names.into_iter().zip(&answer.sites) {
        // Forward: activation x weight; input gradient: gradient x weight; weight
        // gradient: gradient x activation.
        let (a, b) = match role {
            GemmRole::Forward => (site.activation.format, site.weight.format),
            GemmRole::InputGradient => (site.gradient.format, site.weight.format),
            GemmRole::WeightGradient => (site.gradient.format, site.activation.format),
        };
        let f = gemm_format(a, b).ok_or_else(|| anyhow::anyhow!("{}: planned an int32 operand for '{name}'; GEMMs run in floating point", p.info.name))?;
        if f != GemmFormat::Bf16 && f != recipe.format() {
            anyhow::bail!(
                "{} plans {f} GEMMs but the run asks for {recipe}; use --precision {} or a {recipe} policy",
                p.info.name,
                f.name()
            );
        }
        answers.push((name, role, f));
    }
    let plan = Plan::from_sites(recipe, &source, graph, answers);
    if recipe != Recipe::Bf16 && plan.low_precision_share() == 0.0 {
        anyhow::bail!("{} plans every GEMM in BF16 but the run asks for {recipe}; use --precision bf16 or a {recipe} policy", p.info.name);
    }
    Ok((plan, policy.info.clone()))
}

/// The run recipe a published layout's typed precision stands for.
pub fn layout_recipe(p: TrainingPrecision) -> Recipe {
    match p {
        TrainingPrecision::Bf16 | TrainingPrecision::Fp16 => Recipe::Bf16,
        TrainingPrecision::Fp8 | TrainingPrecision::Fp8Delayed | TrainingPrecision::Fp8Blockwise => Recipe::Fp8,
        TrainingPrecision::Fp8Current => Recipe::Fp8Cs,
        TrainingPrecision::Mxfp8 => Recipe::Mxfp8,
        TrainingPrecision::Nvfp4 => Recipe::Nvfp4,
    }
}

/// The published layout of `variant` closest to a run on `gpus` GPUs of `gpu` in
/// `recipe`, on the same GPU: the same precision with the count in its range first, then
/// the same GEMM format in range (FP8 with delayed or current scaling: Megatron-Bridge's
/// tables publish its current-scaling runs as FP8), then either out of range, then any
/// precision in range.
pub fn reference<'a>(variant: &'a Variant, gpu: &GpuProfile, recipe: Recipe, gpus: u32) -> Option<&'a ReferenceLayout> {
    let same_gpu = |l: &&ReferenceLayout| gpu.name.eq_ignore_ascii_case(&l.gpu) || gpu.aliases.iter().any(|a| a.eq_ignore_ascii_case(&l.gpu));
    let same_precision = |l: &ReferenceLayout| layout_recipe(l.precision) == recipe;
    let same_format = |l: &ReferenceLayout| layout_recipe(l.precision).format() == recipe.format();
    let in_range = |l: &ReferenceLayout| (l.gpus_min..=l.gpus_max).contains(&gpus);
    let on_gpu = || variant.layouts.iter().filter(same_gpu);
    on_gpu()
        .find(|l| same_precision(l) && in_range(l))
        .or_else(|| on_gpu().find(|l| same_format(l) && in_range(l)))
        .or_else(|| on_gpu().find(|l| same_precision(l)))
        .or_else(|| on_gpu().find(|l| same_format(l)))
        .or_else(|| on_gpu().find(|l| in_range(l)))
}

/// The activation recompute a reference layout publishes: the policy and, for full
/// recompute, the layers per pipeline chunk (0: all). Selective recompute is of
/// Megatron's default module list (`core_attn`), the one `--recompute-granularity
/// selective` alone gives.
pub fn reference_recompute(l: &ReferenceLayout) -> (RecomputePolicy, u32) {
    match l.recompute {
        RecomputeGranularity::None => (RecomputePolicy::None, 0),
        RecomputeGranularity::Selective => (RecomputePolicy::Selective, 0),
        RecomputeGranularity::Full => (RecomputePolicy::Full, l.recompute_layers),
    }
}

/// The global batch a reference layout's rule gives at `gpus` GPUs.
pub fn reference_gbs(l: &ReferenceLayout, gpus: u32) -> u32 {
    ((l.gbs_per_gpu * f64::from(gpus)).round() as u32).saturating_add(l.gbs_fixed).max(1)
}

/// The training job a batch is chosen for: the tokens it trains on, its total model
/// FLOPs (as counted for MFU) and its sequence length.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    pub tokens: f64,
    pub flops: f64,
    pub seq_len: u32,
}

impl Job {
    /// The job of `tokens` tokens on `model` at its sequence length.
    pub fn new(model: &Model, tokens: f64) -> Job {
        let seq_len = model.seq_len.max(1);
        Job { tokens, flops: model.flops_per_sequence / f64::from(seq_len) * tokens, seq_len }
    }
}

/// The batch, in tokens, a compute-optimal run of `flops` FLOPs trains with:
/// B_opt = 0.2920 · C^0.3271, fitted by DeepSeek LLM on its own runs (arXiv:2401.02954,
/// section 3.1, eq. 1). Their C counts non-embedding FLOPs; ours also counts the output
/// layer, a few percent of C and so about one percent of the batch. Their 7B model, 2T
/// tokens, trained at 9.4M tokens per step; the formula gives 9.2M.
pub fn optimal_batch_tokens(flops: f64) -> f64 {
    0.2920 * flops.max(0.0).powf(0.3271)
}

/// The largest global batch, in sequences, the job uses on `gpus` GPUs:
/// [`optimal_batch_tokens`] in sequences, rounded (on a log scale) to the odd part of the
/// GPU count times a power of two, so that data-parallel groups of whole nodes divide it
/// (2048 on 2^k GPUs, 2304 on 72 x 2^k); to a power of two when the odd part alone is
/// larger than the batch; at least one sequence.
pub fn batch_cap(job: Job, gpus: u32) -> u32 {
    let odd = f64::from(gpus.max(1) >> gpus.max(1).trailing_zeros());
    let seqs = optimal_batch_tokens(job.flops) / f64::from(job.seq_len.max(1));
    if !seqs.is_finite() || seqs <= 1.0 {
        return 1;
    }
    let limit = f64::from(1u32 << 30);
    let best = if odd <= seqs { odd * (seqs / odd).log2().round().exp2() } else { seqs.log2().round().exp2() };
    best.clamp(1.0, limit) as u32
}

/// The global batch at `gpus` GPUs when none is given. Inside a published range, the
/// variant's published rule for this GPU and precision (the runs the numbers are
/// checked against). Outside it, the nearest published layout's sequences per GPU
/// scaled to the count, as the DGXC recipes grow GBS with the GPUs (two per GPU when
/// nothing is published), but never above the batch the job itself would train with
/// ([`batch_cap`]): growing the batch with the GPUs past it would hide the cost of
/// scale (the step's work per GPU never shrinks) and train with a batch no team would.
pub fn default_gbs(variant: &Variant, gpu: &GpuProfile, recipe: Recipe, gpus: u32, job: Job) -> (u32, String) {
    let in_range = |l: &ReferenceLayout| (l.gpus_min..=l.gpus_max).contains(&gpus);
    // A published rule counts sequences of its own length: at another length the same
    // tokens per step (seq 131072 kept 1024 sequences of seq 8192's rule, 16x its tokens).
    let per_seq = |l: &ReferenceLayout| {
        let at = if l.seq_len == 0 { variant.defaults.seq_len } else { l.seq_len };
        (f64::from(at.max(1)) / f64::from(job.seq_len.max(1)), at)
    };
    if let Some(l) = reference(variant, gpu, recipe, gpus).filter(|l| in_range(l)) {
        let (ratio, at) = per_seq(l);
        let rule = reference_gbs(l, gpus);
        if at == job.seq_len {
            return (rule, format!("GBS {rule} at {gpus} GPUs: the published rule ({})", l.source));
        }
        let (gbs, by) = divisible_batch(f64::from(rule) * ratio, gpus);
        return (
            gbs,
            format!(
                "GBS {gbs} at {gpus} GPUs: the published rule's {rule} sequences of {at} tokens ({}), as sequences of {}{}",
                l.source,
                job.seq_len,
                rounded_note(by)
            ),
        );
    }
    let nearest = reference(variant, gpu, recipe, gpus).or_else(|| variant.layouts.first());
    let (per_gpu, why) = match nearest {
        Some(l) => {
            let (ratio, at) = per_seq(l);
            let published = if l.gbs_per_gpu > 0.0 {
                l.gbs_per_gpu
            } else {
                f64::from(reference_gbs(l, l.gpus_min.max(1))) / f64::from(l.gpus_min.max(1))
            };
            let per_gpu = published * ratio;
            let of = if at == job.seq_len { String::new() } else { format!(" of {at} tokens, as sequences of {}", job.seq_len) };
            (per_gpu, format!("{published} sequences per GPU{of} as published for {} ({})", crate::report::plural(l.gpus_min, "GPU"), l.source))
        }
        None => (2.0, format!("2 per GPU (nothing published for {})", variant.name)),
    };
    let (scaled, by) = divisible_batch(per_gpu * f64::from(gpus), gpus);
    let cap = batch_cap(job, gpus);
    if scaled > cap {
        let tokens = optimal_batch_tokens(job.flops);
        return (
            cap,
            format!(
                "GBS {cap} at {gpus} GPUs: {why} would give {scaled}; capped at the batch of a compute-optimal run of {} tokens ({:.2e} FLOPs), \
                 {} tokens (B = 0.292 C^0.3271, DeepSeek LLM arXiv:2401.02954 eq. 1), {cap} sequences of {} (rounded so data-parallel groups divide it)",
                crate::report::si(job.tokens),
                job.flops,
                crate::report::si(tokens),
                job.seq_len
            ),
        );
    }
    (scaled, format!("GBS {scaled} at {gpus} GPUs: {why}{}", rounded_note(by)))
}

/// How far a batch may move to let data-parallel groups divide it: 5 % of its tokens
/// per step changes the step time by as much, where an indivisible batch can cost far
/// more (1365 sequences on 512 GPUs forced data parallelism to 1 and lost a fifth of
/// the throughput).
const BATCH_ROUNDING: f64 = 0.05;

/// A batch of about `seqs` sequences that large data-parallel groups of `gpus` GPUs
/// divide, and the divisor it was moved to a multiple of (1: not moved).
///
/// A batch scaled from a published one (another sequence length, another GPU count)
/// lands on any whole number, often an odd one, and data parallelism must divide the
/// batch: 1365 sequences on 512 GPUs leave DP = 1. The candidates are the GPU count's
/// own divisors `gpus / 2^j` (the data-parallel sizes that layouts of power-of-two
/// tp, pp and cp leave), largest first; the first whose nearest multiple lies within
/// [`BATCH_ROUNDING`] of `seqs` wins (1365 on 512 GPUs: 1408, a multiple of 128).
fn divisible_batch(seqs: f64, gpus: u32) -> (u32, u32) {
    let whole = |x: f64| (x.round().clamp(1.0, f64::from(u32::MAX))) as u32;
    if !seqs.is_finite() || seqs <= 1.0 {
        return (whole(if seqs.is_finite() { seqs } else { 1.0 }), 1);
    }
    // The cap of batch_cap: past it no multiple can pass u32 and break divisibility.
    let seqs = seqs.min(f64::from(1u32 << 30));
    let mut d = gpus.max(1);
    loop {
        let multiple = (seqs / f64::from(d)).round() * f64::from(d);
        if multiple >= 1.0 && (multiple - seqs).abs() <= BATCH_ROUNDING * seqs {
            let moved = whole(multiple) != whole(seqs);
            return (whole(multiple), if moved { d } else { 1 });
        }
        if d % 2 == 1 {
            return (whole(seqs), 1);
        }
        d /= 2;
    }
}

/// The words a default batch's note gains when [`divisible_batch`] moved it.
fn rounded_note(by: u32) -> String {
    if by > 1 {
        format!(", rounded to a multiple of {by} so data-parallel groups divide it")
    } else {
        String::new()
    }
}

/// Read the model a command names.
///
/// # Errors
/// The model cannot be found or its graph cannot be read.
pub fn model(found: &Found, seq_len: u32, limits: Limits) -> Result<(Model, PluginSource)> {
    let mut src = source(found, seq_len, limits)?;
    let m = Model::new(&found.variant.name, seq_len, &mut src).map_err(anyhow::Error::msg)?;
    Ok((m, src))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model not found lists what is there; where the host could not map a plugin's
    /// memory (`ulimit -v`), the host's failure is all it says, once, not as every
    /// plugin's fault.
    #[test]
    fn a_model_not_found_says_the_hosts_memory_failure_once() {
        let m = Missing { known: vec!["llama3.1-8b".into(), "llama3.1-70b".into()], failed: vec!["plugin 'x.wasm' trapped".into()], host: None };
        assert_eq!(
            m.message("llama3.1-7b"),
            "no installed workload plugin provides 'llama3.1-7b' (did you mean llama3.1-8b or llama3.1-70b?); installed models: \
             llama3.1-8b, llama3.1-70b; and none of what these plugins would list, which failed: plugin 'x.wasm' trapped"
        );
        let host = plugin::PluginError::new("a.wasm", "describe", plugin::Failure::HostMemory("mmap failed".into())).to_string();
        let m = Missing { known: Vec::new(), failed: Vec::new(), host: Some(host.clone()) };
        assert_eq!(m.message("m"), format!("cannot look for 'm': {host}"));
    }

    /// A GPU is planned with the formats its profile gives a peak for: each built-in one as
    /// the host's table plans it (no projection moves), and a GPU a user's profile adds with
    /// an FP8 peak gets FP8 (it got none: every FP8 recipe refused it).
    #[test]
    fn a_gpu_is_planned_with_the_formats_its_profile_has_peaks_for() {
        let key = |d: &plugin::precision::DeviceCapabilities| (d.name.clone(), d.compute_capability, format!("{:?} {:?}", d.native_formats, d.emulated_formats));
        let builtin = Profiles::builtin();
        for gpu in &builtin.gpus {
            assert_eq!(key(&plan_device(gpu)), key(&plugin::precision::device_capabilities(&gpu.name)), "{}", gpu.name);
        }
        let text = "[[gpu]]\nname = \"X1\"\ndescription = \"new\"\nmemory_gib = 192.0\nhbm_gbs = 5300.0\ngpus_per_node = 8\n\
                    scale_up_domain = 8\nscale_up_gbs = 448.0\nscale_out_gbs = 50.0\n[gpu.peak_tflops]\nbf16 = 1300.0\nfp8 = 2600.0\n";
        let mine = Profiles::with_overrides(text, "x1.toml").unwrap();
        let x1 = plan_for("x1", &mine).unwrap();
        use plugin::precision::Dtype::*;
        assert_eq!((x1.name.as_str(), x1.compute_capability), ("X1", 0));
        assert_eq!(format!("{:?}", x1.native_formats), format!("{:?}", [Fp32, Bf16, Fp16, Fp8E4m3, Fp8E5m2]));
        let bf16_only = Profiles::with_overrides(&text.replace("fp8 = 2600.0\n", ""), "x1.toml").unwrap();
        assert_eq!(format!("{:?}", plan_for("X1", &bf16_only).unwrap().native_formats), format!("{:?}", [Fp32, Bf16, Fp16]));
        let e = plan_for("X1", &builtin).unwrap_err().to_string();
        assert!(e.starts_with("--plan-for X1: no such device; name a GPU (A100-40GB, ") && e.contains("GB300, MI300X, MI355X, L40S"), "{e}");
        assert_eq!(plan_for("CPU", &mine).unwrap().native_formats.len(), 1, "cpu is the table's, never a profile's");
    }

    /// The optimizer given wins; else the plugin's where the projection models it (a note
    /// unless it is AdamW), else AdamW with a note naming what the plugin said, escaped.
    #[test]
    fn the_optimizer_is_the_given_one_else_the_plugins_where_modelled() {
        let mut variant = find_model("llama3.1-8b", Limits::default()).unwrap().variant;
        let mut notes = Vec::new();
        for (named, given, want, note) in [
            ("adamw", None, Optimizer::AdamW, None),
            ("AdamW", Some(Optimizer::Muon), Optimizer::Muon, None),
            ("muon", None, Optimizer::Muon, Some("optimizer: Muon, as llama3.1-8b names it (--optimizer adamw projects AdamW)")),
            ("muon", Some(Optimizer::AdamW), Optimizer::AdamW, None),
            ("lion", Some(Optimizer::Muon), Optimizer::Muon, None),
            (
                "lion\u{1b}[2J",
                None,
                Optimizer::AdamW,
                Some("optimizer: llama3.1-8b names lion\\u{1b}[2J, which the projection does not model: projected with AdamW (--optimizer muon for Muon)"),
            ),
        ] {
            variant.defaults.optimizer = named.into();
            notes.clear();
            assert_eq!(optimizer(given, &variant, &mut notes), want, "{named} {given:?}");
            assert_eq!(notes.first().map(String::as_str), note, "{named} {given:?}");
        }
    }

    /// DeepSeek LLM trained its 7B and 67B models on 2T tokens at 2304 and 4608
    /// sequences of 4096 (arXiv:2401.02954, Table 2); its own formula must give those
    /// batches from 6 x parameters x tokens within 10 % (a wrong coefficient or exponent
    /// misses by far more).
    #[test]
    fn the_optimal_batch_reproduces_the_batches_deepseek_llm_trained_with() {
        for (params, seqs) in [(6.9e9, 2304.0), (67.0e9, 4608.0)] {
            let want = seqs * 4096.0;
            let got = optimal_batch_tokens(6.0 * params * 2e12);
            assert!((got / want - 1.0).abs() < 0.10, "{params:e} params: {got:.3e} tokens against {want:.3e}");
        }
    }

    /// The audit's cases: a batch rescaled to another sequence length lands on odd
    /// counts (171, 1365, 1049) that force DP = 1; rounded, it lets DP grow, moving at
    /// most 5 %, and a batch already divisible or too small to round stays as it is.
    #[test]
    fn a_scaled_batch_is_rounded_so_data_parallel_groups_divide_it() {
        assert_eq!(divisible_batch(1365.33, 512), (1408, 128));
        assert_eq!(divisible_batch(170.67, 64), (176, 16));
        assert_eq!(divisible_batch(1048.58, 8), (1048, 8));
        assert_eq!(divisible_batch(256.0, 64), (256, 1));
        assert_eq!(divisible_batch(255.6, 64), (256, 1));
        // 24 GPUs: 24, 12, 6, then the odd part 3.
        assert_eq!(divisible_batch(100.0, 24), (96, 24));
        assert_eq!(divisible_batch(7.0, 24), (7, 1));
        assert_eq!(divisible_batch(3.0, 24), (3, 1));
        assert_eq!(divisible_batch(50.0, 24), (48, 24));
        for (seqs, gpus) in [(0.0, 8), (-5.0, 8), (f64::NAN, 8), (f64::INFINITY, 8), (1e30, 8), (5.0, 0), (2.5, u32::MAX)] {
            let (gbs, by) = divisible_batch(seqs, gpus);
            assert!(gbs >= 1 && by >= 1 && gbs % by == 0 && gbs <= 1 << 30, "{seqs} on {gpus}: {gbs}, {by}");
        }
    }

    #[test]
    fn the_batch_cap_rounds_to_what_the_gpu_count_divides_and_is_never_zero() {
        let llama3_8b = Job { tokens: 15e12, flops: 7.72e23, seq_len: 8192 };
        // 19.0M tokens = 2318 sequences: nearest power of two 2048 on 2^k GPUs; on
        // 72 x 2^k GPUs 9 x 256 = 2304, on 24 GPUs 3 x 1024 = 3072 (773 rounds up).
        assert_eq!(batch_cap(llama3_8b, 2048), 2048);
        assert_eq!(batch_cap(llama3_8b, 8), 2048);
        assert_eq!(batch_cap(llama3_8b, 72), 2304);
        assert_eq!(batch_cap(llama3_8b, 576), 2304);
        assert_eq!(batch_cap(llama3_8b, 24), 3072);
        // The same compute at seq 2048: 9274 sequences, nearest 8192.
        assert_eq!(batch_cap(Job { seq_len: 2048, ..llama3_8b }, 64), 8192);
        // A million GPUs (odd part 15625, far above 2318): the nearest power of two.
        assert_eq!(batch_cap(llama3_8b, 1_000_000), 2048);
        for flops in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e60] {
            for gpus in [0, 1, 72, u32::MAX] {
                let cap = batch_cap(Job { tokens: 1.0, flops, seq_len: 0 }, gpus);
                assert!((1..=1 << 30).contains(&cap), "{flops} on {gpus}: {cap}");
            }
        }
    }
}
