// Checkpoints: "AMPSCKPT", u32 version, u64 header length, a JSON header (config, step, scaler
// and data-loader state, the FP32 overrides; in the FP8/FP4 modes the per-layer GEMM precision
// and fp8-delayed's amax histories, fields an older checkpoint lacks and a reader treats as
// empty), the raw parameter, first- and second-moment buffers in their storage
// dtype, and a CRC-32 (zlib) of everything before it. Written to a temporary file and renamed,
// so a crash never leaves a half-written checkpoint under the final name.
#include <zlib.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "require.h"
#include "ampscope/trainer/trainer.h"

namespace ampscope::trainer {
namespace {

constexpr char kMagic[8] = {'A', 'M', 'P', 'S', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t kVersion = 1;

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T get(const std::string& in, std::size_t& pos, const std::string& path) {
  AMPSCOPE_REQUIRE(pos + sizeof(T) <= in.size(), "checkpoint '", path, "' is truncated");
  T v;
  std::memcpy(&v, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

nlohmann::json scaler_to_json(const ScalerState& s) {
  const auto& c = s.config;
  return {{"kind", scaler_kind_name(c.kind)},
          {"init_scale", c.init_scale},
          {"growth_factor", c.growth_factor},
          {"backoff_factor", c.backoff_factor},
          {"growth_interval", c.growth_interval},
          {"hysteresis", c.hysteresis},
          {"min_scale", c.min_scale},
          {"max_scale", c.max_scale},
          {"scale", s.scale},
          {"growth_tracker", s.growth_tracker},
          {"hysteresis_tracker", s.hysteresis_tracker}};
}

ScalerState scaler_from_json(const nlohmann::json& j) {
  ScalerState s;
  auto kind = parse_scaler_kind(j.at("kind").get<std::string>());
  AMPSCOPE_REQUIRE(kind.has_value(), "checkpoint has an unknown scaler kind");
  s.config.kind = *kind;
  s.config.init_scale = j.at("init_scale").get<float>();
  s.config.growth_factor = j.at("growth_factor").get<double>();
  s.config.backoff_factor = j.at("backoff_factor").get<double>();
  s.config.growth_interval = j.at("growth_interval").get<std::int64_t>();
  s.config.hysteresis = j.at("hysteresis").get<int>();
  s.config.min_scale = j.at("min_scale").get<float>();
  s.config.max_scale = j.at("max_scale").get<float>();
  s.scale = j.at("scale").get<float>();
  s.growth_tracker = j.at("growth_tracker").get<std::int64_t>();
  s.hysteresis_tracker = j.at("hysteresis_tracker").get<int>();
  return s;
}

nlohmann::json model_to_json(const GptConfig& m) {
  return {{"vocab_size", m.vocab_size},
          {"context", m.context},
          {"n_embd", m.n_embd},
          {"n_head", m.n_head},
          {"n_layer", m.n_layer}};
}

}  // namespace

void Trainer::save_checkpoint(const std::string& path) const {
  // Every rank holds the same state: rank 0 writes, the others wait until the file is there.
  if (comm_->rank() == 0) write_checkpoint(path);
  comm_->barrier();
}

void Trainer::write_checkpoint(const std::string& path) const {
  nlohmann::json h;
  h["model"] = model_to_json(config_.model);
  h["precision"] = precision_name(config_.precision);
  h["num_params"] = model_->num_parameters();
  h["step"] = step_;
  h["updates"] = updates_;
  h["seed"] = config_.seed;
  h["scaler"] = scaler_to_json(scaler_.state());
  const auto rng = loader_.rng().state();
  h["data"] = {{"rng", {rng[0], rng[1], rng[2], rng[3]}},
               {"batches_drawn", loader_.batches_drawn()}};
  nlohmann::json overrides = nlohmann::json::array();
  for (const auto& [name, from] : overrides_.entries()) overrides.push_back({name, from});
  h["fp32_overrides"] = overrides;
  nlohmann::json bf16 = nlohmann::json::array();
  for (const auto& [name, from] : gemm_.bf16_entries()) bf16.push_back({name, from});
  h["gemm_bf16"] = bf16;
  nlohmann::json delayed = nlohmann::json::array();
  for (const auto& e : gemm_.delayed_entries()) {
    delayed.push_back({e.layer, e.settings.history_length, e.settings.margin, e.from_step});
  }
  h["gemm_delayed"] = delayed;
  if (delayed_) {
    nlohmann::json histories = nlohmann::json::array();
    for (std::size_t i = 0; i < delayed_->inputs().size(); ++i) {
      const auto history = delayed_->history(i).history();
      histories.push_back({{"name", delayed_->inputs()[i].name},
                           {"history_length", delayed_->settings(i).history_length},
                           {"margin", delayed_->settings(i).margin},
                           {"scale", delayed_->scale(i)},
                           {"amaxes", std::vector<float>(history.begin(), history.end())}});
    }
    h["amax_histories"] = histories;
  }
  const std::string header = h.dump();

  std::string out;
  out.append(kMagic, sizeof(kMagic));
  put(out, kVersion);
  put(out, static_cast<std::uint64_t>(header.size()));
  out += header;
  for (const Tensor& t : {model_->param_buffer(), model_->m_buffer(), model_->v_buffer()}) {
    const std::size_t at = out.size();
    out.resize(at + t.bytes());
    backend_->copy_to_host(out.data() + at, t.data, t.bytes());
  }
  const auto crc = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(out.data()), static_cast<uInt>(out.size())));
  put(out, crc);

  const std::filesystem::path final_path(path);
  if (final_path.has_parent_path()) std::filesystem::create_directories(final_path.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    AMPSCOPE_REQUIRE(f.good(), "cannot write checkpoint '", tmp, "'");
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    f.flush();
    AMPSCOPE_REQUIRE(f.good(), "cannot write checkpoint '", tmp, "'");
  }
  std::filesystem::rename(tmp, final_path);
}

void Trainer::load_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  AMPSCOPE_REQUIRE(f.good(), "cannot open checkpoint '", path, "'");
  std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  AMPSCOPE_REQUIRE(in.size() >= sizeof(kMagic) + 16 &&
                     std::memcmp(in.data(), kMagic, sizeof(kMagic)) == 0,
                 "'", path, "' is not an ampscope checkpoint");
  std::uint32_t stored_crc;
  std::memcpy(&stored_crc, in.data() + in.size() - 4, 4);
  const auto crc = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(in.data()), static_cast<uInt>(in.size() - 4)));
  AMPSCOPE_REQUIRE(crc == stored_crc, "checkpoint '", path, "' is corrupt (CRC mismatch)");
  std::size_t pos = sizeof(kMagic);
  const auto version = get<std::uint32_t>(in, pos, path);
  AMPSCOPE_REQUIRE(version == kVersion, "checkpoint '", path, "' has version ", version,
                 ", expected ", kVersion);
  const auto header_len = get<std::uint64_t>(in, pos, path);
  AMPSCOPE_REQUIRE(pos + header_len <= in.size() - 4, "checkpoint '", path, "' is truncated");
  // Read every header field before changing anything, so a bad file leaves the trainer as it was.
  std::int64_t step = 0, updates = 0, drawn = 0;
  ScalerState scaler;
  std::array<std::uint64_t, 4> rng{};
  std::vector<std::pair<std::string, std::int64_t>> overrides, bf16;
  std::vector<GemmPrecisionSet::DelayedEntry> delayed;
  struct History {
    DelayedSettings settings;
    float scale = 1.0f;
    std::vector<float> amaxes;
  };
  std::vector<History> histories;
  try {
    const nlohmann::json h = nlohmann::json::parse(in.substr(pos, header_len));
    AMPSCOPE_REQUIRE(h.at("model") == model_to_json(config_.model), "checkpoint '", path,
                     "' is for model ", h.at("model").dump(), ", this run is ",
                     model_to_json(config_.model).dump());
    AMPSCOPE_REQUIRE(h.at("precision").get<std::string>() == precision_name(config_.precision),
                     "checkpoint '", path, "' is for precision ",
                     h.at("precision").get<std::string>(), ", this run is ",
                     precision_name(config_.precision));
    AMPSCOPE_REQUIRE(h.at("num_params").get<std::int64_t>() == model_->num_parameters(),
                     "checkpoint '", path, "' has a different parameter count");
    step = h.at("step").get<std::int64_t>();
    updates = h.at("updates").get<std::int64_t>();
    scaler = scaler_from_json(h.at("scaler"));
    const auto& r = h.at("data").at("rng");
    for (std::size_t i = 0; i < 4; ++i) rng[i] = r.at(i).get<std::uint64_t>();
    drawn = h.at("data").at("batches_drawn").get<std::int64_t>();
    for (const auto& e : h.at("fp32_overrides")) {
      overrides.emplace_back(e.at(0).get<std::string>(), e.at(1).get<std::int64_t>());
    }
    for (const auto& e : h.value("gemm_bf16", nlohmann::json::array())) {
      bf16.emplace_back(e.at(0).get<std::string>(), e.at(1).get<std::int64_t>());
    }
    for (const auto& e : h.value("gemm_delayed", nlohmann::json::array())) {
      delayed.push_back({e.at(0).get<std::string>(), {e.at(1).get<int>(), e.at(2).get<int>()},
                         e.at(3).get<std::int64_t>()});
    }
    if (delayed_) {
      const auto& hs = h.at("amax_histories");
      AMPSCOPE_REQUIRE(hs.size() == delayed_->inputs().size(), "checkpoint '", path, "' has ",
                       hs.size(), " amax histories, this run ", delayed_->inputs().size());
      for (std::size_t i = 0; i < hs.size(); ++i) {
        AMPSCOPE_REQUIRE(hs[i].at("name").get<std::string>() == delayed_->inputs()[i].name,
                         "checkpoint '", path, "' has the amax history of ",
                         hs[i].at("name").get<std::string>(), " where this run has ",
                         delayed_->inputs()[i].name);
        histories.push_back({{hs[i].at("history_length").get<int>(), hs[i].at("margin").get<int>()},
                             hs[i].at("scale").get<float>(),
                             hs[i].at("amaxes").get<std::vector<float>>()});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint '" + path + "' has a bad header: " + e.what());
  }
  AMPSCOPE_REQUIRE(validate(scaler.config).empty(), "checkpoint '", path,
                   "' has an invalid scaler: ", validate(scaler.config));
  std::optional<DelayedScaling> restored;
  if (delayed_) {
    restored.emplace(*delayed_);
    for (std::size_t i = 0; i < histories.size(); ++i) {
      restored->restore(i, histories[i].settings, histories[i].amaxes, histories[i].scale);
    }
  }
  pos += header_len;
  std::size_t need = 0;
  for (const Tensor& t : {model_->param_buffer(), model_->m_buffer(), model_->v_buffer()}) {
    need += t.bytes();
  }
  AMPSCOPE_REQUIRE(pos + need == in.size() - 4, "checkpoint '", path,
                   "' has the wrong size for this model");
  for (const Tensor& t : {model_->param_buffer(), model_->m_buffer(), model_->v_buffer()}) {
    backend_->copy_from_host(t.data, in.data() + pos, t.bytes());
    pos += t.bytes();
  }
  model_->zero_grads();
  model_->refresh_compute_weights();
  step_ = step;
  updates_ = updates;
  scaler_.restore(scaler, step_);
  loader_.rng().set_state(rng);
  loader_.set_batches_drawn(drawn);
  overrides_.clear();
  for (const auto& [name, from] : overrides) (void)overrides_.add(name, from);
  gemm_.clear();
  for (const auto& [name, from] : bf16) (void)gemm_.add_bf16(name, from);
  for (const auto& e : delayed) (void)gemm_.set_delayed(e.layer, e.settings, e.from_step);
  if (restored) *delayed_ = std::move(*restored);
}

}  // namespace ampscope::trainer
