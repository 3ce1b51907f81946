//! Tokenizers (UDL §12.5.1): characters, byte-pair encoding trained on the corpus to a target
//! vocabulary, and WordPiece (trained, or loaded from a BERT `vocab.txt` / `tokenizer.json`). BPE and
//! WordPiece are Hugging Face's `tokenizers` crate — the implementation the pretrained checkpoints were
//! tokenised with, so a loaded BERT sees exactly the ids it was trained on.
//!
//! Every trained vocabulary starts with the special tokens `<pad>`, `<bos>`, `<eos>`, `<cls>`, `<sep>`,
//! `<mask>`, `<unk>` (ids 0–6); a loaded BERT vocabulary maps them onto `[PAD]`, `[CLS]`, `[SEP]`, `[MASK]`,
//! `[UNK]` (`<bos>`/`<eos>` are `[CLS]`/`[SEP]` there).
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer, WordPieceTrainerBuilder};
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer,
    TokenizerBuilder, Trainer,
};

/// The special tokens, in the id order of a trained vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    Pad,
    Bos,
    Eos,
    Cls,
    Sep,
    Mask,
    Unk,
}

impl Special {
    pub const ALL: [Special; 7] =
        [Special::Pad, Special::Bos, Special::Eos, Special::Cls, Special::Sep, Special::Mask, Special::Unk];

    /// The token in a vocabulary ablate trained.
    pub fn token(self) -> &'static str {
        match self {
            Special::Pad => "<pad>",
            Special::Bos => "<bos>",
            Special::Eos => "<eos>",
            Special::Cls => "<cls>",
            Special::Sep => "<sep>",
            Special::Mask => "<mask>",
            Special::Unk => "<unk>",
        }
    }

    /// The token in a BERT vocabulary.
    fn bert_token(self) -> &'static str {
        match self {
            Special::Pad => "[PAD]",
            Special::Bos | Special::Cls => "[CLS]",
            Special::Eos | Special::Sep => "[SEP]",
            Special::Mask => "[MASK]",
            Special::Unk => "[UNK]",
        }
    }
}

/// The `tokenizers` crate's WordPiece trainer made deterministic. Its BPE core gives each `##c`
/// continuation piece the next free id when it first meets it while walking the word counts, a hash map
/// seeded at random per process; merges then break count ties by those ids, so two trainings on the same
/// text could differ in a few tokens and in up to a fifth of the ids (measured: 387–432 of 500 alike). Here every
/// continuation piece the text can produce is registered up front, in character order, as a trainer
/// special token (they enter the vocabulary before the alphabet, and nothing is left for the walk to
/// number), and only the real special tokens are handed back to the tokenizer as special. The vocabulary
/// holds the same kinds of tokens as the stock trainer's, with ids and tie-breaks fixed.
pub struct OrderedWordPieceTrainer {
    inner: WordPieceTrainer,
}

impl OrderedWordPieceTrainer {
    pub fn new(vocab_size: usize) -> Self {
        let inner = WordPieceTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .special_tokens(special_tokens())
            .show_progress(false)
            .build();
        Self { inner }
    }
}

impl Trainer for OrderedWordPieceTrainer {
    type Model = WordPiece;

    fn should_show_progress(&self) -> bool {
        false
    }

    fn train(&self, model: &mut WordPiece) -> tokenizers::Result<Vec<AddedToken>> {
        self.inner.train(model)?;
        Ok(special_tokens())
    }

    fn feed<I, S, F>(&mut self, iterator: I, process: F) -> tokenizers::Result<()>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
        F: Fn(&str) -> tokenizers::Result<Vec<String>> + Sync,
    {
        let continued = std::sync::Mutex::new(BTreeSet::new());
        self.inner.feed(iterator, |line| {
            let words = process(line)?;
            let after_first: BTreeSet<char> = words.iter().flat_map(|w| w.chars().skip(1)).collect();
            continued.lock().expect("no panics while holding the set").extend(after_first);
            Ok(words)
        })?;
        let prefix = self.inner.continuing_subword_prefix().clone().unwrap_or_default();
        let continuations = continued.into_inner().expect("no panics while holding the set");
        let mut tokens = special_tokens();
        tokens.extend(continuations.into_iter().map(|c| AddedToken::from(format!("{prefix}{c}"), true)));
        self.inner.set_special_tokens(tokens);
        Ok(())
    }
}

