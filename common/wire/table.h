// JSON messages as tables of fields: the one engine behind ring-coord's protocol
// (common/protocol) and ringd's worker control lines (common/contract/control.h).
//
// A message struct is described once, by a Table: its name (the value of the kind/type key) and
// one row a field, each row a builder that names the JSON key, the struct member (a member
// pointer), the kind and its rule (range, length, choices, nested table) and its presence:
//
//   template <> const Table<Bucket>& table<Bucket>() {
//     static const Table<Bucket> t{"bucket", {
//         integer("step", &Bucket::step, 1, kInt64Max),
//         integer("b", &Bucket::b, 0, kInt32Max)}};
//     return t;
//   }
//
// The same rows drive the reader (JSON -> struct: read(), in row order, so the first bad field
// is the one named), the writer (struct -> JSON: write()) and the description (rules(): the
// table as data, for tests and tools). A Catalog over a std::variant of message structs picks
// the alternative by name. Rules across fields are `check` rows, which only the reader runs,
// where they stand. A new field is a member and a row; both directions follow.
//
// What differs between the users is their Dialect: how a broken rule is worded and thrown (the
// engine reports a Breach: what is wrong, where, with the numbers), whether an optional field may
// be JSON null, whether keys no row reads are refused, how NaN is written. Every wording stays
// with its user, so each keeps its messages to the byte.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace ring::wire {

using json = nlohmann::json;

// Longest node (host) name: DNS's limit.
inline constexpr size_t kMaxNodeName = 253;

// A node (host) name: 1..253 of [A-Za-z0-9._-], starting with a letter or digit.
bool valid_node_name(std::string_view s);

// What a row reads and writes.
enum class Kind {
  kInteger,   // int64 in [lo, hi]; `bounded`: in [lo, the reader's bound]; `version`: equals lo
  kNumber,    // double in [min, max], finite; `null_is_nan`: null and non-finite read as NaN
  kBoolean,   // true or false
  kString,    // length in [min_len, max_len] bytes, then `check`
  kNode,      // a node name (valid_node_name), as a kString of 1..253 bytes
  kEnum,      // one of `choices` (1..64 bytes)
  kStrings,   // an array of at most max_items strings of at most max_len bytes
  kIntegers,  // an array of at most max_items integers (any int64)
  kJson,      // a JSON object kept as is (`null_ok`: or null)
  kObject,    // an object described by another table
  kObjects,   // an array of at most max_items objects described by another table
  kCheck,     // no field: a rule across fields, run by the reader where the row stands
};

// Whether a field must be there, and when the writer writes it.
enum class Presence {
  kRequired,  // must be present; always written
  kOptional,  // may be absent (reads as the member's default); always written
  kWhenSet,   // may be absent; written only when set (true, not empty, has a value)
};

// A row's rule, as data: what rules() lists and what the reader checks.
struct Rule {
  std::string key;
  Kind kind = Kind::kInteger;
  Presence presence = Presence::kRequired;
  bool required() const { return presence == Presence::kRequired; }

  int64_t lo = 0, hi = 0;  // kInteger
  bool bounded = false;    // kInteger: hi is the bound the reader is given (at least lo)
  bool version = false;    // kInteger: must equal lo; `mismatch` words the refusal
  std::string (*mismatch)(int64_t got, int64_t want) = nullptr;

  double min = -std::numeric_limits<double>::infinity();  // kNumber
  double max = std::numeric_limits<double>::infinity();
  bool null_is_nan = false;  // kNumber: null (how NaN and inf are written) reads as NaN

  size_t min_len = 0;                                   // kString, kNode, kEnum
  size_t max_len = std::numeric_limits<size_t>::max();  // ... and each item of kStrings
  // kString, kNode: "" when the value is fine, else the rule it breaks.
  std::string (*check)(const std::string& value) = nullptr;
  std::vector<std::string> choices;  // kEnum

  size_t max_items = std::numeric_limits<size_t>::max();  // kStrings, kIntegers, kObjects
  bool null_ok = false;                                   // kJson
};

// The JSON shape a value should have had (Breach::kWrongType).
enum class Shape { kInteger, kNumber, kBoolean, kString, kArray, kObject, kObjectOrNull };

