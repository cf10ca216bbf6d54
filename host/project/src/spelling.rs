//! Spelling: the known name a mistyped one likely meant, for "did you mean" in every
//! error that names an unknown key, model, region or file (one rule for the runner's
//! run files and flags and for this crate's calibration files).

/// The names of `known` nearest `unknown`, letters in any case, where near enough to be a
/// slip of the keyboard (Levenshtein's distance of at most 2, or a third of its length):
/// all those at the least distance, in `known`'s order; none past it.
pub fn nearest<'k>(unknown: &str, known: &[&'k str]) -> Vec<&'k str> {
    let Some(best) = known.iter().map(|k| edit_distance(unknown, k)).min() else {
        return Vec::new();
    };
    if best > 2.max(unknown.chars().count() / 3) {
        return Vec::new();
    }
    known.iter().copied().filter(|k| edit_distance(unknown, k) == best).collect()
}

/// Levenshtein distance between `a` and `b`, ignoring case: how far a typed name is from
/// a known one, for "did you mean".
pub fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.to_lowercase().chars().collect(), b.to_lowercase().chars().collect());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut diagonal = row[0];
        row[0] = i;
        for j in 1..=b.len() {
            let next = (row[j] + 1).min(row[j - 1] + 1).min(diagonal + usize::from(a[i - 1] != b[j - 1]));
            diagonal = row[j];
            row[j] = next;
        }
    }
    row[b.len()]
}
