// NVTX ranges of the agent, in the domain "ampscope": the step and its phases on the training
// thread, and the agent's own work on its threads. Header-only NVTX v3 from the CUDA toolkit
// (nvtx3/nvtx3.hpp); near free when no tool is attached. Where the header is absent (or the
// build defines AMPSCOPE_AGENT_NO_NVTX) every call compiles to nothing.
// Thread safety: ranges are per thread (push/pop pairs on one thread).
#pragma once

#include <cstdint>

#if !defined(AMPSCOPE_AGENT_NO_NVTX) && defined(__has_include)
#if __has_include(<nvtx3/nvtx3.hpp>)
#include <nvtx3/nvtx3.hpp>
#define AMPSCOPE_AGENT_HAVE_NVTX 1
#endif
#endif

namespace ampscope::agent::nvtx {

enum class Range : std::uint8_t {
  kStep = 0,
  kForward,
  kBackward,
  kUnscaleCheck,
  kOptimizer,
  kAgentObserve,  // the agent inside an observe() call
  kAgentEncode,   // the worker: measuring copies, encoding and spooling a step
  kAgentSend,     // the sender: one batch onto the stream
  kCount
};

#ifdef AMPSCOPE_AGENT_HAVE_NVTX
struct Domain {
  static constexpr const char* name{"ampscope"};
};

inline const char* range_name(Range r) {
  static constexpr const char* kNames[] = {"step",          "forward",       "backward",
                                           "unscale/check", "optimizer",     "agent.observe",
                                           "agent.encode",  "agent.send"};
  return kNames[static_cast<int>(r)];
}

// Registered once per name (NVTX's advice: cache registered strings).
inline nvtxStringHandle_t handle(Range r) {
  static const auto handles = [] {
    struct Table {
      nvtxStringHandle_t h[static_cast<int>(Range::kCount)];
    } t{};
    for (int i = 0; i < static_cast<int>(Range::kCount); ++i) {
      t.h[i] = nvtxDomainRegisterStringA(nvtx3::domain::get<Domain>(),
                                         range_name(static_cast<Range>(i)));
    }
    return t;
  }();
  return handles.h[static_cast<int>(r)];
}

inline constexpr bool kEnabled = true;

// payload >= 0 is attached as an int64 (the step number of a step range).
inline void push(Range r, std::int64_t payload = -1) noexcept {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = handle(r);
  if (payload >= 0) {
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = payload;
  }
  nvtxDomainRangePushEx(nvtx3::domain::get<Domain>(), &a);
}
inline void pop() noexcept { nvtxDomainRangePop(nvtx3::domain::get<Domain>()); }
#else
inline constexpr bool kEnabled = false;
inline void push(Range, std::int64_t = -1) noexcept {}
inline void pop() noexcept {}
#endif

class Scoped {
 public:
  explicit Scoped(Range r, bool on = true) noexcept : on_(on) {
    if (on_) push(r);
  }
  ~Scoped() {
    if (on_) pop();
  }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  bool on_;
};

}  // namespace ampscope::agent::nvtx
