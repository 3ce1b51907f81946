//! Every impossible value or combination, caught before anything trains: each check names the key to fix
//! and, where there is a short list, the values that would work.
use super::schema::*;

/// A config value that fails validation: the dotted key, and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub key: String,
    pub message: String,
}

fn invalid(key: &str, message: impl Into<String>) -> Invalid {
    Invalid { key: key.into(), message: message.into() }
}

/// Largest accepted model width: far beyond anything trainable here, small enough that every check on it
/// is instant.
pub const MAX_D_MODEL: i64 = 1 << 20;

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

/// A fraction strictly between 0 and 1 (NaN is refused too).
fn open_fraction(key: &str, value: f64) -> Result<(), Invalid> {
    if value > 0.0 && value < 1.0 {
        Ok(())
    } else {
        Err(invalid(key, format!("must be in (0, 1), got {value}")))
    }
}

/// What is wrong with a window that, spaced `dilation` apart, reaches across the whole sequence of
/// `sequence` tokens (the stack's pattern and each layer's alike); `None` when it does not, or the
/// sequence is not one length (Swin's and DaViT's windows).
fn covers_sequence(window: Option<i64>, dilation: i64, sequence: Option<i64>) -> Option<String> {
    let (w, n) = (window?, sequence?);
    (w.saturating_mul(dilation) >= n)
        .then(|| format!("window {w} × dilation {dilation} covers the whole sequence of {n} tokens"))
}

fn at_least(key: &str, value: i64, min: i64) -> Result<(), Invalid> {
    if value < min {
        return Err(invalid(key, format!("must be at least {min}, got {value}")));
    }
    Ok(())
}

fn probability(key: &str, p: f64) -> Result<(), Invalid> {
    if !(0.0..1.0).contains(&p) {
        return Err(invalid(key, format!("must be in [0, 1), got {p}")));
    }
    Ok(())
}

impl Config {
    /// Every impossible value or combination of this run, before anything trains.
    pub fn validate(&self) -> Result<(), Invalid> {
        // The data and structure first: the Transformer's checks read the sequence length they imply.
        open_fraction("data.validation_fraction", self.data.validation_fraction)?;
        match self.kind {
            Kind::Lm | Kind::Bert | Kind::Translate => self.validate_text()?,
            Kind::SeqClassify => self.validate_seq_classify()?,
            _ => {
                self.validate_vision_structure()?;
                self.validate_images()?;
            }
        }
        if self.kind != Kind::Cnn {
            self.validate_transformer()?;
        }
        self.validate_train()?;
        match self.kind {
            Kind::Bert => self.validate_bert(),
            Kind::Cnn => self.validate_cnn(),
            Kind::Translate => self.validate_translate(),
            Kind::ImageGpt => self.validate_image_gpt(),
            _ => Ok(()),
        }
    }

    /// The Transformer section alone (also what a complexity benchmark checks its attention variants with),
    /// one family of knobs at a time.
    pub fn validate_transformer(&self) -> Result<(), Invalid> {
        self.validate_widths()?;
        self.validate_positions()?;
        self.validate_attention_shape()?;
        self.validate_pattern()
    }

    /// Width, depth, heads, head and FFN sizes, dropout.
    fn validate_widths(&self) -> Result<(), Invalid> {
        let t = &self.transformer;
        at_least("transformer.d_model", t.d_model, 1)?;
        if t.d_model > MAX_D_MODEL {
            return Err(invalid("transformer.d_model", format!("must be at most {MAX_D_MODEL}, got {}", t.d_model)));
        }
        at_least("transformer.layers", t.layers, 1)?;
        at_least("transformer.heads", t.heads, 1)?;
        at_least("transformer.block_size", t.block_size, 1)?;
        match t.head_dim {
            Some(h) => {
                at_least("transformer.head_dim", h, 1)?;
                if h > MAX_D_MODEL {
                    return Err(invalid("transformer.head_dim", format!("must be at most {MAX_D_MODEL}, got {h}")));
                }
            }
            None if t.d_model % t.heads != 0 => {
                return Err(invalid(
                    "transformer.heads",
                    format!(
                        "{} heads do not divide d_model {} (each head works in d_model/heads dimensions, or set transformer.head_dim); allowed: {}",
                        t.heads,
                        t.d_model,
                        divisors(t.d_model)
                    ),
                ))
            }
            None => {}
        }
        if let Some(h) = t.ffn_hidden {
            if !(1..=64 * MAX_D_MODEL).contains(&h) {
                return Err(invalid(
                    "transformer.ffn_hidden",
                    format!("must be between 1 and {} (or null for 4·d_model), got {h}", 64 * MAX_D_MODEL),
                ));
            }
        }
        probability("transformer.dropout", t.dropout)?;
        probability("transformer.attention.dropout", t.attention.dropout)?;
        self.validate_value_embeddings()
    }

