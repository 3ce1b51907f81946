# Sourced by bin/ablate and bin/test: make sure the pinned libtorch is installed and the binary is built.
# Everything heavy is cached outside the repository so that every clone (and CI) reuses it.
# Overrides:
#   ABLATE_TORCH_DIR  where the torch 2.11.0 wheel is (or will be) installed
#                     (default: ${XDG_CACHE_HOME:-$HOME/.cache}/ablate/torch-2.11.0)
#   LIBTORCH          an existing libtorch 2.11.0 (a `torch/` dir of the wheel, or an unpacked libtorch zip)
#   ABLATE_TORCH_INDEX_URL  a pip index to take torch 2.11.0 from instead of PyPI, e.g.
#                     https://download.pytorch.org/whl/cu126 for a CUDA 12.6 build (drivers older than R580,
#                     which PyPI's CUDA 13 build needs); installed beside the default, named after the index
#   ABLATE_CUDA_INCLUDE  where CUDA's and NCCL's headers are (colon-separated), for a LIBTORCH of your own;
#                     else CUDA_HOME's toolkit (default /usr/local/cuda) or the wheel's own are looked for
set -euo pipefail

ABLATE_TORCH_VERSION=2.11.0
ABLATE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

ablate_die() {
  echo "ablate: $*" >&2
  exit 1
}

# Runs "$@" holding an exclusive lock on the file $1 (flock, from util-linux), so that two processes filling
# one cache entry at once (two terminals, a pool's or an array's first runs, ranks on a shared home) take
# turns: the second says in one line that it waits, then finds the entry there. The kernel drops the lock
# when its holder ends however it ends, so a killed install never blocks the next one. Without flock the
# command runs unlocked, as before.
ablate_locked() {
  local lock="$1" what="$2"
  shift 2
  mkdir -p "$(dirname "$lock")"
  if ! command -v flock >/dev/null 2>&1; then
    "$@"
    return
  fi
  local fd
  exec {fd}>>"$lock"
  if ! flock -n "$fd"; then
    echo "ablate: waiting for another ablate process to finish installing $what" >&2
    flock "$fd"
  fi
  local status=0
  "$@" || status=$?
  exec {fd}>&-
  return "$status"
}

ablate_libtorch_version() {
  # Both the wheel (torch/version.py) and the libtorch zip (build-version) record their version.
  local dir="$1"
  if [[ -f "$dir/version.py" ]]; then
    sed -n "s/^__version__ = '\([^'+]*\).*/\1/p" "$dir/version.py"
  elif [[ -f "$dir/build-version" ]]; then
    sed 's/+.*//' "$dir/build-version"
  fi
}

ablate_install_torch() {
  local target="$1"
  # A peer may have finished the install while this process waited for the lock.
  [[ -d "$target/torch/lib" ]] && return 0
  command -v python3 >/dev/null 2>&1 ||
    ablate_die "python3 is missing: install Python 3 with pip (e.g. 'apt-get install python3 python3-pip'), or set LIBTORCH to an existing libtorch $ABLATE_TORCH_VERSION"
  python3 -m pip --version >/dev/null 2>&1 ||
    ablate_die "pip is missing for python3: install it (e.g. 'apt-get install python3-pip' or 'python3 -m ensurepip'), or set LIBTORCH to an existing libtorch $ABLATE_TORCH_VERSION"
  echo "ablate: installing torch $ABLATE_TORCH_VERSION (libtorch, about 4.6 GB with its CUDA libraries) into $target" >&2
  echo "ablate: this happens once; every clone reuses it" >&2
  rm -rf "$target.partial"
  mkdir -p "$(dirname "$target")"
  local index=()
  [[ -n "${ABLATE_TORCH_INDEX_URL:-}" ]] && index=(--index-url "$ABLATE_TORCH_INDEX_URL")
  if ! python3 -m pip install --disable-pip-version-check --no-cache-dir --progress-bar on "${index[@]}" \
      --target "$target.partial" "torch==$ABLATE_TORCH_VERSION" >&2; then
    rm -rf "$target.partial"
    ablate_die "downloading torch $ABLATE_TORCH_VERSION from PyPI failed (see pip's message above): check the network or proxy and run again, or set LIBTORCH to an existing libtorch $ABLATE_TORCH_VERSION"
  fi
  # Rename only once complete, so an interrupted install is never mistaken for a good one.
  mv "$target.partial" "$target"
}