// A broken rule, for the Dialect to word.
struct Breach {
  enum class What {
    kMissing,          // a required field is absent
    kWrongType,        // expected, value (item: the value is an item of an array)
    kIntegerOverflow,  // an unsigned integer above int64's range; lo, hi
    kIntegerRange,     // x outside [lo, hi]
    kNotFinite,        // a number that is inf (1e400)
    kNumberRange,      // number outside [min, max]
    kTooShort,         // a string of fewer than limit bytes
    kTooLong,          // a string of size bytes, limit at most
    kTooManyItems,     // an array of size items, limit at most
    kUnknownField,     // a key no row reads (Dialect::refuse_unknown)
    kRule,             // text: a check, a version, a choice, a node name
  };
  What what = What::kRule;
  Shape expected = Shape::kObject;
  const json* value = nullptr;
  bool item = false;
  int64_t x = 0, lo = 0, hi = 0;
  double number = 0, min = 0, max = 0;
  size_t size = 0, limit = 0;
  std::string text;
};

// Where a breach is: the message's name and the field below it ("gpus[1].memory_mib"; empty:
// the message itself).
struct Where {
  std::string_view root;
  std::string rel;
  // "register.gpus[1].memory_mib"
  std::string path() const;
};

// What sets one family of messages apart.
struct Dialect {
  bool null_is_absent = false;     // an optional field that is null reads as absent
  bool refuse_unknown = false;     // a key that no row reads is a breach
  bool nonfinite_as_null = false;  // the writer writes a NaN or infinite number as null
  // Words the breach and throws; the engine never returns from it.
  void (*fail)(const Where& where, const Breach& breach) = nullptr;
};

// Reads one JSON object: finds each row's field (marking the key as read), checks the value, and
// reports a breach named at the field's path. Arrays that are null read as empty.
class Cursor {
 public:
  // `obj` must be an object (else a breach at `prefix`). `bound`: hi of the `bounded` integers.
  Cursor(const json& obj, const Dialect& dialect, std::string_view root, int64_t bound = 0,
         std::string prefix = "");

  const Dialect& dialect() const { return dialect_; }

  // The row's value; nullptr when absent (or null where that reads as absent). A required field
  // that is absent is a breach.
  const json* find(const Rule& r);
  // A key read outside the rows (an envelope's "v", "type").
  void accept(std::string_view key) { seen_.emplace(key); }
  // With Dialect::refuse_unknown: the first key (in key order) no row read is a breach.
  void finish() const;

  // A breach at `key` below this object (empty: the object itself).
  [[noreturn]] void fail(std::string_view key, Breach breach) const;
  // A check's refusal: `rule` as the breach's text.
  [[noreturn]] void fail(std::string_view key, std::string rule) const;

  // The object at `key` (or at key[index]) below this one.
  Cursor enter(const json& v, std::string_view key) const;
  Cursor enter(const json& v, std::string_view key, size_t index) const;

  // The value of a row of each kind, checked against its rule.
  int64_t integer(const Rule& r, const json& v) const;
  double number(const Rule& r, const json& v) const;
  bool boolean(const Rule& r, const json& v) const;
  std::string string(const Rule& r, const json& v) const;  // kString, kNode
  size_t choice(const Rule& r, const json& v) const;       // kEnum: the index in r.choices
  std::vector<std::string> strings(const Rule& r, const json& v) const;
  std::vector<int64_t> integers(const Rule& r, const json& v) const;
  const json& object(const Rule& r, const json& v) const;  // kJson
  const json& array(const Rule& r, const json& v) const;   // kObjects: an array, not too long

 private:
  std::string rel(std::string_view key) const;
  std::string text(const json& v, std::string_view key, size_t min_len, size_t max_len,
                   bool item) const;

  const json& obj_;
  const Dialect& dialect_;
  std::string_view root_;
  int64_t bound_;
  std::string prefix_;
  std::set<std::string, std::less<>> seen_;
};

// ---- rows and tables --------------------------------------------------------------------------

template <class M>
struct Field {
  Rule rule;
  std::function<void(const Rule&, Cursor&, M&)> read;
  std::function<void(const Rule&, const M&, json&, const Dialect&)> write;  // empty: kCheck
};

// One row or several (a shared group, an embedded table), as a Table's constructor takes them.
template <class M>
struct Rows {
  Rows(Field<M> f) { fields.push_back(std::move(f)); }       // NOLINT: implicit on purpose
  Rows(std::vector<Field<M>> fs) : fields(std::move(fs)) {}  // NOLINT
  std::vector<Field<M>> fields;
};

template <class M>
struct Table {
  Table(std::string name_, std::initializer_list<Rows<M>> parts) : name(std::move(name_)) {
    for (const Rows<M>& p : parts) fields.insert(fields.end(), p.fields.begin(), p.fields.end());
  }
  std::string name;  // the kind/type key's value; empty for a table of a nested object
  std::vector<Field<M>> fields;
};

