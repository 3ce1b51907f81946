// libtorch's torch.distributed (c10d) for data-parallel training: a TCPStore rendezvous and a Gloo (CPU) or
// NCCL (CUDA, csrc/cuda.cpp) process group, the objects torch.distributed.init_process_group builds, driven
// from Rust. tch binds
// none of it. Each function returns nullptr on success or a malloc'ed message (freed with
// ablate_free_error): C++ exceptions, such as Gloo's when a peer dies or a collective times out, must not
// cross into Rust.
//
// ProcessGroupGloo.hpp includes Gloo's own headers, which the torch wheel does not ship; bin/bootstrap.sh
// unpacks Debian's libgloo-dev for them (declarations only: the code that runs is the Gloo inside
// libtorch_cpu). Built without them (ABLATE_HAVE_GLOO unset), ablate_dist_init says so and nothing else runs.
#include <ATen/ATen.h>
#include "errors.h"
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef ABLATE_HAVE_GLOO
#define USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#ifndef ABLATE_HAVE_CUDA
// csrc/cuda.cpp is not built: the allocator's statistics say why.
extern "C" {
char *ablate_cuda_peak_memory(int, int64_t *, int64_t *) { return strdup("built without CUDA headers"); }
char *ablate_cuda_reset_peak_memory(int) { return strdup("built without CUDA headers"); }
char *ablate_cuda_mem_info(int, int64_t *, int64_t *) { return strdup("built without CUDA headers"); }
char *ablate_cuda_set_device(int) { return strdup("built without CUDA headers"); }
bool ablate_has_cuda_extras() { return false; }
}
#endif

#ifdef ABLATE_HAVE_GLOO
struct AblateGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

#ifdef ABLATE_HAVE_CUDA
c10::intrusive_ptr<c10d::Backend> ablate_make_nccl(const c10::intrusive_ptr<c10d::Store> &store, int rank, int world,
                                                   std::chrono::milliseconds timeout);
#else
c10::intrusive_ptr<c10d::Backend> ablate_make_nccl(const c10::intrusive_ptr<c10d::Store> &, int, int,
                                                   std::chrono::milliseconds) {
  throw std::runtime_error("this ablate was built without the CUDA headers NCCL needs (bin/bootstrap.sh adds them "
                           "where libtorch has CUDA): use the gloo backend");
}
#endif

extern "C" {

// Joins the group of `world` processes as `rank`: rank 0 serves the TCPStore at host:port unless
// `client_only` (torchrun's agent already serves one there: TORCHELASTIC_USE_AGENT_STORE), every rank
// connects, and keys live under `prefix`. Every store wait and collective gives up after `timeout_ms`.
// `nccl`: NCCL (CUDA tensors) instead of Gloo.
char *ablate_dist_init(const char *host, int port, int rank, int world, bool client_only, const char *prefix,
                       int64_t timeout_ms, bool nccl, AblateGroup **out) {
  try {
    const auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = rank == 0 && !client_only;
    options.numWorkers = world;
    options.waitWorkers = !client_only;
    options.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), options);
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    c10::intrusive_ptr<c10d::Backend> backend;
    if (nccl) {
      backend = ablate_make_nccl(store, rank, world, timeout);
    } else {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_options);
    }
    *out = new AblateGroup{store, backend};
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Sums `tensor` over all ranks, in place (every rank ends with the same sum).
char *ablate_dist_all_reduce_sum(AblateGroup *group, at::Tensor *tensor) {
  try {
    std::vector<at::Tensor> tensors{*tensor};
    group->backend->allreduce(tensors)->wait();
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Copies rank `root`'s `tensor` into every other rank's, in place.
char *ablate_dist_broadcast(AblateGroup *group, at::Tensor *tensor, int root) {
  try {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group->backend->broadcast(tensors, options)->wait();
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Stores `len` bytes under `key`.
char *ablate_dist_store_set(AblateGroup *group, const char *key, const uint8_t *data, size_t len) {
  try {
    group->store->set(std::string(key), std::vector<uint8_t>(data, data + len));
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Waits (up to the store's timeout) for `key` and returns its bytes in a malloc'ed buffer the caller frees
// with ablate_dist_free_bytes.
char *ablate_dist_store_get(AblateGroup *group, const char *key, uint8_t **data, size_t *len) {
  try {
    auto value = group->store->get(std::string(key));
    *len = value.size();
    *data = static_cast<uint8_t *>(malloc(value.size() == 0 ? 1 : value.size()));
    if (*data == nullptr) {
      return strdup("out of memory reading the store");
    }
    memcpy(*data, value.data(), value.size());
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

void ablate_dist_free_bytes(uint8_t *data) { free(data); }

void ablate_dist_free(AblateGroup *group) { delete group; }

// Ends the group's backend before the process exits (torch.distributed.destroy_process_group): NCCL's
// watchdog and heartbeat threads must not outlive main. `clean`: a graceful shutdown after a run that
// finished; otherwise abort, which does not wait on peers that may be gone. Gloo's are no-ops.
char *ablate_dist_shutdown(AblateGroup *group, bool clean) {
  try {
    if (clean) {
      group->backend->shutdown();
    } else {
      group->backend->abort();
    }
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}
}

#else

struct AblateGroup {};

extern "C" {
char *ablate_dist_init(const char *, int, int, int, bool, const char *, int64_t, bool, AblateGroup **) {
  return strdup("this ablate was built without Gloo's headers (bin/bootstrap.sh unpacks Debian's libgloo-dev and "
                "sets ABLATE_GLOO_INCLUDE): data-parallel training is not available in this build");
}
char *ablate_dist_all_reduce_sum(AblateGroup *, at::Tensor *) { return strdup("no distributed support"); }
char *ablate_dist_broadcast(AblateGroup *, at::Tensor *, int) { return strdup("no distributed support"); }
char *ablate_dist_store_set(AblateGroup *, const char *, const uint8_t *, size_t) {
  return strdup("no distributed support");
}
char *ablate_dist_store_get(AblateGroup *, const char *, uint8_t **, size_t *) {
  return strdup("no distributed support");
}
void ablate_dist_free_bytes(uint8_t *data) { free(data); }
void ablate_dist_free(AblateGroup *) {}
char *ablate_dist_shutdown(AblateGroup *, bool) { return nullptr; }
}
#endif
