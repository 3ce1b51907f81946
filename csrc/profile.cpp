// libtorch's own profiler (Kinetic's CPU activity, what torch.profiler records), started and stopped around
// a few training steps; each recorded operator comes back to Rust through a callback. Each function returns
// nullptr on success or a malloc'ed message freed with ablate_free_error.
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdint>
#include <cstdlib>
#include <set>

#include "errors.h"

extern "C" {
typedef void (*ablate_profile_event)(void *context, const char *name, size_t name_len, uint64_t thread,
                                     uint64_t start_ns, uint64_t duration_ns, bool on_cpu);

char *ablate_profiler_start(bool cuda) {
  try {
    // Kineto logs an error for every GPU it cannot query; on a CPU-only machine that is noise, not news.
    setenv("KINETO_LOG_LEVEL", "5", 0);
    using torch::profiler::impl::ActivityType;
    torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda) {
      activities.insert(ActivityType::CUDA);
    }
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}

char *ablate_profiler_stop(ablate_profile_event on_event, void *context) {
  try {
    auto result = torch::autograd::profiler::disableProfiler();
    for (const auto &event : result->events()) {
      const std::string name = event.name();
      on_event(context, name.data(), name.size(), event.startThreadId(), event.startNs(), event.durationNs(),
               event.deviceType() == c10::DeviceType::CPU);
    }
    return nullptr;
  } catch (const std::exception &e) {
    return ablate::error_of(e);
  }
}
}