// Reads the fields of `t` into m (not finish()).
template <class M>
void read_fields(const Table<M>& t, Cursor& c, M& m) {
  for (const Field<M>& f : t.fields) f.read(f.rule, c, m);
}
// A whole object: every row, then finish().
template <class M>
M read(const Table<M>& t, Cursor& c) {
  M m{};
  read_fields(t, c, m);
  c.finish();
  return m;
}
template <class M>
json write(const Table<M>& t, const M& m, const Dialect& d) {
  json j = json::object();
  for (const Field<M>& f : t.fields)
    if (f.write) f.write(f.rule, m, j, d);
  return j;
}
// The table as data: every row but the checks, in order.
template <class M>
std::vector<Rule> rules(const Table<M>& t) {
  std::vector<Rule> out;
  for (const Field<M>& f : t.fields)
    if (f.rule.kind != Kind::kCheck) out.push_back(f.rule);
  return out;
}

// ---- the builders: one a kind ------------------------------------------------------------------

namespace detail {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// Set: true, not empty, has a value (Presence::kWhenSet).
template <class T>
bool is_set(const T& v) {
  if constexpr (is_optional<T>::value)
    return v.has_value();
  else if constexpr (std::is_same_v<T, bool>)
    return v;
  else if constexpr (std::is_arithmetic_v<T>)
    return true;  // a number is always set
  else
    return !v.empty();
}

template <class T>
json to_value(const T& v, const Dialect& d) {
  if constexpr (is_optional<T>::value)
    return to_value(*v, d);
  else if constexpr (std::is_same_v<T, double>)
    return d.nonfinite_as_null && !std::isfinite(v) ? json(nullptr) : json(v);
  else
    return json(v);
}

// A row whose member holds T (or std::optional of it), read by cursor.*get(rule, value).
template <class M, class T, class Get>
Field<M> value(Rule r, T M::*m, Get get) {
  return {std::move(r),
          [m, get](const Rule& r, Cursor& c, M& msg) {
            if (const json* v = c.find(r)) msg.*m = std::invoke(get, c, r, *v);
          },
          [m](const Rule& r, const M& msg, json& j, const Dialect& d) {
            const T& x = msg.*m;
            if (r.presence != Presence::kWhenSet || is_set(x)) j[r.key] = to_value(x, d);
          }};
}

inline Rule rule(std::string key, Kind kind, Presence p) {
  Rule r;
  r.key = std::move(key);
  r.kind = kind;
  r.presence = p;
  return r;
}

std::string node_rule(const std::string& s);

}  // namespace detail

using StringCheck = std::string (*)(const std::string&);

// An integer in [lo, hi].
template <class M>
Field<M> integer(std::string key, int64_t M::*m, int64_t lo, int64_t hi,
                 Presence p = Presence::kRequired) {
  Rule r = detail::rule(std::move(key), Kind::kInteger, p);
  r.lo = lo;
  r.hi = hi;
  return detail::value(std::move(r), m, &Cursor::integer);
}
// Optional, written when set.
template <class M>
Field<M> integer(std::string key, std::optional<int64_t> M::*m, int64_t lo, int64_t hi) {
  Rule r = detail::rule(std::move(key), Kind::kInteger, Presence::kWhenSet);
  r.lo = lo;
  r.hi = hi;
  return detail::value(std::move(r), m, &Cursor::integer);
}
// An integer in [lo, bound], the bound the reader is given (Cursor's `bound`).
template <class M>
Field<M> bounded_integer(std::string key, int64_t M::*m, int64_t lo,
                         Presence p = Presence::kRequired) {
  Field<M> f = integer(std::move(key), m, lo, std::numeric_limits<int64_t>::max(), p);
  f.rule.bounded = true;
  return f;
}
// A version: must equal v; mismatch(got, v) is the refusal.
template <class M>
Field<M> version(std::string key, int64_t M::*m, int64_t v,
                 std::string (*mismatch)(int64_t got, int64_t want)) {
  Field<M> f = integer(std::move(key), m, v, v);
  f.rule.version = true;
  f.rule.mismatch = mismatch;
  return f;
}

