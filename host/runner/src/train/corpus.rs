//! Training text and its tokenizer: the King James Bible shipped in
//! `workloads/text/kjv.txt` (public domain, from Debian's `bible-kjv-text`), or any
//! UTF-8 file, cut into words and encoded with a byte-level BPE learnt from the text
//! itself (GPT-2's scheme: 256 byte tokens, then the most frequent adjacent pair merged
//! into a new token, again and again, until the vocabulary is the model's).
//!
//! Learning the merges is incremental (each merge recounts only the words holding the
//! pair), so an 8192-token vocabulary over the 4 MB text takes about a second; encoding
//! caches each distinct word.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

/// The default training text.
pub const KJV: &str = include_str!("../../../../workloads/text/kjv.txt");

/// The text cut into words: an optional leading space followed by a run of letters, a
/// run of digits, or one other character (punctuation, newline).
pub fn words(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        if b[i] == b' ' && i + 1 < b.len() && b[i + 1] != b' ' {
            i += 1;
        }
        let class = |c: u8| {
            if c.is_ascii_alphabetic() || c >= 0x80 {
                1
            } else if c.is_ascii_digit() {
                2
            } else {
                0
            }
        };
        let k = class(b[i]);
        i += 1;
        if k != 0 {
            while i < b.len() && class(b[i]) == k {
                i += 1;
            }
        }
        // Never split a UTF-8 sequence: continuation bytes join the word.
        while i < b.len() && (b[i] & 0xC0) == 0x80 {
            i += 1;
        }
        out.push(&text[start..i]);
    }
    out
}

/// A byte-level BPE tokenizer.
#[derive(Clone, Debug)]
pub struct Bpe {
    /// Merge rank of each pair, and the token it makes.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Bytes of each token.
    pieces: Vec<Vec<u8>>,
}

impl Bpe {
    /// Learn merges from `text` until the vocabulary holds `vocab` tokens (or no pair
    /// occurs twice). Deterministic: ties go to the smallest pair.
    pub fn learn(text: &str, vocab: usize) -> Bpe {
        let mut counts: HashMap<&str, u64> = HashMap::new();
        for w in words(text) {
            *counts.entry(w).or_default() += 1;
        }
        let mut distinct: Vec<(&str, u64)> = counts.into_iter().collect();
        distinct.sort_unstable();
        let mut seqs: Vec<Vec<u32>> = distinct.iter().map(|(w, _)| w.bytes().map(u32::from).collect()).collect();
        let freq: Vec<i64> = distinct.iter().map(|(_, c)| *c as i64).collect();
        let mut pairs: HashMap<(u32, u32), i64> = HashMap::new();
        let mut holders: HashMap<(u32, u32), HashSet<usize>> = HashMap::new();
        for (wi, s) in seqs.iter().enumerate() {
            for p in s.windows(2) {
                *pairs.entry((p[0], p[1])).or_default() += freq[wi];
                holders.entry((p[0], p[1])).or_default().insert(wi);
            }
        }
        let mut heap: BinaryHeap<(i64, Reverse<(u32, u32)>)> = pairs.iter().map(|(&p, &c)| (c, Reverse(p))).collect();
        let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let mut merges = HashMap::new();
        while pieces.len() < vocab {
            let Some((c, Reverse(pair))) = heap.pop() else { break };
            if pairs.get(&pair) != Some(&c) {
                continue; // stale entry
            }
            if c < 2 {
                break;
            }
            let id = pieces.len() as u32;
            merges.insert(pair, (merges.len() as u32, id));
            pieces.push([pieces[pair.0 as usize].clone(), pieces[pair.1 as usize].clone()].concat());
            let mut touched: HashSet<(u32, u32)> = HashSet::new();
            for wi in holders.remove(&pair).unwrap_or_default() {
                let old = std::mem::take(&mut seqs[wi]);
                for p in old.windows(2) {
                    let k = (p[0], p[1]);
                    *pairs.entry(k).or_default() -= freq[wi];
                    touched.insert(k);
                }
                let mut new = Vec::with_capacity(old.len());
                let mut i = 0;
                while i < old.len() {
                    if i + 1 < old.len() && (old[i], old[i + 1]) == pair {
                        new.push(id);
                        i += 2;
                    } else {
                        new.push(old[i]);
                        i += 1;
                    }
                }
                for p in new.windows(2) {
                    let k = (p[0], p[1]);
                    *pairs.entry(k).or_default() += freq[wi];
                    holders.entry(k).or_default().insert(wi);
                    touched.insert(k);
                }
                seqs[wi] = new;
            }
            pairs.remove(&pair);
            for k in touched {
                if let Some(&c) = pairs.get(&k) {
                    if c > 0 {
                        heap.push((c, Reverse(k)));
                    } else {
                        pairs.remove(&k);
                    }
                }
            }
        }
        Bpe { merges, pieces }
    }

