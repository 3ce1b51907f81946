//! Which keys a run reads. A key the run's kind (or its other settings) cannot honour is refused when a
//! recipe sets it (one line naming the key, the kind and why), and left out of the run's CSV columns and
//! config hash, so `runs.csv` never records a setting that did nothing. The knob matrix test walks this
//! table: every key a kind reads must change that kind's model.
use super::schema::{
    BertTask, BlockKind, Config, ImageDataset, Kind, LraTask, Norm, PositionEncoding, PretrainObjective, Scoring, Sink,
    Task, Tokenizer,
};

/// Why `key` (a dotted config leaf, as in `runs.csv`) does nothing in this run; `None` when it is read.
pub fn unread(cfg: &Config, key: &str) -> Option<String> {
    let kind = cfg.kind;
    let t = &cfg.transformer;
    let (section, rest) = key.split_once('.').unwrap_or((key, ""));
    let only = |kinds: &[Kind], what: &str| -> Option<String> {
        (!kinds.contains(&kind)).then(|| {
            let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            format!("{what} is read by kind {} only; this run is kind {kind}", names.join(", "))
        })
    };
    match section {
        "kind" => None,
        "bert" => only(&[Kind::Bert], "the bert section").or_else(|| bert_key(cfg, rest)),
        "translate" => only(&[Kind::Translate], "the translate section").or_else(|| {
            (rest == "length_penalty" && cfg.translate().beam_width == 1)
                .then(|| "GNMT's length penalty ranks beam hypotheses; translate.beam_width is 1 (greedy)".into())
        }),
        "image_gpt" => only(&[Kind::ImageGpt], "the image_gpt section"),
        "cnn" => only(&[Kind::Cnn], "the cnn section"),
        "seq_classify" => only(&[Kind::SeqClassify], "the seq_classify section").or_else(|| seq_classify_key(cfg, rest)),
        "vision" => {
            let vision = [Kind::Vit, Kind::Swin, Kind::Davit, Kind::ImageGpt, Kind::Cnn];
            only(&vision, "the vision section").or_else(|| match rest {
                "patch_size" => only(&[Kind::Vit, Kind::Swin, Kind::Davit, Kind::ImageGpt], "vision.patch_size"),
                "pool" => only(&[Kind::Vit], "vision.pool (a <cls> token or mean pooling)"),
                "registers" => only(&[Kind::Vit], "vision.registers (learned tokens beside ViT's patches)"),
                "depths" => only(&[Kind::Swin, Kind::Davit], "vision.depths (blocks per stage)"),
                "window" => only(&[Kind::Swin, Kind::Davit], "vision.window (2-D attention windows)"),
                "shift" => only(&[Kind::Swin], "vision.shift (shifted windows)"),
                "attention_types" => only(&[Kind::Davit], "vision.attention_types (spatial and channel blocks)"),
                "pretrain_steps" => only(&classifiers(), "supervised pre-training of a classifier"),
                _ if rest.starts_with("pretrain_on") || rest == "pretrain_lr" => {
                    only(&classifiers(), "supervised pre-training of a classifier")
                        .or_else(|| {
                            (cfg.vision().pretrain_steps == 0).then(|| {
                                "shapes the pre-training before fine-tuning, and vision.pretrain_steps is 0".to_string()
                            })
                        })
                        .or_else(|| {
                            let on = &cfg.vision().pretrain_on;
                            (rest == "pretrain_on.path").then(|| fetched_set_path("vision.pretrain_on", on.dataset)).flatten()
                        })
                }
                _ => None,
            })
        }
        "data" => data_key(cfg, rest),
        "train" => match rest {
            "steps" if cfg.train.budget.is_some() => {
                Some("train.budget ends the run instead (the budget and the steps are exclusive)".into())
            }
            "test_batches" => match kind {
                Kind::SeqClassify => Some(
                    "kind seq_classify reads its whole test split (seq_classify.eval_examples sets its size)".into(),
                ),
                Kind::Lm
                    if cfg.data.task.is_synthetic()
                        && matches!(cfg.train.test_batches, Some(super::schema::TestBatches::All(_))) =>
                {
                    Some("the copy task draws its test sequences at random, so there is no whole split to read; give a number of batches".into())
                }
                Kind::Bert if cfg.bert().task != BertTask::Pretrain && cfg.bert().pretrain_steps == 0 => Some(
                    "this bert task scores its whole labelled test split and does not pre-train; test_batches sizes a pre-training test set".into(),
                ),
                _ => None,
            },
            "eval_lengths" => (kind != Kind::Lm).then(|| {
                format!("length generalisation evaluates a decoder on longer text windows (kind lm); this run is kind {kind}")
            }),
            "muon_momentum" => (cfg.train.optimizer != crate::recipe::Optimizer::Muon)
                .then(|| "is Muon's momentum, and train.optimizer is adamw".into()),
            "optimizer" if kind == Kind::Cnn => Some(
                "Muon updates the attention and FFN matrices of a Transformer's blocks; kind cnn has none".into(),
            ),
            "world_size" => (cfg.train.world_size == 1).then(|| {
                "is set by a data-parallel launch (torchrun, srun) to its number of processes; 1 (one process) is the default and recorded nowhere".into()
            }),
            "probe_outliers" => (kind != Kind::Lm).then(|| {
                format!("the outlier probe reads a decoder's test batches (kind lm); this run is kind {kind}")
            }),
            "probe_residual" => (kind != Kind::Lm).then(|| {
                format!("the residual-stream probe reads a decoder's test batches (kind lm); this run is kind {kind}")
            }),
            "init_from" => (kind != Kind::Lm).then(|| {
                format!("starts a decoder from a Hugging Face checkpoint (kind lm); this run is kind {kind}")
            }),
            "probe_attention" => matches!(kind, Kind::Bert | Kind::Translate | Kind::Cnn).then(|| {
                format!("attention probes are recorded for kinds lm, vit, swin, davit and image_gpt; this run is kind {kind}")
            }),
            _ => None,
        },
        "transformer" if kind == Kind::Cnn => {
            Some("the transformer section; kind cnn is the convolutional baseline, set its cnn section".into())
        }
        "transformer" => transformer_key(cfg, rest, t.pe),
        _ => None,
    }
}

