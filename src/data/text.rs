//! Text data: the default corpus (the World English Bible, public domain, fetched from Debian's
//! `sword-text-web` package and cached), any local text file, the copy task, and batches.
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

use super::tokenize::{CharTokenizer, TextTokenizer};
use super::{cache_dir, fetch_deb, sha256_hex, tempdir_in};
use crate::recipe::{Corpus, DataConfig, Task, Tokenizer};

/// SHA-256 of the plain text we extract from `sword-text-web` 426.0-1 (one verse per line).
const BIBLE_SHA256: &str = "f5d398a11101886e50c9f7743e8e712b37d14e2636e8bd2ce53e4c0ff735c63c";

/// The corpus text a data config names (fetching and caching the default corpus on first use).
pub fn load_text(cfg: &DataConfig) -> Result<String> {
    let text = match &cfg.path {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("data.path: cannot read {path} as UTF-8 text"))?
        }
        None => match cfg.corpus {
            Corpus::Bible => std::fs::read_to_string(bible_path()?)?,
            Corpus::SpamEmails => spam_training_text(&super::spam::spam_assassin()?),
        },
    };
    Ok(match cfg.max_chars {
        Some(n) => text.chars().take(n).collect(),
        None => text,
    })
}

/// The text of the spam task's training emails, each followed by a blank line; no label, no test email.
pub fn spam_training_text(emails: &[super::spam::Email]) -> String {
    let mut text = String::new();
    for email in emails.iter().filter(|e| !e.test) {
        text.push_str(email.text.trim_end());
        text.push_str("\n\n");
    }
    text
}

/// The cached World English Bible, built from the Debian package on first use.
pub fn bible_path() -> Result<PathBuf> {
    let what = "the default corpus (World English Bible, Debian package sword-text-web, ~4 MB)";
    checked_text_in_cache(&cache_dir(), "web-bible.txt", what, BIBLE_SHA256, fetch_bible)
}

/// The text file `name` in the cache `dir`, made on first use by `fetch` (given a scratch directory) and
/// kept only when its SHA-256 is `sha256`. Several processes may ask at once: one fetches, the others wait
/// for it ([`crate::files::fill_cache_entry`]); the file appears whole, through a rename, or not at all.
pub(crate) fn checked_text_in_cache(
    dir: &Path,
    name: &str,
    what: &str,
    sha256: &str,
    fetch: impl FnOnce(&Path) -> Result<String>,
) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating the data cache {}", dir.display()))?;
    crate::files::fill_cache_entry(
        &path,
        what,
        |p| p.exists(),
        || {
            eprintln!("ablate: fetching {what} into {}", dir.display());
            let work = tempdir_in(dir)?;
            let text = fetch(work.path())?;
            let digest = sha256_hex(text.as_bytes());
            if digest != sha256 {
                bail!(
                "{what}: the text fetched has SHA-256 {digest}, expected {sha256}: its source changed; set data.path to a local text file instead"
            );
            }
            crate::files::write_atomically(&path, text.as_bytes())?;
            eprintln!("ablate: {name} ready: {} characters, checksum ok", text.chars().count());
            Ok(())
        },
    )?;
    Ok(path)
}

