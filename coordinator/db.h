// A thin RAII layer over SQLite: a connection with cached prepared statements, typed binds and
// columns, and a transaction guard. Errors throw DbError with SQLite's message and the SQL.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace ring::coord {

class DbError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Stmt {
 public:
  Stmt(sqlite3* db, sqlite3_stmt* s, std::string sql) : db_(db), s_(s), sql_(std::move(sql)) {}
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, int v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, double v);
  Stmt& bind(int i, std::string_view v);
  Stmt& bind(int i, const char* v) { return bind(i, std::string_view(v)); }
  Stmt& bind(int i, const std::string& v) { return bind(i, std::string_view(v)); }
  Stmt& bind(int i, std::nullptr_t);
  template <typename T>
  Stmt& bind(int i, const std::optional<T>& v) {
    return v ? bind(i, *v) : bind(i, nullptr);
  }
  // Binds all arguments from index 1.
  template <typename... Ts>
  Stmt& args(const Ts&... vs) {
    int i = 0;
    (bind(++i, vs), ...);
    return *this;
  }

  // Steps once: true when a row is available. Resets automatically when done.
  bool step();
  // Runs to completion (for statements without rows).
  void run();
  void reset();

  bool is_null(int col) const;
  int64_t i64(int col) const;
  double f64(int col) const;
  std::string text(int col) const;
  std::optional<int64_t> opt_i64(int col) const;
  std::optional<double> opt_f64(int col) const;

 private:
  sqlite3* db_;
  sqlite3_stmt* s_;
  std::string sql_;
};

class Db {
 public:
  struct Options {
    bool synchronous_full = true;  // FULL survives power loss; NORMAL survives process crashes
    int busy_timeout_ms = 5000;
    // Opens an existing database for reading only (SQLITE_OPEN_READONLY, query_only): ringctl
    // reading the state a stopped coordinator left. Nothing is created, migrated or written.
    bool read_only = false;
  };
  Db(const std::string& path, Options opts);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const std::string& sql);
  // A cached prepared statement (reset and with cleared bindings).
  Stmt& prepare(const std::string& sql);
  int64_t last_insert_id() const;
  int changes() const;
  bool in_transaction() const;
  sqlite3* raw() { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::map<std::string, std::unique_ptr<Stmt>> cache_;
};

// BEGIN IMMEDIATE in the constructor, ROLLBACK in the destructor unless commit() was called.
class Txn {
 public:
  explicit Txn(Db& db);
  ~Txn();
  void commit();

 private:
  Db& db_;
  bool done_ = false;
};

}  // namespace ring::coord