/// The image classifiers (`Kind::is_classifier`), in the order refusals list them.
fn classifiers() -> Vec<Kind> {
    Kind::ALL.into_iter().filter(|k| k.is_classifier()).collect()
}

/// Whether `key` holds a value that leaves the model as it was before the key existed: such a key is read
/// (and may be set, e.g. by a variant going back to the default) but recorded nowhere, so the runs made
/// before it existed keep their `runs.csv` columns and config hashes.
pub fn silent_default(cfg: &Config, key: &str) -> bool {
    let t = &cfg.transformer;
    match key {
        "transformer.norm" => t.norm == Norm::LayerNorm,
        "transformer.position.combine" => t.position.combine == crate::recipe::Combine::Add,
        "transformer.residual" => t.residual,
        "transformer.scale_embeddings" => !t.scale_embeddings,
        "transformer.attention.kv_heads" => t.kv_heads() == t.heads,
        "transformer.attention.qk_dim" => t.qk_dim() == t.head_dim(),
        "transformer.attention.scoring" => t.attention.scoring == Scoring::Dot,
        "transformer.attention.layer_patterns" => t.attention.layer_patterns.is_empty(),
        "vision.pretrain_steps" => cfg.vision.as_ref().is_none_or(|v| v.pretrain_steps == 0),
        "vision.pretrain_lr" => cfg.vision.as_ref().is_none_or(|v| v.pretrain_lr.is_none()),
        "train.budget" => cfg.train.budget.is_none(),
        "train.test_batches" => cfg.train.test_batches.is_none(),
        "train.tf32" => !cfg.train.tf32,
        "train.deterministic" => !cfg.train.deterministic,
        "train.probe_outliers" => !cfg.train.probe_outliers,
        "train.probe_residual" => !cfg.train.probe_residual,
        "train.init_from" => cfg.train.init_from.is_none(),
        "transformer.attention.pattern.window_schedule" => t.attention.pattern.window_schedule.is_empty(),
        "transformer.parametrisation" => t.parametrisation == crate::recipe::Parametrisation::Standard,
        "transformer.mup_base_width" => t.mup_base_width == 64,
        "vision.registers" => cfg.vision.as_ref().is_none_or(|v| v.registers == 0),
        "train.optimizer" => cfg.train.optimizer == crate::recipe::Optimizer::Adamw,
        "train.muon_momentum" => cfg.train.muon_momentum == 0.95,
        "transformer.attention.qk_norm" => t.attention.qk_norm == crate::recipe::QkNorm::None,
        "transformer.attention.softcap" => t.attention.softcap.is_none(),
        "transformer.attention.output_gate" => t.attention.output_gate == crate::recipe::OutputGate::None,
        "transformer.attention.differential" => !t.attention.differential,
        "transformer.attention.sink" => t.attention.sink == Sink::None,
        "transformer.logit_softcap" => t.logit_softcap.is_none(),
        "transformer.output_init" => t.output_init == crate::recipe::OutputInit::Model,
        "transformer.parallel" => !t.parallel,
        "transformer.value_residual" => !t.value_residual,
        "transformer.value_embeddings" => t.value_embeddings == 0,
        "transformer.unet_skips" => !t.unet_skips,
        "transformer.ffn_bias" => t.ffn_bias,
        _ => false,
    }
}

