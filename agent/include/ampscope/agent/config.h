// The agent's configuration: where to send, where to spool, what to measure and how often.
//
// Every setting has one key, and the three ways to set it use the same keys and the same
// parser (set_option):
//   code                  AgentConfig fields, or set_option(config, "sample_full_every", "50")
//   environment           AMPSCOPE_<KEY in upper case>: AMPSCOPE_SERVER, AMPSCOPE_RUN_ID,
//                         AMPSCOPE_TOKEN, AMPSCOPE_SPOOL_DIR, AMPSCOPE_SAMPLE_FULL_EVERY, ...
//                         (apply_environment)
//   command-line flags    --<key with '-' for '_'>, e.g. ampscope-train --server, --run-id,
//                         --spool-dir, --sample-full-every (the trainer's adapter)
// Later sources override earlier ones; ampscope-train applies code defaults, then the
// environment, then its flags.
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ampscope/agent/interfaces.h"
#include "ampscope/formats.h"
#include "ampscope/recipe.h"

namespace ampscope::agent {

// What to measure (docs/agent.md, "Sampling and the first offender").
//   counts  every step: NaN, +-Inf, zero counts and max |x| of every tensor whose role is in
//           count_roles: by default every gradient and the loss. Weight gradients after
//           unscaling repeat the backward-phase ones and are left to full steps.
//   full    every full_every steps (0: never), and around events: from the first non-finite
//           tensor of a step on (that tensor included), and the whole step after a step that
//           held a non-finite value or changed the loss scale: everything of counts plus
//           min |x|, sums, the binade histogram and the exact overflow/underflow/subnormal
//           counts against the run's compute format at the step's loss scale, for every
//           tensor whose role is in full_roles.
// The first offender is the first *measured* tensor that held a non-finite value. With the
// defaults a fault born in the forward pass shows first in the loss (and the next step is a
// full one); adding "activation" to count_roles finds the activation itself, for about one
// more read of the forward pass's activations per step.
//
// Which ranks send full statistics (full_ranks; docs/agent.md, "Which ranks send full
// statistics"), so that the server's load grows with the nodes of a large job rather than its
// GPUs. Every rank counts every step as above, reports its loss, scales, found_inf and skip
// and its own first offender, and measures in full from its own first non-finite tensor on
// within a step (where a fault is born is never lost); only the chosen ranks also take the
// full steps (every full_every steps, the step after a non-finite value or a scale change)
// and keep the flight recorder.
//   auto     all when world_size <= kFullRanksAllUpTo, node beyond
//   all      every rank
//   node     the ranks whose local rank is 0: one per node (local_rank_of below)
//   every:K  the ranks r with r % K == 0
//   R,R,...  the ranks listed
struct FullRanks {
  enum class Kind : std::uint8_t { kAuto, kAll, kNode, kEvery, kList };
  Kind kind = Kind::kAuto;
  std::uint32_t every = 1;           // kEvery: K >= 1
  std::vector<std::uint32_t> ranks;  // kList (set_option sorts them, without repeats)
};
// Up to 8 nodes of 8 GPUs every rank sends everything, as a single machine's run does.
inline constexpr std::uint32_t kFullRanksAllUpTo = 64;

struct SamplingConfig {
  bool counts = true;
  std::vector<TensorRole> count_roles = {TensorRole::kActivationGrad, TensorRole::kWeightGrad,
                                         TensorRole::kLoss};
  std::int64_t full_every = 100;
  bool full_on_nonfinite = true;
  bool full_on_scale_change = true;
  std::vector<TensorRole> full_roles = {TensorRole::kWeight,     TensorRole::kMasterWeight,
                                        TensorRole::kActivation, TensorRole::kActivationGrad,
                                        TensorRole::kWeightGrad, TensorRole::kOptimizerState,
                                        TensorRole::kLoss};
  // Tensors measured per step at most; the rest are counted in dropped_tensors.
  int max_tensors_per_step = 4096;
  // CUPTI tensor-core utilisation on every Nth step (0: off). GPU runs only.
  std::int64_t cupti_every = 100;
  FullRanks full_ranks;
};

// Where CPU tensors are measured: on the training thread during the callback, or on the
// agent's worker thread from a copy (which the training thread makes; the copies of a step
// are bounded by worker_max_bytes, beyond which samples are dropped and counted).
enum class StatsThread : std::uint8_t { kCaller = 0, kWorker = 1 };

// How the ranks of a run apply the server's policy updates together (docs/multi-rank.md).
//   auto         single when world_size is 1, otherwise none
//   single       one rank: an update applies at its effective_from_step if it arrived in time
//   per_step     the host reduces every rank's vote each step (Agent::policy_vote, max
//                all-reduce of {-received_seq, fallback}) and hands the result to
//                Agent::policy_agreed before the next step; every rank applies the updates up
//                to the agreed seq at the same step (late if delivery was late) and falls back
//                to its local scaler on the same step
//   none         several ranks, no agreement: updates are refused, and the outcome says why
//   independent  several ranks applying updates on their own as a single rank does: unsafe
//                (ranks may apply on different steps and diverge); for negative controls
enum class PolicyAgreementMode : std::uint8_t { kAuto, kSingle, kPerStep, kNone, kIndependent };

struct AgentConfig {
  // The run as the server sees it.
  // host:port of ampscope-server, or several separated by commas ("a:50051,b:50051"): tried
  // in order, the next on a failure, and a server's redirect to the run's owner followed
  // (docs/agent.md, "Several servers"); empty: measure and spool only.
  std::string server;
  std::string run_id;  // required, 1..128 of [A-Za-z0-9._-]
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  // This rank's index among the ranks on its node (-1: the launcher's, local_rank_of()).
  std::int32_t local_rank = -1;
  // Ranks holding replicas that split each batch (0: world_size), and whether their weight
  // gradients are sharded (ZeRO/FSDP) rather than replicated: the server merges ranks by it.
  std::uint32_t data_parallel_size = 0;
  bool gradients_sharded = false;
  PolicyAgreementMode policy_agreement = PolicyAgreementMode::kAuto;
  // Fault injection for tests of the agreement: a PolicyUpdate counts as received only this
  // long after it arrived (0: at once).
  std::chrono::milliseconds policy_receive_delay{0};
  // Lockstep policy application, for evaluations that must repeat exactly (docs/agent.md,
  // "Lockstep"). On: begin_step(s) first waits until the server has acknowledged every report
  // handed over before it (the report of step s-1); the server sends the decisions a report
  // caused before its Ack, so every decision caused by the steps before s is held when s
  // begins, and a decision takes effect at the same step on every run, whatever the timing.
  // The wait is bounded: after policy_lockstep_timeout, or at once when the stream that was
  // open is lost, it gives up (a notice, Counters::lockstep_timeouts) and steps do not wait
  // again until the acknowledgements have caught up. Off: the loop is asynchronous.
  bool policy_lockstep = false;
  std::chrono::milliseconds policy_lockstep_timeout{10000};
  std::string token;  // sent as "authorization: Bearer <token>"; empty: none
  // TLS to the server (docs/security.md). On when `tls` is set or a tls_*_file option is
  // given: the server's certificate is checked against tls_ca_pem (empty: the system's CAs);
  // for mutual TLS this agent presents tls_cert_pem with its key tls_key_pem (both or neither).
  bool tls = false;
  std::string tls_ca_pem;
  std::string tls_cert_pem;
  std::string tls_key_pem;

