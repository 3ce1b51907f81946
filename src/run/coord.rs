//! muP's coordinate check (Yang et al., Tensor Programs V, appendix D): the same decoder at several widths
//! takes a few optimisation steps at one learning rate, and after each step the mean absolute value of every
//! coordinate site (the stack's input, each layer's output, the logits) is measured on one fixed batch. In a
//! parametrisation whose updates are right-sized for the width, these stay of the same order as the width
//! grows; in the standard parametrisation the logits and the layers' outputs grow with it.
use anyhow::{ensure, Result};
use std::io::Write;
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

use crate::data::text::Dataset;
use crate::data::HeldOut;
use crate::judge::plot::charts::{loglog_chart, Axes, Series};
use crate::models::gpt::Gpt;
use crate::recipe::{Config, Kind as RunKind, Parametrisation};
use crate::transformer::layers::{record_activations, take_activations};

/// One measurement: a site's mean |x| at a width after `step` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Coordinate {
    pub parametrisation: Parametrisation,
    pub width: i64,
    pub step: i64,
    pub site: String,
    pub mean_abs: f64,
}

/// The run `base` (kind lm) at each of `widths` (d_model; heads kept, so heads widen), in both
/// parametrisations (muP relative to its `mup_base_width`), `steps` steps each at its peak learning rate
/// without warm-up or clipping (so that nothing but the parametrisation sizes the updates), seeded alike.
pub fn coord_check(base: &Config, widths: &[i64], steps: i64) -> Result<Vec<Coordinate>> {
    ensure!(
        base.kind == RunKind::Lm,
        "the coordinate check trains the decoder (kind lm); this recipe is kind {}",
        base.kind
    );
    let data = Dataset::load(&base.data)?;
    let vocab = data.tokenizer().vocab_size();
    let block = base.transformer.block_size;
    data.check_block_size(block)?;
    let probe = data.held_out_batches(HeldOut::Validation, 1, base.train.batch_size, block, Device::Cpu).remove(0).0;
    let mut out = Vec::new();
    for parametrisation in [Parametrisation::Standard, Parametrisation::Mup] {
        for &width in widths {
            let mut cfg = base.clone();
            let t = &mut cfg.transformer;
            (t.d_model, t.parametrisation, t.ffn_hidden, t.head_dim) = (width, parametrisation, None, None);
            cfg.resolve();
            cfg.validate().map_err(|e| anyhow::anyhow!("width {width}: {}: {}", e.key, e.message))?;
            out.extend(measure(&cfg, &data, vocab, &probe, steps)?);
        }
    }
    Ok(out)
}

/// One width's coordinates after 0, 1, …, `steps` steps.
fn measure(cfg: &Config, data: &Dataset, vocab: i64, probe: &Tensor, steps: i64) -> Result<Vec<Coordinate>> {
    tch::manual_seed(cfg.train.seed as i64);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Gpt::new(&vs.root(), &cfg.transformer_spec(), vocab);
    let mut opt = crate::train::optimiser(&cfg.train, &vs);
    let mut out = Vec::new();
    for step in 0..=steps {
        let sites = tch::no_grad(|| {
            record_activations(true);
            let logits = model.forward(probe, false);
            let mut values = take_activations();
            record_activations(false);
            values.push(logits.abs().mean(Kind::Float).double_value(&[]));
            values
        });
        let last = sites.len() - 1;
        for (i, v) in sites.into_iter().enumerate() {
            let site = match i {
                0 => "embedding".to_string(),
                i if i == last => "logits".to_string(),
                i => format!("layer {}", i - 1),
            };
            let parametrisation = cfg.transformer.parametrisation;
            out.push(Coordinate { parametrisation, width: cfg.transformer.d_model, step, site, mean_abs: v });
        }
        if step < steps {
            tch::manual_seed(cfg.train.seed as i64 * 1_000 + step);
            let (x, y) = data.train_batch(cfg.train.batch_size, cfg.transformer.block_size, Device::Cpu);
            let (_, loss) = model.loss(&x, &y, true);
            opt.zero_grad();
            loss.backward();
            opt.step(cfg.train.lr, None, 1.0);
        }
    }
    Ok(out)
}

