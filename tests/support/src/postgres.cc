#include "ampscope/testing/postgres.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <vector>

#include "ampscope/testing/child_process.h"
#include "ampscope/testing/files.h"
#include "ampscope/testing/wait_until.h"

#ifndef AMPSCOPE_POSTGRES_TEMPLATE_DIR
#error "AMPSCOPE_POSTGRES_TEMPLATE_DIR must name a directory in the build tree for initdb's result"
#endif

namespace ampscope::testing {
namespace fs = std::filesystem;

struct PostgresInstance::State {
  TempDir dir;
  std::vector<std::string> argv;  // postgres's command line, for start()
  std::unique_ptr<ChildProcess> postgres;
  int databases = 0;
};

namespace {

bool is_executable(const fs::path& p) { return ::access(p.c_str(), X_OK) == 0; }

// initdb and postgres refuse to run as root: as root, the `postgres` user runs them. The change
// of user clears the death signal ChildProcess set, so setpriv sets it again: SIGQUIT, the
// postmaster's immediate shutdown, when the process that started it dies without stopping it.
std::vector<std::string> as_server_user(std::vector<std::string> argv) {
  if (::geteuid() != 0) return argv;
  std::vector<std::string> out = {find_in_path("setpriv"), "--reuid=postgres",
                                  "--regid=postgres",      "--init-groups",
                                  "--pdeathsig=SIGQUIT",   "--"};
  if (out[0].empty()) throw std::runtime_error("running as root needs setpriv (util-linux)");
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

void hand_to_server_user(const fs::path& dir) {
  if (::geteuid() != 0) return;
  const passwd* pw = ::getpwnam("postgres");
  if (pw == nullptr) {
    throw std::runtime_error(
        "running as root, PostgreSQL is started as the 'postgres' user, and there is none "
        "(Debian's postgresql package makes it)");
  }
  if (::chown(dir.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
    throw std::runtime_error("cannot chown " + dir.string() + " to postgres");
  }
}

// initdb takes over a second; a copy of its result a tenth of that. The first process of a
// build runs initdb and keeps the cluster it made as a template in the build tree
// (AMPSCOPE_POSTGRES_TEMPLATE_DIR, one per server binary directory); the others copy it, under
// a lock, since ctest runs each test in a process of its own, several at once.
void make_cluster(const std::string& bindir, const fs::path& data) {
  const fs::path cache_root = AMPSCOPE_POSTGRES_TEMPLATE_DIR;
  fs::create_directories(cache_root);
  const fs::path templ = cache_root / std::to_string(std::hash<std::string>{}(bindir));
  const int lock = ::open((templ.string() + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    throw std::runtime_error("cannot lock " + templ.string() + ".lock");
  }
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock};
  std::string output;
  if (!fs::exists(templ / "PG_VERSION")) {
    const int rc =
        run_to_completion(as_server_user({bindir + "/initdb", "-D", data.string(), "-U", "ampscope",
                                          "-A", "trust", "--no-sync", "--locale=C", "-E", "UTF8"}),
                          &output, std::chrono::seconds(120));
    if (rc != 0) throw std::runtime_error("initdb failed (" + std::to_string(rc) + "): " + output);
    fs::remove_all(templ);
    output.clear();
    if (run_to_completion({find_in_path("cp"), "-a", data.string(), templ.string()}, &output) !=
        0) {
      fs::remove_all(templ);  // a template is whole or absent
      throw std::runtime_error("cannot keep the initdb template: " + output);
    }
    return;
  }
  if (run_to_completion({find_in_path("cp"), "-a", templ.string(), data.string()}, &output) != 0) {
    throw std::runtime_error("cannot copy the initdb template: " + output);
  }
}

// One statement on `conninfo`'s database; throws with PostgreSQL's message.
std::string exec(const std::string& conninfo, const std::string& sql) {
  return PostgresConnection(conninfo).value(sql);
}

}  // namespace

std::string postgres_bindir() {
  std::string out;
  if (const std::string pg_config = find_in_path("pg_config"); !pg_config.empty()) {
    const CommandResult r = run_process({pg_config, "--bindir"}, std::chrono::seconds(10));
    out = r.code == 0 ? r.out : "";
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  }
  if (!out.empty() && is_executable(fs::path(out) / "initdb") &&
      is_executable(fs::path(out) / "postgres")) {
    return out;
  }
  std::string best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const fs::path bin = entry.path() / "bin";
    const std::string name = entry.path().filename().string();
    const int version = std::atoi(name.c_str());
    if (version > best_version && is_executable(bin / "initdb") &&
        is_executable(bin / "postgres")) {
      best = bin.string();
      best_version = version;
    }
  }
  return best;
}

PostgresInstance::PostgresInstance(PostgresOptions options) : s_(std::make_unique<State>()) {
  const std::string bindir = postgres_bindir();
  if (bindir.empty()) {
    throw std::runtime_error(
        "PostgreSQL's server binaries (initdb, postgres) were not found, neither in "
        "`pg_config --bindir` nor in /usr/lib/postgresql/*/bin: install Debian's postgresql "
        "package (./run does)");
  }
  hand_to_server_user(s_->dir.path());
  const fs::path data = s_->dir / "data";
  make_cluster(bindir, data);
  const std::string durability = options.durable ? "on" : "off";
  // Unix socket only, in the temporary directory.
  s_->argv =
      as_server_user({bindir + "/postgres", "-D", data.string(), "-k", s_->dir.path().string(),
                      "-c", "listen_addresses=", "-p", "5432", "-c", "fsync=" + durability, "-c",
                      "synchronous_commit=" + durability, "-c", "full_page_writes=" + durability,
                      "-c", "max_connections=" + std::to_string(options.max_connections)});
  start();
}

PostgresInstance::~PostgresInstance() { stop(); }

void PostgresInstance::start() {
  if (s_->postgres) return;
  s_->postgres = std::make_unique<ChildProcess>(s_->argv, s_->dir / "postgres.log");
  const std::string admin = conninfo("postgres");
  if (!wait_until([&] { return PQping(admin.c_str()) == PQPING_OK || !s_->postgres->running(); },
                  std::chrono::seconds(60)) ||
      PQping(admin.c_str()) != PQPING_OK) {
    throw std::runtime_error("postgres did not start: " + s_->postgres->log_tail());
  }
}

void PostgresInstance::stop() {
  if (!s_->postgres) return;
  // SIGINT: PostgreSQL's fast shutdown (SIGTERM would wait for clients to leave).
  ::kill(s_->postgres->pid(), SIGINT);
  if (s_->postgres->wait(std::chrono::seconds(10)) < 0) s_->postgres->kill9();
  s_->postgres.reset();
}

std::string PostgresInstance::conninfo(const std::string& dbname) const {
  return "host=" + s_->dir.path().string() + " port=5432 user=ampscope dbname=" + dbname;
}

std::string PostgresInstance::create_database() {
  const std::string name = "test_" + std::to_string(++s_->databases);
  exec(conninfo("postgres"), "CREATE DATABASE " + name);
  return conninfo(name);
}

pid_t PostgresInstance::pid() const { return s_->postgres ? s_->postgres->pid() : -1; }

std::string PostgresInstance::version() const {
  return exec(conninfo("postgres"), "SELECT version()");
}

std::string PostgresInstance::log_tail() const {
  return s_->postgres ? s_->postgres->log_tail() : "(stopped)";
}

PostgresConnection::PostgresConnection(const std::string& conninfo)
    : conn_(PQconnectdb(conninfo.c_str())) {
  if (PQstatus(conn_) != CONNECTION_OK) {
    const std::string error = PQerrorMessage(conn_);
    PQfinish(conn_);
    throw std::runtime_error("cannot connect to " + conninfo + ": " + error);
  }
}

PostgresConnection::~PostgresConnection() { PQfinish(conn_); }

std::vector<std::vector<std::string>> PostgresConnection::query(
    const std::string& sql, const std::vector<std::string>& params) {
  std::vector<const char*> values;
  for (const std::string& p : params) values.push_back(p.c_str());
  // Without parameters the simple protocol, which takes any statement (CREATE DATABASE too).
  PGresult* r = values.empty() ? PQexec(conn_, sql.c_str())
                               : PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()),
                                              nullptr, values.data(), nullptr, nullptr, 0);
  const ExecStatusType status = PQresultStatus(r);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    const std::string error = PQerrorMessage(conn_);
    PQclear(r);
    throw std::runtime_error(sql + ": " + error);
  }
  std::vector<std::vector<std::string>> rows(static_cast<std::size_t>(PQntuples(r)));
  for (int i = 0; i < PQntuples(r); ++i) {
    for (int j = 0; j < PQnfields(r); ++j) rows[i].emplace_back(PQgetvalue(r, i, j));
  }
  PQclear(r);
  return rows;
}

std::string PostgresConnection::value(const std::string& sql,
                                      const std::vector<std::string>& params) {
  const auto rows = query(sql, params);
  return rows.empty() || rows[0].empty() ? std::string() : rows[0][0];
}

}  // namespace ampscope::testing