/// The World English Bible's SWORD module from `sword-text-web`, one verse per line.
fn fetch_bible(work: &Path) -> Result<String> {
    let unpacked = fetch_deb("sword-text-web", work, "the default corpus")?;
    let ztext = unpacked.join("usr/share/sword/modules/texts/ztext");
    let module = std::fs::read_dir(&ztext)
        .with_context(|| format!("the package has no {}", ztext.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("ot.bzs").exists())
        .context("no SWORD ztext module in the package")?;
    let verses = super::sword::read_verses(&module)?;
    let mut text = String::new();
    for (_, _, v) in verses {
        text.push_str(&v);
        text.push('\n');
    }
    Ok(text)
}

/// Targets the loss and the accuracy ignore (the copy task's prompt half).
pub const IGNORE: i64 = -100;

/// What a run trains on: a text corpus, or a synthetic task.
pub enum Dataset {
    Text(TextData),
    Copy(CopyTask),
}

impl Dataset {
    /// A text's frequency level ([`TextData::unigram_cross_entropy`]); `None` for a synthetic task.
    pub fn frequency_level(&self) -> Option<f64> {
        match self {
            Dataset::Text(text) => Some(text.unigram_cross_entropy()),
            Dataset::Copy(_) => None,
        }
    }

    pub fn load(cfg: &DataConfig) -> Result<Self> {
        Ok(match cfg.task {
            Task::Text => Dataset::Text(TextData::load(cfg)?),
            Task::Copy => Dataset::Copy(CopyTask::new(cfg.copy_length, cfg.copy_symbols)),
            Task::Induction => Dataset::Copy(CopyTask::induction(cfg.copy_length, cfg.copy_symbols)),
            Task::Recall => Dataset::Copy(CopyTask::recall(cfg.copy_length, cfg.copy_symbols, cfg.recall_pairs)),
        })
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        match self {
            Dataset::Text(d) => &d.tokenizer,
            Dataset::Copy(c) => &c.tokenizer,
        }
    }

    /// Checks that the data can feed windows of `longest` tokens (the block, or the longest evaluation).
    pub fn check_block_size(&self, longest: i64) -> Result<()> {
        match self {
            Dataset::Text(d) => d.check_block_size(longest),
            Dataset::Copy(c) if longest != 2 * c.length => {
                bail!("the copy task has sequences of {} tokens, not {longest}", 2 * c.length)
            }
            Dataset::Copy(_) => Ok(()),
        }
    }

    pub fn train_batch(&self, batch: i64, block: i64, device: Device) -> (Tensor, Tensor) {
        match self {
            Dataset::Text(d) => d.train_batch(batch, block, device),
            Dataset::Copy(c) if c.form == Form::Induction => {
                let rows = Tensor::randint(c.symbols, [batch, 2 * c.length + 1], (Kind::Int64, Device::Cpu));
                let lengths =
                    Tensor::randint_low(c.shortest_repeat(), c.length + 1, [batch], (Kind::Int64, Device::Cpu));
                c.induction_batch(&rows, &lengths, device)
            }
            Dataset::Copy(c @ CopyTask { form: Form::Recall { pairs }, .. }) => {
                let draws = Tensor::randint(1 << 30, [batch, 3 * pairs], (Kind::Int64, Device::Cpu));
                c.recall_batch(&draws, device)
            }
            Dataset::Copy(c) => {
                c.batch(&Tensor::randint(c.symbols, [batch, c.length], (Kind::Int64, Device::Cpu)), device)
            }
        }
    }

    /// A fixed set of `batches` batches of the `split`, the same for every evaluation of every run.
    pub fn held_out_batches(
        &self,
        split: HeldOut,
        batches: i64,
        batch: i64,
        block: i64,
        device: Device,
    ) -> Vec<(Tensor, Tensor)> {
        match self {
            Dataset::Text(d) => d.held_out_batches(split, batches, batch, block, device),
            Dataset::Copy(c) => c.held_out_batches(split, batches, batch, device),
        }
    }

    /// How many batches of `batch` windows of `block` tokens the final test evaluation reads: `asked`, capped
    /// at the windows the test split holds without overlapping (a copy task draws as many as asked).
    pub fn test_batches(&self, asked: i64, batch: i64, block: i64) -> i64 {
        match self {
            Dataset::Text(d) => asked.min(((d.test.numel() as i64 - 1) / (block * batch)).max(1)),
            Dataset::Copy(_) => asked,
        }
    }

    /// A prompt to sample from after training: a validation character, or a copy task's first half.
    pub fn sample_prompt(&self) -> (Vec<i64>, usize) {
        match self {
            Dataset::Text(d) => (vec![d.validation.int64_value(&[0])], 200),
            Dataset::Copy(c) if c.form != Form::Copy => {
                // Up to the first scored position; the rest is to be generated.
                let (x, y) = &c.held_out_batches(HeldOut::Validation, 1, 1, Device::Cpu)[0];
                let ids = Vec::<i64>::try_from(x.get(0)).expect("int64 tokens");
                let targets = Vec::<i64>::try_from(y.get(0)).expect("int64 targets");
                let start = targets.iter().position(|&t| t != IGNORE).unwrap_or(ids.len() - 1);
                (ids[..=start].to_vec(), ids.len() - start)
            }
            Dataset::Copy(c) => {
                let (x, _) = &c.held_out_batches(HeldOut::Validation, 1, 1, Device::Cpu)[0];
                let ids = Vec::<i64>::try_from(x.get(0)).expect("int64 tokens");
                (ids[..=c.length as usize].to_vec(), c.length as usize - 1)
            }
        }
    }
}

/// The two held-out splits: validation (evaluation during training, tuning, any selection) and test (the
/// reported final metrics, read once per run at its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldOut {
    Validation,
    Test,
}

