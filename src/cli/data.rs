//! `ablate data`: the Long Range Arena tasks' examples as JSON lines, to inspect and check the data a run
//! would read.
use ablate::data::lra::{self, listops, pathfinder, Split};
use clap::ValueEnum;

#[derive(Clone, Copy, ValueEnum)]
pub enum LraTask {
    /// Nested MIN/MAX/MED/SM expressions; the label is the value.
    Listops,
    /// Two dots on a grid, joined by one dashed contour or not.
    Pathfinder,
    /// Images as sequences of grey levels (LRA's "Image").
    Pixels,
    /// SpamAssassin emails as bytes (LRA's "Text").
    Bytes,
}

#[derive(clap::Args)]
pub struct DataArgs {
    task: LraTask,
    /// How many examples.
    #[arg(long, default_value_t = 5)]
    n: usize,
    /// The generator's seed (listops, pathfinder).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// train, validation or test.
    #[arg(long, default_value = "train")]
    split: String,
    /// listops: the length range in tokens, `MIN-MAX` (default 500-2000); bytes: the length in bytes
    /// (default 1024).
    #[arg(long)]
    length: Option<String>,
    /// pathfinder: the image side (default 32).
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// pathfinder: steps of each contour (longer: harder).
    #[arg(long, default_value_t = 14)]
    contour_length: usize,
    /// pixels: the image set (fashion_mnist or mnist).
    #[arg(long, default_value = "fashion_mnist")]
    dataset: String,
}

/// `MIN-MAX` or one number (both ends).
fn range(text: &str) -> anyhow::Result<(usize, usize)> {
    let parse = |s: &str| s.trim().parse::<usize>().map_err(|_| anyhow::anyhow!("--length: `{text}` is not MIN-MAX"));
    match text.split_once('-') {
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
        None => parse(text).map(|n| (n, n)),
    }
}

pub fn data(args: &DataArgs) -> anyhow::Result<()> {
    let split = Split::parse(&args.split)?;
    let lines: Vec<String> = match args.task {
        LraTask::Listops => {
            let (lo, hi) = range(args.length.as_deref().unwrap_or("500-2000"))?;
            anyhow::ensure!(lo <= hi, "--length: the range's start {lo} is past its end {hi}");
            let spec = listops::Spec::lengths(lo, hi);
            lra::examples_of(args.seed, split, args.n, |rng| listops::generate(rng, &spec))
                .iter()
                .map(|e| e.json_line(listops::token_name))
                .collect()
        }
        LraTask::Pathfinder => {
            anyhow::ensure!(args.size >= 8, "--size: at least 8 pixels");
            let spec = pathfinder::Spec::sized(args.size, args.contour_length);
            lra::try_examples_of(args.seed, split, args.n, |rng| pathfinder::generate(rng, &spec))?
                .iter()
                .map(|e| e.json_line(|t| t.to_string()))
                .collect()
        }
        LraTask::Pixels => {
            let dataset: ablate::recipe::ImageDataset = serde_yaml::from_str(&args.dataset)
                .map_err(|_| anyhow::anyhow!("--dataset: `{}` is not fashion_mnist or mnist", args.dataset))?;
            anyhow::ensure!(!dataset.needs_path(), "--dataset: fashion_mnist or mnist (the fetched sets)");
            let cfg = ablate::recipe::ImageDataConfig { dataset, ..Default::default() };
            let images = ablate::data::images::ImageTask::load(&cfg, 0.1)?;
            lra::pixel_examples(&images, split, args.n)?.iter().map(|e| e.json_line(|t| t.to_string())).collect()
        }
        LraTask::Bytes => {
            let (length, _) = range(args.length.as_deref().unwrap_or("1024"))?;
            anyhow::ensure!(length >= 1, "--length: at least 1 byte");
            let emails = ablate::data::spam::spam_assassin()?;
            lra::byte_examples(&emails, split, args.n, length).iter().map(|e| e.json_line(|t| t.to_string())).collect()
        }
    };
    for line in lines {
        println!("{line}");
    }
    Ok(())
}