# Gloo's headers, which libtorch's c10d headers include but the torch wheel does not ship: data-parallel
# training (csrc/distributed.cpp) compiles against them and runs the Gloo inside libtorch_cpu. Debian's
# libgloo-dev is unpacked into the cache (not installed); without it ablate builds without data parallelism
# and says so when a launch asks for it. ABLATE_GLOO_INCLUDE points at another copy.
ABLATE_GLOO_DEB_VERSION=0.0~git20220518.5b14351-3
ablate_unpack_gloo_headers() {
  local dir="$1" work
  [[ -f "$dir/usr/include/gloo/context.h" ]] && return 0
  echo "ablate: unpacking Gloo's headers (Debian libgloo-dev, for data-parallel training) into $dir" >&2
  work="$(mktemp -d)"
  if ! (cd "$work" && apt-get download "libgloo-dev=$ABLATE_GLOO_DEB_VERSION" >/dev/null 2>&1); then
    apt-get update -qq >/dev/null 2>&1 || true
    (cd "$work" && apt-get download "libgloo-dev=$ABLATE_GLOO_DEB_VERSION" >/dev/null 2>&1) || true
  fi
  if compgen -G "$work/libgloo-dev_*.deb" >/dev/null; then
    rm -rf "$dir.partial" && mkdir -p "$dir.partial"
    dpkg-deb -x "$work"/libgloo-dev_*.deb "$dir.partial" && mv "$dir.partial" "$dir"
  fi
  rm -rf "$work"
}

ablate_setup_gloo_headers() {
  if [[ -n "${ABLATE_GLOO_INCLUDE:-}" ]]; then
    [[ -f "$ABLATE_GLOO_INCLUDE/gloo/context.h" ]] ||
      ablate_die "ABLATE_GLOO_INCLUDE=$ABLATE_GLOO_INCLUDE has no gloo/context.h: point it at a directory holding gloo/, or unset it"
    return
  fi
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/ablate/gloo-headers-$ABLATE_GLOO_DEB_VERSION"
  if [[ ! -f "$dir/usr/include/gloo/context.h" ]] && command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
    ablate_locked "$dir.lock" "Gloo's headers" ablate_unpack_gloo_headers "$dir"
  fi
  if [[ -f "$dir/usr/include/gloo/context.h" ]]; then
    export ABLATE_GLOO_INCLUDE="$dir/usr/include"
  else
    echo "ablate: warning: no Gloo headers (Debian's libgloo-dev could not be fetched): building without data-parallel training" >&2
  fi
}

# CUDA's headers for csrc/cuda.cpp (NCCL, the caching allocator's statistics): the torch wheel ships the CUDA
# runtime's and NCCL's, but not nvcc's crt/ nor CCCL's, which those include; both small wheels go into the
# cache. Only where libtorch has CUDA; without them ablate builds without NCCL and GPU memory statistics.
ABLATE_CUDA_HEADER_WHEELS="nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85"
ablate_install_cuda_headers() {
  local dir="$1"
  [[ -f "$dir/nvidia/cu13/include/crt/host_config.h" ]] && return 0
  echo "ablate: installing CUDA's crt and CCCL headers ($ABLATE_CUDA_HEADER_WHEELS, for NCCL and GPU memory statistics) into $dir" >&2
  rm -rf "$dir.partial"
  # shellcheck disable=SC2086
  if python3 -m pip install --disable-pip-version-check --no-cache-dir --quiet --no-deps \
      --target "$dir.partial" $ABLATE_CUDA_HEADER_WHEELS >&2; then
    mv "$dir.partial" "$dir"
  else
    rm -rf "$dir.partial"
    echo "ablate: warning: CUDA's headers could not be installed: building without NCCL and GPU memory statistics" >&2
    return 1
  fi
}