impl HeldOut {
    pub fn name(self) -> &'static str {
        match self {
            HeldOut::Validation => "validation",
            HeldOut::Test => "test",
        }
    }
}

/// The copy task: `length` random symbols, a separator, the same symbols again. The model sees the first
/// 2·length tokens and is scored on predicting the copy, each of which needs the token `length` positions
/// back: a dependency distance that a recipe controls.
///
/// With `induction` (Olsson et al. 2022's repeated random tokens), each window of 2·length tokens is random
/// symbols that end with a segment of n tokens written twice, n drawn per row from length/2 to length; the
/// model is scored on the second writing's tokens after its first. Each such target is the token that
/// followed the previous occurrence of the current token, n positions back: with n varying, no fixed offset
/// finds it, so the model must match the current token against earlier ones and read the token after the
/// match (an induction head, which takes two layers: one to write each position's previous token into it,
/// one to match on that).
pub struct CopyTask {
    pub length: i64,
    pub symbols: i64,
    pub tokenizer: TextTokenizer,
    pub form: Form,
}

/// Which synthetic task a [`CopyTask`] generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Copy,
    Induction,
    /// Multi-query associative recall with this many key–value pairs.
    Recall {
        pairs: i64,
    },
}

impl CopyTask {
    pub fn new(length: i64, symbols: i64) -> Self {
        let alphabet: String = (0..symbols as u8).map(|i| char::from(b'a' + i)).chain(std::iter::once('|')).collect();
        Self { length, symbols, tokenizer: TextTokenizer::Char(CharTokenizer::fit(&alphabet)), form: Form::Copy }
    }

    /// The induction task over windows of 2·`length` tokens from `symbols` symbols.
    pub fn induction(length: i64, symbols: i64) -> Self {
        Self { form: Form::Induction, ..Self::new(length, symbols) }
    }

    /// Multi-query associative recall (Arora et al. 2023, Zoology's MQAR) over windows of 2·`length`
    /// tokens: `pairs` key–value pairs open the window (keys distinct, from the first half of the alphabet;
    /// values from the second), separators fill its middle, and its end asks for every key again in a random
    /// order, each followed by its value. The model is scored on each queried value: the answer lies between
    /// 2·length − 4·pairs + 2 and 2·length − 2 positions back, so the window length sets the distance.
    pub fn recall(length: i64, symbols: i64, pairs: i64) -> Self {
        Self { form: Form::Recall { pairs }, ..Self::new(length, symbols) }
    }

    /// Recall windows from `draws` (B, 3·pairs) of random non-negative integers: per row, the keys (a partial
    /// shuffle), their values and the order of the queries. Inputs are the window's 2·length tokens; targets
    /// are each queried key's value, at the key's position, and ignored elsewhere.
    pub fn recall_batch(&self, draws: &Tensor, device: Device) -> (Tensor, Tensor) {
        let Form::Recall { pairs } = self.form else { unreachable!("recall_batch on a recall task only") };
        let (b, _) = draws.size2().expect("rows of draws");
        let draws = Vec::<i64>::try_from(draws.reshape([-1])).expect("int64 draws");
        let (p, width) = (pairs as usize, (2 * self.length + 1) as usize);
        let (keys, values) = (self.symbols / 2, self.symbols - self.symbols / 2);
        let separator = self.symbols;
        let mut inputs = Vec::with_capacity(b as usize * (width - 1));
        let mut targets = Vec::with_capacity(b as usize * (width - 1));
        for row_draws in draws.chunks(3 * p) {
            // The first `p` of a partial Fisher–Yates shuffle of the keys: distinct keys, uniformly drawn.
            let mut pool: Vec<i64> = (0..keys).collect();
            for (i, &draw) in row_draws[..p].iter().enumerate() {
                let j = i + (draw as usize) % (pool.len() - i);
                pool.swap(i, j);
            }
            let value: Vec<i64> = (0..p).map(|i| keys + row_draws[p + i] % values).collect();
            let mut order: Vec<usize> = (0..p).collect();
            for i in (1..p).rev() {
                order.swap(i, (row_draws[2 * p + i] as usize) % (i + 1));
            }
            let mut row = vec![separator; width];
            let mut scored = vec![IGNORE; width - 1];
            for (i, (&key, &v)) in pool.iter().zip(&value).enumerate() {
                row[2 * i] = key;
                row[2 * i + 1] = v;
            }
            let queries = width - 2 * p;
            for (j, &i) in order.iter().enumerate() {
                row[queries + 2 * j] = pool[i];
                row[queries + 2 * j + 1] = value[i];
                scored[queries + 2 * j] = value[i];
            }
            inputs.extend_from_slice(&row[..width - 1]);
            targets.extend_from_slice(&scored);
        }
        let x = Tensor::from_slice(&inputs).view([b, width as i64 - 1]);
        let y = Tensor::from_slice(&targets).view([b, width as i64 - 1]);
        (super::to_device_async(&x, device), super::to_device_async(&y, device))
    }

