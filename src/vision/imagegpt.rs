//! ImageGPT (the seed's 12.10.1; Chen et al. 2020): an image becomes a sequence of pixel tokens — each p×p
//! block's mean colour, quantised to a small palette fitted on the training images — and a causal GPT
//! decoder (the same `Gpt` as the language models, so the same attention core) learns to predict each
//! pixel from the ones before it in raster order. Its loss is reported in bits per dimension (per pixel
//! token); its features are judged by a linear probe (a logistic regression on the mean of the final
//! embeddings); its samples are completions of half-images, saved as a PNG grid.
use anyhow::{Context, Result};
use plotters::prelude::*;
use std::path::Path;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

use super::{ImageGptConfig, Quantiser, VisionConfig};
use crate::config::{Activation, AttentionConfig, Config, ModelConfig, PositionConfig};
use crate::gpt::Gpt;
use crate::images::ImageTask;
use crate::train::{optimise, CurvePoint, Evaluation, Objective, Progress, RunOutcome, StateFile};

/// Test images per evaluation batch.
const EVAL_BATCH: i64 = 250;
/// Pixels k-means clusters (a random sample of the training pixels).
const KMEANS_PIXELS: i64 = 200_000;
const KMEANS_ITERATIONS: i64 = 30;

/// Palette colours (K, C) as floats in [0, 255], ordered by brightness: for bins the bin centres, for
/// k-means the cluster centres of the training pixels `pixels` (P, C).
pub fn fit_palette(pixels: &Tensor, size: i64, quantiser: Quantiser) -> Tensor {
    let pixels = pixels.to_kind(Kind::Float);
    let centres = match quantiser {
        Quantiser::Bins => (Tensor::arange(size, (Kind::Float, Device::Cpu)) + 0.5) * (256.0 / size as f64),
        Quantiser::Kmeans => kmeans(&pixels, size, KMEANS_ITERATIONS).view([size, -1]),
    };
    let centres = centres.view([size, -1]);
    let order = centres.sum_dim_intlist(1, false, Kind::Float).argsort(0, false);
    centres.index_select(0, &order)
}

/// Lloyd's k-means with k-means++ seeding (libtorch's generator: seed it for a reproducible palette). A
/// cluster that loses all its points keeps its centre.
pub fn kmeans(points: &Tensor, k: i64, iterations: i64) -> Tensor {
    let n = points.size()[0];
    let first = Tensor::randint(n, [1], (Kind::Int64, Device::Cpu));
    let mut centres = points.index_select(0, &first);
    for _ in 1..k {
        let d = nearest_distance(points, &centres);
        // Points identical to a centre have weight 0; when every point is, fall back to uniform picks.
        let weights = if d.sum(Kind::Double).double_value(&[]) > 0.0 { d } else { d.ones_like() };
        let pick = weights.multinomial(1, false);
        centres = Tensor::cat(&[centres, points.index_select(0, &pick)], 0);
    }
    for _ in 0..iterations {
        let assign = squared_distances(points, &centres).argmin(1, false);
        let counts =
            Tensor::zeros([k], (Kind::Float, Device::Cpu)).index_add(0, &assign, &points.ones_like().select(1, 0));
        let sums = Tensor::zeros_like(&centres).index_add(0, &assign, points);
        let moved = sums / counts.clamp_min(1.0).unsqueeze(1);
        centres = moved.where_self(&counts.gt(0.0).unsqueeze(1), &centres);
    }
    centres
}

fn squared_distances(points: &Tensor, centres: &Tensor) -> Tensor {
    (points.unsqueeze(1) - centres.unsqueeze(0)).square().sum_dim_intlist(2, false, Kind::Float)
}

fn nearest_distance(points: &Tensor, centres: &Tensor) -> Tensor {
    squared_distances(points, centres).min_dim(1, false).0
}

/// Each p×p block's mean colour: (B, C, H, W) floats in [0, 255] -> (B, C, H/p, W/p).
fn downsample(images: &Tensor, p: i64) -> Tensor {
    if p == 1 {
        images.shallow_clone()
    } else {
        images.avg_pool2d([p, p], [p, p], [0, 0], false, true, None::<i64>)
    }
}

