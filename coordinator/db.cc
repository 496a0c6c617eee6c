#include "coordinator/db.h"

#include <sqlite3.h>

namespace ring::coord {

namespace {
[[noreturn]] void fail(sqlite3* db, const std::string& what, const std::string& sql) {
  throw DbError(what + ": " + (db ? sqlite3_errmsg(db) : "out of memory") +
                (sql.empty() ? "" : " (in: " + sql.substr(0, 200) + ")"));
}
}  // namespace

Stmt::~Stmt() {
  sqlite3_finalize(s_);
}

Stmt& Stmt::bind(int i, int64_t v) {
  if (sqlite3_bind_int64(s_, i, v) != SQLITE_OK) fail(db_, "bind", sql_);
  return *this;
}
Stmt& Stmt::bind(int i, double v) {
  if (sqlite3_bind_double(s_, i, v) != SQLITE_OK) fail(db_, "bind", sql_);
  return *this;
}
Stmt& Stmt::bind(int i, std::string_view v) {
  if (sqlite3_bind_text64(s_, i, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8) != SQLITE_OK)
    fail(db_, "bind", sql_);
  return *this;
}
Stmt& Stmt::bind(int i, std::nullptr_t) {
  if (sqlite3_bind_null(s_, i) != SQLITE_OK) fail(db_, "bind", sql_);
  return *this;
}

bool Stmt::step() {
  int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) {
    sqlite3_reset(s_);
    return false;
  }
  sqlite3_reset(s_);
  fail(db_, "step", sql_);
}

void Stmt::run() {
  while (step()) {
  }
}

void Stmt::reset() {
  sqlite3_reset(s_);
  sqlite3_clear_bindings(s_);
}

bool Stmt::is_null(int col) const {
  return sqlite3_column_type(s_, col) == SQLITE_NULL;
}
int64_t Stmt::i64(int col) const {
  return sqlite3_column_int64(s_, col);
}
double Stmt::f64(int col) const {
  return sqlite3_column_double(s_, col);
}
std::string Stmt::text(int col) const {
  const unsigned char* p = sqlite3_column_text(s_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, col))
           : std::string();
}
std::optional<int64_t> Stmt::opt_i64(int col) const {
  if (is_null(col)) return std::nullopt;
  return i64(col);
}
std::optional<double> Stmt::opt_f64(int col) const {
  if (is_null(col)) return std::nullopt;
  return f64(col);
}

Db::Db(const std::string& path, Options opts) {
  int flags = opts.read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  int rc = sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw DbError("cannot open database " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db_, opts.busy_timeout_ms);
  if (opts.read_only) {
    exec("PRAGMA query_only=ON");
    return;
  }
  exec("PRAGMA journal_mode=WAL");
  exec(std::string("PRAGMA synchronous=") + (opts.synchronous_full ? "FULL" : "NORMAL"));
  exec("PRAGMA foreign_keys=ON");
  // journal_mode=WAL returns the mode; check that it took (e.g. not on a read-only medium).
  Stmt& s = prepare("PRAGMA journal_mode");
  std::string mode = s.step() ? s.text(0) : "";
  s.reset();
  if (mode != "wal") throw DbError("database " + path + ": WAL mode refused (got '" + mode + "')");
}

Db::~Db() {
  cache_.clear();
  if (db_) sqlite3_close(db_);
}

void Db::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw DbError("exec: " + msg + " (in: " + sql.substr(0, 200) + ")");
  }
}

Stmt& Db::prepare(const std::string& sql) {
  auto it = cache_.find(sql);
  if (it != cache_.end()) {
    it->second->reset();
    return *it->second;
  }
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), static_cast<int>(sql.size()), &s, nullptr) != SQLITE_OK)
    fail(db_, "prepare", sql);
  auto [pos, _] = cache_.emplace(sql, std::make_unique<Stmt>(db_, s, sql));
  return *pos->second;
}

int64_t Db::last_insert_id() const {
  return sqlite3_last_insert_rowid(db_);
}
int Db::changes() const {
  return sqlite3_changes(db_);
}
bool Db::in_transaction() const {
  return !sqlite3_get_autocommit(db_);
}

Txn::Txn(Db& db) : db_(db) {
  db_.exec("BEGIN IMMEDIATE");
}
Txn::~Txn() {
  if (!done_) {
    try {
      db_.exec("ROLLBACK");
    } catch (...) {
    }
  }
}
void Txn::commit() {
  db_.exec("COMMIT");
  done_ = true;
}

}  // namespace ring::coord
