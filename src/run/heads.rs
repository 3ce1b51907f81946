//! Head importance and pruning ("Are Sixteen Heads Really Better than One?", Michel et al. 2019): each
//! attention head of a trained decoder is removed alone at evaluation (its output multiplied by 0 before the
//! heads are mixed) and the validation loss change recorded; then heads are removed cumulatively, least
//! important first, and the loss recorded after each removal: the pruning curve. `ablate heads-importance`.
use anyhow::{bail, Context, Result};
use std::path::Path;
use tch::{Device, Kind, Tensor};

use crate::data::{Dataset, HeldOut};
use crate::judge::plot::{importance_heatmap, line_chart, Axes, Series};
use crate::models::gpt::Gpt;
use crate::recipe::Kind as RunKind;
use crate::tasks::checkpoint::{file_stem, Loaded};
use crate::tasks::lm::evaluate;

/// What removing heads does to one model's validation loss.
#[derive(Debug, Clone)]
pub struct HeadImportance {
    /// Held-out loss with every head.
    pub base_loss: f64,
    /// `delta[l][h]`: loss with head h of layer l removed, minus `base_loss` (the head's importance).
    pub delta: Vec<Vec<f64>>,
    /// (heads removed, loss) after removing the k least important heads, k = 0 … all.
    pub pruning: Vec<(usize, f64)>,
    /// The removal order, (layer, head), least important first.
    pub order: Vec<(usize, usize)>,
}

fn set_masks(model: &Gpt, removed: &[(usize, usize)]) {
    for (l, layer) in model.layers().iter().enumerate() {
        let attention = layer.self_attention();
        let heads = attention.heads();
        let off: Vec<i64> = removed.iter().filter(|(rl, _)| *rl == l).map(|&(_, h)| h as i64).collect();
        let mask = (!off.is_empty()).then(|| {
            let m = Tensor::ones([heads], (Kind::Float, Device::Cpu));
            m.index_fill(0, &Tensor::from_slice(&off), 0.0)
        });
        attention.set_head_mask(mask);
    }
}

/// Importance of every head of `model` and its pruning curve on `batches`; the model's heads are all back
/// when it returns.
pub fn head_importance(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<HeadImportance> {
    let loss_without = |removed: &[(usize, usize)]| -> Result<f64> {
        set_masks(model, removed);
        let loss = evaluate(model, batches).map(|(loss, _)| loss);
        set_masks(model, &[]);
        loss
    };
    let base_loss = loss_without(&[])?;
    let mut delta = Vec::new();
    for (l, layer) in model.layers().iter().enumerate() {
        let row = (0..layer.self_attention().heads() as usize)
            .map(|h| Ok(loss_without(&[(l, h)])? - base_loss))
            .collect::<Result<Vec<f64>>>()?;
        delta.push(row);
    }
    let mut order: Vec<(usize, usize)> =
        delta.iter().enumerate().flat_map(|(l, row)| (0..row.len()).map(move |h| (l, h))).collect();
    order.sort_by(|a, b| delta[a.0][a.1].total_cmp(&delta[b.0][b.1]));
    let mut pruning = vec![(0, base_loss)];
    for k in 1..=order.len() {
        pruning.push((k, loss_without(&order[..k])?));
    }
    Ok(HeadImportance { base_loss, delta, pruning, order })
}

/// A decoder checkpoint (through the one checkpoint loader) with its validation batches: `eval_batches`
/// batches of the run's own batch size and block, from the run's own data.
fn load(checkpoint: &Path, eval_batches: Option<i64>, device: Device) -> Result<(Loaded, Vec<(Tensor, Tensor)>)> {
    let loaded = crate::tasks::checkpoint::load(checkpoint, device)?;
    let config = &loaded.config;
    if config.kind != RunKind::Lm {
        bail!(
            "{}: heads-importance reads a decoder (kind lm); this checkpoint is kind {}",
            checkpoint.display(),
            config.kind
        );
    }
    let tokenizer =
        loaded.tokenizer.as_ref().with_context(|| format!("{} holds no vocabulary", checkpoint.display()))?;
    let data = Dataset::load(&config.data)?;
    if data.tokenizer().vocab_size() != tokenizer.vocab_size() {
        bail!(
            "{}: the run's data now gives {} tokens, the checkpoint was trained on {}",
            checkpoint.display(),
            data.tokenizer().vocab_size(),
            tokenizer.vocab_size()
        );
    }
    let t = &config.train;
    let batches = data.held_out_batches(
        HeldOut::Validation,
        eval_batches.unwrap_or(t.eval_batches),
        t.batch_size,
        config.transformer.block_size,
        device,
    );
    Ok((loaded, batches))
}

/// `ablate heads-importance`: for each checkpoint, `<stem>.head_importance.csv` and `.png` (the heatmap of
/// layer × head), and for all of them `pruning.csv` and `pruning.png` (validation loss against the fraction of
/// heads removed), in `out`.
pub fn run(checkpoints: &[std::path::PathBuf], out: &Path, eval_batches: Option<i64>, device: Device) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut curves = Vec::new();
    let mut pruning_csv =
        String::from("checkpoint,heads_removed,fraction_removed,val_loss,removed_layer,removed_head\n");
    for checkpoint in checkpoints {
        let name = checkpoint.file_stem().and_then(|s| s.to_str()).unwrap_or("checkpoint").to_string();
        let (loaded, batches) = load(checkpoint, eval_batches, device)?;
        let model = loaded.model.gpt().context("a kind lm checkpoint builds a GPT")?;
        let result = tch::no_grad(|| head_importance(model, &batches))?;
        let stem = file_stem(&name);
        let mut csv = String::from("layer,head,val_loss,delta_val_loss\n");
        for (l, row) in result.delta.iter().enumerate() {
            for (h, d) in row.iter().enumerate() {
                csv.push_str(&format!("{l},{h},{:.6},{d:.6}\n", result.base_loss + d));
            }
        }
        crate::files::write_atomically(&out.join(format!("{stem}.head_importance.csv")), csv.as_bytes())?;
        let title = format!(
            "{name}: validation loss change when one head is removed (base {:.4} nats/token)",
            result.base_loss
        );
        importance_heatmap(&out.join(format!("{stem}.head_importance.png")), &result.delta, &title)?;
        let total = result.order.len() as f64;
        for &(k, loss) in &result.pruning {
            let (rl, rh) = if k == 0 {
                (String::new(), String::new())
            } else {
                let (l, h) = result.order[k - 1];
                (l.to_string(), h.to_string())
            };
            pruning_csv.push_str(&format!("{name},{k},{:.6},{loss:.6},{rl},{rh}\n", k as f64 / total));
        }
        curves.push(Series {
            label: name.clone(),
            points: result.pruning.iter().map(|&(k, loss)| (k as f64 / total, loss, 0.0)).collect(),
            ..Default::default()
        });
        eprintln!(
            "{name}: base loss {:.4}; most important head {:?} (+{:.4}); half the heads removed: {:.4}",
            result.base_loss,
            result.order.last().copied().unwrap_or((0, 0)),
            result.order.last().map_or(0.0, |&(l, h)| result.delta[l][h]),
            result.pruning[result.order.len() / 2].1
        );
    }
    crate::files::write_atomically(&out.join("pruning.csv"), pruning_csv.as_bytes())?;
    let axes = Axes {
        title: "validation loss as heads are removed, least important first (Michel et al. 2019)",
        x_label: "fraction of attention heads removed",
        y_label: "validation loss (nats/token)",
        x_categories: None,
    };
    line_chart(&out.join("pruning.png"), &curves, &axes)
}
