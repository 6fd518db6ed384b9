#include "pg_connection.h"

#include <libpq-fe.h>

#include <bit>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <utility>
#include <vector>

namespace ampscope::server {
namespace {

// PostgreSQL's type oids (pg_type.dat); libpq does not export them.
constexpr Oid kBytea = 17;
constexpr Oid kInt8 = 20;
constexpr Oid kText = 25;
constexpr Oid kFloat8 = 701;

std::string trimmed(const char* message) {
  std::string s = message != nullptr ? message : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

[[noreturn]] void fail(PGconn* conn, const PGresult* res, std::string_view what,
                       std::string_view sql) {
  std::string msg = "postgresql: " + std::string(what) + " " + std::string(sql.substr(0, 80)) +
                    ": " + trimmed(res != nullptr ? PQresultErrorMessage(res) : nullptr);
  if (res == nullptr || msg.back() == ' ') msg += trimmed(PQerrorMessage(conn));
  if (PQstatus(conn) == CONNECTION_BAD) msg += " (connection to the database lost)";
  throw StoreError(msg);
}

// Owns a PGresult.
struct Result {
  PGresult* res = nullptr;
  explicit Result(PGresult* r) : res(r) {}
  ~Result() { PQclear(res); }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  bool ok() const {
    const ExecStatusType s = PQresultStatus(res);
    return res != nullptr && (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK);
  }
};

template <typename T>
std::string big_endian(T value) {
  auto bits = std::bit_cast<std::uint64_t>(value);
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, bits >>= 8)
    out[static_cast<std::size_t>(i)] = static_cast<char>(bits);
  return out;
}

// A command's row count, for Connection::changes().
void note_changes(PgConnection& c, const PGresult* res) {
  const std::string_view command = PQcmdStatus(const_cast<PGresult*>(res));
  if (command.starts_with("INSERT") || command.starts_with("UPDATE") ||
      command.starts_with("DELETE")) {
    c.set_changes(std::atoll(PQcmdTuples(const_cast<PGresult*>(res))),
                  command.starts_with("DELETE"));
  }
}

class PgStatement : public StatementImpl {
 public:
  PgStatement(PgConnection& c, std::string_view sql) : c_(c) {
    sql_ = postgres_placeholders(sql, &named_);
    params_.resize(named_.size());
  }
  ~PgStatement() override { PQclear(res_); }

  void bind_int(int index, std::int64_t value) override { set(index, kInt8, big_endian(value)); }
  void bind_double(int index, double value) override { set(index, kFloat8, big_endian(value)); }
  void bind_text(int index, std::string_view text) override {
    set(index, kText, std::string(text));
  }
  void bind_blob(int index, const void* data, std::size_t size) override {
    set(index, kBytea, std::string(static_cast<const char*>(data), size));
  }
  void bind_null(int index) override { param(index) = Param{}; }

  bool step() override {
    if (res_ == nullptr) {
      c_.flush();
      execute();
    }
    blobs_.clear();
    return ++row_ < PQntuples(res_);
  }
  void reset() override {
    PQclear(res_);
    res_ = nullptr;
    row_ = -1;
    blobs_.clear();
    for (Param& p : params_) p = Param{};
  }

  std::int64_t column_int(int col) const override {
    if (column_is_null(col)) return 0;
    const char* v = PQgetvalue(res_, row_, col);
    const char* end = v + PQgetlength(res_, row_, col);
    std::int64_t out = 0;
    if (const auto r = std::from_chars(v, end, out); r.ec == std::errc() && r.ptr == end) {
      return out;
    }
    if (end - v == 1 && (*v == 't' || *v == 'f')) return *v == 't';  // a boolean
    return static_cast<std::int64_t>(std::strtod(v, nullptr));       // a numeric
  }
  double column_double(int col) const override {
    return column_is_null(col) ? 0.0 : std::strtod(PQgetvalue(res_, row_, col), nullptr);
  }
  bool column_is_null(int col) const override { return PQgetisnull(res_, row_, col) != 0; }
  std::string column_text(int col) const override {
    return std::string(PQgetvalue(res_, row_, col),
                       static_cast<std::size_t>(PQgetlength(res_, row_, col)));
  }
  std::string_view column_blob(int col) const override {
    if (PQftype(res_, col) != kBytea) return column_text_view(col);
    if (column_is_null(col)) return {};
    auto& slot = blobs_[col];
    if (!slot) {
      std::size_t size = 0;
      unsigned char* bytes = PQunescapeBytea(
          reinterpret_cast<const unsigned char*>(PQgetvalue(res_, row_, col)), &size);
      if (bytes == nullptr) throw StoreError("postgresql: cannot decode a bytea column");
      slot.emplace(reinterpret_cast<const char*>(bytes), size);
      PQfreemem(bytes);
    }
    return *slot;
  }

