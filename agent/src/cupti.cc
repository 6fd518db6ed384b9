// CUPTI: the offline metric check (Profiler Host API, no GPU needed) and the Range Profiler
// collector (GPU). Every CUPTI call is checked; a failure becomes a one-line reason naming the
// call and CUPTI's result, never an exception or a guessed value.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ampscope/agent/cupti.h"
#include "ampscope/cuda/device.h"
#include "cupti_collector.h"

namespace ampscope::agent {
namespace {

constexpr const char* kTimeMetric = "gpu__time_duration.sum";

// A zeroed parameter struct with its size set, as every CUPTI call wants.
template <typename P>
P params(std::size_t struct_size) {
  P p{};
  p.structSize = struct_size;
  return p;
}

std::string result_name(CUptiResult r) {
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == nullptr) {
    return "CUPTI error " + std::to_string(static_cast<int>(r));
  }
  return s;
}

std::string failed(const char* call, CUptiResult r) {
  return std::string(call) + " failed: " + result_name(r);
}

// A host object for one chip, deinitialised on scope exit.
class HostObject {
 public:
  CUptiResult init(const std::string& chip, const std::uint8_t* availability) {
    auto p = params<CUpti_Profiler_Host_Initialize_Params>(CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE);
    p.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    p.pChipName = chip.c_str();
    p.pCounterAvailabilityImage = availability;
    const CUptiResult r = cuptiProfilerHostInitialize(&p);
    if (r == CUPTI_SUCCESS) object_ = p.pHostObject;
    return r;
  }
  ~HostObject() {
    if (object_ == nullptr) return;
    auto p = params<CUpti_Profiler_Host_Deinitialize_Params>(CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE);
    p.pHostObject = object_;
    cuptiProfilerHostDeinitialize(&p);
  }
  CUpti_Profiler_Host_Object* get() const { return object_; }

  CUptiResult add(const std::vector<const char*>& metrics) {
    auto p = params<CUpti_Profiler_Host_ConfigAddMetrics_Params>(CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE);
    p.pHostObject = object_;
    p.ppMetricNames = const_cast<const char**>(metrics.data());
    p.numMetrics = metrics.size();
    return cuptiProfilerHostConfigAddMetrics(&p);
  }

  // The configuration image of the metrics added so far.
  CUptiResult config_image(std::vector<std::uint8_t>* image) {
    auto s = params<CUpti_Profiler_Host_GetConfigImageSize_Params>(CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE);
    s.pHostObject = object_;
    CUptiResult r = cuptiProfilerHostGetConfigImageSize(&s);
    if (r != CUPTI_SUCCESS) return r;
    image->assign(s.configImageSize, 0);
    auto g = params<CUpti_Profiler_Host_GetConfigImage_Params>(CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE);
    g.pHostObject = object_;
    g.configImageSize = image->size();
    g.pConfigImage = image->data();
    return cuptiProfilerHostGetConfigImage(&g);
  }

