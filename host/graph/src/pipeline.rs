//! How a pipeline's transformer layers split over its pp·vp chunks (chunk c runs on
//! stage c mod pp, Megatron's order): as evenly as possible, or with the embedding and
//! the loss counted as layers, so that the first and last chunks, which also run the
//! embedding and the head, hold fewer transformer layers.
//!
//! Megatron-LM spells the second kind two ways, both read here:
//! - `account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split`
//!   (`TransformerConfig`): the embedding and the loss each count as one layer;
//!   Megatron-Bridge's Llama 3.1 405B recipe sets both (126 layers + 2 over 128 chunks).
//! - `pipeline_model_parallel_layout`, a string of chunks separated by `|`, `E` the
//!   embedding, `t` a transformer layer, `m` an MTP layer, `L` the loss, `x*n` and
//!   `(...)*n` repetitions and cosmetic commas (`PipelineParallelLayerLayout` in
//!   `megatron/core/transformer/pipeline_parallel_layer_layout.py`); Megatron-Bridge's
//!   DeepSeek-V3 presets use `Et*4|(t*4|)*14tmL`, i.e. the head with its MTP layer
//!   counts as three layers.
//!
//! Sharding and the projection both cut the layers with [`PipelineSplit::starts`], so
//! what runs and what is costed cannot disagree.

use serde::{Deserialize, Serialize};

/// Layers' worth of work the embedding and the head side count as. Units = layers +
/// `embedding` + `loss` are split as evenly as possible over the chunks (the first ones
/// take one more, as with no accounting); the first chunk gives `embedding` of its units
/// to the embedding and the last chunk `loss` of its units to the head, loss and MTP.
/// The default (0, 0) is the plain even split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSplit {
    #[serde(default)]
    pub embedding: u32,
    #[serde(default)]
    pub loss: u32,
}

/// The most layers the embedding, and the head side (loss, MTP), count as in the splits
/// [`PipelineSplit::layout_choices`] offers (Megatron-Bridge's DeepSeek-V3 presets count
/// the head with its MTP layer as three).
pub const LAYOUT_EMBEDDING_MAX: u32 = 1;
pub const LAYOUT_HEAD_MAX: u32 = 3;

/// A parsed `pipeline_model_parallel_layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MegatronLayout {
    pub split: PipelineSplit,
    /// pp·vp.
    pub chunks: usize,
    /// Transformer layers placed.
    pub layers: usize,
}

impl MegatronLayout {
    /// Check the layout against a model of `layers` layers run on `chunks` = pp·vp chunks.
    ///
    /// # Errors
    /// Either count differs, named.
    pub fn check(&self, layers: usize, chunks: usize) -> Result<(), String> {
        if self.layers != layers {
            return Err(format!("the pipeline layout places {} transformer layers; the model has {layers}", self.layers));
        }
        if self.chunks != chunks {
            return Err(format!("the pipeline layout has {} chunks; pp·vp = {chunks}", self.chunks));
        }
        Ok(())
    }
}

/// How `layers` plus the embedding's `e` and the loss's `l` units share `chunks` (at
/// least 2): the units, each chunk's share `per`, the `extra` chunks with one more, and
/// the first chunk's share.
fn shares(layers: usize, chunks: usize, e: usize, l: usize) -> (usize, usize, usize, usize) {
    let units = layers.saturating_add(e).saturating_add(l);
    let (per, extra) = (units / chunks, units % chunks);
    (units, per, extra, per + usize::from(extra > 0))
}

/// Whether [`PipelineSplit::starts`] accepts the embedding counted as `e` and the loss as
/// `l` (`chunks` at least 2): no empty chunk, a first chunk of at least `e` units and a
/// last of at least `l`.
fn fits(layers: usize, chunks: usize, e: usize, l: usize) -> bool {
    let (units, per, _, first) = shares(layers, chunks, e, l);
    units >= chunks && first >= e && per >= l
}

/// Where each chunk's layers start, for one split, layer count and chunk count.
#[derive(Clone, Copy, Debug)]
pub struct ChunkStarts {
    layers: usize,
    chunks: usize,
    per: usize,
    extra: usize,
    embedding: usize,
}

impl ChunkStarts {
    /// Index of chunk `c`'s first layer (`c` = chunks gives the layer count).
    pub fn start(&self, c: usize) -> usize {
        let units = c * self.per + c.min(self.extra);
        units.saturating_sub(self.embedding).min(self.layers)
    }

    /// Transformer layers in chunk `c`.
    pub fn len(&self, c: usize) -> usize {
        self.start(c + 1) - self.start(c)
    }