  // Durable transport.
  std::string spool_dir;                         // empty: <temp>/ampscope-spool
  std::uint64_t spool_max_bytes = 256ull << 20;  // beyond it reports are dropped, counted
  std::uint64_t spool_segment_bytes = 4ull << 20;
  std::size_t queue_steps = 256;    // steps waiting for the worker, at most
  std::size_t max_batch = 64;       // reports per network flush
  std::size_t max_in_flight = 256;  // reports sent and not yet acknowledged
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{5000};
  std::chrono::milliseconds connect_timeout{2000};
  // Client keepalive: the server accepts pings every 10 s or slower (telemetry.proto).
  std::chrono::milliseconds keepalive_time{30000};
  std::chrono::milliseconds keepalive_timeout{10000};
  std::chrono::milliseconds flush_timeout{10000};  // shutdown waits this long for acks
  // The local scaler's configuration comes back when the server has been unreachable this
  // long after a policy update changed it (0: never).
  std::chrono::milliseconds policy_fallback_after{60000};

  // Measurement.
  SamplingConfig sampling;
  // The flight recorder (docs/agent.md, "Flight recorder"): the full statistics of the last
  // flight_recorder_steps steps (0: off) that their reports did not carry in full, kept in
  // memory up to flight_recorder_bytes and sent once, with the report of a step that held a
  // non-finite value, was skipped, or whose underflow rose above the alert threshold. It keeps
  // what a step measured in full anyway (device tensors, statistics handed over by
  // observe_stats); the roles in flight_recorder_roles are measured in full on every step for it
  // (a cost: one more read of those tensors) and reported as the sampling says.
  std::size_t flight_recorder_steps = 16;
  std::uint64_t flight_recorder_bytes = 4ull << 20;
  std::vector<TensorRole> flight_recorder_roles;
  StatsThread stats_thread = StatsThread::kCaller;
  std::uint64_t worker_max_bytes = 256ull << 20;
  // Scaled recipes (ampscope/recipe.h) every host tensor measured at the full level is also
  // counted against, where its full statistics are computed (the worker thread with
  // stats_thread=worker): each becomes a quantiser entry of the step's report named
  // "TENSOR [RECIPE]" (canonical recipe text), with the tensor's role, phase and micro-step.
  // Device tensors and statistics handed over by observe_stats are not counted.
  // At most kMaxRecipeTargets, no recipe twice, each one parse_recipe reads back as itself.
  std::vector<Recipe> recipe_targets;
  bool nvtx = true;
};

inline constexpr std::size_t kMaxRecipeTargets = 8;

// Sets one option from text. Keys (values):
//   server, run_id, token, spool_dir (strings); token_file (reads the first line);
//   tls (bool); tls_ca_file, tls_cert_file, tls_key_file (read whole, PEM; each turns TLS on);
//   rank, world_size, data_parallel_size, spool_max_bytes, spool_segment_bytes, queue_steps,
//   max_batch, max_in_flight, worker_max_bytes (integers; sizes take K/M/G suffixes);
//   backoff_initial_ms, backoff_max_ms, connect_timeout_ms, keepalive_time_ms,
//   keepalive_timeout_ms, flush_timeout_ms, policy_fallback_after_ms,
//   policy_receive_delay_ms, policy_lockstep_timeout_ms (milliseconds); gradients_sharded,
//   policy_lockstep (bool);
//   policy_agreement (auto|single|per_step|none|independent);
//   stats_thread (caller|worker); nvtx (bool); recipe_targets (comma-separated recipes,
//   parse_recipe's texts: "mxfp8_e4m3,nvfp4,e4m3:current"; empty for none);
//   sample_counts, sample_full_on_nonfinite, sample_full_on_scale_change (bool: 1/0,
//   true/false, on/off, yes/no); sample_full_every, sample_max_tensors, cupti_every (integers);
//   sample_count_roles, sample_full_roles (comma-separated roles, or "all", or "none");
//   flight_recorder_steps (integer in [0, 1024]), flight_recorder_bytes (size in [0, 8M]),
//   flight_recorder_roles (roles, as sample_full_roles);
//   sample_full_ranks (auto|all|node|every:K|comma-separated ranks), local_rank (an integer
//   in [0, 65535], or auto).
// Keys may use '-' for '_'. Returns an empty string on success, otherwise one line naming the
// key and the problem; the config is unchanged on failure.
std::string set_option(AgentConfig& config, std::string_view key, std::string_view value);

// Every key set_option knows, in documentation order.
const std::vector<std::string_view>& option_keys();

// Applies AMPSCOPE_<KEY> for every key that is set in the environment. Returns the first error
// (naming the variable), or empty.
std::string apply_environment(AgentConfig& config);

// Empty when the configuration can be used, otherwise one line naming the field.
std::string validate(const AgentConfig& config);

// This rank's local rank: config.local_rank when set, otherwise the first of the launchers'
// variables LOCAL_RANK (torchrun), OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun),
// MPI_LOCALRANKID (MPICH and Intel MPI's Hydra) and SLURM_LOCALID (srun) that is set, read
// as set_option reads local_rank; nullopt when none is set or the first set is not a local rank.
std::optional<std::uint32_t> local_rank_of(const AgentConfig& config);

// Whether this rank sends full statistics under sampling.full_ranks (SamplingConfig), auto
// resolved by world_size. `local_rank`: local_rank_of(config); node without one is true (the
// rank cannot tell whether another rank of its node sends them, so it does).
bool sends_full_stats(const AgentConfig& config, std::optional<std::uint32_t> local_rank);

// full_ranks as set_option reads it ("auto", "every:8", "0,8,16").
std::string full_ranks_text(const FullRanks& ranks);

// The mode in force: kAuto resolved by world_size.
PolicyAgreementMode resolved_agreement(const AgentConfig& config);
std::string_view agreement_name(PolicyAgreementMode mode);

}  // namespace ampscope::agent
