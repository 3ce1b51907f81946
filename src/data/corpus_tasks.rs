//! Fine-tuning tasks generated from the corpus itself (UDL §12.6.2 asks for token classification and
//! span prediction; no labelled set of either is reachable from the registries, so the labels are made from
//! the text, deterministically, as described here and in the README).
//!
//! - **Punctuation restoration** (token classification): a line of the corpus with the punctuation mark
//!   after each word removed; the label of a word is the mark that followed it: none, `,`, `.`, `;` or `:`,
//!   `?`, `!` (6 classes). Closing quotes and brackets stay in place (`light,”` → `light”`, label `,`). The
//!   label sits on the word's last token; its other tokens are not scored.
//! - **Phrase location** (span prediction, SQuAD's input format): `<cls> question <sep> passage <sep>`, where
//!   the passage is a line of the corpus and the question is a phrase of 2–5 consecutive words from it,
//!   lower-cased with punctuation made spaces, chosen so that it occurs exactly once in the passage (under
//!   the same normalisation). The answer is the span of passage tokens from its first word's first token to
//!   its last word's last token.
//!
//! Lines come from the same split as pre-training: the training part of the text for training examples, the
//! held-out part for test examples. Lines longer than [`MAX_WORDS`] words are cut into pieces of that many.
use anyhow::{Context, Result};
use tch::Tensor;

use super::tokenize::{Special, TextTokenizer};
use super::IGNORE;

/// The special-token ids the tasks need.
#[derive(Debug, Clone, Copy)]
pub struct Specials {
    pub cls: i64,
    pub sep: i64,
    pub pad: i64,
    pub mask: i64,
    /// Ids below this are special tokens (a trained vocabulary puts them first); never chosen or drawn.
    pub first_ordinary: i64,
}

impl Specials {
    pub fn of(t: &TextTokenizer) -> Result<Self> {
        let get = |s: Special| t.special(s).with_context(|| format!("the tokenizer has no {}", s.token()));
        let ids = [get(Special::Cls)?, get(Special::Sep)?, get(Special::Pad)?, get(Special::Mask)?];
        Ok(Self { cls: ids[0], sep: ids[1], pad: ids[2], mask: ids[3], first_ordinary: Special::ALL.len() as i64 })
    }
}

/// Labelled rows as model inputs: ids and padding (N, block); labels (N) for a sequence task, or (N, block)
/// with `IGNORE` at unscored tokens for a token task.
pub struct Labelled {
    pub ids: Tensor,
    pub padding: Tensor,
    pub labels: Tensor,
}