/// A tokenizer of any kind, with the special-token ids a model needs.
#[derive(Clone)]
pub enum TextTokenizer {
    Char(CharTokenizer),
    Subword(Box<Tokenizer>),
}

fn special_tokens() -> Vec<AddedToken> {
    Special::ALL.iter().map(|s| AddedToken::from(s.token(), true)).collect()
}

fn tk<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> anyhow::Error {
    move |e| anyhow::anyhow!("{what}: {e}")
}

impl TextTokenizer {
    /// Byte-level BPE (GPT-2's scheme: bytes as the initial alphabet, so no text is ever unknown) trained on
    /// the lines of `text` until the vocabulary (special tokens included) has `vocab_size` entries.
    pub fn train_bpe(text: &str, vocab_size: usize) -> Result<Self> {
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .special_tokens(special_tokens())
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .show_progress(false)
            .build();
        let mut tokenizer =
            TokenizerBuilder::<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>::new(
            )
            .with_model(BPE::default())
            // No prefix space: decoding gives back exactly the text that was encoded.
            .with_pre_tokenizer(Some(ByteLevel::new(false, true, true).into()))
            .with_decoder(Some(ByteLevelDecoder::new(false, true, true).into()))
            .build()
            .map_err(tk("building the BPE tokenizer"))?;
        tokenizer.train(&mut trainer, text.lines()).map_err(tk("training BPE"))?;
        Self::from_json(&tokenizer.to_string(false).map_err(tk("serialising BPE"))?)
    }

    /// WordPiece as BERT uses it (lower-casing BERT normaliser, split on whitespace and punctuation, `##`
    /// continuations) trained on the lines of `text` to `vocab_size` entries. The same text always gives
    /// the same vocabulary and ids (see [`OrderedWordPieceTrainer`]).
    pub fn train_wordpiece(text: &str, vocab_size: usize) -> Result<Self> {
        let mut trainer = OrderedWordPieceTrainer::new(vocab_size);
        let model = WordPiece::builder().unk_token(Special::Unk.token().into()).build().map_err(tk("WordPiece"))?;
        let mut tokenizer = TokenizerBuilder::<
            WordPiece,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >::new()
        .with_model(model)
        .with_normalizer(Some(BertNormalizer::default().into()))
        .with_pre_tokenizer(Some(BertPreTokenizer.into()))
        .with_decoder(Some(WordPieceDecoder::default().into()))
        .build()
        .map_err(tk("building the WordPiece tokenizer"))?;
        tokenizer.train(&mut trainer, text.lines()).map_err(tk("training WordPiece"))?;
        Self::from_json(&tokenizer.to_string(false).map_err(tk("serialising WordPiece"))?)
    }

    /// A BERT tokenizer from a `tokenizer.json`, or from a `vocab.txt` (built like BERT's uncased one).
    pub fn load(path: &Path) -> Result<Self> {
        if path.extension().is_some_and(|e| e == "json") {
            let json = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            return Self::from_json(&json).with_context(|| format!("{} is not a tokenizer.json", path.display()));
        }
        let vocab = path.to_str().context("the vocabulary path is not UTF-8")?;
        let model = WordPiece::from_file(vocab)
            .unk_token("[UNK]".into())
            .build()
            .map_err(|e| anyhow::anyhow!("{} is not a WordPiece vocab.txt: {e}", path.display()))?;
        let mut tokenizer = Tokenizer::new(model);
        tokenizer.with_normalizer(Some(BertNormalizer::default()));
        tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
        tokenizer.with_decoder(Some(WordPieceDecoder::default()));
        let t = Self::Subword(Box::new(tokenizer));
        t.check_specials()?;
        Ok(t)
    }

    /// A tokenizer from its JSON form (what checkpoints store).
    pub fn from_json(json: &str) -> Result<Self> {
        use std::str::FromStr;
        let mut tokenizer = Tokenizer::from_str(json).map_err(tk("reading tokenizer JSON"))?;
        // Ids only: no [CLS]/[SEP] added behind the caller's back (BERT inputs are assembled explicitly).
        tokenizer.with_post_processor(None::<PostProcessorWrapper>);
        let _ = tokenizer.with_truncation(None);
        tokenizer.with_padding(None);
        let t = Self::Subword(Box::new(tokenizer));
        t.check_specials()?;
        Ok(t)
    }

    fn check_specials(&self) -> Result<()> {
        for s in [Special::Pad, Special::Cls, Special::Sep, Special::Mask] {
            if self.special(s).is_none() {
                bail!("the vocabulary has no {} / {} token", s.token(), s.bert_token());
            }
        }
        Ok(())
    }