    /// Table j feeds layer j and layer L−N+j: the first and the last N layers of each stack must not overlap.
    fn validate_value_embeddings(&self) -> Result<(), Invalid> {
        let t = &self.transformer;
        at_least("transformer.value_embeddings", t.value_embeddings, 0)?;
        let (shallowest, stack) = match self.kind {
            Kind::Translate => {
                let tr = self.translate();
                (tr.encoder_layers.min(tr.decoder_layers), "the shallower of translate's stacks has")
            }
            _ => (t.layers, "transformer.layers is"),
        };
        if t.value_embeddings > 0 && !self.kind.is_classifier() && 2 * t.value_embeddings > shallowest {
            return Err(invalid(
                "transformer.value_embeddings",
                format!(
                    "{n} tables feed the first {n} and the last {n} layers, which needs at least {} layers; {stack} {shallowest}",
                    2 * t.value_embeddings,
                    n = t.value_embeddings
                ),
            ));
        }
        Ok(())
    }

    /// The position encoding and its settings: where it enters, how it joins the tokens.
    fn validate_positions(&self) -> Result<(), Invalid> {
        let (t, kind) = (&self.transformer, self.kind);
        if t.position.combine == Combine::Concat && t.pe.is_absolute() {
            if t.position.at != AbsoluteAt::Input {
                return Err(invalid(
                    "transformer.position.combine",
                    "concat joins the positions to the token embeddings once, at the input: set transformer.position.at: input",
                ));
            }
            let p = t.position.concat_dim.unwrap_or(t.d_model / 4);
            if !(1..t.d_model).contains(&p) {
                return Err(invalid(
                    "transformer.position.concat_dim",
                    format!(
                        "the position part must leave the tokens some of d_model {}: 1 to {}, got {p}",
                        t.d_model,
                        t.d_model - 1
                    ),
                ));
            }
            if t.tie_embeddings && matches!(kind, Kind::Lm | Kind::ImageGpt) {
                return Err(invalid(
                    "transformer.tie_embeddings",
                    "with concatenated positions the token embedding is d_model − concat_dim wide and cannot be the d_model-wide output layer: set transformer.tie_embeddings: false",
                ));
            }
        }
        let pos = &t.position;
        match t.pe {
            PositionEncoding::Bias2d | PositionEncoding::Conv if kind.is_text() || kind == Kind::SeqClassify => {
                return Err(invalid(
                    "transformer.pe",
                    format!("{} needs a 2-D token grid; kind {kind} reads a 1-D sequence", pe_name(t.pe)),
                ))
            }
            PositionEncoding::Conv if kind == Kind::ImageGpt => {
                return Err(invalid(
                    "transformer.pe",
                    "conv: a 3×3 convolution reads the pixels after each one, which would leak what image_gpt predicts",
                ))
            }
            PositionEncoding::Rope if t.qk_dim() < 2 => {
                return Err(invalid("transformer.pe", "rope needs queries and keys of at least 2 dimensions per head"))
            }
            _ => {}
        }
        if !(pos.rope_fraction > 0.0 && pos.rope_fraction <= 1.0) {
            return Err(invalid(
                "transformer.position.rope_fraction",
                format!("must be in (0, 1], got {}", pos.rope_fraction),
            ));
        }
        if !pos.rope_theta.is_finite() || pos.rope_theta <= 1.0 {
            return Err(invalid(
                "transformer.position.rope_theta",
                format!("must be greater than 1, got {}", pos.rope_theta),
            ));
        }
        at_least("transformer.position.shaw_max_distance", pos.shaw_max_distance, 1)?;
        if pos.t5_buckets < 4 || pos.t5_max_distance <= pos.t5_buckets / 2 {
            return Err(invalid(
                "transformer.position.t5_buckets",
                format!(
                    "need t5_buckets >= 4 and t5_max_distance > t5_buckets / 2, got {} and {}",
                    pos.t5_buckets, pos.t5_max_distance
                ),
            ));
        }
        if pos.at != AbsoluteAt::Input && kind.is_hierarchical() && t.pe.is_absolute() {
            return Err(invalid(
                "transformer.position.at",
                format!(
                    "kind {kind}'s stages change width and resolution, so an absolute encoding enters once, at the input"
                ),
            ));
        }
        Ok(())
    }