    /// Layers of the fullest chunk, in constant time (the search asks it of every
    /// layout it stages, over up to pp·vp chunks). [`PipelineSplit::starts`] refuses a
    /// first chunk with fewer units than the embedding counts and a last one with fewer
    /// than the loss, so no start between the ends is clamped: a middle chunk holds its
    /// units, `per` or (before `extra`) one more, and only the two ends lose what the
    /// embedding and the loss count ([`ChunkStarts::max_len_by_scan`] reads every chunk).
    pub fn max_len(&self) -> usize {
        let n = self.chunks;
        if n <= 2 {
            return self.max_len_by_scan();
        }
        // Chunks 1..n-1: `per`, plus one for chunk 1 when `extra` reaches past it.
        let middle = self.per + usize::from(self.extra > 1);
        self.len(0).max(self.len(n - 1)).max(middle)
    }

    /// [`ChunkStarts::max_len`] by reading every chunk's length.
    pub fn max_len_by_scan(&self) -> usize {
        (0..self.chunks).map(|c| self.len(c)).max().unwrap_or(0)
    }
}

impl PipelineSplit {
    /// Megatron's two `account_for_*_in_pipeline_split` flags.
    pub fn megatron(embedding: bool, loss: bool) -> PipelineSplit {
        PipelineSplit { embedding: u32::from(embedding), loss: u32::from(loss) }
    }

    pub fn is_even(&self) -> bool {
        self.embedding == 0 && self.loss == 0
    }

    /// The split of `layers` over `chunks`.
    ///
    /// # Errors
    /// No chunks, fewer units (layers plus what the embedding and loss count as) than
    /// chunks (a chunk would be empty), or a first or last chunk whose share is smaller
    /// than what the embedding or the loss count as.
    pub fn starts(&self, layers: usize, chunks: usize) -> Result<ChunkStarts, String> {
        if chunks == 0 {
            return Err("a pipeline needs at least one chunk".into());
        }
        if chunks == 1 {
            // One chunk holds everything whatever the accounting.
            return Ok(ChunkStarts { layers, chunks, per: layers, extra: 0, embedding: 0 });
        }
        let (e, l) = (self.embedding as usize, self.loss as usize);
        let (units, per, extra, first) = shares(layers, chunks, e, l);
        if units < chunks {
            // Worded only when refused: the search splits every layout it prices.
            let counted = if self.is_even() { String::new() } else { format!(" (with the embedding as {e} and the loss as {l})") };
            return Err(format!(
                "pp·vp = {chunks} pipeline chunks but the {layers} layers{counted} fill only {units}; use pp·vp ≤ {units}"
            ));
        }
        // What counting more shifts grows the units too: the first chunk holds
        // ceil((layers + e + l) / chunks) ≥ e exactly while e·(chunks - 1) ≤ layers + l +
        // chunks - 1, and the last floor(...) ≥ l while l·(chunks - 1) ≤ layers + e.
        // Lowering the count that failed lowers the units, which the other two checks
        // need: when the bound above fails them, so does every smaller count, and only
        // fewer chunks help.
        if first < e {
            let most = (layers + l + chunks - 1) / (chunks - 1);
            let advice = if fits(layers, chunks, most, l) {
                format!("count it as at most {most}")
            } else {
                format!("no count of it fits {chunks} chunks with the loss counted as {l}: use fewer pipeline chunks (pp·vp)")
            };
            return Err(format!("the embedding counts as {e} layers but the first of {chunks} chunks holds only {first}; {advice}"));
        }
        if per < l {
            let most = (layers + e) / (chunks - 1);
            let advice = if fits(layers, chunks, e, most) {
                format!("count it as at most {most}")
            } else {
                format!("no count of it fits {chunks} chunks with the embedding counted as {e}: use fewer pipeline chunks (pp·vp)")
            };
            return Err(format!("the loss counts as {l} layers but the last of {chunks} chunks holds only {per}; {advice}"));
        }
        Ok(ChunkStarts { layers, chunks, per, extra, embedding: e })
    }

    /// Layers of the fullest of `chunks` chunks (what a per-chunk recompute count ranges
    /// over); a split that does not fit falls back to the even split's.
    pub fn fullest_chunk(&self, layers: u32, chunks: u32) -> u32 {
        let chunks = chunks.max(1);
        self.starts(layers as usize, chunks as usize).map_or(layers.div_ceil(chunks), |s| s.max_len() as u32)
    }

    /// Whether Megatron-Core builds this split from its plain flags (pp, vp and the two
    /// `account_for_*_in_pipeline_split` booleans), without a
    /// `pipeline_model_parallel_layout`: `get_num_layers_to_build` asserts that the
    /// layers plus the counted embedding and loss divide by pp, and each stage's share by
    /// vp. The even split of 80 layers over PP2 VP12 is priced, but Megatron refuses it
    /// unless given the layout string ([`PipelineSplit::megatron_layout`]).
    ///
    /// # Errors
    /// Why the flags cannot build it, naming the counts.
    pub fn megatron_flags(&self, layers: usize, pp: usize, vp: usize) -> Result<(), String> {
        if pp <= 1 {
            return Ok(());
        }
        if self.embedding > 1 || self.loss > 1 {
            return Err(format!(
                "the embedding counted as {} and the loss as {} layers: Megatron's flags count each as one at most",
                self.embedding, self.loss
            ));
        }
        let units = layers + self.embedding as usize + self.loss as usize;
        let counted = if self.is_even() { String::new() } else { format!(" (with {})", self.label()) };
        if !units.is_multiple_of(pp) {
            return Err(format!("{units} layers{counted} do not divide by pp={pp}"));
        }
        if vp > 1 && !(units / pp).is_multiple_of(vp) {
            return Err(format!("the {} layers{counted} of each of the {pp} stages do not divide by vp={vp}", units / pp));
        }
        Ok(())
    }