ablate_setup_cuda_headers() {
  [[ -f "$LIBTORCH/lib/libtorch_cuda.so" ]] || return 0
  # Given by the user (a LIBTORCH of their own): taken as it is.
  [[ -n "${ABLATE_CUDA_INCLUDE:-}" ]] && return 0
  local site nv dir toolkit nccl d
  site="$(dirname "$LIBTORCH")"
  # A CUDA toolkit has nvcc's crt/ and CCCL itself; NCCL's header comes from the wheel or the system.
  toolkit="${CUDA_HOME:-/usr/local/cuda}/include"
  nccl=""
  for d in "$site/nvidia/nccl/include" "$toolkit" /usr/include; do
    [[ -f "$d/nccl.h" ]] && { nccl="$d"; break; }
  done
  if [[ -f "$toolkit/cuda_runtime_api.h" && -f "$toolkit/crt/host_config.h" && -n "$nccl" ]]; then
    export ABLATE_CUDA_INCLUDE="$toolkit:$nccl"
    return 0
  fi
  nv="$site/nvidia/cu13/include"
  if [[ ! -f "$nv/cuda_runtime_api.h" || -z "$nccl" ]]; then
    echo "ablate: warning: this libtorch has CUDA but no CUDA/NCCL headers were found (no CUDA 13 wheel layout, no toolkit at $toolkit): building without NCCL and GPU memory statistics; set CUDA_HOME or ABLATE_CUDA_INCLUDE" >&2
    return 0
  fi
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/ablate/cuda-headers-13.0"
  if [[ ! -f "$dir/nvidia/cu13/include/crt/host_config.h" ]]; then
    ablate_locked "$dir.lock" "CUDA's headers" ablate_install_cuda_headers "$dir" || return 0
  fi
  export ABLATE_CUDA_INCLUDE="$nv:$dir/nvidia/cu13/include:$dir/nvidia/cu13/include/cccl:$nccl"
}

ablate_setup_torch() {
  if [[ -n "${LIBTORCH:-}" ]]; then
    [[ -d "$LIBTORCH/lib" ]] || ablate_die "LIBTORCH=$LIBTORCH has no lib/ directory: point it at the wheel's torch/ dir or an unpacked libtorch, or unset it"
  else
    # Another index (a CUDA 12 build) gets its own directory, named after the index's last component.
    local variant=""
    [[ -n "${ABLATE_TORCH_INDEX_URL:-}" ]] && variant="-$(basename "${ABLATE_TORCH_INDEX_URL%/}")"
    local dir="${ABLATE_TORCH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ablate/torch-$ABLATE_TORCH_VERSION$variant}"
    [[ -d "$dir/torch/lib" ]] || ablate_locked "$dir.lock" "torch $ABLATE_TORCH_VERSION" ablate_install_torch "$dir"
    export LIBTORCH="$dir/torch"
  fi
  local found
  found="$(ablate_libtorch_version "$LIBTORCH")"
  [[ "$found" == "$ABLATE_TORCH_VERSION" ]] ||
    ablate_die "libtorch at $LIBTORCH is version '${found:-unknown}', but ablate (tch 0.24) needs exactly $ABLATE_TORCH_VERSION: unset LIBTORCH (or remove that directory) to let ablate install the right one"
  export LIBTORCH_CXX11_ABI=1
  ablate_setup_gloo_headers
  ablate_setup_cuda_headers
  # The wheel's Python package is also the PyTorch reference that benchmarks and numeric tests compare against.
  export ABLATE_TORCH_PYTHONPATH="$(dirname "$LIBTORCH")"
}

ablate_build() {
  command -v cargo >/dev/null 2>&1 ||
    ablate_die "cargo is missing: install the Rust toolchain (https://rustup.rs) and run again"
  if [[ ! -x "$ABLATE_ROOT/target/release/ablate" ]]; then
    # The first build compiles every dependency: say so, and let cargo show its progress.
    echo "ablate: first build (release, with every dependency): 4 to 5 minutes on the 2-core machines measured (up to 9 reported on one); later builds take seconds" >&2
    (cd "$ABLATE_ROOT" && cargo build --release "$@") ||
      ablate_die "the build failed (see the compiler's message above)"
  else
    (cd "$ABLATE_ROOT" && cargo build --release --quiet "$@") ||
      ablate_die "the build failed (see the compiler's message above)"
  fi
}

# The test suite's references besides torch: PyPI's tensorboard (its reader checks ablate's event files) and
# Chromium from Debian (it renders the HTML report). Installed once, like torch; ablate itself needs neither.
ABLATE_TENSORBOARD_VERSION=2.21.0

# Installs pinned PyPI packages (pip's arguments ARGS: a spec, with its dependencies, or --no-deps and a
# list) into DIR through DIR.partial and a rename; PACKAGE is the module that marks it done, WHY says in the
# message what it is for. Called under ablate_locked; a peer may have finished meanwhile.
ablate_pip_into() {
  local dir="$1" package="$2" why="$3"
  shift 3
  [[ -d "$dir/$package" ]] && return 0
  echo "ablate: installing $package ($why) into $dir" >&2
  rm -rf "$dir.partial"
  mkdir -p "$(dirname "$dir")"
  if ! python3 -m pip install --disable-pip-version-check --no-cache-dir --quiet \
      --target "$dir.partial" "$@" >&2; then
    rm -rf "$dir.partial"
    ablate_die "installing $package from PyPI failed (see pip's message above)"
  fi
  mv "$dir.partial" "$dir"
}