    /// Key/value heads, the query/key width, and how scores are made.
    fn validate_attention_shape(&self) -> Result<(), Invalid> {
        let t = &self.transformer;
        if let Some(kv) = t.attention.kv_heads {
            at_least("transformer.attention.kv_heads", kv, 1)?;
            if t.heads % kv != 0 {
                return Err(invalid(
                    "transformer.attention.kv_heads",
                    format!(
                        "{kv} key/value heads do not divide {} heads (each serves heads/kv_heads query heads); allowed: {}",
                        t.heads,
                        divisors(t.heads)
                    ),
                ));
            }
        }
        if let Some(q) = t.attention.qk_dim {
            at_least("transformer.attention.qk_dim", q, 1)?;
            if q > MAX_D_MODEL {
                return Err(invalid("transformer.attention.qk_dim", format!("must be at most {MAX_D_MODEL}, got {q}")));
            }
        }
        for (key, cap) in
            [("transformer.attention.softcap", t.attention.softcap), ("transformer.logit_softcap", t.logit_softcap)]
        {
            if let Some(c) = cap.filter(|c| !(c.is_finite() && *c > 0.0)) {
                return Err(invalid(key, format!("a soft cap must be a positive number (or null for none), got {c}")));
            }
        }
        // The sparse kernel takes a soft cap through the one score path; the fused kernel cannot
        // (`ScorePath::fused_cannot`).
        if t.attention.softcap.is_some() && t.attention.implementation == Implementation::Fused {
            return Err(invalid(
                "transformer.attention.softcap",
                "capped scores are written out (a cap stands between the fused kernel's scale and its mask); transformer.attention.implementation is fused: use auto, explicit or sparse",
            ));
        }
        if t.parametrisation == Parametrisation::Mup {
            at_least("transformer.mup_base_width", t.mup_base_width, 1)?;
            if t.attention.scale != Scale::SqrtDk {
                return Err(invalid(
                    "transformer.attention.scale",
                    "muP sets the score scale itself (1/d_head, equal to 1/√d_head at the base width): leave it at sqrt_dk",
                ));
            }
            if t.tie_embeddings {
                return Err(invalid(
                    "transformer.parametrisation",
                    "muP treats the embedding (an input layer) and the LM head (the readout) differently: set transformer.tie_embeddings: false",
                ));
            }
        }
        if t.parallel && !t.pre_ln && t.norm != Norm::None {
            return Err(invalid(
                "transformer.parallel",
                "parallel blocks normalise once before both branches (x + attn(norm x) + ffn(norm x)): set transformer.pre_ln: true",
            ));
        }
        if t.attention.scoring == Scoring::Additive
            && matches!(t.attention.implementation, Implementation::Fused | Implementation::Sparse)
        {
            return Err(invalid(
                "transformer.attention.scoring",
                format!(
                    "additive scores are written out (no fused or sparse kernel computes wᵀ tanh(q + k)); transformer.attention.implementation is {}: use auto or explicit",
                    if t.attention.implementation == Implementation::Fused { "fused" } else { "sparse" }
                ),
            ));
        }
        Ok(())
    }

