#include "ampscope/agent/interfaces.h"

#include <array>
#include <cctype>
#include <string>

namespace ampscope::agent {
namespace {
constexpr std::array<std::string_view, kNumTensorRoles> kRoleNames = {
    "weight", "master_weight", "activation", "activation_grad", "weight_grad",
    "optimizer_state", "loss"};
}  // namespace

std::string_view role_name(TensorRole role) {
  const auto i = static_cast<std::size_t>(role);
  return i < kRoleNames.size() ? kRoleNames[i] : "unknown";
}

std::optional<TensorRole> parse_role(std::string_view name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::size_t i = 0; i < kRoleNames.size(); ++i) {
    if (n == kRoleNames[i]) return static_cast<TensorRole>(i);
  }
  return std::nullopt;
}

}  // namespace ampscope::agent