fn transformer_key(cfg: &Config, key: &str, pe: PositionEncoding) -> Option<String> {
    let kind = cfg.kind;
    let t = &cfg.transformer;
    match key {
        "pre_ln" if t.norm == Norm::None => Some(
            "places the normalisation before or after each residual addition; transformer.norm is none, so both are x + f(x)".into(),
        ),
        "final_norm" if t.norm == Norm::None => {
            Some("adds a normalisation after the last layer; transformer.norm is none".into())
        }
        "attention.kv_heads" | "attention.qk_dim" | "attention.scoring"
            if kind == Kind::Davit && !cfg.vision().attention_types.contains(&BlockKind::Spatial) =>
        {
            Some("shapes spatial attention; DaViT's channel blocks swap the roles of q, k and v and keep the plain shape, and vision.attention_types has no spatial block".into())
        }
        "attention.differential" if kind == Kind::Davit && cfg.vision().attention_types.contains(&BlockKind::Channel) => {
            Some("DaViT's channel blocks swap the roles of q, k and v (their scores run over tokens, with no halves of q and k to difference), and vision.attention_types has a channel block".into())
        }
        "attention.differential" if t.qk_dim() % 2 != 0 => Some(format!(
            "splits each head's queries and keys into two halves, and transformer.attention.qk_dim is {}, odd",
            t.qk_dim()
        )),
        "scale_embeddings" if kind.is_hierarchical() => Some(format!(
            "kind {kind} normalises its patch embedding (LayerNorm) before anything else, which cancels a scale"
        )),
        "parametrisation" if kind != Kind::Lm => Some(format!(
            "muP's readout multiplier and per-layer learning rates are built for the decoder's LM head (kind lm); kind {kind}'s output layers take the standard parametrisation"
        )),
        "mup_base_width" if t.parametrisation != crate::recipe::Parametrisation::Mup => {
            Some("is muP's base width, and transformer.parametrisation is standard".into())
        }
        "parallel" if kind == Kind::Translate => Some(
            "parallel blocks join self-attention and the FFN; kind translate's decoder cross-attends between them".into(),
        ),
        "value_embeddings" if kind.is_classifier() => Some(format!(
            "looks a table up by token id; kind {kind} embeds image patches, which have none"
        )),
        "parallel" | "value_residual" | "unet_skips" if kind.is_hierarchical() => Some(format!(
            "acts across the layers of one stack of one width; kind {kind}'s stages change width and token count, and its blocks let the model act between the branches"
        )),
        "layers" if kind == Kind::Translate => Some(
            "kind translate has two stacks: set translate.encoder_layers and translate.decoder_layers".into(),
        ),
        "layers" if kind.is_hierarchical() => {
            Some(format!("kind {kind} sets its depth per stage: set vision.depths (e.g. [2, 2])"))
        }
        "block_size" if kind.is_vision() => Some(format!(
            "kind {kind} reads the image's token grid (vision.image_size / vision.patch_size), not a text window"
        )),
        "tie_embeddings" if matches!(kind, Kind::Vit | Kind::Swin | Kind::Davit | Kind::SeqClassify) => Some(format!(
            "kind {kind} predicts classes, not tokens: it has no output vocabulary to tie to an embedding"
        )),
        "position.combine" if !pe.is_absolute() => Some(format!(
            "says how an absolute encoding (sinusoidal, learned) joins the tokens; transformer.pe is {}",
            name(pe)
        )),
        "position.combine" if !matches!(kind, Kind::Lm | Kind::ImageGpt | Kind::Vit | Kind::SeqClassify) => Some(format!(
            "concatenated positions are built for kinds lm, image_gpt, vit and seq_classify; kind {kind} keeps x + Π"
        )),
        "position.concat_dim"
            if t.position.combine != crate::recipe::Combine::Concat
                || !pe.is_absolute()
                || !matches!(kind, Kind::Lm | Kind::ImageGpt | Kind::Vit | Kind::SeqClassify) =>
        {
            Some("is the width of concatenated positions, and this run adds its positions (or has none to add)".into())
        }
        "position.at" if !pe.is_absolute() => Some(format!(
            "says where an absolute encoding (sinusoidal, learned) enters; transformer.pe is {}",
            name(pe)
        )),
        "position.rope_theta" | "position.rope_fraction" if pe != PositionEncoding::Rope => {
            Some(format!("applies to pe: rope; transformer.pe is {}", name(pe)))
        }
        "position.shaw_max_distance" if pe != PositionEncoding::Shaw => {
            Some(format!("applies to pe: shaw; transformer.pe is {}", name(pe)))
        }
        "position.t5_buckets" | "position.t5_max_distance" if pe != PositionEncoding::T5 => {
            Some(format!("applies to pe: t5; transformer.pe is {}", name(pe)))
        }
        k if k.starts_with("attention.pattern.") && kind.is_hierarchical() => Some(format!(
            "a 1-D pattern restricts keys along a sequence; kind {kind} attends inside 2-D windows of vision.window × vision.window tokens (set that instead)"
        )),
        "attention.layer_patterns" if kind.is_hierarchical() => Some(format!(
            "a 1-D pattern restricts keys along a sequence; kind {kind} attends inside 2-D windows of vision.window × vision.window tokens (set that instead)"
        )),
        "attention.pattern.dilation" if cfg.transformer.attention.pattern.window.is_none() => {
            Some("spaces a window's neighbours: set transformer.attention.pattern.window too".into())
        }
        _ => None,
    }
}

