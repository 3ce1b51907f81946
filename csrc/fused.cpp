// libtorch kernels that tch does not bind. Each returns nullptr on success or a malloc'ed error message that
// the caller frees with ablate_free_error (C++ exceptions must not cross into Rust).
#include "errors.h"
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adamw.h>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

extern "C" {

// Float32 arithmetic and determinism for the runs that follow (process-wide, as torch.backends sets them):
// `tf32` lets CUDA matmuls and cuDNN convolutions use TF32 (torch.backends.cuda.matmul.fp32_precision and
// cudnn.conv.fp32_precision = "tf32", else "ieee"); `deterministic` is torch.use_deterministic_algorithms(True)
// with cudnn.deterministic and without cuDNN's benchmark search.
char *ablate_set_math_modes(bool tf32, bool deterministic) {
  try {
    auto &ctx = at::globalContext();
    // Both of libtorch's APIs, so that they agree: the legacy getters (allowTF32CuBLAS, allowTF32CuDNN, which
    // libtorch_cuda and any Python code still call) throw "mix of the legacy and new APIs" when the legacy
    // state (float32_matmul_precision, the cuDNN flag) disagrees with the new per-op precisions. The legacy
    // setters write both; the new ones after them say the intent explicitly. RNN follows CONV, as
    // torch.backends.cudnn.allow_tf32 sets them together.
    ctx.setAllowTF32CuBLAS(tf32);
    ctx.setAllowTF32CuDNN(tf32);
    const auto fp32 = tf32 ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
    ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, fp32);
    ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, fp32);
    ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::RNN, fp32);
    ctx.setDeterministicAlgorithms(deterministic, /*warn_only=*/false);
    ctx.setDeterministicCuDNN(deterministic);
    ctx.setBenchmarkCuDNN(false);
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

// The legacy TF32 getters, as libtorch_cuda and torch.backends call them: null with their answers, or the
// message they throw when the legacy and new APIs disagree.
char *ablate_legacy_tf32(bool *cublas, bool *cudnn) {
  try {
    auto &ctx = at::globalContext();
    *cublas = ctx.allowTF32CuBLAS();
    *cudnn = ctx.allowTF32CuDNN();
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// `t` copied into page-locked host memory (libtorch's caching host allocator) for a non-blocking copy to the
// GPU. Tensor::pin_memory() without a device: tch passes one, and libtorch 2.11 prints a deprecation warning for
// every call that does (two lines per batch tensor per step).
char *ablate_pin_memory(at::Tensor *t, at::Tensor **out) {
  try {
    *out = new at::Tensor(t->pin_memory());
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// What ablate_set_math_modes set, read back from libtorch's context.
void ablate_math_modes(bool *tf32_matmul, bool *tf32_conv, bool *deterministic) {
  auto &ctx = at::globalContext();
  *tf32_matmul = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) == at::Float32Precision::TF32;
  *tf32_conv = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV) == at::Float32Precision::TF32;
  *deterministic = ctx.deterministicAlgorithms() && ctx.deterministicCuDNN();
}


// One fused AdamW update (torch.optim.AdamW(fused=True)'s kernel) of the `n` tensors `params` from `grads`,
// with moments `ms`, `vs` and the step count in the one-element float tensor `step` (already incremented;
// shared by every tensor, as they are always stepped together).
char *ablate_fused_adamw(at::Tensor **params, at::Tensor **grads, at::Tensor **ms, at::Tensor **vs, int64_t n,
                         at::Tensor *step, double lr, double beta1, double beta2, double weight_decay, double eps) {
  try {
    std::vector<at::Tensor> p, g, m, v, steps;
    for (int64_t i = 0; i < n; ++i) {
      p.push_back(*params[i]);
      g.push_back(*grads[i]);
      m.push_back(*ms[i]);
      v.push_back(*vs[i]);
      steps.push_back(*step);
    }
    at::_fused_adamw_(p, g, m, v, {}, steps, lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                      /*maximize=*/false);
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

// The global 2-norm of `n` tensors, left on their device as a new 0-dim tensor in `*out` (owned by the
// caller, freed as tch frees a tensor): one _foreach_norm (one kernel on a GPU instead of one per tensor),
// then the norm of the norms, as torch.nn.utils.clip_grad_norm_ computes it.
char *ablate_global_norm(at::Tensor **ts, int64_t n, at::Tensor **out) {
  try {
    std::vector<at::Tensor> v;
    for (int64_t i = 0; i < n; ++i) {
      v.push_back(*ts[i]);
    }
    *out = new at::Tensor(at::stack(at::_foreach_norm(v, 2)).norm());
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

// Multiplies each of `n` tensors in place by the 0-dim tensor `factor` (torch._foreach_mul_ with a tensor):
// the clip coefficient stays on the device, so the host never waits for it.
char *ablate_foreach_mul_(at::Tensor **ts, int64_t n, at::Tensor *factor) {
  try {
    std::vector<at::Tensor> v;
    for (int64_t i = 0; i < n; ++i) {
      v.push_back(*ts[i]);
    }
    at::_foreach_mul_(v, *factor);
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

// Drops `param`'s gradient (zero_grad(set_to_none=True)): backward then hands its fresh gradient buffer
// over instead of adding it into a zeroed one.
char *ablate_clear_grad(at::Tensor *param) {
  try {
    param->mutable_grad() = at::Tensor();
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

// Turns autocast on (dtype 1: bfloat16, 2: float16) or off (dtype 0) for `cuda` or the CPU, in this thread.
// Leaving it clears the cache of casted weights, as torch.autocast's __exit__ does.
char *ablate_autocast(bool cuda, int dtype) {
  try {
    const auto device = cuda ? at::DeviceType::CUDA : at::DeviceType::CPU;
    if (dtype == 0) {
      at::autocast::set_autocast_enabled(device, false);
      if (at::autocast::decrement_nesting() == 0) {
        at::autocast::clear_cache();
      }
    } else {
      at::autocast::set_autocast_dtype(device, dtype == 1 ? at::kBFloat16 : at::kHalf);
      at::autocast::set_autocast_enabled(device, true);
      at::autocast::increment_nesting();
    }
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

// Drops autocast's low-precision copies of the weights: they are stale once an optimiser step changed them.
void ablate_autocast_clear_cache() { at::autocast::clear_cache(); }

void ablate_free_error(char *message) { free(message); }
}
