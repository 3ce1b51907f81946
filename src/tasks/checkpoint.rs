//! A trained model on disk: weights in safetensors next to a JSON file with the run's config and, for a text
//! model, its vocabulary: enough to rebuild any kind's model (through its task) and, for a decoder, to
//! generate text with `ablate generate`.
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tch::{nn, Device};

use super::{task, Built};
use crate::data::tokenize::TextTokenizer;
use crate::files::{write_atomically, write_atomically_with};
use crate::recipe::Config;

#[derive(Serialize, Deserialize)]
struct Meta {
    run_id: String,
    config: Config,
    /// The model's input vocabulary size (tokens, palette colours; 0 for an image classifier).
    vocab_size: i64,
    /// The characters of a character vocabulary (empty for a subword one or none).
    #[serde(default)]
    vocabulary: String,
    /// A subword tokenizer in its JSON form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subword_tokenizer: Option<String>,
}

/// File-system-safe name for a run id (`transformer.heads=4 seed=1` -> `transformer.heads=4_seed=1`).
pub fn file_stem(run_id: &str) -> String {
    run_id.chars().map(|c| if c.is_ascii_alphanumeric() || "=.-_".contains(c) { c } else { '_' }).collect()
}

/// Writes `<dir>/<run>.safetensors` (through a temporary file and a rename) and `<dir>/<run>.json`; returns
/// the weights' path.
pub fn save(
    dir: &Path,
    run_id: &str,
    config: &Config,
    vocab_size: i64,
    tokenizer: Option<&TextTokenizer>,
    vs: &nn::VarStore,
) -> Result<PathBuf> {
    let (vocabulary, subword_tokenizer) = match tokenizer {
        Some(t) => match t.to_saved()? {
            ("char", saved) => (saved, None),
            (_, saved) => (String::new(), Some(saved)),
        },
        None => (String::new(), None),
    };
    let meta = Meta { run_id: run_id.to_string(), config: config.clone(), vocab_size, vocabulary, subword_tokenizer };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stem = file_stem(run_id);
    let weights = dir.join(format!("{stem}.safetensors"));
    write_atomically_with(&weights, |tmp| vs.save(tmp).with_context(|| format!("writing {}", weights.display())))?;
    write_atomically(&dir.join(format!("{stem}.json")), serde_json::to_string_pretty(&meta)?.as_bytes())?;
    Ok(weights)
}

fn read_meta(path: &Path) -> Result<Meta> {
    let meta_path = path.with_extension("json");
    serde_json::from_str(
        &std::fs::read_to_string(&meta_path).with_context(|| format!("cannot read {}", meta_path.display()))?,
    )
    .with_context(|| format!("{} is not an ablate checkpoint description of this version", meta_path.display()))
}

/// The config and tokenizer (text models only) a checkpoint was trained with, from the JSON next to its
/// weights.
pub fn load_description(path: &Path) -> Result<(Config, Option<TextTokenizer>)> {
    let meta = read_meta(path)?;
    let tokenizer = match (&meta.subword_tokenizer, meta.vocabulary.is_empty()) {
        (Some(json), _) => Some(TextTokenizer::from_saved("subword", json)?),
        (None, false) => Some(TextTokenizer::from_saved("char", &meta.vocabulary)?),
        (None, true) => None,
    };
    Ok((meta.config, tokenizer))
}

/// A loaded checkpoint: its config, its tokenizer (text models), and the model with its weights.
pub struct Loaded {
    pub config: Config,
    pub tokenizer: Option<TextTokenizer>,
    pub vs: nn::VarStore,
    pub model: Box<dyn Built>,
}

/// Loads a checkpoint given its `.safetensors` or `.json` path: the model its kind builds, weights in.
pub fn load(path: &Path, device: Device) -> Result<Loaded> {
    let meta = read_meta(path)?;
    let (config, tokenizer) = load_description(path)?;
    let weights = path.with_extension("safetensors");
    let mut vs = nn::VarStore::new(device);
    let model = task(config.kind).build(&config, &vs.root(), meta.vocab_size);
    vs.load(&weights).with_context(|| format!("loading weights from {}", weights.display()))?;
    Ok(Loaded { config, tokenizer, vs, model })
}