    /// Which keys each query sees: the pattern, the per-layer patterns, and the sparse kernel they need.
    fn validate_pattern(&self) -> Result<(), Invalid> {
        let (t, kind) = (&self.transformer, self.kind);
        let p = &t.attention.pattern;
        let sequence = match kind {
            Kind::Lm | Kind::Bert | Kind::Translate => Some(t.block_size),
            Kind::Vit | Kind::ImageGpt => Some(self.vision().grid(kind).pow(2)),
            Kind::SeqClassify => Some(self.seq_classify().positions()),
            Kind::Swin | Kind::Davit | Kind::Cnn => None,
        };
        if let Some(w) = p.window {
            at_least("transformer.attention.pattern.window", w, 1)?;
        }
        if let Some(covers) = covers_sequence(p.window, p.dilation, sequence) {
            return Err(invalid(
                "transformer.attention.pattern.window",
                format!("{covers}: use dense attention (no window) instead"),
            ));
        }
        at_least("transformer.attention.pattern.dilation", p.dilation, 1)?;
        self.validate_window_schedule()?;
        let layers = &t.attention.layer_patterns;
        if !layers.is_empty() && (p.window.is_some() || p.global_every.is_some()) {
            return Err(invalid(
                "transformer.attention.layer_patterns",
                "gives every layer its pattern: set the window and global positions there, not also in transformer.attention.pattern (which keeps only global_tokens)",
            ));
        }
        let key = "transformer.attention.layer_patterns";
        for (i, l) in layers.iter().enumerate() {
            let entry = |message: String| Err(invalid(key, format!("entry {i}: {message}")));
            if l.window.is_some_and(|w| w < 1) || l.dilation < 1 || l.global_every.is_some_and(|e| e < 1) {
                return entry("window, dilation and global_every must be at least 1".into());
            }
            if let Some(covers) = covers_sequence(l.window, l.dilation, sequence) {
                return entry(format!("{covers}: use {{}} (dense) for that layer"));
            }
            if l.window.is_none() && l.dilation != 1 {
                return entry("a dilation spaces a window's neighbours: give the layer a window too".into());
            }
        }
        // Layer i takes entry i mod the list's length, so entries past the deepest stack would never act.
        let deepest = match kind {
            Kind::Translate => self.translate.as_ref().map_or(t.layers, |tr| tr.encoder_layers.max(tr.decoder_layers)),
            _ => t.layers,
        };
        if layers.len() as i64 > deepest {
            return Err(invalid(
                key,
                format!(
                    "{} entries, but the model's deepest stack has {deepest} layers: entries {deepest} and later would never act",
                    layers.len()
                ),
            ));
        }
        if let Some(e) = p.global_every {
            at_least("transformer.attention.pattern.global_every", e, 1)?;
        }
        at_least("transformer.attention.pattern.global_tokens", p.global_tokens, 0)?;
        if t.attention.implementation == Implementation::Sparse {
            if p.window.is_none() && layers.iter().all(|l| l.window.is_none()) {
                return Err(invalid(
                    "transformer.attention.implementation",
                    "sparse needs a window pattern (transformer.attention.pattern.window); use fused or explicit for dense attention",
                ));
            }
            if t.pe == PositionEncoding::Bias2d {
                return Err(invalid(
                    "transformer.attention.implementation",
                    "the sparse kernel scores 1-D offsets, and bias_2d needs each token's row and column: use fused or explicit (the pattern then runs as a mask)",
                ));
            }
        }
        Ok(())
    }

    /// A window warm-up: steps increasing, windows positive, a window of the stack's pattern to warm up.
    fn validate_window_schedule(&self) -> Result<(), Invalid> {
        let p = &self.transformer.attention.pattern;
        let key = "transformer.attention.pattern.window_schedule";
        if p.window_schedule.is_empty() {
            return Ok(());
        }
        if p.window.is_none() {
            return Err(invalid(
                key,
                "warms up the stack's window: set transformer.attention.pattern.window (the window after the warm-up)",
            ));
        }
        if !self.transformer.attention.layer_patterns.is_empty() {
            return Err(invalid(
                key,
                "warms up transformer.attention.pattern.window; per-layer patterns keep their own windows",
            ));
        }
        let mut last = 0;
        for (i, &[until, window]) in p.window_schedule.iter().enumerate() {
            if until <= last || window < 1 {
                return Err(invalid(
                    key,
                    format!("entry {i}: [{until}, {window}]: steps must increase from 1 and windows be at least 1"),
                ));
            }
            last = until;
        }
        Ok(())
    }

