// Lockstep policy application (config policy_lockstep): before a step begins, wait until the
// server has acknowledged every report handed over before it. The server sends the
// PolicyUpdates that the reports up to n caused before its Ack of n, on the same stream, and the
// transport hands each update to the policy before it reads the next message; so once the
// report of step s-1 is acknowledged, every decision caused by the steps before s is held, and
// the policy applies those due at s as always. A decision's effective step (the server's latest
// step + its lead) then no longer depends on how late the reports and updates travelled: a
// single-rank run takes the same decisions at the same steps every time.
//
// The wait is bounded. It gives up after policy_lockstep_timeout, or at once when the stream
// that was open is lost (the server went away); a wait while no stream has been acknowledged
// yet (the first steps, a server still starting) waits for the timeout. Giving up is counted
// and said once as a notice; from then on steps do not wait, until the
// acknowledgements have caught up with what was waited for and a stream is open again. A step
// whose report was never handed over (dropped, or a re-run after a resume) adds nothing to wait
// for. Without a server there is nothing to wait for (one notice). Shutdown ends a wait through
// Delivery::interrupt_waits.
//
// Owner: the recorder, which calls before_step under its step lock (one thread at a time).
// Giving up is counted by the pipeline (Delivery::count_lockstep_timeout), which reports it.
#pragma once

#include <cstdint>

#include "ampscope/agent/config.h"
#include "notices.h"

namespace ampscope::agent {

class Delivery;

class Lockstep {
 public:
  // Everything is borrowed and must outlive the lockstep.
  Lockstep(const AgentConfig& config, Delivery* delivery, Notices* notices);

  // Before `step` begins (after the pipeline started). Does nothing unless policy_lockstep.
  void before_step(std::int64_t step);

 private:
  const AgentConfig& config_;
  Delivery* delivery_;
  Notices* notices_;

  // The step lock's.
  bool engaged_ = true;
  std::uint64_t behind_seq_ = 0;  // what the wait that gave up was waiting for
};

}  // namespace ampscope::agent
