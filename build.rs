//! Builds `csrc/fused.cpp` (libtorch kernels tch does not bind) and sets link flags that torch-sys does not
//! set for the final binary:
//! - an rpath to libtorch's lib dir, so `ablate` runs without LD_LIBRARY_PATH;
//! - libtorch_cuda forced in: nothing references its symbols directly, so `--as-needed` would drop it
//!   and CUDA would silently report "unavailable" on a GPU machine.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
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
    // Kernels tch does not bind (fused AdamW), compiled against the same libtorch headers as torch-sys.
    println!("cargo:rerun-if-changed=csrc/fused.cpp");
    cc::Build::new()
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
        .file("csrc/fused.cpp")
        .compile("ablate_fused");
    // torch.distributed's c10d (TCPStore, ProcessGroupGloo): with Gloo's headers when bootstrap found them.
    println!("cargo:rerun-if-changed=csrc/distributed.cpp");
    println!("cargo:rerun-if-env-changed=ABLATE_GLOO_INCLUDE");
    let mut distributed = cc::Build::new();
    distributed
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
        .file("csrc/distributed.cpp");
    if let Some(gloo) = std::env::var_os("ABLATE_GLOO_INCLUDE").filter(|g| PathBuf::from(g).join("gloo").is_dir()) {
        distributed.include(gloo).define("ABLATE_HAVE_GLOO", None);
    }
    // NCCL and the CUDA caching allocator's statistics (csrc/cuda.cpp): with CUDA's headers (a list of
    // directories, as bootstrap sets it) and a libtorch built with CUDA.
    println!("cargo:rerun-if-changed=csrc/cuda.cpp");
    println!("cargo:rerun-if-env-changed=ABLATE_CUDA_INCLUDE");
    let cuda_include: Vec<PathBuf> =
        std::env::var_os("ABLATE_CUDA_INCLUDE").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    let has = |header: &str| cuda_include.iter().any(|d| d.join(header).exists());
    if lib.join("libtorch_cuda.so").exists() && has("cuda_runtime_api.h") && has("crt/host_config.h") && has("nccl.h") {
        let mut cuda = cc::Build::new();
        cuda.cpp(true)
            .pic(true)
            .warnings(false)
            .include(root.join("include"))
            .include(root.join("include/torch/csrc/api/include"))
            .includes(&cuda_include)
            .flag("-std=c++17")
            .flag(format!(
                "-D_GLIBCXX_USE_CXX11_ABI={}",
                std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into())
            ))
            .flag("-DGLOG_USE_GLOG_EXPORT")
            .file("csrc/cuda.cpp")
            .compile("ablate_cuda");
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