    /// Where Megatron-Core's flags build no split: the splits a
    /// `pipeline_model_parallel_layout` builds with every chunk holding the same units,
    /// the embedding counted as 0 or 1 layer and the head side (loss, MTP) as 0 to 3, as
    /// Megatron-Bridge's DeepSeek-V3 presets write them (`Et*4|(t*4|)*14tmL`: 61 layers,
    /// the head with its MTP layer as three, 64 units over 16 chunks; NeMo's PP16 script
    /// counts the embedding as one and the head as two). Fewest counted units first.
    pub fn layout_choices(layers: usize, pp: usize, vp: usize) -> Vec<PipelineSplit> {
        let chunks = pp * vp;
        if pp <= 1 || chunks == 0 {
            return Vec::new();
        }
        (0..=LAYOUT_EMBEDDING_MAX + LAYOUT_HEAD_MAX)
            .flat_map(|units| (0..=LAYOUT_EMBEDDING_MAX.min(units)).map(move |e| PipelineSplit { embedding: e, loss: units - e }))
            .filter(|s| s.loss <= LAYOUT_HEAD_MAX)
            .filter(|s| (layers + (s.embedding + s.loss) as usize).is_multiple_of(chunks) && s.starts(layers, chunks).is_ok())
            .collect()
    }

    /// The splits Megatron-Core's flags build for `layers` on pp and vp, the even one
    /// first: each of the embedding and the loss counted as a layer or not, kept where
    /// [`PipelineSplit::megatron_flags`] allows it. Empty where none does (80 layers on
    /// PP7, or on PP2 VP12).
    pub fn megatron_choices(layers: usize, pp: usize, vp: usize) -> Vec<PipelineSplit> {
        [(false, false), (true, true), (true, false), (false, true)]
            .into_iter()
            .map(|(e, l)| PipelineSplit::megatron(e, l))
            .filter(|s| s.megatron_flags(layers, pp, vp).is_ok())
            .collect()
    }

    /// Megatron's `pipeline_model_parallel_layout` for this split of `layers` over
    /// `chunks` = pp·vp (in Megatron's chunk order, chunk c on stage c mod pp), with
    /// `mtp` multi-token-prediction layers beside the head; runs of equal middle chunks
    /// written `(t*n|)*k`, as Megatron-Bridge's presets write them.
    ///
    /// # Errors
    /// As [`PipelineSplit::starts`].
    pub fn megatron_layout(&self, layers: usize, chunks: usize, mtp: usize) -> Result<String, String> {
        let st = self.starts(layers, chunks)?;
        let t = |n: usize| match n {
            0 => String::new(),
            1 => "t".to_string(),
            n => format!("t*{n}"),
        };
        let tail = format!("{}L", "m".repeat(mtp));
        if chunks == 1 {
            return Ok(format!("E{}{tail}", t(layers)));
        }
        let mut out = format!("E{}|", t(st.len(0)));
        let mut c = 1;
        while c < chunks - 1 {
            let n = st.len(c);
            let run = (c..chunks - 1).take_while(|&d| st.len(d) == n).count();
            if run > 1 {
                out += &format!("({}|)*{run}", t(n));
            } else {
                out += &format!("{}|", t(n));
            }
            c += run;
        }
        out += &t(st.len(chunks - 1));
        out += &tail;
        Ok(out)
    }

    /// Short form in layout labels: `E1L1` (empty for the even split).
    pub fn label(&self) -> String {
        if self.is_even() { String::new() } else { format!("E{}L{}", self.embedding, self.loss) }
    }

