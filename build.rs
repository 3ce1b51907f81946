//! Builds the C++ shims over libtorch entry points tch does not bind, and sets link flags that torch-sys does
//! not set for the final binary:
//! - `csrc/fused.cpp` (fused AdamW, CPU autocast, gradient reset) and `csrc/profile.cpp` (libtorch's
//!   profiler), always;
//! - `csrc/distributed.cpp` (c10d's TCPStore and ProcessGroupGloo), with Gloo's headers when bootstrap
//!   found them (`ABLATE_GLOO_INCLUDE`), else a version that says data parallelism is not built in;
//! - `csrc/cuda.cpp` (ProcessGroupNCCL, the CUDA caching allocator's statistics), when libtorch has CUDA and
//!   CUDA's headers are at hand (`ABLATE_CUDA_INCLUDE`, a list of directories);
//! - an rpath to libtorch's lib dir, so `ablate` runs without LD_LIBRARY_PATH;
//! - libtorch_cuda (and with csrc/cuda.cpp, libc10_cuda) forced in: nothing references libtorch_cuda's
//!   symbols directly, so `--as-needed` would drop it and CUDA would silently report "unavailable" on a GPU
//!   machine.
use std::path::{Path, PathBuf};

/// A C++17 build against libtorch's headers with the ABI and flags torch-sys uses.
fn against_libtorch(root: &Path, file: &str) -> cc::Build {
    println!("cargo:rerun-if-changed={file}");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!(
            "-D_GLIBCXX_USE_CXX11_ABI={}",
            std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into())
        ))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file(file);
    build
}

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-env-changed=ABLATE_GLOO_INCLUDE");
    println!("cargo:rerun-if-env-changed=ABLATE_CUDA_INCLUDE");
    println!("cargo:rerun-if-changed=csrc/errors.h");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        // The recipe layer alone (`--no-default-features`): nothing links libtorch.
        return;
    }
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        // torch-sys fails with its own message in this case; bin/ablate always sets LIBTORCH.
        return;
    };
    let root = PathBuf::from(&libtorch);
    let lib = root.join("lib");
    against_libtorch(&root, "csrc/fused.cpp").compile("ablate_fused");
    against_libtorch(&root, "csrc/profile.cpp").compile("ablate_profile");
    let mut distributed = against_libtorch(&root, "csrc/distributed.cpp");
    if let Some(gloo) = std::env::var_os("ABLATE_GLOO_INCLUDE").filter(|g| PathBuf::from(g).join("gloo").is_dir()) {
        distributed.include(gloo).define("ABLATE_HAVE_GLOO", None);
    }
    let cuda_include: Vec<PathBuf> =
        std::env::var_os("ABLATE_CUDA_INCLUDE").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    let has = |header: &str| cuda_include.iter().any(|d| d.join(header).exists());
    if lib.join("libtorch_cuda.so").exists() && has("cuda_runtime_api.h") && has("crt/host_config.h") && has("nccl.h") {
        against_libtorch(&root, "csrc/cuda.cpp").includes(&cuda_include).compile("ablate_cuda");
        distributed.define("ABLATE_HAVE_CUDA", None);
        // The caching allocator lives in libc10_cuda, which torch-sys does not link.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-lc10_cuda,--as-needed");
    }
    distributed.compile("ablate_distributed");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
