#include "query_service.h"

#include "log.h"
#include "validation.h"

namespace ampscope::server {
namespace {

grpc::Status not_found(const std::string& run_id) {
  return grpc::Status(grpc::StatusCode::NOT_FOUND, "run '" + run_id + "' is not known");
}

// The caller's token must be a reader's or an admin's (every RPC but DeleteRun reads).
grpc::Status authorize(grpc::CallbackServerContext* context, const Authenticator& auth,
                       Metrics& metrics, std::string_view rpc, AccessRole needed) {
  Principal who;
  grpc::Status status = auth.authorize(*context, rpc, needed, &who);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    metrics.auth_failure(AuthSurface::grpc);
  }
  return status;
}

// Runs `body` unless a reader may not make the call, mapping store errors to INTERNAL, and
// finishes.
template <typename Body>
grpc::ServerUnaryReactor* respond(grpc::CallbackServerContext* context, const Authenticator& auth,
                                  Metrics& metrics, std::string_view rpc, Body&& body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = authorize(context, auth, metrics, rpc, AccessRole::kReader);
  if (status.ok()) {
    try {
      status = body();
    } catch (const std::exception& e) {
      log_error("query failed: ", e.what());
      status = grpc::Status(grpc::StatusCode::INTERNAL, std::string("store: ") + e.what());
    }
  }
  reactor->Finish(status);
  return reactor;
}

grpc::Status check_run_id_arg(const std::string& run_id) {
  if (std::optional<Violation> v = check_run_id(run_id, "run_id")) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, v->message);
  }
  return grpc::Status::OK;
}

grpc::Status invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// after_report_id belongs to REPORT_ORDER_ARRIVAL and page_token to REPORT_ORDER_STEP: with the
// other order either would be ignored, and a client would take unfiltered answers for filtered
// ones.
grpc::Status check_order_fields(const v1::GetReportsRequest& q) {
  const bool arrival = q.order() == v1::REPORT_ORDER_ARRIVAL;
  if (!arrival && q.after_report_id() != 0) {
    return invalid("after_report_id: only with order REPORT_ORDER_ARRIVAL (page with page_token)");
  }
  if (q.page_token().empty()) return grpc::Status::OK;
  if (arrival) {
    return invalid("page_token: only with order REPORT_ORDER_STEP (continue with after_report_id)");
  }
  if (!parse_page_token(q.page_token())) {
    return invalid(
        "page_token: not a token this server issued; pass a response's "
        "next_page_token unchanged");
  }
  return grpc::Status::OK;
}

}  // namespace

QueryService::QueryService(StoreReader& store, const StreamTable& streams, const RunRegistry& runs,
                           Ingest& ingest, const Authenticator& auth, Metrics& metrics)
    : store_(store),
      streams_(streams),
      runs_(runs),
      ingest_(ingest),
      auth_(auth),
      metrics_(metrics) {}

void QueryService::add_live_facts(v1::RunSummary* summary) const {
  server::add_live_facts(live_facts(streams_, runs_, summary->run_id()), summary);
}