/// The model's view of the images of a config: the pixels a palette is fitted on.
pub fn training_pixels(task: &ImageTask, v: &VisionConfig) -> Tensor {
    let count = task.train_count.min(KMEANS_PIXELS);
    let small = downsample(&task.train.images.narrow(0, 0, count).to_kind(Kind::Float), v.patch_size);
    let c = small.size()[1];
    let pixels = small.permute([0, 2, 3, 1]).reshape([-1, c]);
    let sample = Tensor::randperm(pixels.size()[0], (Kind::Int64, Device::Cpu)).narrow(
        0,
        0,
        KMEANS_PIXELS.min(pixels.size()[0]),
    );
    pixels.index_select(0, &sample)
}

pub struct ImageGpt {
    gpt: Gpt,
    /// Palette colours (K, C) in [0, 255]: a buffer saved with the weights (not trained), set from the data.
    pub palette: Tensor,
    pub patch: i64,
    pub grid: i64,
    pub channels: i64,
    /// The start-of-image token: the first input, whose output predicts the first pixel.
    pub start: i64,
}

impl ImageGpt {
    /// The decoder a vision config describes: GPT-2's pre-LN layers, as in iGPT.
    pub fn model_config(v: &VisionConfig) -> ModelConfig {
        let grid = v.stage_grid(0);
        ModelConfig {
            d_model: v.dim,
            layers: v.depths[0],
            heads: v.heads[0],
            ffn_hidden: Some(v.ffn_hidden(v.dim)),
            activation: Activation::Gelu,
            pre_ln: true,
            final_norm: true,
            dropout: v.dropout,
            pe: v.pe,
            position: PositionConfig::default(),
            block_size: grid * grid,
            tie_embeddings: false,
            attention: AttentionConfig::default(),
        }
    }

    pub fn new(vs: &nn::Path, v: &VisionConfig) -> Self {
        let palette_size = v.image_gpt.as_ref().map_or(ImageGptConfig::default().palette, |g| g.palette);
        // One token more than the palette: the start-of-image token (never a target).
        let gpt = Gpt::new(&(vs / "decoder"), &Self::model_config(v), palette_size + 1);
        let palette = vs.zeros_no_train("palette", &[palette_size, v.channels]);
        Self { gpt, palette, patch: v.patch_size, grid: v.stage_grid(0), channels: v.channels, start: palette_size }
    }

    pub fn palette_size(&self) -> i64 {
        self.start
    }

    pub fn set_palette(&mut self, colours: &Tensor) {
        tch::no_grad(|| self.palette.copy_(colours));
    }

    /// Pixel tokens (B, N) of images (B, C, H, W) with values in [0, 255]: each p×p block's mean colour,
    /// then the nearest palette colour, in raster order.
    pub fn tokens(&self, images: &Tensor) -> Tensor {
        let small = downsample(&images.to_kind(Kind::Float).to_device(self.palette.device()), self.patch);
        let (b, c, _, _) = small.size4().unwrap();
        let pixels = small.permute([0, 2, 3, 1]).reshape([-1, c]);
        squared_distances(&pixels, &self.palette).argmin(1, false).view([b, -1])
    }

    /// Images (B, C, g, g) in [0, 255] of pixel tokens (B, N).
    pub fn colours(&self, tokens: &Tensor) -> Tensor {
        let b = tokens.size()[0];
        self.palette
            .index_select(0, &tokens.reshape([-1]).to_device(self.palette.device()))
            .view([b, self.grid, self.grid, self.channels])
            .permute([0, 3, 1, 2])
    }

    /// Logits (B, n+1, K) of pixels 0..=n given the first n pixel tokens (B, n): the decoder reads the start
    /// token followed by the prefix. The start token's own logit is dropped, so the distribution is over
    /// the palette.
    pub fn logits_after(&self, prefix: &Tensor, train: bool) -> Tensor {
        self.gpt.forward(&self.with_start(prefix), train).narrow(2, 0, self.start)
    }