    /// The shortest repeated segment of the induction task: half the longest, at least 2 (so that every row
    /// has a scored target).
    pub fn shortest_repeat(&self) -> i64 {
        ((self.length + 1) / 2).max(2).min(self.length)
    }

    /// Induction windows from rows of 2·length + 1 random symbols (B, 2L + 1) and each row's segment length n
    /// (B): the row's last 2n symbols become its first n written twice; inputs are the first 2L symbols,
    /// targets the next symbol at the second writing's positions 1..n and ignored elsewhere.
    pub fn induction_batch(&self, rows: &Tensor, lengths: &Tensor, device: Device) -> (Tensor, Tensor) {
        let (b, width) = rows.size2().expect("rows of symbols");
        let mut symbols = Vec::<i64>::try_from(rows.reshape([-1])).expect("int64 symbols");
        let lengths = Vec::<i64>::try_from(lengths).expect("int64 lengths");
        let mut targets = vec![IGNORE; (b * (width - 1)) as usize];
        for (i, &n) in lengths.iter().enumerate() {
            let row = &mut symbols[i * width as usize..(i + 1) * width as usize];
            let (first, second) = (width - 2 * n, width - n);
            for k in 0..n {
                row[(second + k) as usize] = row[(first + k) as usize];
            }
            // The target at input position t is the symbol at t + 1: score second writing's tokens 1..n.
            for t in second..width - 1 {
                targets[i * (width - 1) as usize + t as usize] = row[(t + 1) as usize];
            }
        }
        let all = Tensor::from_slice(&symbols).view([b, width]);
        let x = all.narrow(1, 0, width - 1).contiguous();
        let y = Tensor::from_slice(&targets).view([b, width - 1]);
        (super::to_device_async(&x, device), super::to_device_async(&y, device))
    }

    /// Inputs and targets for rows of symbols (B, L): inputs `s | s[..L-1]`, targets ignored over the first
    /// half and `s` over the second.
    fn batch(&self, symbols: &Tensor, device: Device) -> (Tensor, Tensor) {
        let (b, l) = symbols.size2().unwrap();
        let sep = Tensor::full([b, 1], self.symbols, (Kind::Int64, Device::Cpu)); // '|' sorts after the letters
        let seq = Tensor::cat(&[symbols, &sep, symbols], 1); // (B, 2L + 1)
        let x = seq.narrow(1, 0, 2 * l).contiguous();
        let ignored = Tensor::full([b, l], IGNORE, (Kind::Int64, Device::Cpu));
        let y = Tensor::cat(&[&ignored, symbols], 1);
        (super::to_device_async(&x, device), super::to_device_async(&y, device))
    }

    /// A fixed held-out set, the same for every run: symbols from a fixed-seed generator of our own, one
    /// seed per split (training batches come from libtorch's generator, seeded per step).
    pub fn held_out_batches(&self, split: HeldOut, batches: i64, batch: i64, device: Device) -> Vec<(Tensor, Tensor)> {
        let mut state: u64 = match split {
            HeldOut::Test => 0x5eed,
            HeldOut::Validation => 0x7a11d,
        };
        let mut next = || crate::stats::splitmix64(&mut state);
        if let Form::Recall { pairs } = self.form {
            return (0..batches)
                .map(|_| {
                    let v: Vec<i64> = (0..batch * 3 * pairs).map(|_| (next() >> 34) as i64).collect();
                    self.recall_batch(&Tensor::from_slice(&v).view([batch, 3 * pairs]), device)
                })
                .collect();
        }
        if self.form == Form::Induction {
            let width = 2 * self.length + 1;
            let span = (self.length - self.shortest_repeat() + 1) as u64;
            return (0..batches)
                .map(|_| {
                    let v: Vec<i64> = (0..batch * width).map(|_| (next() % self.symbols as u64) as i64).collect();
                    let n: Vec<i64> = (0..batch).map(|_| self.shortest_repeat() + (next() % span) as i64).collect();
                    self.induction_batch(&Tensor::from_slice(&v).view([batch, width]), &Tensor::from_slice(&n), device)
                })
                .collect();
        }
        (0..batches)
            .map(|_| {
                let v: Vec<i64> = (0..batch * self.length).map(|_| (next() % self.symbols as u64) as i64).collect();
                self.batch(&Tensor::from_slice(&v).view([batch, self.length]), device)
            })
            .collect()
    }
}