grpc::ServerUnaryReactor* QueryService::ListRuns(grpc::CallbackServerContext* context,
                                                 const v1::ListRunsRequest* request,
                                                 v1::ListRunsResponse* response) {
  return respond(context, auth_, metrics_, "ListRuns", [&] {
    for (v1::RunSummary& s : store_.list_runs(request->limit())) {
      add_live_facts(&s);
      *response->add_runs() = std::move(s);
    }
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::GetRun(grpc::CallbackServerContext* context,
                                               const v1::GetRunRequest* request,
                                               v1::GetRunResponse* response) {
  return respond(context, auth_, metrics_, "GetRun", [&] {
    if (grpc::Status s = check_run_id_arg(request->run_id()); !s.ok()) return s;
    std::optional<v1::GetRunResponse> run = store_.get_run(request->run_id(), request->limit());
    if (!run) return not_found(request->run_id());
    *response = std::move(*run);
    const LiveFacts facts = live_facts(streams_, runs_, request->run_id());
    server::add_live_facts(facts, response->mutable_summary());
    mark_connected(facts, *response->mutable_agents());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::GetReports(grpc::CallbackServerContext* context,
                                                   const v1::GetReportsRequest* request,
                                                   v1::GetReportsResponse* response) {
  return respond(context, auth_, metrics_, "GetReports", [&] {
    if (grpc::Status s = check_run_id_arg(request->run_id()); !s.ok()) return s;
    if (request->from_step() < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "from_step: must be >= 0");
    }
    if (request->to_step() < 0 ||
        (request->to_step() > 0 && request->to_step() < request->from_step())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "to_step: must be 0 (no bound) or >= from_step");
    }
    if (!v1::ReportOrder_IsValid(request->order())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "order: unknown value");
    }
    if (grpc::Status s = check_order_fields(*request); !s.ok()) return s;
    std::optional<v1::GetReportsResponse> reports = store_.get_reports(*request);
    if (!reports) return not_found(request->run_id());
    *response = std::move(*reports);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::GetPolicy(grpc::CallbackServerContext* context,
                                                  const v1::GetPolicyRequest* request,
                                                  v1::GetPolicyResponse* response) {
  return respond(context, auth_, metrics_, "GetPolicy", [&] {
    if (grpc::Status s = check_run_id_arg(request->run_id()); !s.ok()) return s;
    std::optional<v1::GetPolicyResponse> policy = store_.get_policy(request->run_id());
    if (!policy) return not_found(request->run_id());
    *response = std::move(*policy);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::GetStepHistory(grpc::CallbackServerContext* context,
                                                       const v1::GetStepHistoryRequest* request,
                                                       v1::GetStepHistoryResponse* response) {
  return respond(context, auth_, metrics_, "GetStepHistory", [&] {
    if (grpc::Status s = check_run_id_arg(request->run_id()); !s.ok()) return s;
    if (request->step() < 0) return invalid("step: must be >= 0");
    if (request->tensors_size() > 64) return invalid("tensors: at most 64 names");
    std::optional<v1::GetStepHistoryResponse> history = store_.get_step_history(*request);
    if (!history) return not_found(request->run_id());
    *response = std::move(*history);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::DeleteRun(grpc::CallbackServerContext* context,
                                                  const v1::DeleteRunRequest* request,
                                                  v1::DeleteRunResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Principal who;
  grpc::Status status = auth_.authorize(*context, "DeleteRun", AccessRole::kAdmin, &who);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    metrics_.auth_failure(AuthSurface::grpc);
  }
  // Deleting is the one call that destroys data: the log says who asked, refused or not.
  if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    log_warning("runs: DeleteRun of '", request->run_id(), "' refused (", status.error_message(),
                ") for ", describe_caller(*context, who, auth_));
  }
  if (status.ok()) status = check_run_id_arg(request->run_id());
  if (!status.ok()) {
    reactor->Finish(status);
    return reactor;
  }
  const std::string run_id = request->run_id();
  const std::string caller = describe_caller(*context, who, auth_);
  auto answer = [reactor, response, run_id, caller](const DeleteOutcome& o) {
    switch (o.result) {
      case DeleteOutcome::Result::kDeleted:
        log_info("runs: run '", run_id, "' deleted at the request of ", caller);
        response->set_deleted_reports(static_cast<std::uint64_t>(o.reports));
        response->set_streams_ended(static_cast<std::uint32_t>(o.streams_ended));
        reactor->Finish(grpc::Status::OK);
        return;
      case DeleteOutcome::Result::kNotFound:
        reactor->Finish(not_found(run_id));
        return;
      case DeleteOutcome::Result::kFailed:
        reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "store: " + o.error));
        return;
    }
  };
  if (!ingest_.delete_run(run_id, std::move(answer))) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down"));
  }
  return reactor;
}

}  // namespace ampscope::server