// A finite number in [min, max].
template <class M>
Field<M> number(std::string key, double M::*m, double min, double max,
                Presence p = Presence::kRequired) {
  Rule r = detail::rule(std::move(key), Kind::kNumber, p);
  r.min = min;
  r.max = max;
  return detail::value(std::move(r), m, &Cursor::number);
}
template <class M>
Field<M> number(std::string key, std::optional<double> M::*m, double min, double max) {
  Rule r = detail::rule(std::move(key), Kind::kNumber, Presence::kWhenSet);
  r.min = min;
  r.max = max;
  return detail::value(std::move(r), m, &Cursor::number);
}
// Any number; null (how NaN and inf are written) and an infinite value read as NaN.
template <class M>
Field<M> number_or_nan(std::string key, double M::*m, Presence p = Presence::kRequired) {
  Field<M> f = number(std::move(key), m, -std::numeric_limits<double>::infinity(),
                      std::numeric_limits<double>::infinity(), p);
  f.rule.null_is_nan = true;
  return f;
}

template <class M>
Field<M> boolean(std::string key, bool M::*m, Presence p = Presence::kRequired) {
  return detail::value(detail::rule(std::move(key), Kind::kBoolean, p), m, &Cursor::boolean);
}
template <class M>
Field<M> boolean(std::string key, std::optional<bool> M::*m) {
  return detail::value(detail::rule(std::move(key), Kind::kBoolean, Presence::kWhenSet), m,
                       &Cursor::boolean);
}

// A string of min_len..max_len bytes, then check (nullptr: none).
template <class M>
Field<M> string(std::string key, std::string M::*m, size_t min_len, size_t max_len,
                Presence p = Presence::kRequired, StringCheck check = nullptr) {
  Rule r = detail::rule(std::move(key), Kind::kString, p);
  r.min_len = min_len;
  r.max_len = max_len;
  r.check = check;
  return detail::value(std::move(r), m, &Cursor::string);
}
// Any length.
template <class M>
Field<M> string(std::string key, std::string M::*m, Presence p = Presence::kRequired,
                StringCheck check = nullptr) {
  return string(std::move(key), m, 0, std::numeric_limits<size_t>::max(), p, check);
}
// A node name (required).
template <class M>
Field<M> node(std::string key, std::string M::*m) {
  Field<M> f = string(std::move(key), m, 1, kMaxNodeName, Presence::kRequired, detail::node_rule);
  f.rule.kind = Kind::kNode;
  return f;
}

// One of names' strings (required), read into and written from the enum member.
template <class M, class E, size_t N>
Field<M> enumeration(std::string key, E M::*m, const std::pair<E, const char*> (&names)[N]) {
  Rule r = detail::rule(std::move(key), Kind::kEnum, Presence::kRequired);
  r.min_len = 1;
  r.max_len = 64;
  for (const auto& [e, n] : names) r.choices.push_back(n);
  const std::pair<E, const char*>* table = names;
  return {std::move(r),
          [m, table](const Rule& r, Cursor& c, M& msg) {
            if (const json* v = c.find(r)) msg.*m = table[c.choice(r, *v)].first;
          },
          [m, table](const Rule& r, const M& msg, json& j, const Dialect&) {
            for (size_t i = 0; i < N; ++i)
              if (table[i].first == msg.*m) j[r.key] = table[i].second;
          }};
}

// Arrays of strings or integers (optional: absent or null reads as empty).
template <class M>
Field<M> strings(std::string key, std::vector<std::string> M::*m, size_t max_items, size_t max_len,
                 Presence p) {
  Rule r = detail::rule(std::move(key), Kind::kStrings, p);
  r.max_items = max_items;
  r.max_len = max_len;
  return detail::value(std::move(r), m, &Cursor::strings);
}
template <class M>
Field<M> integers(std::string key, std::vector<int64_t> M::*m, size_t max_items, Presence p) {
  Rule r = detail::rule(std::move(key), Kind::kIntegers, p);
  r.max_items = max_items;
  return detail::value(std::move(r), m, &Cursor::integers);
}

// Any JSON object, kept as is (optional: absent reads as the member's default; null_ok: null is
// accepted too). Always written.
template <class M>
Field<M> json_object(std::string key, json M::*m, bool null_ok) {
  Rule r = detail::rule(std::move(key), Kind::kJson, Presence::kOptional);
  r.null_ok = null_ok;
  return detail::value(std::move(r), m, &Cursor::object);
}