    fn validate_train(&self) -> Result<(), Invalid> {
        let t = &self.train;
        for (key, value) in [
            ("train.steps", t.steps),
            ("train.batch_size", t.batch_size),
            ("train.eval_interval", t.eval_interval),
            ("train.eval_batches", t.eval_batches),
            ("train.test_batches", if let Some(super::schema::TestBatches::Count(n)) = t.test_batches { n } else { 1 }),
            ("train.log_interval", t.log_interval),
            ("train.checkpoint_every", t.checkpoint_every.unwrap_or(1)),
            ("train.world_size", t.world_size),
        ] {
            at_least(key, value, 1)?;
        }
        if !(0.0..1.0).contains(&t.muon_momentum) {
            return Err(invalid("train.muon_momentum", format!("must be in [0, 1), got {}", t.muon_momentum)));
        }
        if let Some(path) = &t.init_from {
            let dir = std::path::Path::new(path);
            if let Some(missing) = ["config.json", "model.safetensors"].into_iter().find(|f| !dir.join(f).is_file()) {
                return Err(invalid(
                    "train.init_from",
                    format!("{path} holds no {missing}: name a Hugging Face model directory"),
                ));
            }
            // What the checkpoint holds is read by the decoder's task before training (the layer that knows
            // the layouts), against the run's model and data.
        }
        if !(t.lr > 0.0 && t.lr.is_finite()) {
            return Err(invalid("train.lr", format!("must be a positive number, got {}", t.lr)));
        }
        if !(t.min_lr >= 0.0 && t.min_lr <= t.lr) {
            return Err(invalid("train.min_lr", format!("must be in [0, lr={}], got {}", t.lr, t.min_lr)));
        }
        at_least("train.warmup_steps", t.warmup_steps, 0)?;
        if t.weight_decay.is_nan() || t.weight_decay < 0.0 {
            return Err(invalid("train.weight_decay", format!("must be at least 0, got {}", t.weight_decay)));
        }
        probability("train.beta1", t.beta1)?;
        probability("train.beta2", t.beta2)?;
        if let Some(c) = t.grad_clip {
            if c.is_nan() || c <= 0.0 {
                return Err(invalid("train.grad_clip", format!("must be positive (or null for no clipping), got {c}")));
            }
        }
        if let Some(&k) = t.eval_lengths.iter().find(|&&k| !(2..=1024).contains(&k)) {
            return Err(invalid("train.eval_lengths", format!("multiples of block_size must be in 2..=1024, got {k}")));
        }
        if let Some(budget) = t.budget {
            let Some(budget) = budget.kind() else {
                return Err(invalid("train.budget", "give exactly one of tokens, flops and seconds"));
            };
            let n = budget.amount();
            if !(n > 0.0 && n.is_finite()) {
                return Err(invalid("train.budget", format!("must be a positive number, got {n}")));
            }
            if matches!(budget, crate::recipe::BudgetKind::Flops(_)) && self.kind == Kind::Translate {
                return Err(invalid(
                    "train.budget",
                    "kind translate has no analytic FLOP count (it depends on sentence lengths): use tokens or seconds",
                ));
            }
            if matches!(budget, crate::recipe::BudgetKind::Seconds(_)) && t.world_size > 1 {
                return Err(invalid(
                    "train.budget",
                    "a seconds budget would end each data-parallel process at its own step: use tokens or flops",
                ));
            }
        }
        Ok(())
    }

    fn validate_text(&self) -> Result<(), Invalid> {
        let (d, t) = (&self.data, &self.transformer);
        if d.task.is_synthetic() {
            if self.kind != Kind::Lm {
                return Err(invalid(
                    "data.task",
                    format!("the copy and induction tasks train a decoder (kind lm), not kind {}", self.kind),
                ));
            }
            if !(1..=26).contains(&d.copy_symbols) {
                return Err(invalid("data.copy_symbols", format!("must be in 1..=26, got {}", d.copy_symbols)));
            }
            if d.task == Task::Recall && !(1..=(d.copy_symbols / 2).min(d.copy_length / 2)).contains(&d.recall_pairs) {
                return Err(invalid(
                    "data.recall_pairs",
                    format!(
                        "the recall task's keys are distinct, from half of copy_symbols, and its pairs and queries fit the window: set 1 to {} (min(copy_symbols/2, copy_length/2)), got {}",
                        (d.copy_symbols / 2).min(d.copy_length / 2),
                        d.recall_pairs
                    ),
                ));
            }
            if d.task == Task::Induction && d.copy_length < 2 {
                return Err(invalid(
                    "data.copy_length",
                    format!(
                        "the induction task repeats segments of at least 2 symbols: set 2 or more, got {}",
                        d.copy_length
                    ),
                ));
            }
            if d.copy_length < 1 || t.block_size != 2 * d.copy_length {
                return Err(invalid(
                    "transformer.block_size",
                    format!(
                        "the copy and induction tasks read 2·copy_length = {} tokens: set transformer.block_size to that (got {})",
                        2 * d.copy_length,
                        t.block_size
                    ),
                ));
            }
            if d.tokenizer != Tokenizer::Char {
                return Err(invalid(
                    "data.tokenizer",
                    "the copy and induction tasks' symbols are characters: use char",
                ));
            }
        }
        open_fraction("data.test_fraction", d.test_fraction)?;
        if let Some(path) = &d.path {
            let p = std::path::Path::new(path);
            if p.is_dir() {
                return Err(invalid("data.path", format!("{path} is a directory; give a UTF-8 text file")));
            }
            if !p.is_file() {
                return Err(invalid("data.path", format!("no such file: {path}")));
            }
        }
        self.validate_tokenizer()
    }