impl Labelled {
    pub fn len(&self) -> i64 {
        self.ids.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `idx` on `device`.
    pub fn rows(&self, idx: &Tensor, device: tch::Device) -> Self {
        let pick = |t: &Tensor| super::to_device_async(&t.index_select(0, idx), device);
        Self { ids: pick(&self.ids), padding: pick(&self.padding), labels: pick(&self.labels) }
    }
}

/// `<cls> text <sep>` rows padded (or cut) to `block`.
pub fn encode_labelled(tokenizer: &TextTokenizer, texts: &[&str], labels: &[i64], block: i64) -> Result<Labelled> {
    let s = Specials::of(tokenizer)?;
    let encoded = tokenizer.encode_lines(texts)?;
    let mut ids = Vec::with_capacity(texts.len() * block as usize);
    let mut real = Vec::with_capacity(ids.capacity());
    for tokens in encoded {
        let n = tokens.len().min(block as usize - 2);
        let row: Vec<i64> =
            std::iter::once(s.cls).chain(tokens[..n].iter().copied()).chain(std::iter::once(s.sep)).collect();
        real.extend((0..block as usize).map(|j| j < row.len()));
        ids.extend(row.iter().copied().chain(std::iter::repeat(s.pad)).take(block as usize));
    }
    let n = texts.len() as i64;
    Ok(Labelled {
        ids: Tensor::from_slice(&ids).view([n, block]),
        padding: Tensor::from_slice(&real).view([n, block]),
        labels: Tensor::from_slice(labels),
    })
}

/// The punctuation classes, by label.
pub const PUNCTUATION_CLASSES: [&str; 6] = ["none", ",", ".", ";:", "?", "!"];
/// Lines are cut into pieces of at most this many words.
pub const MAX_WORDS: usize = 60;
/// Questions of the location task have this many words at least and at most.
pub const PHRASE_WORDS: (usize, usize) = (2, 5);

fn mark_class(c: char) -> Option<i64> {
    match c {
        ',' => Some(1),
        '.' => Some(2),
        ';' | ':' => Some(3),
        '?' => Some(4),
        '!' => Some(5),
        _ => None,
    }
}

fn is_closing(c: char) -> bool {
    matches!(c, '"' | '\'' | '’' | '”' | ')' | ']' | '»')
}

/// A word without the punctuation marks that end it (closing quotes and brackets kept), and the class of the
/// mark nearest the word (0: none). A word that is nothing but marks keeps them and has label 0.
pub fn strip_mark(word: &str) -> (String, i64) {
    let core = word.trim_end_matches(is_closing);
    let closing = &word[core.len()..];
    let bare = core.trim_end_matches(|c| mark_class(c).is_some());
    if bare.is_empty() || bare.len() == core.len() {
        return (word.to_string(), 0);
    }
    let first_mark = core[bare.len()..].chars().next().and_then(mark_class).unwrap_or(0);
    (format!("{bare}{closing}"), first_mark)
}

/// A line of the corpus (or a piece of a long one) as its words.
pub type Passage = Vec<String>;

/// The lines of `text` as word lists, long lines cut into pieces of at most [`MAX_WORDS`] words.
pub fn word_pieces(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .flat_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.chunks(MAX_WORDS).map(|c| c.to_vec()).collect::<Vec<_>>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The tokens of each word of each sequence, such that a sequence's tokens are exactly the tokens of its
/// words joined by single spaces (each word after the first is encoded with its leading space, which is how
/// byte-level BPE and WordPiece pre-tokenise running text; a test checks the equality).
pub fn encode_words(tokenizer: &TextTokenizer, sequences: &[Vec<String>]) -> Result<Vec<Vec<Vec<i64>>>> {
    let flat: Vec<String> = sequences
        .iter()
        .flat_map(|words| words.iter().enumerate().map(|(i, w)| if i == 0 { w.clone() } else { format!(" {w}") }))
        .collect();
    let refs: Vec<&str> = flat.iter().map(String::as_str).collect();
    let mut encoded = tokenizer.encode_lines(&refs)?.into_iter();
    Ok(sequences.iter().map(|words| encoded.by_ref().take(words.len()).collect()).collect())
}

/// Punctuation-restoration rows `<cls> words <sep>` from word pieces, labelled per token (`IGNORE` where
/// unscored); words that do not fit in the block are dropped whole.
pub fn punctuation_examples<S: AsRef<str>>(
    tokenizer: &TextTokenizer,
    pieces: &[Vec<S>],
    block: i64,
    s: Specials,
) -> Result<Labelled> {
    let stripped: Vec<(Vec<String>, Vec<i64>)> =
        pieces.iter().map(|words| words.iter().map(|w| strip_mark(w.as_ref())).unzip()).collect();
    let words: Vec<Vec<String>> = stripped.iter().map(|(w, _)| w.clone()).collect();
    let tokens = encode_words(tokenizer, &words)?;
    let width = block as usize;
    let (mut ids, mut padding, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    for (word_tokens, (_, marks)) in tokens.iter().zip(&stripped) {
        let mut row_ids = vec![s.cls];
        let mut row_labels = vec![IGNORE];
        for (t, &mark) in word_tokens.iter().zip(marks) {
            if t.is_empty() || row_ids.len() + t.len() > width - 1 {
                break;
            }
            row_ids.extend(t);
            row_labels.extend(std::iter::repeat_n(IGNORE, t.len() - 1));
            row_labels.push(mark);
        }
        row_ids.push(s.sep);
        row_labels.push(IGNORE);
        padding.extend((0..width).map(|j| j < row_ids.len()));
        ids.extend(row_ids.iter().copied().chain(std::iter::repeat(s.pad)).take(width));
        labels.extend(row_labels.iter().copied().chain(std::iter::repeat(IGNORE)).take(width));
    }
    let n = pieces.len() as i64;
    Ok(Labelled {
        ids: Tensor::from_slice(&ids).view([n, block]),
        padding: Tensor::from_slice(&padding).view([n, block]),
        labels: Tensor::from_slice(&labels).view([n, block]),
    })
}

/// Span rows: ids, segments, padding and `context` (true at passage tokens) (N, block); start and end (N)
/// are the answer's first and last token positions in the row.
pub struct SpanExamples {
    pub ids: Tensor,
    pub segments: Tensor,
    pub padding: Tensor,
    pub context: Tensor,
    pub start: Tensor,
    pub end: Tensor,
    /// The question's words, for inspection.
    pub questions: Vec<String>,
}

impl SpanExamples {
    /// Rows `idx` on `device`: a batch (without the questions' words).
    pub fn rows(&self, idx: &Tensor, device: tch::Device) -> Self {
        let pick = |t: &Tensor| super::to_device_async(&t.index_select(0, idx), device);
        Self {
            ids: pick(&self.ids),
            segments: pick(&self.segments),
            padding: pick(&self.padding),
            context: pick(&self.context),
            start: pick(&self.start),
            end: pick(&self.end),
            questions: Vec::new(),
        }
    }
}

/// The location task's word normalisation: lower case, and every character but letters, digits and
/// apostrophes made a space (`heart—a` → `heart a`, `light,”` → `light`).
pub fn normalise(word: &str) -> String {
    let spaced: String = word
        .chars()
        .map(|c| if c.is_alphanumeric() || c == '\'' || c == '’' { c } else { ' ' })
        .flat_map(char::to_lowercase)
        .collect();
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// SplitMix64: the phrase choice depends on the line's index only, never on a run's seed, so every run of
/// a sweep sees the same questions.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The phrase (first word, word count) asked about in a passage of normalised words: a random length and
/// start (from `key`), moved forward until the phrase has no empty word and occurs once; `None` if none does.
pub fn choose_phrase(normalised: &[String], key: u64) -> Option<(usize, usize)> {
    let (lo, hi) = PHRASE_WORDS;
    if normalised.len() < hi + 1 {
        return None;
    }
    let r = splitmix(key);
    let len = lo + (r % (hi - lo + 1) as u64) as usize;
    let starts = normalised.len() - len + 1;
    let first = ((r >> 16) % starts as u64) as usize;
    (0..starts).map(|k| (first + k) % starts).find_map(|start| {
        let phrase = &normalised[start..start + len];
        let unique = normalised.windows(len).filter(|w| *w == phrase).count() == 1;
        (unique && phrase.iter().all(|w| !w.is_empty())).then_some((start, len))
    })
}

/// Phrase-location rows `<cls> question <sep> passage <sep>` (segment 0 up to the first `<sep>`, 1 after).
/// Passages whose answer does not fit in the block, or without a unique phrase, are skipped.
pub fn locate_examples<S: AsRef<str>>(
    tokenizer: &TextTokenizer,
    pieces: &[Vec<S>],
    block: i64,
    s: Specials,
    key: u64,
) -> Result<SpanExamples> {
    let mut chosen = Vec::new();
    let mut sequences: Vec<Vec<String>> = Vec::new();
    for (i, words) in pieces.iter().enumerate() {
        let normalised: Vec<String> = words.iter().map(|w| normalise(w.as_ref())).collect();
        if let Some((start, len)) = choose_phrase(&normalised, splitmix(key) ^ i as u64) {
            sequences.push(normalised[start..start + len].to_vec());
            sequences.push(words.iter().map(|w| w.as_ref().to_string()).collect());
            chosen.push((start, len));
        }
    }
    let tokens = encode_words(tokenizer, &sequences)?;
    let width = block as usize;
    let mut rows = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut starts, mut ends, mut questions) = (Vec::new(), Vec::new(), Vec::new());
    for ((pair, &(first, len)), words) in tokens.chunks(2).zip(&chosen).zip(sequences.chunks(2)) {
        let (question, passage) = (&pair[0], &pair[1]);
        let mut ids = vec![s.cls];
        ids.extend(question.iter().flatten());
        ids.push(s.sep);
        let passage_from = ids.len();
        let mut word_start = Vec::with_capacity(passage.len());
        for t in passage {
            word_start.push(ids.len());
            ids.extend(t);
        }
        let passage_to = ids.len();
        let start = word_start[first];
        let end = word_start[first + len - 1] + passage[first + len - 1].len() - 1;
        // The passage may be cut at the block, but the answer must survive whole (and not be empty).
        if end + 2 > width || end < start {
            continue;
        }
        ids.truncate(width - 1);
        ids.push(s.sep);
        let n = ids.len();
        rows.0.extend(ids.iter().copied().chain(std::iter::repeat(s.pad)).take(width));
        rows.1.extend((0..width).map(|j| i64::from(j >= passage_from && j < n)));
        rows.2.extend((0..width).map(|j| j < n));
        rows.3.extend((0..width).map(|j| j >= passage_from && j < passage_to.min(n - 1)));
        starts.push(start as i64);
        ends.push(end as i64);
        questions.push(words[0].join(" "));
    }
    let n = starts.len() as i64;
    Ok(SpanExamples {
        ids: Tensor::from_slice(&rows.0).view([n, block]),
        segments: Tensor::from_slice(&rows.1).view([n, block]),
        padding: Tensor::from_slice(&rows.2).view([n, block]),
        context: Tensor::from_slice(&rows.3).view([n, block]),
        start: Tensor::from_slice(&starts),
        end: Tensor::from_slice(&ends),
        questions,
    })
}

/// The SQuAD-style scores of predicted spans against gold spans (all inclusive token positions): exact match
/// (both ends right) and F1 of the positions they share, each averaged over the examples.
pub fn span_scores(predicted: &[(i64, i64)], gold: &[(i64, i64)]) -> (f64, f64) {
    let n = gold.len().max(1) as f64;
    let (mut exact, mut f1) = (0.0, 0.0);
    for (&(ps, pe), &(gs, ge)) in predicted.iter().zip(gold) {
        exact += f64::from(u8::from(ps == gs && pe == ge));
        let overlap = (pe.min(ge) - ps.max(gs) + 1).max(0) as f64;
        if overlap > 0.0 {
            let (p, r) = (overlap / (pe - ps + 1) as f64, overlap / (ge - gs + 1) as f64);
            f1 += 2.0 * p * r / (p + r);
        }
    }
    (exact / n, f1 / n)
}

/// Micro-F1 of the punctuation marks (classes other than 0): a predicted mark is right when the gold mark is
/// the same; a missed or wrong mark counts against recall, a spurious or wrong one against precision.
pub fn mark_f1(predicted: &Tensor, labels: &Tensor) -> f64 {
    let count = |t: Tensor| t.to_kind(tch::Kind::Float).sum(tch::Kind::Float).double_value(&[]);
    let scored = labels.ne(IGNORE);
    let (p, l) = (predicted.masked_select(&scored), labels.masked_select(&scored));
    let right = p.eq_tensor(&l);
    let tp = count(right.logical_and(&l.ne(0)));
    let predicted_marks = count(p.ne(0));
    let gold_marks = count(l.ne(0));
    if tp == 0.0 {
        0.0
    } else {
        2.0 * tp / (predicted_marks + gold_marks)
    }
}