    /// Read `even` or a label such as `E1L1` (what the embedding and the loss count as).
    ///
    /// # Errors
    /// Anything else, with the accepted forms.
    pub fn parse(text: &str) -> Result<PipelineSplit, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("even") {
            return Ok(PipelineSplit::default());
        }
        let bad = || format!("pipeline split {text:?}: use even or E<n>L<m> (E1L1: the embedding and the loss as one layer each)");
        let rest = t.strip_prefix(['E', 'e']).ok_or_else(bad)?;
        let (e, l) = rest.split_once(['L', 'l']).ok_or_else(bad)?;
        Ok(PipelineSplit { embedding: e.parse().map_err(|_| bad())?, loss: l.parse().map_err(|_| bad())? })
    }

    /// Read Megatron's `pipeline_model_parallel_layout`: the split it describes, its
    /// chunk count (pp·vp) and the transformer layers it places (the model's count, which
    /// the caller checks against the model it projects).
    ///
    /// # Errors
    /// A character other than `E`, `t`, `m`, `L`, `|`, `,`, `(`, `)`, `*` and digits; an
    /// unbalanced or empty repetition; `E` anywhere but the start of the first chunk, `L`
    /// anywhere but the end of the last, `m` outside the last chunk (this model runs MTP
    /// with the head); or a layout no counting of the embedding and loss reproduces
    /// (uneven middle chunks).
    pub fn from_megatron_layout(layout: &str) -> Result<MegatronLayout, String> {
        let flat = expand(layout)?;
        let chunks: Vec<&str> = flat.split('|').collect();
        let k = chunks.len();
        let mut counts = Vec::with_capacity(k);
        for (c, chunk) in chunks.iter().enumerate() {
            for (i, ch) in chunk.char_indices() {
                let ok = match ch {
                    't' => true,
                    'E' => c == 0 && i == 0,
                    'L' => c == k - 1 && i == chunk.len() - 1,
                    'm' => c == k - 1,
                    _ => return Err(format!("pipeline layout {layout:?}: unknown layer '{ch}' (E, t, m, L)")),
                };
                if !ok {
                    let (what, rule) = match ch {
                        'E' => ("E (the embedding)", "must open the first chunk"),
                        'L' => ("L (the loss)", "must close the last chunk"),
                        _ => ("m (an MTP layer)", "runs with the head here, in the last chunk (Megatron's standalone MTP chunk is not modelled)"),
                    };
                    return Err(format!("pipeline layout {layout:?}: {what} {rule}"));
                }
            }
            counts.push(chunk.chars().filter(|&ch| ch == 't').count());
        }
        if !flat.starts_with('E') || !flat.ends_with('L') {
            return Err(format!("pipeline layout {layout:?}: it must start with E (the embedding) and end with L (the loss)"));
        }
        let layers: usize = counts.iter().sum();
        if let Some(split) = split_for(&counts, layers) {
            return Ok(MegatronLayout { split, chunks: k, layers });
        }
        Err(format!(
            "pipeline layout {layout:?} (layers per chunk {counts:?}) is not an even split with the embedding and the \
             loss counted as whole layers, the only kind the runner models"
        ))
    }
}

/// The counting of the embedding and the loss that gives these layers per chunk, if one
/// does; several can, and one that divides evenly (as Megatron's accounting requires) is
/// preferred. Worked out from the chunks rather than searched, so a layout of a million
/// chunks or layers costs one pass.
fn split_for(counts: &[usize], layers: usize) -> Option<PipelineSplit> {
    let k = counts.len();
    if k <= 1 {
        return Some(PipelineSplit::default());
    }
    let (first, last) = (counts[0], counts[k - 1]);
    // Candidate (per, extra): chunk c holds per + (c < extra) units.
    let mut cands: Vec<(usize, usize)> = Vec::new();
    if k == 2 {
        let per = first.max(last);
        cands.push((per, 0));
    } else {
        let mid = &counts[1..k - 1];
        let m = mid.iter().copied().min().unwrap_or(0);
        let plus = mid.iter().filter(|&&c| c > m).count();
        cands.push((m, plus + 1));
        if plus == 0 {
            cands.push((m, 0));
            if m > 0 {
                cands.push((m - 1, k - 1));
            }
        }
    }
    let check = |(per, extra): (usize, usize)| -> Option<PipelineSplit> {
        let units_first = per + usize::from(extra > 0);
        let e = units_first.checked_sub(first)?;
        let l = per.checked_sub(last)?;
        let s = PipelineSplit { embedding: u32::try_from(e).ok()?, loss: u32::try_from(l).ok()? };
        let st = s.starts(layers, k).ok()?;
        (0..k).all(|c| st.len(c) == counts[c]).then_some(s)
    };
    let valid: Vec<PipelineSplit> = cands.into_iter().filter_map(check).collect();
    valid
        .iter()
        .copied()
        .find(|s| (layers + s.embedding as usize + s.loss as usize).is_multiple_of(k))
        .or_else(|| valid.first().copied())
}

/// Megatron's string with commas dropped and `(...)*n` and `x*n` unrolled.
fn expand(layout: &str) -> Result<String, String> {
    // Bounded so that a hostile repetition count cannot exhaust memory.
    const MAX: usize = 1 << 20;
    let s: Vec<char> = layout.chars().filter(|&c| c != ',' && !c.is_whitespace()).collect();
    let mut out = String::new();
    let mut i = 0;
    while i < s.len() {
        let (unit, next) = if s[i] == '(' {
            let close = s[i..].iter().position(|&c| c == ')').map(|p| i + p)
                .ok_or_else(|| format!("pipeline layout {layout:?}: '(' without ')'"))?;
            if s[i + 1..close].contains(&'(') {
                return Err(format!("pipeline layout {layout:?}: nested parentheses"));
            }
            (expand(&s[i + 1..close].iter().collect::<String>())?, close + 1)
        } else if s[i] == ')' || s[i] == '*' || s[i].is_ascii_digit() {
            return Err(format!("pipeline layout {layout:?}: unexpected '{}'", s[i]));
        } else {
            (s[i].to_string(), i + 1)
        };
        let (times, after) = if s.get(next) == Some(&'*') {
            let digits: String = s[next + 1..].iter().take_while(|c| c.is_ascii_digit()).collect();
            let n: usize = digits.parse().map_err(|_| format!("pipeline layout {layout:?}: '*' needs a count"))?;
            (n, next + 1 + digits.len())
        } else {
            (1, next)
        };
        if unit.is_empty() || out.len().saturating_add(unit.len().saturating_mul(times)) > MAX {
            return Err(format!("pipeline layout {layout:?}: an empty or oversized repetition"));
        }
        out.push_str(&unit.repeat(times));
        i = after;
    }
    Ok(out)
}