 private:
  struct Param {
    Oid type = 0;  // 0 (NULL): PostgreSQL infers it from the statement
    std::optional<std::string> value;
  };
  Param& param(int index) {
    if (index < 1 || index > static_cast<int>(params_.size())) {
      throw StoreError("postgresql: no parameter ?" + std::to_string(index) + " in " +
                       sql_.substr(0, 80));
    }
    return params_[static_cast<std::size_t>(index - 1)];
  }
  void set(int index, Oid type, std::string value) { param(index) = Param{type, std::move(value)}; }
  std::string_view column_text_view(int col) const {
    return {PQgetvalue(res_, row_, col), static_cast<std::size_t>(PQgetlength(res_, row_, col))};
  }

  void run() override {
    if (!c_.pipelining()) {
      StatementImpl::run();
      return;
    }
    Bound b = bound();
    const std::string& name =
        c_.prepared(sql_, b.types_key, static_cast<int>(b.types.size()), b.types.data());
    c_.send(name, static_cast<int>(b.types.size()), b.values.data(), b.lengths.data(),
            b.formats.data(), sql_);
    reset();
  }

  // The parameters as libpq takes them (pointing into params_).
  struct Bound {
    std::vector<Oid> types;
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    std::string types_key;
  };
  Bound bound() const {
    const std::size_t n = params_.size();
    Bound b{std::vector<Oid>(n),
            std::vector<const char*>(n),
            std::vector<int>(n),
            std::vector<int>(n, 1),
            {}};
    for (std::size_t i = 0; i < n; ++i) {
      const Param& p = params_[i];
      // A NULL's type is inferred from where it stands; a parameter the SQL never names (a
      // query that uses ?1, ?2 and ?8) has nowhere to stand and still needs one.
      b.types[i] = p.value || named_[i] ? p.type : kText;
      b.values[i] = p.value ? p.value->data() : nullptr;
      b.lengths[i] = p.value ? static_cast<int>(p.value->size()) : 0;
      b.types_key += std::to_string(b.types[i]) + ",";
    }
    return b;
  }

  void execute() {
    const Bound b = bound();
    const int n = static_cast<int>(b.types.size());
    const std::string& name = c_.prepared(sql_, b.types_key, n, b.types.data());
    res_ = PQexecPrepared(c_.handle(), name.c_str(), n, b.values.data(), b.lengths.data(),
                          b.formats.data(), /*resultFormat=*/0);
    const ExecStatusType s = PQresultStatus(res_);
    if (res_ == nullptr || (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)) {
      Result gone(std::exchange(res_, nullptr));
      fail(c_.handle(), gone.res, "step", sql_);
    }
    note_changes(c_, res_);
    row_ = -1;
  }

