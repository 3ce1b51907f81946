// The CUDA side of libtorch that tch does not bind: torch.distributed's NCCL process group and the CUDA caching
// allocator's statistics (torch.cuda.max_memory_allocated / reset_peak_memory_stats). Compiled only when the
// CUDA headers are at hand (bin/bootstrap.sh adds nvcc's crt and CCCL headers, which the torch wheel lacks, to
// its CUDA runtime and NCCL headers); otherwise distributed.cpp and native.rs say the build has no CUDA extras.
#include "errors.h"
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <chrono>
#include <cstring>
#define USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

// An NCCL backend over `store` (see distributed.cpp).
c10::intrusive_ptr<c10d::Backend> ablate_make_nccl(const c10::intrusive_ptr<c10d::Store> &store, int rank, int world,
                                                   std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
}


extern "C" {
// Peak bytes the caching allocator handed out (allocated) and held from the driver (reserved) on `device`
// since the last reset.
char *ablate_cuda_peak_memory(int device, int64_t *allocated, int64_t *reserved) {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[all].peak;
    *reserved = stats.reserved_bytes[all].peak;
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Starts the peaks afresh from what is held now (per measurement: a warm-up's peak must not leak into it).
char *ablate_cuda_reset_peak_memory(int device) {
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Free and total bytes of GPU `device` as the driver reports them (torch.cuda.mem_get_info).
char *ablate_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes) {
  try {
    const auto [free, total] =
        c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(static_cast<c10::DeviceIndex>(device));
    *free_bytes = static_cast<int64_t>(free);
    *total_bytes = static_cast<int64_t>(total);
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

// Makes GPU `device` this process's current one (torch.cuda.set_device): NCCL's communicator and any
// kernel launched without an explicit device go there instead of GPU 0.
char *ablate_cuda_set_device(int device) {
  try {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

bool ablate_has_cuda_extras() { return true; }
}