 private:
  CUpti_Profiler_Host_Object* object_ = nullptr;
};

CUptiResult num_passes(std::vector<std::uint8_t>& image, int* passes) {
  auto p = params<CUpti_Profiler_Host_GetNumOfPasses_Params>(CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE);
  p.configImageSize = image.size();
  p.pConfigImage = image.data();
  const CUptiResult r = cuptiProfilerHostGetNumOfPasses(&p);
  *passes = static_cast<int>(p.numOfPasses);
  return r;
}

// Does `metric` resolve on `chip`? Tried on a fresh host object each time: after one invalid
// name the object may refuse every later addition.
CuptiMetricCheck try_metric(const std::string& chip, const std::uint8_t* availability,
                            const std::string& metric) {
  CuptiMetricCheck m;
  m.name = metric;
  HostObject host;
  CUptiResult r = host.init(chip, availability);
  if (r == CUPTI_SUCCESS) r = host.add({metric.c_str()});
  m.resolves = r == CUPTI_SUCCESS;
  if (!m.resolves) m.error = result_name(r);
  return m;
}

CuptiChipCheck check(const std::string& chip, const std::uint8_t* availability,
                     std::vector<std::uint8_t>* config_out) {
  CuptiChipCheck c;
  c.chip = chip;
  auto sc = params<CUpti_Profiler_Host_GetSupportedChips_Params>(CUpti_Profiler_Host_GetSupportedChips_Params_STRUCT_SIZE);
  if (const CUptiResult r = cuptiProfilerHostGetSupportedChips(&sc); r != CUPTI_SUCCESS) {
    c.error = failed("cuptiProfilerHostGetSupportedChips", r);
    return c;
  }
  for (std::size_t i = 0; i < sc.numChips; ++i) c.supported_chips.emplace_back(sc.ppChipNames[i]);
  if (std::find(c.supported_chips.begin(), c.supported_chips.end(), chip) ==
      c.supported_chips.end()) {
    c.error = "chip '" + chip + "' is not supported by this CUPTI";
    return c;
  }
  c.available = true;
  for (const auto& name : tensor_metric_candidates()) {
    c.candidates.push_back(try_metric(chip, availability, name));
    if (c.tensor_metric.empty() && c.candidates.back().resolves) c.tensor_metric = name;
  }
  const CuptiMetricCheck time = try_metric(chip, availability, kTimeMetric);
  c.candidates.push_back(time);
  if (time.resolves) c.time_metric = kTimeMetric;
  if (c.tensor_metric.empty()) {
    c.error = "no tensor-pipe metric resolves on " + chip;
    return c;
  }
  // The combined configuration the collector would use, and its pass count.
  std::vector<const char*> metrics = {c.tensor_metric.c_str()};
  if (!c.time_metric.empty()) metrics.push_back(c.time_metric.c_str());
  HostObject host;
  std::vector<std::uint8_t> image;
  CUptiResult r = host.init(chip, availability);
  if (r == CUPTI_SUCCESS) r = host.add(metrics);
  if (r == CUPTI_SUCCESS) r = host.config_image(&image);
  if (r == CUPTI_SUCCESS) r = num_passes(image, &c.passes);
  if (r != CUPTI_SUCCESS) {
    c.error = failed("building the configuration image", r);
    c.passes = 0;
    return c;
  }
  c.config_image_bytes = image.size();
  if (config_out != nullptr) *config_out = std::move(image);
  return c;
}

using CuCtxGetCurrent = CUresult (*)(CUcontext*);

// The context current on this thread, through the runtime's driver entry point (the agent
// does not link libcuda: a binary must start on a machine without a driver).
CUcontext current_context(std::string* error) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaFree(nullptr) != cudaSuccess) {  // makes the runtime's primary context current
    *error = "no usable CUDA context";
    return nullptr;
  }
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      fn == nullptr) {
    *error = "cuCtxGetCurrent is not available from the driver";
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (reinterpret_cast<CuCtxGetCurrent>(fn)(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    *error = "no CUDA context is current on the training thread";
    return nullptr;
  }
  return ctx;
}

class RangeCollector final : public CuptiCollector {
 public:
  ~RangeCollector() override {
    if (range_ != nullptr) {
      auto p = params<CUpti_RangeProfiler_Disable_Params>(CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE);
      p.pRangeProfilerObject = range_;
      cuptiRangeProfilerDisable(&p);
    }
  }

  bool init(std::string* error) {
    CUcontext ctx = current_context(error);
    if (ctx == nullptr) return false;
    auto ip = params<CUpti_Profiler_Initialize_Params>(CUpti_Profiler_Initialize_Params_STRUCT_SIZE);
    if (CUptiResult r = cuptiProfilerInitialize(&ip); r != CUPTI_SUCCESS) {
      *error = failed("cuptiProfilerInitialize", r);
      return false;
    }
    int device = 0;
    cudaGetDevice(&device);
    auto cn = params<CUpti_Device_GetChipName_Params>(CUpti_Device_GetChipName_Params_STRUCT_SIZE);
    cn.deviceIndex = static_cast<std::size_t>(device);
    if (CUptiResult r = cuptiDeviceGetChipName(&cn); r != CUPTI_SUCCESS) {
      *error = failed("cuptiDeviceGetChipName", r);
      return false;
    }
    chip_ = cn.pChipName;
    // Which counters this context may use now; another profiler (DCGM, Nsight) holding them
    // shows up here or at enable as CUPTI_ERROR_HARDWARE_BUSY.
    auto ca = params<CUpti_Profiler_GetCounterAvailability_Params>(CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE);
    ca.ctx = ctx;
    if (CUptiResult r = cuptiProfilerGetCounterAvailability(&ca); r != CUPTI_SUCCESS) {
      *error = failed("cuptiProfilerGetCounterAvailability", r);
      return false;
    }
    availability_.assign(ca.counterAvailabilityImageSize, 0);
    ca.pCounterAvailabilityImage = availability_.data();
    if (CUptiResult r = cuptiProfilerGetCounterAvailability(&ca); r != CUPTI_SUCCESS) {
      *error = failed("cuptiProfilerGetCounterAvailability", r);
      return false;
    }
    const CuptiChipCheck c = check(chip_, availability_.data(), &config_);
    if (c.tensor_metric.empty() || c.passes != 1) {
      *error = c.error.empty() ? "the metrics need " + std::to_string(c.passes) +
                                     " passes; a training step cannot be replayed"
                               : c.error;
      return false;
    }
    metric_names_ = {c.tensor_metric};
    if (!c.time_metric.empty()) metric_names_.push_back(c.time_metric);
    for (const auto& m : metric_names_) metrics_.push_back(m.c_str());
    if (CUptiResult r = host_.init(chip_, availability_.data()); r != CUPTI_SUCCESS) {
      *error = failed("cuptiProfilerHostInitialize", r);
      return false;
    }
    if (CUptiResult r = host_.add(metrics_); r != CUPTI_SUCCESS) {
      *error = failed("cuptiProfilerHostConfigAddMetrics", r);
      return false;
    }
    auto en = params<CUpti_RangeProfiler_Enable_Params>(CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE);
    en.ctx = ctx;
    if (CUptiResult r = cuptiRangeProfilerEnable(&en); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerEnable", r);
      return false;
    }
    range_ = en.pRangeProfilerObject;
    auto sz = params<CUpti_RangeProfiler_GetCounterDataSize_Params>(CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE);
    sz.pRangeProfilerObject = range_;
    sz.pMetricNames = metrics_.data();
    sz.numMetrics = metrics_.size();
    sz.maxNumOfRanges = 1;
    sz.maxNumRangeTreeNodes = 1;
    if (CUptiResult r = cuptiRangeProfilerGetCounterDataSize(&sz); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerGetCounterDataSize", r);
      return false;
    }
    counter_data_.assign(sz.counterDataSize, 0);
    return true;
  }

  bool begin(std::int64_t, std::string* error) override {
    // A fresh counter-data image and configuration for every sampled step (one range each).
    auto ci = params<CUpti_RangeProfiler_CounterDataImage_Initialize_Params>(CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE);
    ci.pRangeProfilerObject = range_;
    ci.counterDataSize = counter_data_.size();
    ci.pCounterData = counter_data_.data();
    if (CUptiResult r = cuptiRangeProfilerCounterDataImageInitialize(&ci); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerCounterDataImageInitialize", r);
      return false;
    }
    auto sc = params<CUpti_RangeProfiler_SetConfig_Params>(CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE);
    sc.pRangeProfilerObject = range_;
    sc.configSize = config_.size();
    sc.pConfig = config_.data();
    sc.counterDataImageSize = counter_data_.size();
    sc.pCounterDataImage = counter_data_.data();
    // User ranges keep the step's kernels concurrent (auto ranges would serialise them).
    sc.range = CUPTI_UserRange;
    sc.replayMode = CUPTI_UserReplay;
    sc.maxRangesPerPass = 1;
    sc.numNestingLevels = 1;
    sc.minNestingLevel = 1;
    sc.passIndex = 0;
    sc.targetNestingLevel = 1;
    if (CUptiResult r = cuptiRangeProfilerSetConfig(&sc); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerSetConfig", r);
      return false;
    }
    auto st = params<CUpti_RangeProfiler_Start_Params>(CUpti_RangeProfiler_Start_Params_STRUCT_SIZE);
    st.pRangeProfilerObject = range_;
    if (CUptiResult r = cuptiRangeProfilerStart(&st); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerStart", r);
      return false;
    }
    auto pr = params<CUpti_RangeProfiler_PushRange_Params>(CUpti_RangeProfiler_PushRange_Params_STRUCT_SIZE);
    pr.pRangeProfilerObject = range_;
    pr.pRangeName = "step";
    if (CUptiResult r = cuptiRangeProfilerPushRange(&pr); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerPushRange", r);
      return false;
    }
    return true;
  }

  std::optional<double> end(std::string* error) override {
    auto pp = params<CUpti_RangeProfiler_PopRange_Params>(CUpti_RangeProfiler_PopRange_Params_STRUCT_SIZE);
    pp.pRangeProfilerObject = range_;
    if (CUptiResult r = cuptiRangeProfilerPopRange(&pp); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerPopRange", r);
      return std::nullopt;
    }
    auto sp = params<CUpti_RangeProfiler_Stop_Params>(CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE);
    sp.pRangeProfilerObject = range_;
    if (CUptiResult r = cuptiRangeProfilerStop(&sp); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerStop", r);
      return std::nullopt;
    }
    if (!sp.isAllPassSubmitted) {
      *error = "the configuration needs more than one pass";
      return std::nullopt;
    }
    auto dd = params<CUpti_RangeProfiler_DecodeData_Params>(CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE);
    dd.pRangeProfilerObject = range_;
    if (CUptiResult r = cuptiRangeProfilerDecodeData(&dd); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerDecodeData", r);
      return std::nullopt;
    }
    auto gi = params<CUpti_RangeProfiler_GetCounterDataInfo_Params>(CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE);
    gi.pCounterDataImage = counter_data_.data();
    gi.counterDataImageSize = counter_data_.size();
    if (CUptiResult r = cuptiRangeProfilerGetCounterDataInfo(&gi); r != CUPTI_SUCCESS) {
      *error = failed("cuptiRangeProfilerGetCounterDataInfo", r);
      return std::nullopt;
    }
    if (gi.numTotalRanges < 1) {
      *error = "the range of the step was dropped (" + std::to_string(dd.numOfRangeDropped) +
               " dropped)";
      return std::nullopt;
    }
    std::vector<double> values(metrics_.size(), 0.0);
    auto ev = params<CUpti_Profiler_Host_EvaluateToGpuValues_Params>(CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE);
    ev.pHostObject = host_.get();
    ev.pCounterDataImage = counter_data_.data();
    ev.counterDataImageSize = counter_data_.size();
    ev.rangeIndex = 0;
    ev.ppMetricNames = metrics_.data();
    ev.numMetrics = metrics_.size();
    ev.pMetricValues = values.data();
    if (CUptiResult r = cuptiProfilerHostEvaluateToGpuValues(&ev); r != CUPTI_SUCCESS) {
      *error = failed("cuptiProfilerHostEvaluateToGpuValues", r);
      return std::nullopt;
    }
    // Percent of the active cycles' peak -> a ratio. A value CUPTI could not form (NaN) is
    // not a measurement.
    const double pct = values[0];
    if (!(pct >= 0.0)) {
      *error = "the tensor-pipe metric evaluated to " + std::to_string(pct);
      return std::nullopt;
    }
    return std::clamp(pct / 100.0, 0.0, 1.0);
  }

 private:
  std::string chip_;
  std::vector<std::uint8_t> availability_;
  std::vector<std::uint8_t> config_;
  std::vector<std::uint8_t> counter_data_;
  std::vector<std::string> metric_names_;
  std::vector<const char*> metrics_;
  HostObject host_;
  CUpti_RangeProfiler_Object* range_ = nullptr;
};

}  // namespace

bool cupti_built_in() { return true; }

CuptiChipCheck check_chip(const std::string& chip) {
  // The Host API is not documented as thread-safe; the check is rare, so it is serialised.
  static std::mutex mu;
  std::lock_guard lock(mu);
  return check(chip, nullptr, nullptr);
}

std::unique_ptr<CuptiCollector> CuptiCollector::create(std::string* why_not) {
  if (!cuda::cuda_device_available()) {
    *why_not = "no CUDA device";
    return nullptr;
  }
  auto c = std::make_unique<RangeCollector>();
  if (!c->init(why_not)) return nullptr;
  return c;
}

}  // namespace ampscope::agent