/// A tokenised corpus split three ways, in the text's order: training, validation (the last
/// `validation_fraction` of what precedes the test part) and test (the last `test_fraction` of the text).
pub struct TextData {
    pub tokenizer: TextTokenizer,
    pub train: Tensor,
    pub validation: Tensor,
    pub test: Tensor,
}

/// The tokenizer a data config asks for. Characters are the whole text's; BPE and WordPiece are trained
/// on the training part only (or WordPiece loaded from `tokenizer_path`).
pub fn build_tokenizer(cfg: &DataConfig, train_text: &str, all_text: &str) -> Result<TextTokenizer> {
    let size = || cfg.vocab_size.unwrap_or(0) as usize;
    Ok(match (cfg.tokenizer, &cfg.tokenizer_path) {
        (Tokenizer::Char, _) => TextTokenizer::Char(CharTokenizer::fit(all_text)),
        (Tokenizer::Bpe, _) => TextTokenizer::train_bpe(train_text, size())?,
        (Tokenizer::Wordpiece, Some(path)) => {
            TextTokenizer::load(Path::new(path)).with_context(|| format!("data.tokenizer_path {path}"))?
        }
        (Tokenizer::Wordpiece, None) => TextTokenizer::train_wordpiece(train_text, size())?,
    })
}