    fn validate_tokenizer(&self) -> Result<(), Invalid> {
        let d = &self.data;
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

    fn validate_bert(&self) -> Result<(), Invalid> {
        let b = self.bert();
        if self.data.tokenizer == Tokenizer::Char {
            return Err(invalid(
                "data.tokenizer",
                "BERT needs <cls>, <sep>, <mask> and <pad>: use a wordpiece or bpe tokenizer",
            ));
        }
        open_fraction("bert.mask_fraction", b.mask_fraction)?;
        at_least("bert.pretrain_steps", b.pretrain_steps, 0)?;
        if let Some(n) = b.labelled_examples {
            at_least("bert.labelled_examples", n, 1)?;
        }
        if let Some(f) = b.eval_mask_fraction {
            open_fraction("bert.eval_mask_fraction", f)?;
        }
        if !(b.pretrain_lr > 0.0 && b.pretrain_lr.is_finite()) {
            return Err(invalid("bert.pretrain_lr", format!("must be positive, got {}", b.pretrain_lr)));
        }
        if let Some(path) = &b.init_from {
            // A `$RESULTS/` checkpoint is another recipe's output: the sweep checks it once it knows where
            // results go, still before any training.
            if !path.starts_with(RESULTS_PREFIX) && !std::path::Path::new(path).is_file() {
                return Err(invalid("bert.init_from", format!("no such checkpoint: {path}")));
            }
        }
        if self.transformer.block_size < 8 {
            return Err(invalid("transformer.block_size", "BERT inputs need at least 8 positions"));
        }
        Ok(())
    }

    fn validate_translate(&self) -> Result<(), Invalid> {
        let tr = self.translate();
        if self.data.tokenizer == Tokenizer::Char {
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
        probability("translate.label_smoothing", tr.label_smoothing)?;
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
        if self.transformer.block_size < 4 {
            return Err(invalid("transformer.block_size", "the longest sentence in tokens: at least 4"));
        }
        Ok(())
    }

    /// The long-range task, and that its longest sequence (with the `<cls>` token) fits the position table.
    fn validate_seq_classify(&self) -> Result<(), Invalid> {
        let s = self.seq_classify();
        for (key, v, min) in
            [("seq_classify.train_examples", s.train_examples, 1), ("seq_classify.eval_examples", s.eval_examples, 1)]
        {
            if v < min || v > 10_000_000 {
                return Err(invalid(key, format!("must be in {min}..=10000000, got {v}")));
            }
        }
        match s.task {
            LraTask::Listops => {
                at_least("seq_classify.min_length", s.min_length, 4)?;
                // An operator adds at least three tokens: the generator aims within two of its target.
                if s.max_length < s.min_length + 2 {
                    return Err(invalid(
                        "seq_classify.max_length",
                        format!("must be at least min_length + 2 = {}, got {}", s.min_length + 2, s.max_length),
                    ));
                }
            }
            LraTask::Bytes => at_least("seq_classify.max_length", s.max_length, 1)?,
            LraTask::Pathfinder => {
                if !(8..=256).contains(&s.image_size) {
                    return Err(invalid(
                        "seq_classify.image_size",
                        format!("must be in 8..=256 pixels, got {}", s.image_size),
                    ));
                }
                at_least("seq_classify.contour_length", s.contour_length, 2)?;
            }
            LraTask::Pixels if s.dataset.needs_path() => {
                return Err(invalid(
                    "seq_classify.dataset",
                    "the pixel task reads a fetched 28×28 set: fashion_mnist or mnist",
                ));
            }
            LraTask::Pixels => {}
        }
        let t = &self.transformer;
        if s.positions() > t.block_size {
            let cls = if s.pool == Pool::Cls { " and the <cls> token" } else { "" };
            return Err(invalid(
                "transformer.block_size",
                format!(
                    "is {}, and task {} gives sequences of {} tokens{cls}: set it to at least {}",
                    t.block_size,
                    serde_yaml::to_string(&s.task).unwrap_or_default().trim(),
                    s.sequence_length(),
                    s.positions()
                ),
            ));
        }
        Ok(())
    }

    fn validate_image_gpt(&self) -> Result<(), Invalid> {
        let g = self.image_gpt();
        if !(2..=4096).contains(&g.palette) {
            return Err(invalid("image_gpt.palette", format!("must be in 2..=4096 colours, got {}", g.palette)));
        }
        if g.quantiser == Quantiser::Bins && self.vision().channels != 1 {
            return Err(invalid(
                "image_gpt.quantiser",
                format!("bins quantise grey intensities; {}-channel images need kmeans", self.vision().channels),
            ));
        }
        for (key, v, min) in [
            ("image_gpt.probe_images", g.probe_images, 10),
            ("image_gpt.completions", g.completions, 0),
            ("image_gpt.samples_per_completion", g.samples_per_completion, 1),
        ] {
            if v < min || v > 1_000_000 {
                return Err(invalid(key, format!("must be in {min}..=1000000, got {v}")));
            }
        }
        Ok(())
    }

    /// A vision model on its own (a preset, a complexity point): its structure and its Transformer.
    pub fn validate_vision_model(&self) -> Result<(), Invalid> {
        self.validate_vision_structure()?;
        self.validate_transformer()
    }

    /// A vision model's structure: image, patches, stages and windows.
    fn validate_vision_structure(&self) -> Result<(), Invalid> {
        let (v, kind, t) = (self.vision(), self.kind, &self.transformer);
        for (key, value) in [
            ("vision.image_size", v.image_size),
            ("vision.channels", v.channels),
            ("vision.classes", v.classes),
            ("vision.patch_size", v.patch_size),
            ("vision.window", v.window),
        ] {
            at_least(key, value, 1)?;
        }
        if v.image_size > 1 << 16 {
            return Err(invalid("vision.image_size", format!("must be at most 65536, got {}", v.image_size)));
        }
        if !matches!(kind, Kind::Davit | Kind::Cnn) && v.image_size % v.patch_size != 0 {
            return Err(invalid(
                "vision.patch_size",
                format!(
                    "{} does not divide image_size {}; allowed: {}",
                    v.patch_size,
                    v.image_size,
                    divisors(v.image_size)
                ),
            ));
        }
        if kind.is_hierarchical() {
            if v.depths.is_empty() || v.depths.len() > 16 || v.depths.iter().any(|&d| !(1..=1024).contains(&d)) {
                return Err(invalid(
                    "vision.depths",
                    format!("1 to 16 stages of 1 to 1024 blocks each, got {:?}", v.depths),
                ));
            }
            let stages = v.depths.len();
            if t.d_model.checked_shl(stages as u32 - 1).is_none_or(|w| w > MAX_D_MODEL) {
                return Err(invalid(
                    "transformer.d_model",
                    format!("doubled over {stages} stages it passes {MAX_D_MODEL}"),
                ));
            }
            for i in 0..stages {
                let grid = v.stage_grid(kind, i);
                if kind == Kind::Swin {
                    let w = v.stage_window(kind, i);
                    if grid % w != 0 {
                        return Err(invalid(
                            "vision.window",
                            format!(
                                "stage {i}'s token grid is {grid}×{grid}, which windows of {w} do not tile; windows that do: {}",
                                divisors(grid)
                            ),
                        ));
                    }
                    if i + 1 < stages && grid % 2 != 0 {
                        return Err(invalid(
                            "vision.depths",
                            format!("patch merging after stage {i} needs an even token grid, got {grid}×{grid}"),
                        ));
                    }
                }
            }
        }
        if kind == Kind::Davit && v.attention_types.is_empty() {
            return Err(invalid("vision.attention_types", "give at least one of spatial, channel"));
        }
        let deepest_stage = v.depths.iter().copied().max().unwrap_or(0);
        if kind == Kind::Davit && v.attention_types.len() as i64 > deepest_stage {
            // The kinds are cycled through each stage's blocks: entries past the deepest stage never act.
            return Err(invalid(
                "vision.attention_types",
                format!(
                    "{} block kinds, but the deepest stage has {deepest_stage} blocks (vision.depths {:?}): entries {deepest_stage} and later would never act",
                    v.attention_types.len(),
                    v.depths
                ),
            ));
        }
        Ok(())
    }

    /// The convolutional baseline's stages: each pooling halves the map, so every stage has one to work on.
    fn validate_cnn(&self) -> Result<(), Invalid> {
        let c = self.cnn();
        if c.channels.is_empty() || c.channels.iter().any(|&n| !(1..=1 << 14).contains(&n)) {
            return Err(invalid(
                "cnn.channels",
                format!("1 or more stages of 1 to 16384 channels, got {:?}", c.channels),
            ));
        }
        if c.kernel < 1 || c.kernel % 2 == 0 || c.kernel > 63 {
            return Err(invalid("cnn.kernel", format!("must be odd, 1 to 63 (same padding), got {}", c.kernel)));
        }
        let side = self.cnn_spec().side(c.channels.len() - 1);
        if side < 1 {
            return Err(invalid(
                "cnn.channels",
                format!(
                    "{} stages pool a {}-pixel image to nothing: at most {}",
                    c.channels.len(),
                    self.vision().image_size,
                    self.vision().image_size.ilog2() + 1
                ),
            ));
        }
        Ok(())
    }

    /// A vision run's images, and that the model fits them.
    fn validate_images(&self) -> Result<(), Invalid> {
        let v = self.vision();
        let images = self.images();
        check_image_set("data.images", &images)?;
        if let Some((channels, size, classes)) = images.dataset.shape() {
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
        at_least("vision.pretrain_steps", v.pretrain_steps, 0)?;
        if v.pretrain_steps > 0 {
            let on = &v.pretrain_on;
            check_image_set("vision.pretrain_on", on)?;
            if let Some(lr) = v.pretrain_lr {
                if !(lr > 0.0 && lr.is_finite()) {
                    return Err(invalid("vision.pretrain_lr", format!("must be positive, got {lr}")));
                }
            }
            if let Some((channels, size, classes)) = on.dataset.shape() {
                if (channels, size, classes) != (v.channels, v.image_size, v.classes) {
                    return Err(invalid(
                        "vision.pretrain_on.dataset",
                        format!(
                            "{:?} has {channels}-channel {size}×{size} images of {classes} classes; the model is built for {}-channel {}×{} images of {} classes",
                            on.dataset, v.channels, v.image_size, v.image_size, v.classes
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An image set's own settings (`data.images`, or the pre-training's `vision.pretrain_on`, named by
/// `prefix`): a fraction of its training images, its augmentation, the directory a file-based set needs.
fn check_image_set(prefix: &str, images: &ImageDataConfig) -> Result<(), Invalid> {
    if !(images.train_fraction > 0.0 && images.train_fraction <= 1.0) {
        return Err(invalid(
            &format!("{prefix}.train_fraction"),
            format!("must be in (0, 1], got {}", images.train_fraction),
        ));
    }
    at_least(&format!("{prefix}.crop_padding"), images.crop_padding, 0)?;
    if images.dataset.needs_path() && images.path.is_none() {
        return Err(invalid(
            &format!("{prefix}.path"),
            format!("{:?} needs the directory of its files", images.dataset),
        ));
    }
    Ok(())
}

fn pe_name(pe: PositionEncoding) -> String {
    serde_yaml::to_string(&pe).unwrap_or_default().trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_must_divide_d_model_unless_their_width_is_given_and_the_error_lists_the_allowed_values() {
        let mut c = Config::defaults(Kind::Lm);
        c.transformer.d_model = 12;
        c.transformer.heads = 5;
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "transformer.heads");
        assert!(e.message.contains("allowed: 1, 2, 3, 4, 6, 12"), "{}", e.message);
        c.transformer.head_dim = Some(4);
        assert!(c.validate().is_ok(), "5 heads of 4 dimensions project back to 12");
        c.transformer.head_dim = None;
        c.transformer.heads = 6;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn divisors_are_listed_in_order_even_for_squares() {
        assert_eq!(divisors(36), "1, 2, 3, 4, 6, 9, 12, 18, 36");
        assert_eq!(divisors(1), "1");
    }
}
