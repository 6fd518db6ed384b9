#include "lockstep.h"

#include <chrono>
#include <string>

#include "delivery.h"

namespace ampscope::agent {

Lockstep::Lockstep(const AgentConfig& config, Delivery* delivery, Notices* notices)
    : config_(config), delivery_(delivery), notices_(notices) {}

void Lockstep::before_step(std::int64_t step) {
  if (!config_.policy_lockstep) return;
  if (config_.server.empty()) {
    notices_->raise("lockstep-no-server",
                    "policy: policy_lockstep is on but no server is configured; steps do not wait");
    return;
  }
  if (!engaged_) {
    // Resumed once the acknowledgements caught up with what the wait gave up on.
    if (!delivery_->connected() || delivery_->acked() < behind_seq_) return;
    engaged_ = true;
  }
  std::uint64_t target = 0;
  const auto deadline = std::chrono::steady_clock::now() + config_.policy_lockstep_timeout;
  std::string why;
  switch (delivery_->wait_all_acked(deadline, &target)) {
    case Delivery::AckWait::kAcked:
    case Delivery::AckWait::kInterrupted:  // shutting down
      return;
    case Delivery::AckWait::kTimedOut:
      why = "no acknowledgement within policy_lockstep_timeout_ms " +
            std::to_string(config_.policy_lockstep_timeout.count());
      break;
    case Delivery::AckWait::kLost:
      why = "the stream to the server was lost";
      break;
  }
  engaged_ = false;
  behind_seq_ = target;
  delivery_->count_lockstep_timeout();
  notices_->raise("lockstep",
                  "policy: lockstep gave up before step " + std::to_string(step) + " (" + why +
                      "); steps do not wait until the acknowledgements catch up, and decisions "
                      "may take effect later than in a run that kept in step (counted in "
                      "lockstep_timeouts)");
}

}  // namespace ampscope::agent
