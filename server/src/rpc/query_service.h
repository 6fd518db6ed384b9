// The Query service: unary ListRuns, GetRun, GetReports, GetPolicy and GetStepHistory over the
// store, plus the
// live facts only the running server knows (connected agents, duplicates since start), and
// DeleteRun, which the ingest thread carries out (the store's only writer) and answers.
//
// Thread safety: handlers run on gRPC's threads; StoreReader serialises them; a DeleteRun is
// finished from the ingest thread.
#pragma once

#include "ampscope/v1/query.grpc.pb.h"
#include "auth.h"
#include "ingest.h"
#include "live_facts.h"
#include "metrics.h"
#include "run_registry.h"
#include "store.h"
#include "streams.h"

namespace ampscope::server {

class QueryService final : public v1::Query::CallbackService {
 public:
  QueryService(StoreReader& store, const StreamTable& streams, const RunRegistry& runs,
               Ingest& ingest, const Authenticator& auth, Metrics& metrics);

  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* context,
                                     const v1::ListRunsRequest* request,
                                     v1::ListRunsResponse* response) override;
  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* context,
                                   const v1::GetRunRequest* request,
                                   v1::GetRunResponse* response) override;
  grpc::ServerUnaryReactor* GetReports(grpc::CallbackServerContext* context,
                                       const v1::GetReportsRequest* request,
                                       v1::GetReportsResponse* response) override;
  grpc::ServerUnaryReactor* GetPolicy(grpc::CallbackServerContext* context,
                                      const v1::GetPolicyRequest* request,
                                      v1::GetPolicyResponse* response) override;
  grpc::ServerUnaryReactor* GetStepHistory(grpc::CallbackServerContext* context,
                                           const v1::GetStepHistoryRequest* request,
                                           v1::GetStepHistoryResponse* response) override;
  grpc::ServerUnaryReactor* DeleteRun(grpc::CallbackServerContext* context,
                                      const v1::DeleteRunRequest* request,
                                      v1::DeleteRunResponse* response) override;

 private:
  void add_live_facts(v1::RunSummary* summary) const;

  StoreReader& store_;
  const StreamTable& streams_;
  const RunRegistry& runs_;
  Ingest& ingest_;
  const Authenticator& auth_;
  Metrics& metrics_;
};

}  // namespace ampscope::server
