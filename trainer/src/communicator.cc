// The single-process communicator, the launch detection and the --comm vocabulary.
#include "ampscope/trainer/communicator.h"

#include <array>
#include <cstdlib>
#include <utility>

#include "ampscope/check.h"

namespace ampscope::trainer {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  bool supports(Device) const override { return true; }
  void all_reduce_sum(const Tensor& x, Stream&) override {
    AMPSCOPE_CHECK(x.dtype == Format::kFP32, "all_reduce_sum takes FP32 tensors");
  }
  void all_reduce_max(std::span<double>) override {}
  void broadcast(std::span<std::byte>, int root) override {
    AMPSCOPE_CHECK(root == 0, "broadcast from rank ", root, " of 1");
  }
  void barrier() override {}
};

constexpr std::array<std::pair<CommKind, std::string_view>, 4> kCommKinds = {{
    {CommKind::kAuto, "auto"},
    {CommKind::kSingle, "single"},
    {CommKind::kMpi, "mpi"},
    {CommKind::kNccl, "nccl"},
}};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

std::string_view comm_kind_name(CommKind kind) {
  for (const auto& [k, name] : kCommKinds) {
    if (k == kind) return name;
  }
  return "?";
}

std::optional<CommKind> parse_comm_kind(std::string_view name) {
  for (const auto& [k, n] : kCommKinds) {
    if (n == name) return k;
  }
  return std::nullopt;
}

CommKind resolve_comm_kind(CommKind requested, Device device, bool under_mpi) {
  if (requested != CommKind::kAuto) return requested;
  if (!under_mpi) return CommKind::kSingle;
  return device == Device::kCpu ? CommKind::kMpi : CommKind::kNccl;
}

}  // namespace ampscope::trainer
