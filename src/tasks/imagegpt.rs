//! kind image_gpt: ImageGPT (UDL §12.10.1) trained to predict every pixel from the ones before it. Its loss
//! is reported in bits per dimension (per pixel token); its features are judged by a linear probe (a
//! logistic regression on the mean of the final embeddings); its samples are completions of half-images,
//! saved as a PNG grid under `completions/`.
use anyhow::Result;
use plotters::prelude::*;
use std::path::Path;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

use super::classify::{images_key, load_images};
use super::{Built, DataCache, RunContext, Task, Trained};
use crate::data::images::ImageTask;
use crate::data::HeldOut;
use crate::metrics::{self, Metric};
use crate::models::imagegpt::{downsample, fit_palette, ImageGpt as Model};
use crate::recipe::{Config, Quantiser};
use crate::train::distributed::{sum_over_share, BatchShard};
use crate::train::{optimise, Evaluation, Objective};

pub struct ImageGpt;

/// Test images per evaluation batch.
const EVAL_BATCH: i64 = 250;
/// Pixels k-means clusters (a random sample of the training pixels).
const KMEANS_PIXELS: i64 = 200_000;

/// The pixels of the training images as the model sees them (downsampled), a sample to fit the palette on.
pub fn training_pixels(task: &ImageTask, patch: i64) -> Tensor {
    let count = task.train_count.min(KMEANS_PIXELS);
    let small = downsample(&task.train.images.narrow(0, 0, count).to_kind(Kind::Float), patch);
    let c = small.size()[1];
    let pixels = small.permute([0, 2, 3, 1]).reshape([-1, c]);
    let sample = Tensor::randperm(pixels.size()[0], (Kind::Int64, Device::Cpu)).narrow(
        0,
        0,
        KMEANS_PIXELS.min(pixels.size()[0]),
    );
    pixels.index_select(0, &sample)
}

/// Next-pixel prediction on the task's (augmented) training images; evaluation on validation images, and
/// once on test images.
struct NextPixel<'a> {
    model: &'a Model,
    task: &'a ImageTask,
    validation: Vec<Tensor>,
    test: Vec<Tensor>,
    batch: i64,
    device: Device,
    probe_attention: bool,
}

/// Bytes of the model-input range [−1, 1] back to [0, 255].
fn input_to_bytes(x: &Tensor) -> Tensor {
    (x + 1.0) * 127.5
}

impl Objective for NextPixel<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let (x, _) = self.task.train_batch(shard.global(self.batch), self.device);
        let [x] = shard.take([x]);
        self.model.loss(&self.model.tokens(&input_to_bytes(&x)), true).0
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        let e = self.score(&self.validation)?;
        Ok(match self.probe_attention {
            true => super::probe(e, &self.model.attention_weights(&self.validation[0])),
            false => e,
        })
    }

    fn test(&self) -> Result<Evaluation> {
        self.score(&self.test)
    }
}