/// Forwards stage `stage` of `stages` runs before its first backward under 1F1B, over
/// `micro_batches` (Megatron's `num_warmup_microbatches` in
/// `forward_backward_pipelining_without_interleaving`,
/// megatron/core/pipeline_parallel/schedules.py): the executor's pass order and the
/// projection's activation memory (each stage then holds one more) both follow it.
pub fn warmup_forwards(stages: usize, stage: usize, micro_batches: usize) -> usize {
    stages.saturating_sub(stage + 1).min(micro_batches)
}

/// As [`warmup_forwards`] for the interleaved schedule over `vp` chunks per stage, in
/// chunk forwards (Megatron's `forward_backward_pipelining_with_interleaving`):
/// (pp − s − 1)·2 + (vp − 1)·pp, at most every chunk forward of the step.
pub fn warmup_chunk_forwards(stages: usize, stage: usize, vp: usize, micro_batches: usize) -> usize {
    (stages.saturating_sub(stage + 1) * 2 + vp.saturating_sub(1) * stages).min(micro_batches * vp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Megatron's warm-up counts: pp − s − 1 forwards (at most the micro-batches); with
    /// vp chunks, (pp − s − 1)·2 + (vp − 1)·pp chunk forwards (at most all of them).
    #[test]
    fn warmups_follow_megatrons_schedules() {
        assert_eq!((0..4).map(|s| warmup_forwards(4, s, 8)).collect::<Vec<_>>(), [3, 2, 1, 0]);
        assert_eq!((0..4).map(|s| warmup_forwards(4, s, 2)).collect::<Vec<_>>(), [2, 2, 1, 0]);
        assert_eq!((0..4).map(|s| warmup_chunk_forwards(4, s, 2, 8)).collect::<Vec<_>>(), [10, 8, 6, 4]);
        assert_eq!(warmup_chunk_forwards(4, 0, 2, 3), 6, "at most every chunk forward");
        assert_eq!((warmup_forwards(1, 0, 5), warmup_chunk_forwards(1, 0, 1, 5)), (0, 0));
    }

    fn lens(s: PipelineSplit, layers: usize, chunks: usize) -> Vec<usize> {
        let st = s.starts(layers, chunks).unwrap();
        (0..chunks).map(|c| st.len(c)).collect()
    }

    /// The advice's count passes every check, and is the largest that does. The old
    /// bound (the first or last chunk's share alone) told 2 layers over 4 chunks with the
    /// loss as 3 to count the embedding as 2, which leaves the last chunk 1 unit for the
    /// loss's 3; and 1 layer over 3 chunks with the embedding as 4 to count the loss as
    /// 2, which leaves the first chunk 3 units for the embedding's 4. No count fits either.
    #[test]
    fn the_advised_count_is_the_largest_that_fits() {
        let split = |embedding, loss| PipelineSplit { embedding, loss };
        let e = split(10, 3).starts(2, 4).unwrap_err();
        assert!(e.ends_with("no count of it fits 4 chunks with the loss counted as 3: use fewer pipeline chunks (pp·vp)"), "{e}");
        let l = split(4, 6).starts(1, 3).unwrap_err();
        assert!(l.ends_with("no count of it fits 3 chunks with the embedding counted as 4: use fewer pipeline chunks (pp·vp)"), "{l}");
        assert!(split(0, 5).starts(4, 3).unwrap_err().ends_with("count it as at most 2"));
        // Every small case: the count advised fits and one more does not; where none is,
        // no smaller count fits either.
        let most = |err: &str| err.rsplit_once("count it as at most ").map(|(_, n)| n.parse::<u32>().unwrap());
        for layers in 0..10 {
            for chunks in 2..6 {
                for (e, l) in (0..12).flat_map(|e| (0..12).map(move |l| (e, l))) {
                    let Err(err) = split(e, l).starts(layers, chunks) else { continue };
                    let embedding = err.starts_with("the embedding");
                    let with = |n: u32| if embedding { split(n, l) } else { split(e, n) };
                    if !embedding && !err.starts_with("the loss") {
                        continue;
                    }
                    match most(&err) {
                        Some(n) => {
                            assert!(with(n).starts(layers, chunks).is_ok(), "{layers} layers, {chunks} chunks, {e}/{l}: {err}");
                            assert!(with(n + 1).starts(layers, chunks).is_err(), "{layers} layers, {chunks} chunks, {e}/{l}: {err}");
                        }
                        None => assert!((0..=e.max(l)).all(|n| with(n).starts(layers, chunks).is_err()), "{layers}, {chunks}, {e}/{l}: {err}"),
                    }
                }
            }
        }
    }

    #[test]
    fn even_split_gives_the_first_chunks_one_more() {
        assert_eq!(lens(PipelineSplit::default(), 10, 4), vec![3, 3, 2, 2]);
        assert_eq!(lens(PipelineSplit::default(), 80, 40), vec![2; 40]);
        assert!(PipelineSplit::default().starts(3, 4).unwrap_err().contains("use pp·vp ≤ 3"));
    }

    #[test]
    fn megatron_accounting_frees_the_first_and_last_chunk() {
        // Llama 3.1 405B on PP16 VP8: 126 + 2 units over 128 chunks, the first chunk the
        // embedding alone and the last the loss alone (Megatron-Bridge 405B recipes).
        let v = lens(PipelineSplit::megatron(true, true), 126, 128);
        assert_eq!((v[0], v[127], v.iter().sum::<usize>()), (0, 0, 126));
        assert!(v[1..127].iter().all(|&n| n == 1));
        // PP8 VP8: two layers per chunk, one in the first and the last.
        let v = lens(PipelineSplit::megatron(true, true), 126, 64);
        assert_eq!((v[0], v[1], v[62], v[63]), (1, 2, 2, 1));
        // Only the loss counted.
        assert_eq!(lens(PipelineSplit::megatron(false, true), 7, 4), vec![2, 2, 2, 1]);
        // A count bigger than the chunk's share is refused, naming it.
        let e = PipelineSplit { embedding: 0, loss: 5 }.starts(8, 4).unwrap_err();
        assert!(e.contains("the loss counts as 5 layers") && e.contains("holds only 3"), "{e}");
        // The bound it names is the largest count that fits, for every shape: one more is
        // refused, and it is not (the bound once moved with each retry: 66, then 49, 36).
        for (layers, chunks) in [(32usize, 2usize), (8, 4), (126, 16), (5, 3)] {
            let embedding: fn(u32) -> PipelineSplit = |n| PipelineSplit { embedding: n, loss: 0 };
            let loss: fn(u32) -> PipelineSplit = |n| PipelineSplit { embedding: 0, loss: n };
            for (which, split) in [("embedding", embedding), ("loss", loss)] {
                let err = split(1000).starts(layers, chunks).unwrap_err();
                let most: u32 = err.rsplit("at most ").next().unwrap().parse().unwrap();
                assert!(split(most).starts(layers, chunks).is_ok(), "{which} {most} of {layers} over {chunks}: {err}");
                assert!(split(most + 1).starts(layers, chunks).is_err(), "{which} {most} of {layers} over {chunks} is not the most");
            }
        }
    }

    #[test]
    fn megatron_layout_strings_parse_to_their_split() {
        // DeepSeek-V3 presets: 61 layers, 16 chunks, the head with MTP as three layers.
        let m = PipelineSplit::from_megatron_layout("Et*4|(t*4|)*14tmL").unwrap();
        let (s, k) = (m.split, m.chunks);
        assert_eq!((s, k, m.layers), (PipelineSplit { embedding: 0, loss: 3 }, 16, 61));
        assert!(m.check(61, 16).is_ok());
        assert!(m.check(60, 16).unwrap_err().contains("places 61 transformer layers; the model has 60"));
        assert!(m.check(61, 8).unwrap_err().contains("16 chunks; pp·vp = 8"));
        let v = lens(s, 61, 16);
        assert_eq!((v[0], v[1], v[15]), (4, 4, 1));
        // Megatron-Bridge's DeepSeek-V3 PP4 map entry: [E+16, 16, 16, 13+mL].
        let MegatronLayout { split: s, chunks: k, .. } = PipelineSplit::from_megatron_layout("Et*16|t*16|t*16|t*13mL").unwrap();
        assert_eq!(lens(s, 61, k), vec![16, 16, 16, 13]);
        // The plain accounting, spelled out, with cosmetic commas.
        let MegatronLayout { split: s, chunks: k, .. } = PipelineSplit::from_megatron_layout("E|(t|)*126,L").unwrap();
        assert_eq!((k, lens(s, 126, k)[0], lens(s, 126, k)[127]), (128, 0, 0));
        // The same counts come back whichever (e, l) the search found first.
        let MegatronLayout { split: s, chunks: k, .. } = PipelineSplit::from_megatron_layout("Ett|tt|tt|ttL").unwrap();
        assert_eq!(lens(s, 8, k), vec![2, 2, 2, 2]);
    }

    #[test]
    fn megatron_flags_follow_its_divisibility_rule() {
        let even = PipelineSplit::default();
        let both = PipelineSplit::megatron(true, true);
        // Llama 3 70B: PP4 VP5 (20 layers a stage, 4 a chunk) builds; PP2 VP12 does not.
        assert!(even.megatron_flags(80, 4, 5).is_ok());
        let e = even.megatron_flags(80, 2, 12).unwrap_err();
        assert!(e.contains("40 layers") && e.contains("vp=12"), "{e}");
        // Llama 3.1 405B: 126 layers build on PP8 VP8 only with both counted (128 units).
        assert!(even.megatron_flags(126, 8, 1).unwrap_err().contains("do not divide by pp=8"));
        assert!(both.megatron_flags(126, 8, 8).is_ok());
        assert!(PipelineSplit::megatron(true, false).megatron_flags(80, 3, 1).is_ok());
        // Without a pipeline anything builds (nothing is split, whatever is counted);
        // counts above one need a layout string.
        assert!(even.megatron_flags(7, 1, 1).is_ok());
        assert!(PipelineSplit { embedding: 0, loss: 3 }.megatron_flags(61, 1, 1).is_ok());
        // Each stage's share divides by vp, vp = 2 included: 12 layers on PP4 are 3 a stage.
        assert!(even.megatron_flags(12, 4, 2).unwrap_err().contains("the 3 layers of each of the 4 stages do not divide by vp=2"));
        assert!(even.megatron_flags(16, 4, 2).is_ok());
        assert!(PipelineSplit { embedding: 0, loss: 3 }.megatron_flags(61, 4, 4).unwrap_err().contains("one at most"));
        // The choices, the even split first.
        assert_eq!(PipelineSplit::megatron_choices(80, 3, 1), vec![PipelineSplit::megatron(true, false), PipelineSplit::megatron(false, true)]);
        assert_eq!(PipelineSplit::megatron_choices(80, 4, 5), vec![PipelineSplit::default()]);
        assert_eq!(PipelineSplit::megatron_choices(126, 8, 8), vec![PipelineSplit::megatron(true, true)]);
        assert!(PipelineSplit::megatron_choices(80, 2, 12).is_empty());
    }

    #[test]
    fn megatron_layout_strings_reproduce_the_split() {
        // DeepSeek-V3 on PP4 VP4 as Megatron-Bridge writes it.
        let ds = PipelineSplit { embedding: 0, loss: 3 };
        assert_eq!(ds.megatron_layout(61, 16, 1).unwrap(), "Et*4|(t*4|)*14tmL");
        assert_eq!(PipelineSplit::default().megatron_layout(10, 4, 0).unwrap(), "Et*3|t*3|t*2|t*2L");
        assert_eq!(PipelineSplit::megatron(true, true).megatron_layout(6, 4, 0).unwrap(), "Et|(t*2|)*2tL");
        assert_eq!(PipelineSplit::default().megatron_layout(5, 1, 0).unwrap(), "Et*5L");
        // Every split read back from its string gives the same chunks.
        for layers in [7usize, 32, 61, 80, 126] {
            for chunks in [2usize, 3, 5, 8, 16, 24] {
                for s in [PipelineSplit::default(), PipelineSplit::megatron(true, true), PipelineSplit::megatron(false, true)] {
                    let Ok(text) = s.megatron_layout(layers, chunks, 0) else { continue };
                    let back = PipelineSplit::from_megatron_layout(&text).unwrap();
                    assert_eq!((back.chunks, back.layers), (chunks, layers), "{text}");
                    assert_eq!(lens(back.split, layers, chunks), lens(s, layers, chunks), "{text}");
                }
            }
        }
    }

    #[test]
    fn labels_read_back() {
        for s in [PipelineSplit::default(), PipelineSplit::megatron(true, true), PipelineSplit { embedding: 0, loss: 3 }] {
            let text = if s.is_even() { "even".to_string() } else { s.label() };
            assert_eq!(PipelineSplit::parse(&text).unwrap(), s);
        }
        assert!(PipelineSplit::parse("E1").unwrap_err().contains("use even or E<n>L<m>"));
        assert!(PipelineSplit::parse("balanced").is_err());
    }

    #[test]
    fn bad_layout_strings_are_refused_with_the_reason() {
        let err = |s: &str, _: usize| PipelineSplit::from_megatron_layout(s).unwrap_err();
        assert!(err("Ett|tEt|ttL", 6).contains("E (the embedding) must open the first chunk"));
        assert!(err("Ett|ttL|tt", 6).contains("L (the loss) must close the last chunk"));
        assert!(err("Ett|tm|ttL", 5).contains("m (an MTP layer)"));
        assert!(err("Ett|tx|ttL", 5).contains("unknown layer 'x'"));
        assert!(err("E(tt|*2L", 4).contains("'(' without ')'"));
        assert!(err("Et*99999999999|L", 1).contains("oversized"));
        assert!(err("Et*|L", 1).contains("'*' needs a count"));
        // A million layers in few chunks, or a million chunks, parse at once.
        let m = PipelineSplit::from_megatron_layout("Et*300000|t*300000|t*299999L").unwrap();
        assert_eq!((m.layers, m.chunks), (899_999, 3));
        assert_eq!(PipelineSplit::from_megatron_layout("E(t|)*400000L").unwrap().chunks, 400_001);
        // Uneven middle chunks are not an accounting of the embedding and loss.
        assert!(err("Et|ttt|t|tL", 6).contains("not an even split"));
        // Megatron-Bridge's Llama 3 70B H100 layout puts three layers mid-pipeline.
        assert!(err("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 80).contains("not an even split"));
        // The grammar of PipelineParallelLayerLayout: the loss closes the last chunk (an L
        // before its end is refused, also when another L closes it), the layout ends
        // with L, repetitions do not nest and repeat something.
        assert!(err("Et|tLL", 2).contains("L (the loss) must close the last chunk"));
        assert!(err("Et|tt", 3).contains("must start with E (the embedding) and end with L (the loss)"));
        assert!(err("E(t(t|)*2)*2L", 0).contains("nested parentheses"));
        assert!(err("E()*3|tL", 1).contains("an empty or oversized repetition"));
    }

    /// The fullest chunk of a split that fits, wherever it is (with the embedding counted
    /// the first chunk is the emptiest), and the even split's ceil(layers / chunks) for
    /// one that does not fit or no chunks at all.
    #[test]
    fn fullest_chunk_is_the_largest_share() {
        assert_eq!(PipelineSplit::default().fullest_chunk(10, 4), 3);
        assert_eq!(PipelineSplit::megatron(true, false).fullest_chunk(7, 4), 2, "chunks [1, 2, 2, 2]");
        assert_eq!(lens(PipelineSplit::megatron(true, false), 7, 4), vec![1, 2, 2, 2]);
        assert_eq!(PipelineSplit::megatron(true, true).fullest_chunk(126, 128), 1);
        // The embedding as 9 layers does not fit the first of 4 chunks of 10 + 9 units.
        let big = PipelineSplit { embedding: 9, loss: 0 };
        assert!(big.starts(10, 4).is_err());
        assert_eq!(big.fullest_chunk(10, 4), 3, "the even split's: ceil(10 / 4)");
        assert_eq!(PipelineSplit::default().fullest_chunk(10, 0), 10, "no chunks: one");
    }

    /// The constant-time fullest chunk is the scan's for every split that fits: few and
    /// many layers, one to many chunks, the embedding and the loss counted as 0 to 4.
    #[test]
    fn max_len_is_the_scans() {
        let mut checked = 0;
        for layers in 1..=70 {
            for chunks in 1..=40 {
                for embedding in 0..=4 {
                    for loss in 0..=4 {
                        if let Ok(st) = (PipelineSplit { embedding, loss }).starts(layers, chunks) {
                            assert_eq!(st.max_len(), st.max_len_by_scan(), "{layers} layers, {chunks} chunks, E{embedding} L{loss}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 30_000, "{checked}");
    }

    /// Where several of Megatron's flag pairs build a pipeline the even split comes first
    /// (80 and 82 units both divide by PP2): the search and the published-layout checks
    /// take the first.
    #[test]
    fn layout_choices_divide_the_units_evenly_as_megatron_bridge_presets_do() {
        // DeepSeek-V3's 61 layers over 16 chunks: the head as three (Megatron-Bridge's
        // layout_map) or the embedding as one and the head as two (NeMo's PP16 script).
        assert_eq!(PipelineSplit::layout_choices(61, 4, 4), vec![PipelineSplit { embedding: 0, loss: 3 }, PipelineSplit { embedding: 1, loss: 2 }]);
        assert_eq!(PipelineSplit::layout_choices(61, 16, 1), PipelineSplit::layout_choices(61, 8, 2));
        assert_eq!(PipelineSplit { embedding: 0, loss: 3 }.megatron_layout(61, 16, 1).unwrap(), "Et*4|(t*4|)*14tmL");
        // 80 layers over PP4 VP3: only the embedding as one and the head as three make 84.
        assert_eq!(PipelineSplit::layout_choices(80, 4, 3), vec![PipelineSplit { embedding: 1, loss: 3 }]);
        // None of 80-84 units divides by 13 chunks; one stage has nothing to lay out.
        assert_eq!(PipelineSplit::layout_choices(80, 13, 1), vec![]);
        assert_eq!(PipelineSplit::layout_choices(80, 1, 1), vec![]);
    }

    #[test]
    fn megatron_choices_put_the_even_split_first() {
        assert_eq!(PipelineSplit::megatron_choices(80, 2, 1), vec![PipelineSplit::default(), PipelineSplit::megatron(true, true)]);
        // Labels read back in either case, as the flag help shows them.
        assert_eq!(PipelineSplit::parse("e1l0").unwrap(), PipelineSplit::megatron(true, false));
        assert_eq!(PipelineSplit::parse(" EVEN ").unwrap(), PipelineSplit::default());
    }
}