    fn with_start(&self, prefix: &Tensor) -> Tensor {
        let b = prefix.size()[0];
        let start = Tensor::full([b, 1], self.start, (Kind::Int64, prefix.device()));
        Tensor::cat(&[start, prefix.shallow_clone()], 1)
    }

    /// Mean next-pixel cross-entropy (nats per pixel) of tokens (B, N), and the logits.
    pub fn loss(&self, tokens: &Tensor, train: bool) -> (Tensor, Tensor) {
        let n = tokens.size()[1];
        let logits = self.logits_after(&tokens.narrow(1, 0, n - 1), train).to_kind(Kind::Float);
        let loss = logits.reshape([-1, self.start]).cross_entropy_for_logits(&tokens.reshape([-1]));
        (loss, logits)
    }

    /// Probe features (B, D): the mean over positions of the final embeddings of the sequence the model
    /// reads when it predicts the whole image (the start token and all pixels but the last).
    pub fn features(&self, tokens: &Tensor) -> Tensor {
        let n = tokens.size()[1];
        let (hidden, _) = self.gpt.hidden_with_weights(&self.with_start(&tokens.narrow(1, 0, n - 1)), false, false);
        hidden.to_kind(Kind::Float).mean_dim(1, false, Kind::Float)
    }

    /// Completes each image of `tokens` (B, N) after its first `keep` pixels, pixel by pixel: sampled from
    /// the model at temperature 1 (libtorch's generator) or, when `greedy`, its most likely colour.
    pub fn complete(&self, tokens: &Tensor, keep: i64, greedy: bool) -> Tensor {
        let _guard = tch::no_grad_guard();
        let n = tokens.size()[1];
        let mut out = tokens.narrow(1, 0, keep);
        for _ in keep..n {
            let logits = self.logits_after(&out, false).select(1, -1).to_kind(Kind::Float);
            let next =
                if greedy { logits.argmax(-1, true) } else { logits.softmax(-1, Kind::Float).multinomial(1, true) };
            out = Tensor::cat(&[out, next], 1);
        }
        out
    }
}

/// Next-pixel prediction on the task's (augmented) training images; evaluation on test images.
struct NextPixel<'a> {
    model: &'a ImageGpt,
    task: &'a ImageTask,
    test: Vec<Tensor>,
    batch: i64,
    device: Device,
}

/// Bytes of the model-input range [−1, 1] back to [0, 255].
fn input_to_bytes(x: &Tensor) -> Tensor {
    (x + 1.0) * 127.5
}

impl Objective for NextPixel<'_> {
    fn training_loss(&self) -> Tensor {
        let (x, _) = self.task.train_batch(self.batch, self.device);
        self.model.loss(&self.model.tokens(&input_to_bytes(&x)), true).0
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let _guard = tch::no_grad_guard();
        let (mut loss, mut correct, mut count) = (0.0, 0.0, 0.0);
        for tokens in &self.test {
            let (l, logits) = self.model.loss(tokens, false);
            let pixels = tokens.numel() as f64;
            loss += l.double_value(&[]) * pixels;
            correct +=
                logits.argmax(-1, false).eq_tensor(tokens).to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
            count += pixels;
        }
        let e = Evaluation { loss: loss / count, accuracy: correct / count };
        e.record(step, curves);
        curves.push(CurvePoint::new(step, "val", "bits_per_dim", e.loss / std::f64::consts::LN_2));
        e
    }
}