pub fn name(p: Parametrisation) -> &'static str {
    match p {
        Parametrisation::Standard => "standard",
        Parametrisation::Mup => "mup",
    }
}

/// Per parametrisation and site, the largest over the smallest mean |x| across the widths after the last
/// step: about 1 when the coordinates do not grow with the width.
pub fn spread(coords: &[Coordinate], parametrisation: Parametrisation, site: &str) -> f64 {
    let last = coords.iter().map(|c| c.step).max().unwrap_or(0);
    let values: Vec<f64> = coords
        .iter()
        .filter(|c| c.parametrisation == parametrisation && c.site == site && c.step == last)
        .map(|c| c.mean_abs)
        .collect();
    let max = values.iter().cloned().fold(f64::MIN, f64::max);
    let min = values.iter().cloned().fold(f64::MAX, f64::min);
    max / min
}

/// The sites in the order they were measured.
pub fn sites(coords: &[Coordinate]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in coords {
        if !out.contains(&c.site) {
            out.push(c.site.clone());
        }
    }
    out
}

/// The coordinates after the last step as a Markdown table per parametrisation (rows: sites; columns: widths;
/// last column: the spread across widths).
pub fn table(coords: &[Coordinate]) -> String {
    let last = coords.iter().map(|c| c.step).max().unwrap_or(0);
    let mut widths: Vec<i64> = coords.iter().map(|c| c.width).collect();
    widths.sort();
    widths.dedup();
    let mut s = String::new();
    for p in [Parametrisation::Standard, Parametrisation::Mup] {
        s.push_str(&format!("\n{} parametrisation, mean |x| after {last} steps:\n\n| site |", name(p)));
        for w in &widths {
            s.push_str(&format!(" d={w} |"));
        }
        s.push_str(" largest / smallest |\n|---|");
        s.push_str(&"---|".repeat(widths.len() + 1));
        s.push('\n');
        for site in sites(coords) {
            s.push_str(&format!("| {site} |"));
            for w in &widths {
                let v =
                    coords.iter().find(|c| c.parametrisation == p && c.site == site && c.step == last && c.width == *w);
                s.push_str(&format!(" {:.4} |", v.map_or(f64::NAN, |c| c.mean_abs)));
            }
            s.push_str(&format!(" {:.2} |\n", spread(coords, p, &site)));
        }
    }
    s
}

/// `coord_check.csv` (every step) and one log-log chart per parametrisation of the last step's coordinates
/// against the width, under `out`.
pub fn write(coords: &[Coordinate], out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let csv = out.join("coord_check.csv");
    let tmp = out.join(".coord_check.csv.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "parametrisation,width,step,site,mean_abs")?;
    for c in coords {
        writeln!(f, "{},{},{},{},{:.6e}", name(c.parametrisation), c.width, c.step, c.site, c.mean_abs)?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, &csv)?;
    let last = coords.iter().map(|c| c.step).max().unwrap_or(0);
    for p in [Parametrisation::Standard, Parametrisation::Mup] {
        let series: Vec<Series> = sites(coords)
            .into_iter()
            .map(|site| Series {
                points: coords
                    .iter()
                    .filter(|c| c.parametrisation == p && c.site == site && c.step == last)
                    .map(|c| (c.width as f64, c.mean_abs, 0.0))
                    .collect(),
                label: site,
                ..Default::default()
            })
            .collect();
        let title = format!("coordinate check, {} parametrisation: mean |x| after {last} steps", name(p));
        let axes = Axes { title: &title, x_label: "width (d_model)", y_label: "mean |x|", x_categories: None };
        loglog_chart(&out.join(format!("coord_check_{}.png", name(p))), &series, &[], &axes)?;
    }
    Ok(())
}
