// libtorch kernels that tch does not bind. Each returns nullptr on success or a malloc'ed error message that
// the caller frees with ablate_free_error (C++ exceptions must not cross into Rust).
#include <ATen/ATen.h>
#include <ATen/ops/_fused_adamw.h>
#include <cstdlib>
#include <cstring>
#include <exception>

extern "C" {

// One fused AdamW update (torch.optim.AdamW(fused=True)'s kernel) of `param` from `grad`, with moments
// `m`, `v` and the step count in the one-element float tensor `step` (already incremented).
char *ablate_fused_adamw(at::Tensor *param, at::Tensor *grad, at::Tensor *m, at::Tensor *v, at::Tensor *step,
                         double lr, double beta1, double beta2, double weight_decay, double eps) {
  try {
    at::_fused_adamw_({*param}, {*grad}, {*m}, {*v}, {}, {*step}, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return nullptr;
  } catch (const std::exception &e) {
    return strdup(e.what());
  }
}

void ablate_free_error(char *message) { free(message); }
}