/// Why `section.path` does nothing for `dataset`, if it does nothing: a set that is fetched and cached.
fn fetched_set_path(section: &str, dataset: ImageDataset) -> Option<String> {
    (!dataset.needs_path())
        .then(|| format!("{section}.dataset {dataset:?} is fetched and cached; a path is for idx and cifar10"))
}

/// The task settings of kind seq_classify that only some tasks read.
fn seq_classify_key(cfg: &Config, key: &str) -> Option<String> {
    let task = cfg.seq_classify().task;
    let by = |tasks: &[LraTask], what: &str| {
        (!tasks.contains(&task)).then(|| {
            let task = serde_yaml::to_string(&task).unwrap_or_default();
            format!("{what}; seq_classify.task is {}", task.trim())
        })
    };
    match key {
        "min_length" => by(&[LraTask::Listops], "is the shortest ListOps expression (task listops)"),
        "max_length" => {
            by(&[LraTask::Listops, LraTask::Bytes], "is the longest expression (listops) or the bytes kept (bytes)")
        }
        "image_size" | "contour_length" => by(&[LraTask::Pathfinder], "shapes the Pathfinder images (task pathfinder)"),
        "dataset" => by(&[LraTask::Pixels], "is the image set of the pixel task (task pixels)"),
        "data_seed" => by(
            &[LraTask::Listops, LraTask::Pathfinder],
            "seeds the generated tasks (listops, pathfinder); the pixel and byte tasks read fixed data sets",
        ),
        _ => None,
    }
}

