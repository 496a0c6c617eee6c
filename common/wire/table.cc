#include "common/wire/table.h"

#include <cctype>
#include <stdexcept>

namespace ring::wire {

bool valid_node_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNodeName) return false;
  if (!std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return false;
  return true;
}

namespace detail {

std::string node_rule(const std::string& s) {
  return valid_node_name(s) ? std::string()
                            : "'" + s + "' is not a node name (letters, digits, '.', '_', '-')";
}

}  // namespace detail

namespace {

Breach wrong_type(Shape expected, const json& v, bool item = false) {
  Breach b;
  b.what = Breach::What::kWrongType;
  b.expected = expected;
  b.value = &v;
  b.item = item;
  return b;
}

Breach of(Breach::What what) {
  Breach b;
  b.what = what;
  return b;
}

Breach sized(Breach::What what, size_t size, size_t limit) {
  Breach b = of(what);
  b.size = size;
  b.limit = limit;
  return b;
}

std::string item_key(std::string_view key, size_t i) {
  return std::string(key) + "[" + std::to_string(i) + "]";
}

bool is_array_kind(Kind k) {
  return k == Kind::kStrings || k == Kind::kIntegers || k == Kind::kObjects;
}

}  // namespace

std::string Where::path() const {
  return rel.empty() ? std::string(root) : std::string(root) + "." + rel;
}

Cursor::Cursor(const json& obj, const Dialect& dialect, std::string_view root, int64_t bound,
               std::string prefix)
    : obj_(obj), dialect_(dialect), root_(root), bound_(bound), prefix_(std::move(prefix)) {
  if (!obj_.is_object()) fail("", wrong_type(Shape::kObject, obj_));
}

std::string Cursor::rel(std::string_view key) const {
  if (key.empty()) return prefix_;
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

void Cursor::fail(std::string_view key, Breach breach) const {
  dialect_.fail(Where{root_, rel(key)}, breach);
  throw std::logic_error("wire::Dialect::fail returned");
}

void Cursor::fail(std::string_view key, std::string rule) const {
  Breach b = of(Breach::What::kRule);
  b.text = std::move(rule);
  fail(key, std::move(b));
}

const json* Cursor::find(const Rule& r) {
  seen_.insert(r.key);
  const auto it = obj_.find(r.key);
  if (it == obj_.end()) {
    if (r.required()) fail(r.key, of(Breach::What::kMissing));
    return nullptr;
  }
  if (it->is_null()) {
    if (is_array_kind(r.kind)) return nullptr;
    if (!r.required() && dialect_.null_is_absent && r.kind != Kind::kJson) return nullptr;
  }
  return &*it;
}

void Cursor::finish() const {
  if (!dialect_.refuse_unknown) return;
  for (auto it = obj_.begin(); it != obj_.end(); ++it)
    if (!seen_.count(it.key())) fail(it.key(), of(Breach::What::kUnknownField));
}

Cursor Cursor::enter(const json& v, std::string_view key) const {
  return Cursor(v, dialect_, root_, bound_, rel(key));
}

Cursor Cursor::enter(const json& v, std::string_view key, size_t index) const {
  return Cursor(v, dialect_, root_, bound_, rel(item_key(key, index)));
}

int64_t Cursor::integer(const Rule& r, const json& v) const {
  if (!v.is_number_integer()) fail(r.key, wrong_type(Shape::kInteger, v));
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    Breach b = of(Breach::What::kIntegerOverflow);
    b.lo = r.lo;
    b.hi = r.hi;
    fail(r.key, b);
  }
  const int64_t x = v.get<int64_t>();
  if (r.version && x != r.lo) fail(r.key, r.mismatch(x, r.lo));
  const int64_t hi = r.bounded ? std::max(bound_, r.lo) : r.hi;
  if (x < r.lo || x > hi) {
    Breach b = of(Breach::What::kIntegerRange);
    b.x = x;
    b.lo = r.lo;
    b.hi = hi;
    fail(r.key, b);
  }
  return x;
}

double Cursor::number(const Rule& r, const json& v) const {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (v.is_null() && r.null_is_nan) return kNaN;
  if (!v.is_number()) fail(r.key, wrong_type(Shape::kNumber, v));
  const double x = v.get<double>();
  // JSON 1e400 reads as inf, which is written back as null: keep every value finite (or NaN, where
  // null reads as NaN) so that a message re-encodes to itself.
  if (!std::isfinite(x)) {
    if (!r.null_is_nan) fail(r.key, of(Breach::What::kNotFinite));
    return kNaN;
  }
  if (x < r.min || x > r.max) {
    Breach b = of(Breach::What::kNumberRange);
    b.number = x;
    b.min = r.min;
    b.max = r.max;
    fail(r.key, b);
  }
  return x;
}

bool Cursor::boolean(const Rule& r, const json& v) const {
  if (!v.is_boolean()) fail(r.key, wrong_type(Shape::kBoolean, v));
  return v.get<bool>();
}

std::string Cursor::text(const json& v, std::string_view key, size_t min_len, size_t max_len,
                         bool item) const {
  if (!v.is_string()) fail(key, wrong_type(Shape::kString, v, item));
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() < min_len) fail(key, sized(Breach::What::kTooShort, s.size(), min_len));
  if (s.size() > max_len) fail(key, sized(Breach::What::kTooLong, s.size(), max_len));
  return s;
}

std::string Cursor::string(const Rule& r, const json& v) const {
  std::string s = text(v, r.key, r.min_len, r.max_len, false);
  if (r.check) {
    std::string why = r.check(s);
    if (!why.empty()) fail(r.key, std::move(why));
  }
  return s;
}

size_t Cursor::choice(const Rule& r, const json& v) const {
  const std::string s = text(v, r.key, r.min_len, r.max_len, false);
  std::string allowed;
  for (size_t i = 0; i < r.choices.size(); ++i) {
    if (s == r.choices[i]) return i;
    allowed += (allowed.empty() ? "" : ", ") + r.choices[i];
  }
  fail(r.key, "'" + s + "' is not one of: " + allowed);
}

const json& Cursor::array(const Rule& r, const json& v) const {
  if (!v.is_array()) fail(r.key, wrong_type(Shape::kArray, v));
  if (v.size() > r.max_items)
    fail(r.key, sized(Breach::What::kTooManyItems, v.size(), r.max_items));
  return v;
}

std::vector<std::string> Cursor::strings(const Rule& r, const json& v) const {
  const json& a = array(r, v);
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i)
    out.push_back(text(a[i], item_key(r.key, i), 0, r.max_len, true));
  return out;
}

std::vector<int64_t> Cursor::integers(const Rule& r, const json& v) const {
  const json& a = array(r, v);
  std::vector<int64_t> out;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number_integer())
      fail(item_key(r.key, i), wrong_type(Shape::kInteger, a[i], true));
    out.push_back(a[i].get<int64_t>());
  }
  return out;
}

const json& Cursor::object(const Rule& r, const json& v) const {
  if (!v.is_object() && !(r.null_ok && v.is_null()))
    fail(r.key, wrong_type(r.null_ok ? Shape::kObjectOrNull : Shape::kObject, v));
  return v;
}

}  // namespace ring::wire