impl NextPixel<'_> {
    /// Loss, accuracy and bits per dimension over held-out token `batches`.
    fn score(&self, batches: &[Tensor]) -> Result<Evaluation> {
        let _guard = tch::no_grad_guard();
        let [loss, correct, count] = sum_over_share(batches, |tokens| {
            let (l, logits) = self.model.loss(tokens, false);
            let pixels = tokens.numel() as f64;
            [
                l.double_value(&[]) * pixels,
                logits.argmax(-1, false).eq_tensor(tokens).to_kind(Kind::Float).sum(Kind::Float).double_value(&[]),
                pixels,
            ]
        })?;
        Ok(Evaluation::default()
            .with("val/loss", loss / count)
            .with("val/accuracy", correct / count)
            .with("val/bits_per_dim", loss / count / std::f64::consts::LN_2))
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

fn features_of(model: &Model, images: &Tensor, device: Device) -> Tensor {
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
    crate::files::write_atomically_with(path, |tmp| {
        let root = BitMapBackend::new(tmp, size).into_drawing_area();
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
        Ok(())
    })
}

struct BuiltImageGpt {
    model: Model,
    pixels: i64,
}

impl Built for BuiltImageGpt {
    fn forward_example(&self, batch: i64, train: bool, device: Device) -> Tensor {
        let tokens = super::example_tokens(batch, self.pixels, self.model.palette_size(), device);
        self.model.loss(&tokens, train).1
    }
}

impl Task for ImageGpt {
    fn metrics(&self, cfg: &Config) -> Vec<Metric> {
        let mut m = vec![
            Metric::both("test_loss", "val/loss", "test loss", "nats/pixel", false).detail(),
            Metric::both("test_accuracy", "val/accuracy", "test next-pixel accuracy", "", true),
            Metric::both("test_bits_per_dim", "val/bits_per_dim", "test bits per dimension", "bits/pixel", false),
            Metric::column("test_probe_accuracy", "test linear-probe accuracy", "", true),
        ];
        if cfg.train.probe_attention {
            m.extend(metrics::attention_probes());
        }
        m.extend(metrics::optimisation("nats/pixel"));
        m.extend(metrics::cost("pixels/s", cfg.train.world_size));
        m
    }

    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()> {
        let task = DataCache::get_or_load(&mut data.images, images_key(cfg), || load_images(cfg))?;
        super::classify::check_fits(task, &cfg.image())
    }

    fn vocab(&self, cfg: &Config, _data: &DataCache) -> Result<i64> {
        Ok(cfg.image_gpt().palette + 1)
    }

    fn build(&self, cfg: &Config, vs: &nn::Path, _vocab: i64) -> Box<dyn Built> {
        let spec = cfg.image_gpt_spec();
        Box::new(BuiltImageGpt { model: Model::new(vs, &spec), pixels: spec.grid() * spec.grid() })
    }

    fn forward_flops(&self, cfg: &Config, _params: i64, _vocab: i64) -> (f64, String) {
        (2.0 * cfg.image_gpt_spec().forward_macs(), "image".into())
    }

    fn tokens_per_example(&self, cfg: &Config, _data: &DataCache) -> Result<f64> {
        let grid = cfg.image_gpt_spec().grid();
        Ok((grid * grid) as f64)
    }

    /// Fits the palette, trains next-pixel prediction, fits the linear probe and samples the completion
    /// grid.
    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained> {
        let task = DataCache::loaded(&data.images, &images_key(cfg))?;
        let (g, t, device) = (cfg.image_gpt(), &cfg.train, ctx.device);
        let spec = cfg.image_gpt_spec();
        let started = Instant::now();
        // The palette depends on the data only, not on the run's seed.
        tch::manual_seed(0x9a1e);
        let palette =
            fit_palette(&training_pixels(task, spec.image.patch), g.palette, g.quantiser == Quantiser::Kmeans);
        tch::manual_seed(t.seed as i64);
        let mut vs = nn::VarStore::new(device);
        let mut model = Model::new(&vs.root(), &spec);
        model.set_palette(&palette.to_device(device));
        let tokens_of = |split: HeldOut| -> (Tensor, Vec<Tensor>) {
            let set = task.held_out(split);
            let batches = if split == HeldOut::Test { t.test_batches() } else { t.eval_batches };
            let count = (batches * EVAL_BATCH).min(set.len());
            let images = set.images.narrow(0, 0, count);
            let batches = (0..count)
                .step_by(EVAL_BATCH as usize)
                .map(|s| model.tokens(&images.narrow(0, s, EVAL_BATCH.min(count - s)).to_device(device)))
                .collect();
            (images, batches)
        };
        let ((_, validation), (test_images, test)) = (tokens_of(HeldOut::Validation), tokens_of(HeldOut::Test));
        let test_count = test_images.size()[0];
        let objective = NextPixel {
            model: &model,
            task,
            validation,
            test,
            batch: t.batch_size,
            device,
            probe_attention: t.probe_attention,
        };
        let run = optimise(t, &objective, &mut vs, device, ctx.progress, ctx.state)?;
        let images_per_s = (run.steps_done * t.global_batch()) as f64 / run.train_time.max(1e-9);
        let tokens = model.grid * model.grid;
        let mut probe_accuracy = f64::NAN;
        // A tuning run reads no test split: no probe scored on test images, no completions of them.
        if run.diverged_at.is_none() && !t.skip_test {
            tch::manual_seed(t.seed as i64);
            let n = g.probe_images.min(task.train_count);
            let train_x = features_of(&model, &task.train.images.narrow(0, 0, n), device);
            let test_x = features_of(&model, &test_images, device);
            probe_accuracy = linear_probe(
                &train_x,
                &task.train.labels.narrow(0, 0, n).to(device),
                &test_x,
                &task.test.labels.narrow(0, 0, test_count).to(device),
                spec.image.classes,
                PROBE_STEPS,
            );
            if g.completions > 0 {
                let path = ctx.out.join("completions").join(format!("{}.png", ctx.stem));
                let originals = model.tokens(&completion_images(task, g.completions).to_device(device));
                let keep_rows = model.grid / 2;
                let samples: Vec<Tensor> = (0..g.samples_per_completion)
                    .map(|_| {
                        model
                            .colours(&model.complete(&originals, keep_rows * model.grid, false, true))
                            .to_device(Device::Cpu)
                    })
                    .collect();
                let quantised = model.colours(&originals).to_device(Device::Cpu);
                let rows: Vec<Vec<Tensor>> = (0..originals.size()[0])
                    .map(|i| std::iter::once(quantised.get(i)).chain(samples.iter().map(|s| s.get(i))).collect())
                    .collect();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                write_completion_grid(&path, &rows, keep_rows)?;
            }
        }
        let model_flops = images_per_s * 6.0 * spec.forward_macs();
        let metrics = self.metrics(cfg);
        let mut outcome =
            run.into_outcome(started, images_per_s * tokens as f64, model_flops, device, t.precision, &metrics);
        outcome.set("test_probe_accuracy", probe_accuracy);
        Ok(Trained { outcome, vs, tokenizer: None })
    }
}