/// Token ids of a text, line by line (keeping each line's newline) so subword tokenizers run in parallel.
pub fn encode_text(tokenizer: &TextTokenizer, text: &str) -> Result<Vec<i64>> {
    if let TextTokenizer::Char(c) = tokenizer {
        return c.encode(text);
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    Ok(tokenizer.encode_lines(&lines)?.concat())
}

/// The text split for subword runs: the first `1 − fraction` of it (cut at a line break) and the rest.
pub fn split_text(text: &str, fraction: f64) -> (&str, &str) {
    let mut cut = ((text.len() as f64) * (1.0 - fraction)) as usize;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let cut = text[..cut].rfind('\n').map_or(cut, |i| i + 1);
    text.split_at(cut)
}

impl TextData {
    /// Characters as tokens, split by token count (`test_fraction` of them for test, then
    /// `validation_fraction` of the rest for validation).
    pub fn from_text(text: &str, test_fraction: f64, validation_fraction: f64) -> Result<Self> {
        Self::from_text_with(text, &DataConfig { test_fraction, validation_fraction, ..DataConfig::default() })
    }

    /// The text tokenised as `cfg` says. Characters split by token count; subword texts are cut at line
    /// breaks, and their vocabularies trained on the training part only.
    pub fn from_text_with(text: &str, cfg: &DataConfig) -> Result<Self> {
        Self::split(text, cfg, None)
    }

    /// The text split as `cfg` says but tokenised by `tokenizer` (a checkpoint's), so a fine-tuning run
    /// sees the ids its pre-trained embeddings were learnt for.
    pub fn from_text_with_tokenizer(text: &str, cfg: &DataConfig, tokenizer: TextTokenizer) -> Result<Self> {
        Self::split(text, cfg, Some(tokenizer))
    }

    fn split(text: &str, cfg: &DataConfig, given: Option<TextTokenizer>) -> Result<Self> {
        if cfg.tokenizer == Tokenizer::Char {
            let tokenizer = match given {
                Some(t) => t,
                None => build_tokenizer(cfg, text, text)?,
            };
            let ids = encode_text(&tokenizer, text)?;
            let n_test = ((ids.len() as f64) * cfg.test_fraction).round() as i64;
            let rest = ids.len() as i64 - n_test;
            let n_validation = ((rest as f64) * cfg.validation_fraction).round() as i64;
            let n_train = rest - n_validation;
            let all = Tensor::from_slice(&ids);
            return Ok(Self {
                tokenizer,
                train: all.narrow(0, 0, n_train),
                validation: all.narrow(0, n_train, n_validation),
                test: all.narrow(0, rest, n_test),
            });
        }
        let (rest, test_text) = split_text(text, cfg.test_fraction);
        let (train_text, validation_text) = split_text(rest, cfg.validation_fraction);
        let tokenizer = match given {
            Some(t) => t,
            None => build_tokenizer(cfg, train_text, text)?,
        };
        let encode = |t: &str| Ok::<_, anyhow::Error>(Tensor::from_slice(&encode_text(&tokenizer, t)?));
        let (train, validation, test) = (encode(train_text)?, encode(validation_text)?, encode(test_text)?);
        Ok(Self { tokenizer, train, validation, test })
    }

    /// The frequency level: the test split's cross-entropy (nats per token) under the training split's token
    /// frequencies, add-one smoothed over the tokenizer's vocabulary — the loss of a model that has learnt
    /// which tokens are common and nothing else (no context). A model near it has learnt no order.
    pub fn unigram_cross_entropy(&self) -> f64 {
        let vocab = self.tokenizer.vocab_size().max(1);
        let counts = self.train.bincount(None::<Tensor>, vocab).to_kind(tch::Kind::Double) + 1.0;
        let log_p = (&counts / counts.sum(tch::Kind::Double)).log();
        let test = self.test.to_kind(tch::Kind::Int64);
        -log_p.index_select(0, &test).mean(tch::Kind::Double).double_value(&[])
    }

    /// One of the held-out splits.
    pub fn held_out(&self, split: HeldOut) -> &Tensor {
        match split {
            HeldOut::Validation => &self.validation,
            HeldOut::Test => &self.test,
        }
    }

    pub fn load(cfg: &DataConfig) -> Result<Self> {
        Self::from_text_with(&load_text(cfg)?, cfg)
    }

    /// Checks that every split holds at least one window of `block_size + 1` tokens.
    pub fn check_block_size(&self, block_size: i64) -> Result<()> {
        for (name, split) in [("training", &self.train), ("validation", &self.validation), ("test", &self.test)] {
            if split.numel() as i64 <= block_size {
                bail!(
                    "the {name} split has {} tokens, fewer than model.block_size + 1 = {}: use more data (data.max_chars, data.validation_fraction, data.test_fraction) or a shorter block",
                    split.numel(),
                    block_size + 1
                );
            }
        }
        Ok(())
    }

    /// `batch` random training windows: inputs (B, T) and next-token targets (B, T). Uses libtorch's generator.
    pub fn train_batch(&self, batch: i64, block: i64, device: Device) -> (Tensor, Tensor) {
        let starts = Tensor::randint(self.train.numel() as i64 - block, [batch], (Kind::Int64, Device::Cpu));
        windows(&self.train, &starts, block, device)
    }

    /// A fixed set of `batches` batches of `split`, evenly spaced over it, so every evaluation (of every
    /// run in a sweep) sees exactly the same text.
    pub fn held_out_batches(
        &self,
        split: HeldOut,
        batches: i64,
        batch: i64,
        block: i64,
        device: Device,
    ) -> Vec<(Tensor, Tensor)> {
        let data = self.held_out(split);
        let span = data.numel() as i64 - block - 1;
        let count = batches * batch;
        let starts: Vec<i64> = (0..count).map(|i| if count > 1 { i * span / (count - 1) } else { 0 }).collect();
        starts.chunks(batch as usize).map(|c| windows(data, &Tensor::from_slice(c), block, device)).collect()
    }
}

fn windows(data: &Tensor, starts: &Tensor, block: i64, device: Device) -> (Tensor, Tensor) {
    let offsets = Tensor::arange(block + 1, (Kind::Int64, Device::Cpu));
    let idx = starts.unsqueeze(1) + offsets.unsqueeze(0);
    let rows = data.index_select(0, &idx.view([-1])).view([starts.size()[0], block + 1]);
    let x = super::to_device_async(&rows.narrow(1, 0, block).contiguous(), device);
    let y = super::to_device_async(&rows.narrow(1, 1, block).contiguous(), device);
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_round_trips_and_names_unknown_characters() {
        let t = CharTokenizer::fit("hello world");
        assert_eq!(t.vocab_size(), 8);
        let ids = t.encode("low held").unwrap();
        assert_eq!(t.decode(&ids), "low held");
        assert!(t.encode("hex").unwrap_err().to_string().contains("'x'"));
    }

    #[test]
    fn the_frequency_level_is_the_test_splits_cross_entropy_under_smoothed_training_counts() {
        // Characters a, b, c (vocabulary 3). Training "aaab" (no validation), test "ac": counts a 3, b 1,
        // c 0, smoothed to 4, 2, 1 of 7; the level is −(ln 4/7 + ln 1/7) / 2.
        let d = TextData::from_text("aaabac", 2.0 / 6.0, 0.0).unwrap();
        assert_eq!((d.train.numel(), d.test.numel(), d.tokenizer.vocab_size()), (4, 2, 3));
        let expected = -((4.0f64 / 7.0).ln() + (1.0f64 / 7.0).ln()) / 2.0;
        assert!((d.unigram_cross_entropy() - expected).abs() < 1e-12, "{}", d.unigram_cross_entropy());
    }

    #[test]
    fn batches_are_shifted_windows_of_the_text() {
        let text: String = (0..200).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let d = TextData::from_text(&text, 0.25, 0.2).unwrap();
        assert_eq!((d.train.numel(), d.validation.numel(), d.test.numel()), (120, 30, 50));
        tch::manual_seed(1);
        let (x, y) = d.train_batch(4, 10, Device::Cpu);
        assert_eq!(x.size(), vec![4, 10]);
        // The alphabet cycles, so every target is the next letter of its input.
        let expected = (&x + 1).remainder(26);
        assert!(y.equal(&expected));
        for split in [HeldOut::Validation, HeldOut::Test] {
            let held = d.held_out_batches(split, 3, 2, 8, Device::Cpu);
            assert_eq!(held.len(), 3);
            assert!(held[0].0.get(0).equal(&d.held_out(split).narrow(0, 0, 8)));
        }
    }

    /// The three splits are consecutive, disjoint stretches of the one encoding, the test part where it
    /// always was (the text's end), for characters and for a trained subword vocabulary alike.
    #[test]
    fn splits_partition_the_text_in_order() {
        let text: String = (0..400).map(|i| format!("line {i} of the text\n")).collect();
        let chars = TextData::from_text(&text, 0.1, 0.1).unwrap();
        let whole = Tensor::cat(&[&chars.train, &chars.validation, &chars.test], 0);
        assert!(whole.equal(&Tensor::from_slice(&encode_text(&chars.tokenizer, &text).unwrap())));
        let n = whole.numel() as f64;
        assert_eq!(chars.test.numel(), (n * 0.1).round() as usize);
        let cfg = DataConfig { tokenizer: Tokenizer::Bpe, vocab_size: Some(80), ..DataConfig::default() };
        let bpe = TextData::from_text_with(&text, &cfg).unwrap();
        let (rest, test_text) = split_text(&text, cfg.test_fraction);
        let (train_text, validation_text) = split_text(rest, cfg.validation_fraction);
        assert_eq!(format!("{train_text}{validation_text}{test_text}"), text);
        assert!(train_text.ends_with('\n') && validation_text.ends_with('\n'));
        // No line is in two splits (each line of this text is unique).
        for line in validation_text.lines() {
            assert!(!train_text.contains(&format!("{line}\n")) && !test_text.contains(&format!("{line}\n")));
        }
        let decoded = |t: &Tensor| bpe.tokenizer.decode(&Vec::<i64>::try_from(t).unwrap());
        assert_eq!(decoded(&bpe.validation), validation_text);
        assert_eq!(decoded(&bpe.test), test_text);
    }

    /// The corpus's path through the cache with a local stand-in for Debian's archive: a deterministic text,
    /// slow enough to fetch (300 ms) that processes started together overlap.
    fn stand_in_corpus() -> String {
        (0..20_000).map(|i| format!("verse {i} of a stand-in corpus\n")).collect()
    }

    fn fill_stand_in(cache: &Path) -> Result<PathBuf> {
        let sha = sha256_hex(stand_in_corpus().as_bytes());
        checked_text_in_cache(cache, "web-bible.txt", "a stand-in corpus", &sha, |work| {
            std::fs::write(work.join("download"), b"scratch")?;
            std::thread::sleep(std::time::Duration::from_millis(300));
            Ok(stand_in_corpus())
        })
    }

    /// This test binary again, running only `test` with `env` set: a second process on the same code path.
    fn this_test_in_a_child(test: &str, env: &[(&str, &Path)]) -> std::process::Child {
        let mut cmd = crate::this_test_again(test);
        cmd.envs(env.iter().copied());
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("a child")
    }

    /// Issue 67: two pool workers fetching the corpus into one empty cache at once both failed but one (each
    /// wrote `web-bible.txt.partial` and renamed it; the second rename found nothing). Six processes,
    /// released together by a barrier, fill one empty cache: every one succeeds with the whole, checksummed
    /// text, exactly one fetches, and no scratch file is left.
    #[test]
    fn processes_filling_one_empty_cache_at_once_each_get_the_whole_checked_corpus() {
        const TEST: &str =
            "data::text::tests::processes_filling_one_empty_cache_at_once_each_get_the_whole_checked_corpus";
        const N: usize = 6;
        if let Some(dir) = std::env::var_os("ABLATE_TEST_FILL_DIR").map(PathBuf::from) {
            // A child: wait until all N have started, then fill.
            std::fs::write(dir.join("ready").join(std::process::id().to_string()), b"")
                .expect("marking this child ready");
            let started = std::time::Instant::now();
            while std::fs::read_dir(dir.join("ready")).expect("the barrier").count() < N {
                assert!(started.elapsed().as_secs() < 120, "the other children never started");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let path = fill_stand_in(&dir.join("cache")).expect("filling the cache");
            let text = std::fs::read_to_string(path).expect("reading the entry");
            assert_eq!(sha256_hex(text.as_bytes()), sha256_hex(stand_in_corpus().as_bytes()));
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ready")).unwrap();
        let children: Vec<_> =
            (0..N).map(|_| this_test_in_a_child(TEST, &[("ABLATE_TEST_FILL_DIR", dir.path())])).collect();
        let mut fetched = 0;
        for child in children {
            let out = child.wait_with_output().unwrap();
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && said.contains("1 passed"), "a child failed:\n{said}");
            fetched += said.matches("ablate: fetching a stand-in corpus").count();
        }
        assert_eq!(fetched, 1, "exactly one process fetches; the others wait for it or find it there");
        let cache = dir.path().join("cache");
        let text = std::fs::read_to_string(cache.join("web-bible.txt")).unwrap();
        assert_eq!(sha256_hex(text.as_bytes()), sha256_hex(stand_in_corpus().as_bytes()));
        let mut left: Vec<String> =
            std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["web-bible.txt", "web-bible.txt.lock"], "no scratch file is left behind");
    }

    /// A filler killed while it holds the lock blocks nobody: the kernel drops its `flock`, and the next
    /// process fills the entry itself.
    #[test]
    fn a_filler_killed_while_fetching_leaves_no_lock_and_no_half_entry() {
        const TEST: &str = "data::text::tests::a_filler_killed_while_fetching_leaves_no_lock_and_no_half_entry";
        if let Some(dir) = std::env::var_os("ABLATE_TEST_HOLD_DIR").map(PathBuf::from) {
            // A child: take the lock, say so, and hang in the fetch until killed.
            let sha = sha256_hex(stand_in_corpus().as_bytes());
            let _ = checked_text_in_cache(&dir.join("cache"), "web-bible.txt", "a stand-in corpus", &sha, |_| {
                std::fs::write(dir.join("holding"), b"").unwrap();
                std::thread::sleep(std::time::Duration::from_secs(600));
                Ok(stand_in_corpus())
            });
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut holder = this_test_in_a_child(TEST, &[("ABLATE_TEST_HOLD_DIR", dir.path())]);
        let started = std::time::Instant::now();
        while !dir.path().join("holding").exists() {
            assert!(started.elapsed().as_secs() < 120, "the child never took the lock");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        holder.kill().unwrap();
        holder.wait().unwrap();
        assert!(!dir.path().join("cache/web-bible.txt").exists(), "the killed fetch left a half entry");
        // Bounded: were the lock still held, the fill below would wait forever.
        let (tx, rx) = std::sync::mpsc::channel();
        let cache = dir.path().join("cache");
        std::thread::spawn(move || tx.send(fill_stand_in(&cache).map_err(|e| e.to_string())));
        let filled = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the dead holder's lock was released");
        let text = std::fs::read_to_string(filled.unwrap()).unwrap();
        assert_eq!(text, stand_in_corpus());
    }
}
