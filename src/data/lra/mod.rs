//! The Long Range Arena's tasks (Tay et al. 2020), generated here from their published specifications
//! (no LRA data can be downloaded on these machines): ListOps, Pathfinder, pixel sequences (LRA's "Image")
//! and byte-level text (LRA's "Text"). Every example is a sequence of integer tokens and a class label.
//!
//! Splits. The generated tasks draw candidates from one stream per seed and send each to the split its
//! content hashes to (8 of 10 buckets train, one validation, one test), so an example can never be in two
//! splits, and the same seed gives the same examples on every machine (a PCG stream, SHA-256 buckets). The
//! pixel and byte tasks keep their data sets' splits (the images' test set and validation carve-out; every
//! fifth email of each SpamAssassin group for test, then every tenth of the rest for validation).
use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use serde::Serialize;

pub mod listops;
pub mod pathfinder;

/// Which split an example belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Validation,
    Test,
}

impl Split {
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "train" => Split::Train,
            "validation" => Split::Validation,
            "test" => Split::Test,
            other => bail!("unknown split `{other}`: train, validation or test"),
        })
    }

    /// The split an example's content hashes to: 80% train, 10% validation, 10% test.
    pub fn of_content(tokens: &[u32]) -> Self {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        match super::sha256_hex(&bytes).as_bytes()[0] % 10 {
            8 => Split::Validation,
            9 => Split::Test,
            _ => Split::Train,
        }
    }
}

/// One example: its tokens and its class.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Example {
    pub tokens: Vec<u32>,
    pub label: u32,
}

/// `ablate data`'s line: the tokens as text, separated by spaces, and the label.
#[derive(Serialize)]
pub struct JsonLine {
    pub input: String,
    pub label: u32,
}

impl Example {
    /// The JSON line: the tokens through `render` (a generated task's own token names, or the integers).
    pub fn json_line(&self, render: impl Fn(u32) -> String) -> String {
        let input = self.tokens.iter().map(|&t| render(t)).collect::<Vec<_>>().join(" ");
        serde_json::to_string(&JsonLine { input, label: self.label }).expect("plain strings and numbers")
    }
}

/// The random stream of a generated task's seed.
pub fn stream(seed: u64) -> Pcg64 {
    Pcg64::seed_from_u64(seed)
}

/// The first `n` examples of `split` that `generate` draws from the stream of `seed`, each sent to the
/// split its content hashes to.
pub fn examples_of(seed: u64, split: Split, n: usize, mut generate: impl FnMut(&mut Pcg64) -> Example) -> Vec<Example> {
    try_examples_of(seed, split, n, |rng| Ok(generate(rng))).expect("an infallible generator")
}

/// [`examples_of`] for a generator that can fail (Pathfinder's contours may not fit).
pub fn try_examples_of(
    seed: u64,
    split: Split,
    n: usize,
    mut generate: impl FnMut(&mut Pcg64) -> Result<Example>,
) -> Result<Vec<Example>> {
    let mut rng = stream(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let e = generate(&mut rng)?;
        if Split::of_content(&e.tokens) == split {
            out.push(e);
        }
    }
    Ok(out)
}

/// A uniform integer in `lo..=hi`.
pub(crate) fn between(rng: &mut Pcg64, lo: usize, hi: usize) -> usize {
    rng.random_range(lo..=hi)
}

/// LRA's "Image" task: the images of `images` as sequences of grey levels (0–255; colour images channel by
/// channel per pixel, CIFAR-10's 3,072 values), in the data set's splits (validation: the same carve-out
/// as the vision kinds'). The first `n` of `split`.
pub fn pixel_examples(images: &crate::data::images::ImageTask, split: Split, n: usize) -> Result<Vec<Example>> {
    let set = match split {
        Split::Train => &images.train,
        Split::Validation => &images.validation,
        Split::Test => &images.test,
    };
    let n = (n as i64).min(set.len());
    let pixels = set.images.narrow(0, 0, n).permute([0, 2, 3, 1]).reshape([n, -1]).to_kind(tch::Kind::Int64);
    let labels = set.labels.narrow(0, 0, n);
    (0..n)
        .map(|i| {
            let row = Vec::<i64>::try_from(pixels.get(i))?;
            Ok(Example { tokens: row.iter().map(|&p| p as u32).collect(), label: labels.int64_value(&[i]) as u32 })
        })
        .collect()
}

/// The pad token of the byte task (LRA pads with 0; no email holds a NUL byte).
pub const BYTE_PAD: u32 = 0;

/// LRA's "Text" task on the labelled text these machines have: SpamAssassin emails (subject and body, cut
/// to 2,000 characters when cached) as UTF-8 bytes, truncated or padded with 0 to `length`; label 1 is spam.
/// Splits: the corpus's test emails (every fifth of each group), and of the rest every tenth (evenly spread)
/// for validation. `n` of a split are spread evenly over it (the corpus is ordered by group).
pub fn byte_examples(emails: &[crate::data::spam::Email], split: Split, n: usize, length: usize) -> Vec<Example> {
    let rest: Vec<&crate::data::spam::Email> = emails.iter().filter(|e| !e.test).collect();
    let (train_idx, validation_idx) = crate::data::carve_validation(rest.len(), 0.1);
    let chosen: Vec<&crate::data::spam::Email> = match split {
        Split::Test => emails.iter().filter(|e| e.test).collect(),
        Split::Train => train_idx.iter().map(|&i| rest[i]).collect(),
        Split::Validation => validation_idx.iter().map(|&i| rest[i]).collect(),
    };
    // The corpus lists its emails group by group (ham, then spam): `n` of them spread evenly over the split
    // keep its mix of classes, where the first `n` would be one group.
    let count = chosen.len();
    let keep = n.min(count);
    (0..keep)
        .map(|i| chosen[i * count / keep])
        .map(|e| {
            let mut tokens: Vec<u32> = e.text.bytes().take(length).map(u32::from).collect();
            tokens.resize(length, BYTE_PAD);
            Example { tokens, label: u32::from(e.spam) }
        })
        .collect()
}