    /// Tokens in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.pieces.len()
    }

    /// One word's tokens: merge the lowest-ranked pair until none applies.
    fn encode_word(&self, w: &str) -> Vec<u32> {
        let mut s: Vec<u32> = w.bytes().map(u32::from).collect();
        loop {
            let best = s
                .windows(2)
                .enumerate()
                .filter_map(|(i, p)| self.merges.get(&(p[0], p[1])).map(|&(rank, id)| (rank, i, id)))
                .min();
            let Some((_, i, id)) = best else { return s };
            s[i] = id;
            s.remove(i + 1);
        }
    }

    /// `text` as tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut cache: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut out = Vec::with_capacity(text.len() / 3);
        for w in words(text) {
            let t = cache.entry(w).or_insert_with(|| self.encode_word(w));
            out.extend_from_slice(t);
        }
        out
    }

    /// The text of `tokens` (lossy where a token sequence cuts a UTF-8 character).
    pub fn decode(&self, tokens: &[u32]) -> String {
        let bytes: Vec<u8> = tokens.iter().flat_map(|&t| self.pieces.get(t as usize).cloned().unwrap_or_default()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_keep_every_byte_and_split_classes() {
        let t = "In the beginning, God 1611 created\nthe heaven  and é!";
        let w = words(t);
        assert_eq!(w.concat(), t);
        assert_eq!(&w[..6], ["In", " the", " beginning", ",", " God", " 1611"]);
        assert!(w.contains(&" é") && w.contains(&"!") && w.contains(&"\n"));
        // A space before a space stays alone; the last one leads the next word. A
        // non-ASCII letter is a letter (bytes >= 0x80 join the run).
        assert_eq!(w[6..], [" created", "\n", "the", " heaven", " ", " and", " é", "!"]);
        assert_eq!(words("naïve 42x "), ["naïve", " 42", "x", " "]);
    }

    /// The merges the incremental learner finds are those of the textbook algorithm
    /// (count every adjacent pair of every word, merge the most frequent, the smallest
    /// pair on a tie, stop below two occurrences), and encoding applies them in the
    /// order learnt. Kills slips in the incremental bookkeeping (stale heap entries,
    /// counts not moved to the new pairs, ties) that still round-trip.
    #[test]
    fn the_incremental_learner_finds_the_textbook_merges() {
        let text = &KJV[..20_000];
        let mut counts: std::collections::BTreeMap<&str, i64> = Default::default();
        for w in words(text) {
            *counts.entry(w).or_default() += 1;
        }
        let mut seqs: Vec<(Vec<u32>, i64)> = counts.iter().map(|(w, &c)| (w.bytes().map(u32::from).collect(), c)).collect();
        let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let mut merges: Vec<(u32, u32)> = Vec::new();
        let merge = |s: &[u32], pair: (u32, u32), id: u32| {
            let mut out = Vec::new();
            let mut i = 0;
            while i < s.len() {
                if i + 1 < s.len() && (s[i], s[i + 1]) == pair {
                    out.push(id);
                    i += 2;
                } else {
                    out.push(s[i]);
                    i += 1;
                }
            }
            out
        };
        while pieces.len() < 600 {
            let mut pairs: std::collections::BTreeMap<(u32, u32), i64> = Default::default();
            for (s, c) in &seqs {
                for p in s.windows(2) {
                    *pairs.entry((p[0], p[1])).or_default() += c;
                }
            }
            // Highest count; among equal counts the smallest pair.
            let Some((&pair, &c)) = pairs.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else { break };
            if c < 2 {
                break;
            }
            let id = pieces.len() as u32;
            pieces.push([pieces[pair.0 as usize].clone(), pieces[pair.1 as usize].clone()].concat());
            merges.push(pair);
            for (s, _) in &mut seqs {
                *s = merge(s, pair, id);
            }
        }
        let bpe = Bpe::learn(text, 600);
        assert_eq!(bpe.pieces, pieces, "the same merges, in the same order");
        // Encoding: every merge in the order learnt, over each word.
        let mut want = Vec::new();
        for w in words(text) {
            let mut s: Vec<u32> = w.bytes().map(u32::from).collect();
            for (r, &pair) in merges.iter().enumerate() {
                s = merge(&s, pair, 256 + r as u32);
            }
            want.extend(s);
        }
        assert_eq!(bpe.encode(text), want);
    }

    #[test]
    fn ties_go_to_the_smallest_pair_and_a_pair_seen_twice_is_merged() {
        // (a,b), (' ',c) and (c,d) each occur twice: (' ',c) = (32, 99) is the smallest.
        let bpe = Bpe::learn("ab ab cd cd", 257);
        assert_eq!(bpe.decode(&[256]), " c");
        // Twice in one word is twice: merged; then nothing repeats.
        let bpe = Bpe::learn("abab", 1000);
        assert_eq!(bpe.vocab(), 257);
        assert_eq!(bpe.encode("abab"), [256, 256]);
    }

    #[test]
    fn bpe_round_trips_and_compresses_the_shipped_text() {
        let text = &KJV[..200_000];
        let bpe = Bpe::learn(text, 2000);
        assert_eq!(bpe.vocab(), 2000);
        let tokens = bpe.encode(text);
        assert_eq!(bpe.decode(&tokens), text);
        assert!(tokens.iter().all(|&t| (t as usize) < bpe.vocab()));
        let ratio = text.len() as f64 / tokens.len() as f64;
        assert!(ratio > 3.0, "{ratio:.2} bytes per token");
        // Text it never saw still round-trips (bytes are always tokens).
        let other = "Zebras quickly jumped over 42 lazy dogs — naïve café.";
        assert_eq!(bpe.decode(&bpe.encode(other)), other);
        // The first merges are the most frequent pairs: " t"+"h" and the like.
        assert!(bpe.encode(" the").len() == 1, "' the' is one token");
        // Deterministic.
        assert_eq!(Bpe::learn(text, 2000).encode(text), tokens);
    }

    #[test]
    fn small_texts_stop_when_no_pair_repeats() {
        let bpe = Bpe::learn("abcd", 1000);
        assert_eq!(bpe.vocab(), 256);
        assert_eq!(bpe.encode("abcd"), [97, 98, 99, 100]);
    }
}
