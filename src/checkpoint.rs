//! A trained model on disk: weights in safetensors next to a JSON file with the config and the vocabulary,
//! enough to rebuild the model and decode text with `ablate generate`.
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tch::{nn, Device};

use crate::config::Config;
use crate::gpt::Gpt;
use crate::tokenize::TextTokenizer;

#[derive(Serialize, Deserialize)]
struct Meta {
    run_id: String,
    config: Config,
    /// The characters of a character vocabulary (empty for a subword one).
    vocabulary: String,
    /// A subword tokenizer in its JSON form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subword_tokenizer: Option<String>,
}

/// File-system-safe name for a run id (`model.heads=4 seed=1` -> `model.heads=4_seed=1`).
pub fn file_stem(run_id: &str) -> String {
    run_id.chars().map(|c| if c.is_ascii_alphanumeric() || "=.-_".contains(c) { c } else { '_' }).collect()
}

/// Writes `<dir>/<run>.safetensors` and `<dir>/<run>.json`; returns the weights' path.
pub fn save(
    dir: &Path,
    run_id: &str,
    config: &Config,
    tokenizer: &TextTokenizer,
    vs: &nn::VarStore,
) -> Result<PathBuf> {
    let (kind, saved) = tokenizer.to_saved()?;
    let (vocabulary, subword_tokenizer) = if kind == "char" { (saved, None) } else { (String::new(), Some(saved)) };
    let meta = Meta { run_id: run_id.to_string(), config: config.clone(), vocabulary, subword_tokenizer };
    write(dir, run_id, vs, &serde_json::to_string_pretty(&meta)?)
}

/// A vision run's weights and config (no vocabulary): `<dir>/<run>.safetensors` and `<dir>/<run>.json`.
pub fn save_weights(dir: &Path, run_id: &str, config: &Config, vs: &nn::VarStore) -> Result<PathBuf> {
    let meta = serde_json::json!({ "run_id": run_id, "config": config });
    write(dir, run_id, vs, &serde_json::to_string_pretty(&meta)?)
}

/// The weights (through a temporary file and a rename) and their JSON description.
fn write(dir: &Path, run_id: &str, vs: &nn::VarStore, description: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let stem = file_stem(run_id);
    let weights = dir.join(format!("{stem}.safetensors"));
    let tmp = dir.join(format!("{stem}.tmp.safetensors"));
    vs.save(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &weights)?;
    std::fs::write(dir.join(format!("{stem}.json")), description)?;
    Ok(weights)
}

/// Loads a checkpoint given its `.safetensors` or `.json` path.
pub fn load(path: &Path, device: Device) -> Result<(Config, TextTokenizer, nn::VarStore, Gpt)> {
    let (config, tokenizer) = load_description(path)?;
    let weights = path.with_extension("safetensors");
    let mut vs = nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &config.model, tokenizer.vocab_size());
    vs.load(&weights).with_context(|| format!("loading weights from {}", weights.display()))?;
    Ok((config, tokenizer, vs, model))
}

/// The config and tokenizer a checkpoint was trained with, from the JSON next to its weights.
pub fn load_description(path: &Path) -> Result<(Config, TextTokenizer)> {
    let meta_path = path.with_extension("json");
    let meta: Meta = serde_json::from_str(
        &std::fs::read_to_string(&meta_path).with_context(|| format!("cannot read {}", meta_path.display()))?,
    )
    .with_context(|| format!("{} is not an ablate checkpoint description", meta_path.display()))?;
    let tokenizer = match &meta.subword_tokenizer {
        Some(json) => TextTokenizer::from_saved("subword", json)?,
        None => TextTokenizer::from_saved("char", &meta.vocabulary)?,
    };
    Ok((meta.config, tokenizer))
}