ablate_setup_tensorboard() {
  local dir="${ABLATE_TENSORBOARD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ablate/tensorboard-$ABLATE_TENSORBOARD_VERSION}"
  [[ -d "$dir/tensorboard" ]] || ablate_locked "$dir.lock" "tensorboard" ablate_pip_into "$dir" tensorboard \
    "the reader the event-file test checks against" "tensorboard==$ABLATE_TENSORBOARD_VERSION"
  export ABLATE_TENSORBOARD_PYTHONPATH="$dir"
}

# The reference implementations the interop test loads ablate's exports with: PyPI's transformers (which
# brings safetensors and tokenizers), pinned, into the cache beside torch (whose Python side it runs on).
ABLATE_TRANSFORMERS_VERSION=5.25.0

ablate_setup_hf_reference() {
  local dir="${ABLATE_HF_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ablate/transformers-$ABLATE_TRANSFORMERS_VERSION}"
  [[ -d "$dir/transformers" ]] || ablate_locked "$dir.lock" "transformers" ablate_pip_into "$dir" transformers \
    "the reference the export test loads ablate's models with" "transformers==$ABLATE_TRANSFORMERS_VERSION"
  export ABLATE_HF_PYTHONPATH="$dir"
}

# timm, the reference the interop test loads Swin exports with. Its requirements would pull a second torch; it
# is installed without dependencies beside the modules it imports that transformers' cache lacks:
# torchvision (whose version pairs with torch 2.11) and Pillow, which torchvision imports.
ABLATE_TIMM_VERSION=1.0.31
ABLATE_TIMM_IMPORTS=(torchvision==0.26.0 pillow==13.0.0)

ablate_setup_timm() {
  local dir="${ABLATE_TIMM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ablate/timm-$ABLATE_TIMM_VERSION}"
  [[ -d "$dir/timm" ]] || ablate_locked "$dir.lock" "timm" ablate_pip_into "$dir" timm \
    "the reference the export test loads ablate's Swin models with" --no-deps \
    "timm==$ABLATE_TIMM_VERSION" "${ABLATE_TIMM_IMPORTS[@]}"
  export ABLATE_TIMM_PYTHONPATH="$dir"
}

# TransformerLens (its TransformerBridge over transformers) for the interop test's attention patterns. Its
# requirements would pull a second torch and transformers, so it is installed without dependencies beside
# the pinned list of the modules it imports (it runs on the cached transformers and torch above).
ABLATE_TRANSFORMER_LENS_VERSION=4.3.0
ABLATE_TRANSFORMER_LENS_IMPORTS=(
  einops==0.8.2 fancy-einsum==0.0.3 jaxtyping==0.3.11 wadler-lindig==0.1.8 beartype==0.23.1 typeguard==4.6.1
  datasets==5.2.0 pyarrow==26.0.1 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 pandas==3.1.1
  requests==2.34.2 urllib3==2.8.0 charset-normalizer==3.5.3 certifi==2026.10.19.post1 accelerate==1.16.0
  psutil==7.2.2 tqdm==4.70.1 sentencepiece==0.2.3 transformers-stream-generator==0.0.5
)

ablate_setup_transformer_lens() {
  local dir="${ABLATE_TL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ablate/transformer-lens-$ABLATE_TRANSFORMER_LENS_VERSION}"
  [[ -d "$dir/transformer_lens" ]] || ablate_locked "$dir.lock" "TransformerLens" ablate_pip_into "$dir" \
    transformer_lens "the interop test's attention patterns" --no-deps \
    "transformer-lens==$ABLATE_TRANSFORMER_LENS_VERSION" "${ABLATE_TRANSFORMER_LENS_IMPORTS[@]}"
  export ABLATE_TL_PYTHONPATH="$dir"
}

ablate_setup_chromium() {
  local found
  found="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
  if [[ -z "$found" ]]; then
    [[ $(id -u) -eq 0 ]] ||
      ablate_die "the HTML report test needs a headless Chromium: install it (e.g. 'sudo apt-get install chromium') or set ABLATE_CHROMIUM"
    echo "ablate: installing chromium from Debian (the HTML report test renders the report with it)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null ||
      ablate_die "installing chromium with apt-get failed"
    found="$(command -v chromium)"
  fi
  export ABLATE_CHROMIUM="${ABLATE_CHROMIUM:-$found}"
}
