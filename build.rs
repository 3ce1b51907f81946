//! Link flags that torch-sys does not set for the final binary:
//! - an rpath to libtorch's lib dir, so `ablate` runs without LD_LIBRARY_PATH;
//! - libtorch_cuda forced in: nothing references its symbols directly, so `--as-needed` would drop it
//!   and CUDA would silently report "unavailable" on a GPU machine.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let Ok(libtorch) = std::env::var("LIBTORCH") else {
        // torch-sys fails with its own message in this case; bin/ablate always sets LIBTORCH.
        return;
    };
    let lib = PathBuf::from(libtorch).join("lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