    pub fn vocab_size(&self) -> i64 {
        match self {
            TextTokenizer::Char(c) => c.vocab_size(),
            TextTokenizer::Subword(t) => t.get_vocab_size(true) as i64,
        }
    }

    /// The id of a special token (`None` for characters, which have none).
    pub fn special(&self, s: Special) -> Option<i64> {
        match self {
            TextTokenizer::Char(_) => None,
            TextTokenizer::Subword(t) => {
                t.token_to_id(s.token()).or_else(|| t.token_to_id(s.bert_token())).map(|id| id as i64)
            }
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        match self {
            TextTokenizer::Char(c) => c.encode(text),
            TextTokenizer::Subword(t) => {
                Ok(t.encode_fast(text, false).map_err(tk("tokenizing"))?.get_ids().iter().map(|&i| i as i64).collect())
            }
        }
    }

    /// Token ids of many lines at once (in parallel for subword tokenizers).
    pub fn encode_lines(&self, lines: &[&str]) -> Result<Vec<Vec<i64>>> {
        match self {
            TextTokenizer::Char(_) => lines.iter().map(|l| self.encode(l)).collect(),
            TextTokenizer::Subword(t) => Ok(t
                .encode_batch_fast(lines.to_vec(), false)
                .map_err(tk("tokenizing"))?
                .iter()
                .map(|e| e.get_ids().iter().map(|&i| i as i64).collect())
                .collect()),
        }
    }

    pub fn decode(&self, ids: &[i64]) -> String {
        match self {
            TextTokenizer::Char(c) => c.decode(ids),
            TextTokenizer::Subword(t) => {
                let ids: Vec<u32> = ids.iter().map(|&i| i.max(0) as u32).collect();
                // Special tokens (a model may emit `<bos>` or `<pad>`) are not text.
                t.decode(&ids, true).unwrap_or_else(|e| format!("<undecodable: {e}>"))
            }
        }
    }

    /// The tokens of `ids` as strings (for inspecting a tokenisation).
    pub fn tokens(&self, ids: &[i64]) -> Vec<String> {
        match self {
            TextTokenizer::Char(c) => ids.iter().map(|&i| c.decode(&[i])).collect(),
            TextTokenizer::Subword(t) => {
                ids.iter().map(|&i| t.id_to_token(i as u32).unwrap_or_else(|| "<?>".into())).collect()
            }
        }
    }

    /// What a checkpoint stores to rebuild this tokenizer: ("char", the characters) or ("subword", JSON).
    pub fn to_saved(&self) -> Result<(&'static str, String)> {
        Ok(match self {
            TextTokenizer::Char(c) => ("char", c.vocabulary()),
            TextTokenizer::Subword(t) => ("subword", t.to_string(false).map_err(tk("serialising the tokenizer"))?),
        })
    }

    pub fn from_saved(kind: &str, saved: &str) -> Result<Self> {
        match kind {
            "char" => Ok(TextTokenizer::Char(CharTokenizer::from_vocabulary(saved))),
            "subword" => Self::from_json(saved),
            other => bail!("unknown tokenizer kind {other:?} in the checkpoint"),
        }
    }
}

/// Characters as tokens: the vocabulary is the sorted set of characters in the corpus.
#[derive(Debug, Clone)]
pub struct CharTokenizer {
    chars: Vec<char>,
}

impl CharTokenizer {
    pub fn fit(text: &str) -> Self {
        let set: BTreeSet<char> = text.chars().collect();
        Self { chars: set.into_iter().collect() }
    }

    /// The vocabulary as one string, in id order (what a checkpoint stores).
    pub fn vocabulary(&self) -> String {
        self.chars.iter().collect()
    }

    pub fn from_vocabulary(vocabulary: &str) -> Self {
        Self { chars: vocabulary.chars().collect() }
    }

    pub fn vocab_size(&self) -> i64 {
        self.chars.len() as i64
    }

    /// Token ids of `text`; characters outside the vocabulary are an error naming the first one.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        text.chars()
            .map(|c| match self.chars.binary_search(&c) {
                Ok(i) => Ok(i as i64),
                Err(_) => bail!("character {c:?} is not in the vocabulary"),
            })
            .collect()
    }

    pub fn decode(&self, ids: &[i64]) -> String {
        ids.iter().map(|&i| self.chars.get(i as usize).copied().unwrap_or('\u{FFFD}')).collect()
    }
}