  PgConnection& c_;
  std::string sql_;
  std::vector<bool> named_;  // per parameter: whether the SQL names it
  std::vector<Param> params_;
  PGresult* res_ = nullptr;
  int row_ = -1;
  mutable std::map<int, std::optional<std::string>> blobs_;  // decoded bytea of the row
};

void ignore_notice(void*, const char*) {}

}  // namespace

std::string postgres_placeholders(std::string_view sql, std::vector<bool>* named) {
  std::string out;
  out.reserve(sql.size());
  named->clear();
  char quote = 0;  // ' or " while inside one
  for (std::size_t i = 0; i < sql.size(); ++i) {
    const char ch = sql[i];
    if (quote != 0) {
      if (ch == quote) quote = 0;  // a doubled quote closes and reopens: same result
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
    } else if (ch == '-' && i + 1 < sql.size() && sql[i + 1] == '-') {
      const std::size_t eol = sql.find('\n', i);
      const std::size_t end = eol == std::string_view::npos ? sql.size() : eol;
      out.append(sql.substr(i, end - i));
      i = end - 1;
      continue;
    } else if (ch == '?' && i + 1 < sql.size() && sql[i + 1] >= '0' && sql[i + 1] <= '9') {
      std::size_t j = i + 1;
      int n = 0;
      while (j < sql.size() && sql[j] >= '0' && sql[j] <= '9') n = n * 10 + (sql[j++] - '0');
      if (n >= 1) {
        if (static_cast<std::size_t>(n) > named->size()) named->resize(static_cast<std::size_t>(n));
        (*named)[static_cast<std::size_t>(n - 1)] = true;
      }
      out += '$';
      out.append(sql.substr(i + 1, j - i - 1));
      i = j - 1;
      continue;
    }
    out += ch;
  }
  return out;
}

std::string mask_conninfo_password(const std::string& conninfo) {
  static const std::regex uri_user(R"(^(postgres(ql)?://[^:/@?]*:)[^@/?]*@)");
  static const std::regex uri_query(R"(([?&]password=)[^&]*)");
  static const std::regex key_value(R"((password\s*=\s*)('([^'\\]|\\.)*'|[^\s']+))");
  if (conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://")) {
    return std::regex_replace(std::regex_replace(conninfo, uri_user, "$1***@"), uri_query, "$1***");
  }
  return std::regex_replace(conninfo, key_value, "$1***");
}

PgConnection::PgConnection(const std::string& conninfo, const std::string& password) {
  // Later keywords override what the expanded dbname (the whole conninfo) says.
  // Earlier keywords are defaults the conninfo may override: a database host that does not
  // answer costs a connection attempt 5 s, not the operating system's TCP timeout (minutes).
  std::vector<const char*> keys = {"connect_timeout", "dbname", "client_encoding",
                                   "fallback_application_name"};
  std::vector<const char*> values = {"5", conninfo.c_str(), "UTF8", "ampscope-server"};
  if (!password.empty()) {
    keys.push_back("password");
    values.push_back(password.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  conn_ = PQconnectdbParams(keys.data(), values.data(), /*expand_dbname=*/1);
  if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    const std::string msg = "postgresql: cannot connect to " + mask_conninfo_password(conninfo) +
                            ": " +
                            (conn_ != nullptr ? trimmed(PQerrorMessage(conn_)) : "out of memory");
    PQfinish(conn_);
    conn_ = nullptr;
    throw StoreError(msg);
  }
  // Notices (an IF NOT EXISTS that found the table) are not the server's log's business.
  PQsetNoticeProcessor(conn_, ignore_notice, nullptr);
}

PgConnection::~PgConnection() { PQfinish(conn_); }

bool PgConnection::broken() const { return PQstatus(conn_) != CONNECTION_OK; }

void PgConnection::exec(std::string_view sql) {
  flush();
  const std::string text(sql);
  Result r(PQexec(conn_, text.c_str()));
  if (!r.ok()) fail(conn_, r.res, "exec", text);
}

Statement PgConnection::prepare(std::string_view sql) {
  return Statement(std::make_unique<PgStatement>(*this, sql));
}

const std::string& PgConnection::prepared(const std::string& sql, const std::string& types_key,
                                          int n_params, const unsigned int* types) {
  const std::string key = types_key + "\n" + sql;
  if (auto it = prepared_.find(key); it != prepared_.end()) return it->second;
  flush();  // PQprepare waits for its answer
  const std::string name = "ampscope_" + std::to_string(prepared_.size() + 1);
  Result r(PQprepare(conn_, name.c_str(), sql.c_str(), n_params, types));
  if (!r.ok()) fail(conn_, r.res, "prepare", sql);
  return prepared_.emplace(key, name).first->second;
}

void PgConnection::commit() {
  writing_ = false;
  exec("COMMIT");  // reads the pipeline's answers first: an error there fails the commit
}

void PgConnection::rollback() {
  writing_ = false;
  try {
    flush();
  } catch (const StoreError&) {
    // The statements being rolled back failed: nothing of them is kept either way.
  }
  exec("ROLLBACK");
}

void PgConnection::send(const std::string& name, int n_params, const char* const* values,
                        const int* lengths, const int* formats, const std::string& sql) {
  // The server answers each statement while the next ones arrive; a pipeline far longer than
  // the sockets' buffers could hold its answers would leave both sides waiting to write.
  constexpr std::size_t kMostInFlight = 1000;
  if (sent_.size() >= kMostInFlight) flush();
  if (PQpipelineStatus(conn_) == PQ_PIPELINE_OFF && PQenterPipelineMode(conn_) != 1) {
    fail(conn_, nullptr, "pipeline", sql);
  }
  if (PQsendQueryPrepared(conn_, name.c_str(), n_params, values, lengths, formats, 0) != 1) {
    fail(conn_, nullptr, "send", sql);
  }
  sent_.push_back(sql);
}

void PgConnection::flush() {
  if (PQpipelineStatus(conn_) == PQ_PIPELINE_OFF) return;
  std::string error;  // the first statement's that failed; the ones after it were skipped
  if (PQpipelineSync(conn_) != 1) error = "postgresql: sync: " + trimmed(PQerrorMessage(conn_));
  for (const std::string& sql : sent_) {
    // Each statement's results, then a null.
    while (PGresult* r = PQgetResult(conn_)) {
      const Result res(r);
      const ExecStatusType s = PQresultStatus(r);
      if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
        note_changes(*this, r);
      } else if (s != PGRES_PIPELINE_ABORTED && error.empty()) {
        error = "postgresql: step " + sql.substr(0, 80) + ": " + trimmed(PQresultErrorMessage(r));
      }
    }
  }
  sent_.clear();
  if (error.empty() || PQstatus(conn_) == CONNECTION_OK) {
    Result sync(PQgetResult(conn_));  // PGRES_PIPELINE_SYNC
  }
  if (PQexitPipelineMode(conn_) != 1 && error.empty()) {
    error = "postgresql: leaving pipeline mode: " + trimmed(PQerrorMessage(conn_));
  }
  if (!error.empty()) {
    if (PQstatus(conn_) == CONNECTION_BAD) error += " (connection to the database lost)";
    throw StoreError(error);
  }
}

std::uint64_t PgConnection::live_bytes() {
  const auto now = std::chrono::steady_clock::now();
  if (!live_bytes_ || now - live_bytes_at_ > std::chrono::minutes(1)) {
    live_bytes_ = static_cast<std::uint64_t>(
        query_int("SELECT coalesce((SELECT sum(pg_column_size(payload)) FROM reports), 0) + "
                  "coalesce((SELECT sum(pg_column_size(stats)) FROM tensor_history), 0)"));
    live_bytes_at_ = now;
  }
  return *live_bytes_;
}

}  // namespace ampscope::server
