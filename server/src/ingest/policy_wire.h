// The policy engine's modes on the wire (ampscope.v1.PolicyMode) and back: the one mapping the
// server's policy host, its store reader and the web UI's API share. Their text is the policy
// library's mode_name ("observe", "static-params", "headroom").
// Thread safety: pure functions.
#pragma once

#include <optional>

#include "ampscope/policy/policy_engine.h"
#include "ampscope/v1/telemetry.pb.h"

namespace ampscope::server {

constexpr v1::PolicyMode mode_to_wire(policy::PolicyMode mode) {
  switch (mode) {
    case policy::PolicyMode::kObserve:
      return v1::POLICY_MODE_OBSERVE;
    case policy::PolicyMode::kStaticParams:
      return v1::POLICY_MODE_STATIC_PARAMS;
    case policy::PolicyMode::kHeadroom:
      return v1::POLICY_MODE_HEADROOM;
  }
  return v1::POLICY_MODE_UNSPECIFIED;
}

// nullopt for UNSPECIFIED or a value this server does not know.
constexpr std::optional<policy::PolicyMode> mode_from_wire(v1::PolicyMode wire) {
  for (const policy::PolicyMode m : {policy::PolicyMode::kObserve,
                                     policy::PolicyMode::kStaticParams,
                                     policy::PolicyMode::kHeadroom}) {
    if (mode_to_wire(m) == wire) return m;
  }
  return std::nullopt;
}

}  // namespace ampscope::server