fn data_key(cfg: &Config, key: &str) -> Option<String> {
    let kind = cfg.kind;
    if kind == Kind::SeqClassify {
        return Some("kind seq_classify makes its sequences from the seq_classify section (task, sizes, data_seed), not from data".into());
    }
    let (field, _) = key.split_once('.').unwrap_or((key, ""));
    if field == "images" {
        if !kind.is_vision() {
            return Some(format!("image data is for the vision kinds; this run is kind {kind}"));
        }
        let dataset = cfg.images().dataset;
        return (key == "images.path").then(|| fetched_set_path("data.images", dataset)).flatten();
    }
    if field == "validation_fraction" {
        return (kind == Kind::Lm && cfg.data.task.is_synthetic())
            .then(|| "the copy and induction tasks draw their validation sequences from a seed of their own".into());
    }
    if kind.is_vision() {
        return Some(format!("kind {kind} reads images (data.images), not text"));
    }
    fn task_name(task: Task) -> &'static str {
        match task {
            Task::Induction => "induction",
            Task::Recall => "recall",
            _ => "copy",
        }
    }
    match field {
        "task" => (kind == Kind::Translate).then(|| "kind translate reads sentence pairs (translate.pairs)".into()),
        "copy_length" | "copy_symbols" => (kind != Kind::Lm || !cfg.data.task.is_synthetic()).then(|| {
            "sets the copy, induction or recall task: kind lm with data.task: copy, induction or recall".into()
        }),
        "recall_pairs" => (kind != Kind::Lm || cfg.data.task != Task::Recall)
            .then(|| "sets the recall task: kind lm with data.task: recall".into()),
        "corpus" | "path" | "max_chars" | "test_fraction" if kind == Kind::Translate => {
            Some("kind translate reads sentence pairs (translate.pairs), not a corpus".into())
        }
        "corpus" | "path" | "max_chars" | "test_fraction" if cfg.data.task.is_synthetic() => {
            Some(format!("the {} task generates its sequences; it reads no corpus", task_name(cfg.data.task)))
        }
        "corpus" if cfg.data.path.is_some() => Some("data.path replaces the default corpus".into()),
        "tokenizer" | "vocab_size" | "tokenizer_path" if cfg.data.task.is_synthetic() => {
            Some(format!("the {} task's symbols are characters", task_name(cfg.data.task)))
        }
        "vocab_size" if cfg.data.tokenizer == Tokenizer::Char => {
            Some("a character vocabulary is the corpus's characters; vocab_size is for bpe and wordpiece".into())
        }
        "tokenizer_path" if cfg.data.tokenizer != Tokenizer::Wordpiece => {
            Some("loads a WordPiece vocabulary: set data.tokenizer: wordpiece".into())
        }
        _ => None,
    }
}

fn bert_key(cfg: &Config, key: &str) -> Option<String> {
    let b = cfg.bert();
    match key {
        // next_token also makes the fine-tuning causal, so it acts without pre-training too.
        "objective" if !b.pretrains() && b.objective != PretrainObjective::NextToken => Some(
            "chooses the pre-training objective, and this fine-tuning run does not pre-train (bert.pretrain_steps is 0)".into(),
        ),
        "pretrain_steps" | "pretrain_lr" if b.task == BertTask::Pretrain => {
            Some("task: pretrain pre-trains for train.steps at train.lr".into())
        }
        "pretrain_lr" if b.pretrain_steps == 0 => {
            Some("applies to the pre-training before fine-tuning; bert.pretrain_steps is 0".into())
        }
        "mask_fraction" | "replace_rule" | "eval_mask_fraction" if !b.masks() => Some(
            "shapes masked-LM pre-training, which this run does not do (next_token objective, or fine-tuning without pretrain_steps)".into(),
        ),
        "init_from" if b.task == BertTask::Pretrain => {
            Some("starts a fine-tuning task from a checkpoint; task: pretrain starts from random weights".into())
        }
        "labelled_examples" if b.task == BertTask::Pretrain => {
            Some("limits a fine-tuning task's labelled examples; task: pretrain reads no labels".into())
        }
        _ => None,
    }
}

fn name(pe: PositionEncoding) -> String {
    serde_yaml::to_string(&pe).unwrap_or_default().trim().to_string()
}