/// Multinomial logistic regression on standardised features: full-batch Adam with a little L2, seeded.
/// Returns the test accuracy.
pub fn linear_probe(
    train_x: &Tensor,
    train_y: &Tensor,
    test_x: &Tensor,
    test_y: &Tensor,
    classes: i64,
    steps: i64,
) -> f64 {
    let mean = train_x.mean_dim(0, true, Kind::Float);
    let std = train_x.std_dim(0, false, true).clamp_min(1e-6);
    let (xs, xt) = ((train_x - &mean) / &std, (test_x - &mean) / &std);
    let vs = nn::VarStore::new(train_x.device());
    let probe = nn::linear(vs.root(), train_x.size()[1], classes, Default::default());
    let mut opt = nn::OptimizerConfig::build(nn::Adam { wd: 1e-4, ..Default::default() }, &vs, 0.05)
        .expect("Adam over the probe's parameters");
    for _ in 0..steps {
        let loss = nn::Module::forward(&probe, &xs).cross_entropy_for_logits(train_y);
        opt.backward_step(&loss);
    }
    let _guard = tch::no_grad_guard();
    let predicted = nn::Module::forward(&probe, &xt).argmax(-1, false);
    predicted.eq_tensor(test_y).to_kind(Kind::Float).mean(Kind::Float).double_value(&[])
}

/// Full-batch optimisation steps of the linear probe.
const PROBE_STEPS: i64 = 500;

fn features_of(model: &ImageGpt, images: &Tensor, device: Device) -> Tensor {
    let _guard = tch::no_grad_guard();
    let n = images.size()[0];
    let batches: Vec<Tensor> = (0..n)
        .step_by(EVAL_BATCH as usize)
        .map(|s| model.features(&model.tokens(&images.narrow(0, s, EVAL_BATCH.min(n - s)).to_device(device))))
        .collect();
    Tensor::cat(&batches, 0)
}

/// Test images for the completion grid: the first image of each class, then the next test images, `count`
/// in all.
fn completion_images(task: &ImageTask, count: i64) -> Tensor {
    let labels = Vec::<i64>::try_from(&task.test.labels).unwrap_or_default();
    let mut chosen: Vec<i64> = Vec::new();
    for class in 0..task.classes {
        if let Some(i) = labels.iter().position(|&l| l == class) {
            chosen.push(i as i64);
        }
    }
    let mut next = 0;
    while (chosen.len() as i64) < count.min(task.test.len()) {
        if !chosen.contains(&next) {
            chosen.push(next);
        }
        next += 1;
    }
    chosen.truncate(count as usize);
    task.test.images.index_select(0, &Tensor::from_slice(&chosen))
}