// An object described by table t (required; keys its rows do not read are the dialect's).
template <class M, class T>
Field<M> object(std::string key, T M::*m, const Table<T>& t) {
  const Table<T>* table = &t;
  return {detail::rule(std::move(key), Kind::kObject, Presence::kRequired),
          [m, table](const Rule& r, Cursor& c, M& msg) {
            if (const json* v = c.find(r)) {
              Cursor in = c.enter(*v, r.key);
              read_fields(*table, in, msg.*m);
              in.finish();
            }
          },
          [m, table](const Rule& r, const M& msg, json& j, const Dialect& d) {
            j[r.key] = write(*table, msg.*m, d);
          }};
}
// An array of at most max_items objects described by table t (null reads as empty).
template <class M, class T>
Field<M> objects(std::string key, std::vector<T> M::*m, const Table<T>& t, size_t max_items,
                 Presence p) {
  Rule r = detail::rule(std::move(key), Kind::kObjects, p);
  r.max_items = max_items;
  const Table<T>* table = &t;
  return {std::move(r),
          [m, table](const Rule& r, Cursor& c, M& msg) {
            const json* v = c.find(r);
            if (!v) return;
            const json& a = c.array(r, *v);
            for (size_t i = 0; i < a.size(); ++i) {
              Cursor in = c.enter(a[i], r.key, i);
              (msg.*m).push_back(read(*table, in));
            }
          },
          [m, table](const Rule& r, const M& msg, json& j, const Dialect& d) {
            const std::vector<T>& v = msg.*m;
            if (r.presence == Presence::kWhenSet && v.empty()) return;
            json a = json::array();
            for (const T& x : v) a.push_back(write(*table, x, d));
            j[r.key] = std::move(a);
          }};
}

// The rows of t, reading into and writing from member m, as rows of M (its fields sit beside
// M's own on the wire).
template <class M, class T>
std::vector<Field<M>> embed(T M::*m, const Table<T>& t) {
  std::vector<Field<M>> out;
  for (const Field<T>& f : t.fields) {
    Field<M> g{f.rule, [m, rd = f.read](const Rule& r, Cursor& c, M& msg) { rd(r, c, msg.*m); },
               nullptr};
    if (f.write)
      g.write = [m, wr = f.write](const Rule& r, const M& msg, json& j, const Dialect& d) {
        wr(r, msg.*m, j, d);
      };
    out.push_back(std::move(g));
  }
  return out;
}

// A rule across fields: rule(m, cursor) runs when the reader reaches the row, with the fields
// above it read, and refuses with cursor.fail(key, why).
template <class M>
Field<M> check(void (*rule)(const M& m, const Cursor& c)) {
  return {detail::rule("", Kind::kCheck, Presence::kOptional),
          [rule](const Rule&, Cursor& c, M& msg) { rule(msg, c); }, nullptr};
}

// ---- messages of several kinds ----------------------------------------------------------------

// The tables of a std::variant's alternatives, in its order: the alternative is chosen by name.
template <class Variant>
class Catalog;

template <class... Ms>
class Catalog<std::variant<Ms...>> {
 public:
  using Message = std::variant<Ms...>;
  explicit Catalog(const Table<Ms>&... tables) : tables_(&tables...) {}

  static constexpr size_t size() { return sizeof...(Ms); }
  const std::string& name(size_t index) const {
    const std::string* n = nullptr;
    at(index, [&](const auto& t) { n = &t.name; });
    return *n;
  }
  const std::string& name(const Message& m) const { return name(m.index()); }
  // The index of the alternative named `name`; -1 when none is.
  int find(std::string_view name) const {
    int found = -1;
    for (size_t i = 0; i < size() && found < 0; ++i)
      if (this->name(i) == name) found = static_cast<int>(i);
    return found;
  }
  // The alternative at index, read from the cursor's object (every row, then finish()).
  Message read(size_t index, Cursor& c) const {
    Message out;
    at(index, [&](const auto& t) { out = wire::read(t, c); });
    return out;
  }
  // The message's fields (without its name).
  json write(const Message& m, const Dialect& d) const {
    return std::visit(
        [&](const auto& x) {
          using M = std::decay_t<decltype(x)>;
          return wire::write(*std::get<const Table<M>*>(tables_), x, d);
        },
        m);
  }
  std::vector<Rule> rules(size_t index) const {
    std::vector<Rule> out;
    at(index, [&](const auto& t) { out = wire::rules(t); });
    return out;
  }

 private:
  template <class F>
  void at(size_t index, F&& f) const {
    at(index, f, std::index_sequence_for<Ms...>{});
  }
  template <class F, size_t... I>
  void at(size_t index, F& f, std::index_sequence<I...>) const {
    ((index == I ? f(*std::get<I>(tables_)) : void()), ...);
  }

  std::tuple<const Table<Ms>*...> tables_;
};

}  // namespace ring::wire