/// A PNG grid, one row per image: the quantised original, the kept upper half (the rest marked), then
/// each sampled completion.
pub fn write_completion_grid(path: &Path, rows: &[Vec<Tensor>], keep_rows: i64) -> Result<()> {
    const SCALE: u32 = 4;
    const GAP: u32 = 4;
    let Some(first) = rows.first().and_then(|r| r.first()) else { return Ok(()) };
    let (c, h, w) = first.size3()?;
    let cols = rows[0].len() as u32 + 1;
    let cell = (w as u32 * SCALE + GAP, h as u32 * SCALE + GAP);
    let size = (cols * cell.0 + GAP, rows.len() as u32 * cell.1 + GAP);
    let tmp = path.with_extension("png.tmp.png");
    {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE)?;
        for (r, row) in rows.iter().enumerate() {
            // Column 0 the original, column 1 the prompt, then the samples.
            let images: Vec<(&Tensor, bool)> = std::iter::once((&row[0], false))
                .chain(std::iter::once((&row[0], true)))
                .chain(row[1..].iter().map(|t| (t, false)))
                .collect();
            for (col, (image, prompt)) in images.into_iter().enumerate() {
                let bytes =
                    Vec::<u8>::try_from(image.clamp(0.0, 255.0).round().to_kind(Kind::Uint8).contiguous().view([-1]))?;
                for y in 0..h {
                    for x in 0..w {
                        let at = |ch: i64| bytes[((ch.min(c - 1) * h + y) * w + x) as usize];
                        let colour = if prompt && y >= keep_rows {
                            RGBColor(200, 60, 60)
                        } else {
                            RGBColor(at(0), at(1), at(2))
                        };
                        let x0 = (GAP + col as u32 * cell.0 + x as u32 * SCALE) as i32;
                        let y0 = (GAP + r as u32 * cell.1 + y as u32 * SCALE) as i32;
                        root.draw(&Rectangle::new(
                            [(x0, y0), (x0 + SCALE as i32, y0 + SCALE as i32)],
                            colour.filled(),
                        ))?;
                    }
                }
            }
        }
        root.present()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A trained ImageGPT and its measurements.
pub struct TrainedImageGpt {
    pub outcome: RunOutcome,
    pub model: ImageGpt,
    pub vs: nn::VarStore,
}

/// Trains `cfg.vision` (an ImageGPT) on `task`: fits the palette, trains next-pixel prediction, fits the
/// linear probe and, given `grid_png`, samples the completion grid there.
pub fn train_image_gpt(
    cfg: &Config,
    task: &ImageTask,
    device: Device,
    progress: Progress,
    state: Option<&StateFile>,
    grid_png: Option<&Path>,
) -> Result<TrainedImageGpt> {
    let v = cfg.vision.as_ref().expect("a vision run");
    let g = v.image_gpt.clone().expect("validated: an image_gpt run has its section");
    let t = &cfg.train;
    task.check_model(v)?;
    let started = Instant::now();
    // The palette depends on the data only, not on the run's seed.
    tch::manual_seed(0x9a1e);
    let palette = fit_palette(&training_pixels(task, v), g.palette, g.quantiser);
    tch::manual_seed(t.seed as i64);
    let mut vs = nn::VarStore::new(device);
    let mut model = ImageGpt::new(&vs.root(), v);
    model.set_palette(&palette.to_device(device));
    let test_count = (t.eval_batches * EVAL_BATCH).min(task.test.len());
    let test_images = task.test.images.narrow(0, 0, test_count);
    let test: Vec<Tensor> = (0..test_count)
        .step_by(EVAL_BATCH as usize)
        .map(|s| model.tokens(&test_images.narrow(0, s, EVAL_BATCH.min(test_count - s)).to_device(device)))
        .collect();
    let objective = NextPixel { model: &model, task, test, batch: t.batch_size, device };
    let run = optimise(t, &objective, &mut vs, device, progress, state)?;
    let images_per_s = (run.steps_done * t.batch_size) as f64 / run.train_time.max(1e-9);
    let tokens = model.grid * model.grid;

    let mut probe_accuracy = f64::NAN;
    if run.diverged_at.is_none() {
        tch::manual_seed(t.seed as i64);
        let n = g.probe_images.min(task.train_count);
        let train_x = features_of(&model, &task.train.images.narrow(0, 0, n), device);
        let test_x = features_of(&model, &test_images, device);
        probe_accuracy = linear_probe(
            &train_x,
            &task.train.labels.narrow(0, 0, n).to(device),
            &test_x,
            &task.test.labels.narrow(0, 0, test_count).to(device),
            v.classes,
            PROBE_STEPS,
        );
        if let (Some(path), true) = (grid_png, g.completions > 0) {
            let originals = model.tokens(&completion_images(task, g.completions).to_device(device));
            let keep_rows = model.grid / 2;
            let samples: Vec<Tensor> = (0..g.samples_per_completion)
                .map(|_| {
                    model.colours(&model.complete(&originals, keep_rows * model.grid, false)).to_device(Device::Cpu)
                })
                .collect();
            let quantised = model.colours(&originals).to_device(Device::Cpu);
            let rows: Vec<Vec<Tensor>> = (0..originals.size()[0])
                .map(|i| std::iter::once(quantised.get(i)).chain(samples.iter().map(|s| s.get(i))).collect())
                .collect();
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            write_completion_grid(path, &rows, keep_rows)?;
        }
    }
    let model_flops = images_per_s * 6.0 * v.forward_macs();
    let bits_per_dim = run.final_eval.loss / std::f64::consts::LN_2;
    let outcome = RunOutcome {
        extra_metrics: vec![bits_per_dim, probe_accuracy],
        ..run.into_outcome(started, images_per_s * tokens as f64, model_flops, device, t.precision)
    };
    Ok(TrainedImageGpt { outcome, model, vs })
}
