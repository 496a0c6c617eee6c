#include "worker/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {
namespace {

using json = nlohmann::json;

// ---- UTF-8 helpers --------------------------------------------------------------------------

// The length of the valid UTF-8 sequence at s[i], or 0 when it is not one (WHATWG bounds: no
// overlongs, no surrogates, nothing above U+10FFFF). `consumed` gets the bytes of the maximal
// invalid prefix (at least 1) when it is not valid.
size_t utf8_seq(std::string_view s, size_t i, size_t* consumed) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *consumed = 1;
    return 0;
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) break;
    const auto c = static_cast<unsigned char>(s[j]);
    if (c < lo || c > hi) break;
    lo = 0x80;
    hi = 0xBF;
    if (k == need - 1) return j + 1 - i;
  }
  *consumed = j - i;
  return 0;
}

// `s` with every maximal invalid subsequence replaced by U+FFFD; empty optional-like flag when
// `s` is valid (returns false and leaves `out` alone).
bool replace_invalid_utf8(std::string_view s, std::string& out) {
  size_t i = 0, consumed = 0;
  while (i < s.size() && utf8_seq(s, i, &consumed) > 0) i += utf8_seq(s, i, &consumed);
  if (i == s.size()) return false;
  out.assign(s.substr(0, i));
  while (i < s.size()) {
    const size_t n = utf8_seq(s, i, &consumed);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += consumed;
    }
  }
  return true;
}

// Decodes the (valid) character at s[i]; `len` gets its byte count.
uint32_t utf8_decode(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return *len = 1, b;
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = static_cast<size_t>(n);
  return cp;
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s match).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string_view trim_start(std::string_view s) {
  size_t i = 0, n = 0;
  while (i < s.size() && is_white_space(utf8_decode(s, i, &n))) i += n;
  return s.substr(i);
}

std::string_view trim_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t n = 0;
    if (!is_white_space(utf8_decode(s, start, &n))) break;
    end = start;
  }
  return s.substr(0, end);
}

// GPT-2's byte <-> unicode table: printable Latin-1 bytes stand for themselves, the others for
// U+0100 upwards in byte order.
struct ByteUnicode {
  std::array<std::string, 256> to_char;  // UTF-8 of the character that stands for each byte
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteUnicode() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + static_cast<uint32_t>(n++);
      utf8_append(cp, to_char[b]);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteUnicode& byte_unicode() {
  static const ByteUnicode t;
  return t;
}

// ---- JSON access with field paths -----------------------------------------------------------

struct Ctx {
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& rule) const {
    throw DataError(fmt::format("data.tokenizer '{}': {}: {}", file, field, rule));
  }
  std::string shown(const json& v) const {
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  }
  const json& field(const json& obj, const std::string& key, const std::string& at) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(at + "." + key, "missing");
    return *it;
  }
  std::string str(const json& obj, const std::string& key, const std::string& at) const {
    const json& v = field(obj, key, at);
    if (!v.is_string()) fail(at + "." + key, "must be a string, not " + shown(v));
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& key, const std::string& at, bool dflt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(at + "." + key, "must be true or false, not " + shown(*it));
    return it->get<bool>();
  }
  int64_t integer(const json& obj, const std::string& key, const std::string& at) const {
    const json& v = field(obj, key, at);
    if (!v.is_number_integer()) fail(at + "." + key, "must be an integer, not " + shown(v));
    return v.get<int64_t>();
  }
  std::string type(const json& obj, const std::string& at) const {
    if (!obj.is_object()) fail(at, "must be an object, not " + shown(obj));
    return str(obj, "type", at);
  }
  // A pattern {"String": s} or {"Regex": r}; `is_regex` tells which.
  std::string pattern(const json& obj, const std::string& at, bool* is_regex) const {
    const json& p = field(obj, "pattern", at);
    if (p.is_object() && p.size() == 1 && p.begin().value().is_string()) {
      if (p.contains("String")) return *is_regex = false, p["String"].get<std::string>();
      if (p.contains("Regex")) return *is_regex = true, p["Regex"].get<std::string>();
    }
    fail(at + ".pattern", "must be {\"String\": ...} or {\"Regex\": ...}, not " + shown(p));
  }
};

// ---- Regex (PCRE2) --------------------------------------------------------------------------

struct CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using Code = std::shared_ptr<pcre2_code>;

// Oniguruma's Unicode meaning of the class shorthands, spelled for PCRE2.
std::string oniguruma_to_pcre2(const std::string& re) {
  static const char* kWord = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
  std::string out;
  int depth = 0;  // inside a character class
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char e = re[++i];
      if (e == 's') {
        out += R"(\p{White_Space})";
      } else if (e == 'S') {
        out += R"(\P{White_Space})";
      } else if (e == 'd') {
        out += R"(\p{Nd})";
      } else if (e == 'D') {
        out += R"(\P{Nd})";
      } else if (e == 'w') {
        out += depth > 0 ? std::string(kWord) : "[" + std::string(kWord) + "]";
      } else if (e == 'W' && depth == 0) {
        out += "[^" + std::string(kWord) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[') {
      ++depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];
      continue;
    }
    if (c == ']' && depth > 0) --depth;
    out += c;
  }
  return out;
}

Code compile_regex(const Ctx& ctx, const std::string& field, const std::string& re, bool literal) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string pat = literal ? re : oniguruma_to_pcre2(re);
  // PCRE2_LITERAL takes no PCRE2_UCP (nothing in a literal depends on it).
  const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts, &err,
                                &off, nullptr);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    ctx.fail(field, fmt::format("regex {} does not compile at offset {}: {}", json(re).dump(), off,
                                reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // the interpreter runs it when JIT is unavailable
  return Code(c, CodeFree{});
}

pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

// ---- The tokenizer --------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false, rstrip = false, normalized = false, special = false;
};

// Leftmost-longest matching of a set of strings.
class AddedMatcher {
 public:
  void add(const std::string& s, int index) {
    if (s.empty()) return;
    by_first_[static_cast<unsigned char>(s[0])].push_back({s, index});
    any_ = true;
  }
  void finish() {
    for (auto& v : by_first_)
      std::stable_sort(v.begin(), v.end(),
                       [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  bool empty() const { return !any_; }
  // The first match at or after `from`: (position, index into added tokens, length).
  bool find(std::string_view s, size_t from, size_t* pos, int* index, size_t* len) const {
    for (size_t i = from; i < s.size(); ++i) {
      for (const auto& [str, idx] : by_first_[static_cast<unsigned char>(s[i])]) {
        if (s.compare(i, str.size(), str) == 0) {
          *pos = i;
          *index = idx;
          *len = str.size();
          return true;
        }
      }
    }
    return false;
  }

 private:
  std::array<std::vector<std::pair<std::string, int>>, 256> by_first_;
  bool any_ = false;
};

struct Section {
  std::string_view text;
  int added = -1;  // index into added tokens, or -1 for text
};

struct PreStep {
  enum Kind { kSplit, kPrefixSpace } kind = kSplit;
  Code regex;
  bool removed = false;  // behavior Removed (else Isolated)
};

struct NormStep {
  enum Kind { kPrepend, kReplace } kind = kPrepend;
  std::string from, to;  // Prepend: to; Replace: from -> to
};

struct DecStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip } kind = kFuse;
  std::string from, to;  // Replace; Strip: from = the content
  int64_t start = 0, stop = 0;
};

struct Merge {
  int32_t rank;
  int32_t id;
};

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class JsonBpeTokenizer final : public Tokenizer {
 public:
  explicit JsonBpeTokenizer(const std::string& path);

  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  const char* format() const override { return "tokenizer.json"; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t special_token_id(std::string_view content) const override {
    for (const AddedToken& t : added_)
      if (t.content == content) return t.id;
    return -1;
  }

 private:
  void read_normalizer(const Ctx& ctx, const json& n, const std::string& at);
  void read_pre_tokenizer(const Ctx& ctx, const json& p, const std::string& at);
  void read_model(const Ctx& ctx, const json& m);
  void read_decoder(const Ctx& ctx, const json& d, const std::string& at);
  void read_added(const Ctx& ctx, const json& a);
  void read_bos_eos(const Ctx& ctx, const json& root);
  int32_t special_id(const Ctx& ctx, const json& v, const std::string& at) const;

  void split_added(std::string_view s, const AddedMatcher& m, std::vector<Section>& out) const;
  void encode_section(std::string_view s, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> id_to_token_;
  Vocab vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<AddedToken> added_;
  AddedMatcher raw_added_, normalized_added_;
  std::vector<NormStep> normalizer_;
  std::vector<PreStep> pre_;
  bool byte_level_ = false;  // pre-tokens are mapped byte -> unicode before the model
  std::vector<DecStep> decoder_;
  bool has_decoder_ = false;
  std::array<int32_t, 256> byte_ids_{};  // byte-level: the mapped char's id; else <0xXX>'s
  int32_t unk_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t bos_ = -1, eos_ = -1;
  uint64_t serial_;
};

std::atomic<uint64_t> next_serial{1};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("data.tokenizer: cannot read '{}'", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("data.tokenizer '{}': not valid JSON: {}", path, e.what()));
  }
}

JsonBpeTokenizer::JsonBpeTokenizer(const std::string& path)
    : Tokenizer(path), serial_(next_serial++) {
  const json root = parse_json(path);
  Ctx ctx{path};
  if (!root.is_object()) ctx.fail("(top level)", "must be an object");
  read_model(ctx, ctx.field(root, "model", "tokenizer"));
  if (root.contains("added_tokens")) read_added(ctx, root["added_tokens"]);
  if (root.contains("normalizer") && !root["normalizer"].is_null())
    read_normalizer(ctx, root["normalizer"], "normalizer");
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null())
    read_pre_tokenizer(ctx, root["pre_tokenizer"], "pre_tokenizer");
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    has_decoder_ = true;
    read_decoder(ctx, root["decoder"], "decoder");
  }
  // Byte ids: the byte-level alphabet when pre-tokens are mapped, else the <0xXX> tokens.
  const auto& bu = byte_unicode();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_level_ ? bu.to_char[b] : fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  read_bos_eos(ctx, root);
}

void JsonBpeTokenizer::read_model(const Ctx& ctx, const json& m) {
  const std::string at = "model";
  if (!m.is_object()) ctx.fail(at, "must be an object");
  const std::string type =
      m.contains("type") ? ctx.str(m, "type", at) : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    ctx.fail(at + ".type", fmt::format("'{}' is not supported (only BPE: byte-level or with "
                                       "byte_fallback)",
                                       type));
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(key);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      ctx.fail(at + "." + key, "is not supported (must be null), got " + ctx.shown(*it));
  }
  const json& vocab = ctx.field(m, "vocab", at);
  if (!vocab.is_object()) ctx.fail(at + ".vocab", "must be an object of token: id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      ctx.fail(at + ".vocab." + it.key(), "must be an id >= 0, not " + ctx.shown(it.value()));
    const auto id = it.value().get<int32_t>();
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
    id_to_token_[id] = it.key();
    vocab_[it.key()] = id;
  }
  const json& merges = ctx.field(m, "merges", at);
  if (!merges.is_array()) ctx.fail(at + ".merges", "must be an array");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    const std::string where = fmt::format("{}.merges[{}]", at, i);
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        ctx.fail(where, "must be two tokens separated by one space, not " + ctx.shown(e));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      ctx.fail(where, "must be \"a b\" or [\"a\", \"b\"], not " + ctx.shown(e));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      ctx.fail(where, fmt::format("{} needs '{}', '{}' and '{}' in model.vocab", ctx.shown(e), a,
                                  b, a + b));
    merges_.emplace(pair_key(ia->second, ib->second),
                    Merge{static_cast<int32_t>(i), iab->second});  // first rank wins
  }
  byte_fallback_ = ctx.flag(m, "byte_fallback", at, false);
  fuse_unk_ = ctx.flag(m, "fuse_unk", at, false);
  ignore_merges_ = ctx.flag(m, "ignore_merges", at, false);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string u = ctx.str(m, "unk_token", at);
    auto it = vocab_.find(u);
    if (it == vocab_.end()) ctx.fail(at + ".unk_token", "'" + u + "' is not in model.vocab");
    unk_ = it->second;
  }
}

void JsonBpeTokenizer::read_added(const Ctx& ctx, const json& a) {
  if (!a.is_array()) ctx.fail("added_tokens", "must be an array");
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string at = fmt::format("added_tokens[{}]", i);
    if (!a[i].is_object()) ctx.fail(at, "must be an object");
    AddedToken t;
    t.content = ctx.str(a[i], "content", at);
    const int64_t id = ctx.integer(a[i], "id", at);
    if (id < 0 || id > INT32_MAX) ctx.fail(at + ".id", "must be >= 0");
    t.id = static_cast<int32_t>(id);
    t.special = ctx.flag(a[i], "special", at, false);
    t.lstrip = ctx.flag(a[i], "lstrip", at, false);
    t.rstrip = ctx.flag(a[i], "rstrip", at, false);
    t.normalized = ctx.flag(a[i], "normalized", at, !t.special);
    if (ctx.flag(a[i], "single_word", at, false))
      ctx.fail(at + ".single_word", "true is not supported");
    if (static_cast<size_t>(t.id) >= id_to_token_.size()) id_to_token_.resize(t.id + 1);
    id_to_token_[t.id] = t.content;
    vocab_[t.content] = t.id;
    added_.push_back(t);
  }
  for (size_t i = 0; i < added_.size(); ++i)
    (added_[i].normalized ? normalized_added_ : raw_added_).add(added_[i].content,
                                                                 static_cast<int>(i));
  raw_added_.finish();
  normalized_added_.finish();
}

void JsonBpeTokenizer::read_normalizer(const Ctx& ctx, const json& n, const std::string& at) {
  const std::string type = ctx.type(n, at);
  if (type == "Sequence") {
    const json& list = ctx.field(n, "normalizers", at);
    if (!list.is_array()) ctx.fail(at + ".normalizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(ctx, list[i], fmt::format("{}.normalizers[{}]", at, i));
  } else if (type == "Prepend") {
    normalizer_.push_back({NormStep::kPrepend, "", ctx.str(n, "prepend", at)});
  } else if (type == "Replace") {
    bool is_regex = false;
    std::string from = ctx.pattern(n, at, &is_regex);
    if (is_regex) ctx.fail(at + ".pattern", "a Regex pattern is not supported (only String)");
    if (from.empty()) ctx.fail(at + ".pattern", "must not be empty");
    normalizer_.push_back({NormStep::kReplace, from, ctx.str(n, "content", at)});
  } else {
    ctx.fail(at + ".type", fmt::format("normalizer '{}' is not supported (supported: Prepend, "
                                       "Replace, Sequence, or null)",
                                       type));
  }
}

void JsonBpeTokenizer::read_pre_tokenizer(const Ctx& ctx, const json& p,
                                          const std::string& at) {
  const std::string type = ctx.type(p, at);
  if (byte_level_) ctx.fail(at, "a pre-tokenizer after ByteLevel is not supported");
  if (type == "Sequence") {
    const json& list = ctx.field(p, "pretokenizers", at);
    if (!list.is_array()) ctx.fail(at + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(ctx, list[i], fmt::format("{}.pretokenizers[{}]", at, i));
  } else if (type == "Split") {
    bool is_regex = false;
    const std::string pat = ctx.pattern(p, at, &is_regex);
    if (ctx.flag(p, "invert", at, false)) ctx.fail(at + ".invert", "true is not supported");
    const std::string behavior = ctx.str(p, "behavior", at);
    if (behavior != "Isolated" && behavior != "Removed")
      ctx.fail(at + ".behavior",
               fmt::format("'{}' is not supported (supported: Isolated, Removed)", behavior));
    pre_.push_back({PreStep::kSplit, compile_regex(ctx, at + ".pattern", pat, !is_regex),
                    behavior == "Removed"});
  } else if (type == "ByteLevel") {
    if (ctx.flag(p, "add_prefix_space", at, true)) pre_.push_back({PreStep::kPrefixSpace, {}});
    if (ctx.flag(p, "use_regex", at, true)) {
      static const char* kGpt2 =
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
      pre_.push_back({PreStep::kSplit, compile_regex(ctx, at, kGpt2, false), false});
    }
    byte_level_ = true;
  } else {
    ctx.fail(at + ".type", fmt::format("pre-tokenizer '{}' is not supported (supported: Split, "
                                       "ByteLevel, Sequence, or null)",
                                       type));
  }
}

void JsonBpeTokenizer::read_decoder(const Ctx& ctx, const json& d, const std::string& at) {
  const std::string type = ctx.type(d, at);
  if (type == "Sequence") {
    const json& list = ctx.field(d, "decoders", at);
    if (!list.is_array()) ctx.fail(at + ".decoders", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_decoder(ctx, list[i], fmt::format("{}.decoders[{}]", at, i));
  } else if (type == "ByteLevel") {
    decoder_.push_back({DecStep::kByteLevel});
  } else if (type == "ByteFallback") {
    decoder_.push_back({DecStep::kByteFallback});
  } else if (type == "Fuse") {
    decoder_.push_back({DecStep::kFuse});
  } else if (type == "Replace") {
    bool is_regex = false;
    std::string from = ctx.pattern(d, at, &is_regex);
    if (is_regex) ctx.fail(at + ".pattern", "a Regex pattern is not supported (only String)");
    if (from.empty()) ctx.fail(at + ".pattern", "must not be empty");
    decoder_.push_back({DecStep::kReplace, from, ctx.str(d, "content", at)});
  } else if (type == "Strip") {
    DecStep s{DecStep::kStrip, ctx.str(d, "content", at), ""};
    s.start = ctx.integer(d, "start", at);
    s.stop = ctx.integer(d, "stop", at);
    decoder_.push_back(s);
  } else {
    ctx.fail(at + ".type", fmt::format("decoder '{}' is not supported (supported: ByteLevel, "
                                       "ByteFallback, Fuse, Replace, Strip, Sequence, or null)",
                                       type));
  }
}

int32_t JsonBpeTokenizer::special_id(const Ctx& ctx, const json& v, const std::string& at) const {
  std::string content;
  if (v.is_string()) {
    content = v.get<std::string>();
  } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    content = v["content"].get<std::string>();
  } else {
    ctx.fail(at, "must be a token string or an object with \"content\", not " + ctx.shown(v));
  }
  auto it = vocab_.find(content);
  if (it == vocab_.end()) ctx.fail(at, "'" + content + "' is not a token of the vocabulary");
  return it->second;
}

void JsonBpeTokenizer::read_bos_eos(const Ctx& ctx, const json& root) {
  // The post-processor's template first: a SpecialToken first (BOS) or last (EOS) in "single".
  std::function<void(const json&, const std::string&)> from_template = [&](const json& pp,
                                                                             const std::string& at) {
    if (!pp.is_object() || !pp.contains("type")) return;
    if (pp["type"] == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
      for (size_t i = 0; i < pp["processors"].size(); ++i)
        from_template(pp["processors"][i], fmt::format("{}.processors[{}]", at, i));
      return;
    }
    if (pp["type"] != "TemplateProcessing" || !pp.contains("single")) return;
    const json& single = pp["single"];
    if (!single.is_array() || single.empty()) return;
    auto id_of = [&](const json& item, const std::string& where) -> int32_t {
      if (!item.is_object() || !item.contains("SpecialToken")) return -1;
      return special_id(ctx, ctx.field(item["SpecialToken"], "id", where + ".SpecialToken"),
                        where + ".SpecialToken.id");
    };
    bos_ = id_of(single.front(), at + ".single[0]");
    if (single.size() > 1) eos_ = id_of(single.back(), fmt::format("{}.single[{}]", at,
                                                                   single.size() - 1));
  };
  if (root.contains("post_processor")) from_template(root["post_processor"], "post_processor");
  // tokenizer_config.json beside it wins for each token it names.
  const auto cfg_path = std::filesystem::path(path()).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg_path, ec)) return;
  const json cfg = parse_json(cfg_path.string());
  Ctx cctx{cfg_path.string()};
  if (!cfg.is_object()) cctx.fail("(top level)", "must be an object");
  auto it = cfg.find("bos_token");
  if (it != cfg.end() && !it->is_null()) bos_ = special_id(cctx, *it, "bos_token");
  it = cfg.find("eos_token");
  if (it != cfg.end() && !it->is_null()) eos_ = special_id(cctx, *it, "eos_token");
}

// ---- Encoding -------------------------------------------------------------------------------

void JsonBpeTokenizer::split_added(std::string_view s, const AddedMatcher& m,
                                   std::vector<Section>& out) const {
  const size_t first = out.size();
  size_t at = 0, pos = 0, len = 0;
  int idx = -1;
  while (!m.empty() && m.find(s, at, &pos, &idx, &len)) {
    if (pos > at) out.push_back({s.substr(at, pos - at), -1});
    out.push_back({s.substr(pos, len), idx});
    at = pos + len;
  }
  if (at < s.size()) out.push_back({s.substr(at), -1});
  // lstrip / rstrip: the whitespace next to the token goes with it.
  for (size_t i = first; i < out.size(); ++i) {
    if (out[i].added < 0) continue;
    const AddedToken& t = added_[out[i].added];
    if (t.lstrip && i > first && out[i - 1].added < 0) out[i - 1].text = trim_end(out[i - 1].text);
    if (t.rstrip && i + 1 < out.size() && out[i + 1].added < 0)
      out[i + 1].text = trim_start(out[i + 1].text);
  }
}

void JsonBpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string fixed;
  if (replace_invalid_utf8(text, fixed)) text = fixed;
  std::vector<Section> sections;
  split_added(text, raw_added_, sections);
  for (const Section& s : sections) {
    if (s.added >= 0) {
      out.push_back(added_[s.added].id);
      continue;
    }
    if (s.text.empty()) continue;
    std::string norm;
    std::string_view t = s.text;
    if (!normalizer_.empty()) {
      norm.assign(t);
      for (const NormStep& n : normalizer_) {
        if (n.kind == NormStep::kPrepend) {
          if (!norm.empty()) norm.insert(0, n.to);
          continue;
        }
        std::string r;
        size_t at = 0;
        for (size_t p; (p = norm.find(n.from, at)) != std::string::npos; at = p + n.from.size())
          r.append(norm, at, p - at).append(n.to);
        r.append(norm, at);
        norm.swap(r);
      }
      t = norm;
    }
    if (normalized_added_.empty()) {
      encode_section(t, out);
      continue;
    }
    std::vector<Section> subs;
    split_added(t, normalized_added_, subs);
    for (const Section& ss : subs) {
      if (ss.added >= 0) {
        out.push_back(added_[ss.added].id);
      } else if (!ss.text.empty()) {
        encode_section(ss.text, out);
      }
    }
  }
}

void JsonBpeTokenizer::encode_section(std::string_view s, std::vector<int32_t>& out) const {
  if (pre_.empty()) return encode_piece(s, out);
  std::vector<std::string_view> pieces{s}, next;
  std::deque<std::string> store;  // pieces with a prefix space
  pcre2_match_data* md = thread_match_data();
  for (const PreStep& step : pre_) {
    next.clear();
    for (std::string_view p : pieces) {
      if (step.kind == PreStep::kPrefixSpace) {
        if (!p.empty() && p[0] != ' ') p = store.emplace_back(" " + std::string(p));
        next.push_back(p);
        continue;
      }
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(p.data());
      size_t prev = 0, at = 0;
      while (at <= p.size()) {
        const int rc = pcre2_match(step.regex.get(), subj, p.size(), at, PCRE2_NO_UTF_CHECK, md,
                                   nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {  // an empty match: no piece; go on after the next character
          size_t n = 1;
          if (ov[0] >= p.size()) break;
          utf8_decode(p, ov[0], &n);
          at = ov[0] + n;
          continue;
        }
        if (ov[0] > prev) next.push_back(p.substr(prev, ov[0] - prev));
        if (!step.removed) next.push_back(p.substr(ov[0], ov[1] - ov[0]));
        prev = at = ov[1];
      }
      if (prev < p.size()) next.push_back(p.substr(prev));
    }
    pieces.swap(next);
  }
  for (std::string_view p : pieces)
    if (!p.empty()) encode_piece(p, out);
}

struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StrHash, std::equal_to<>> map;
};
constexpr size_t kCacheMaxPiece = 255;      // bytes
constexpr size_t kCacheEntries = 1u << 16;  // per thread; cleared when full

void JsonBpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kCacheMaxPiece) return bpe(piece, out);
  thread_local PieceCache cache;
  if (cache.owner != serial_) {
    cache.map.clear();
    cache.owner = serial_;
  }
  auto it = cache.map.find(piece);
  if (it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t before = out.size();
  bpe(piece, out);
  if (cache.map.size() >= kCacheEntries) cache.map.clear();
  cache.map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + before, out.end()));
}

void JsonBpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const auto& bu = byte_unicode();
  if (ignore_merges_) {
    auto it = byte_level_ ? [&] {
      std::string mapped;
      for (char c : piece) mapped += bu.to_char[static_cast<unsigned char>(c)];
      return vocab_.find(mapped);
    }()
                          : vocab_.find(piece);
    if (it != vocab_.end()) return out.push_back(it->second);
  }
  // The initial symbols: one per byte (byte-level) or per character (else: a character not in
  // the vocabulary becomes its <0xXX> byte tokens with byte_fallback, else unk).
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(piece.size());
  auto push = [&](int32_t id) {
    if (id < 0 && fuse_unk_ && !syms.empty() && syms.back().id == unk_) return;
    if (id < 0) id = unk_;
    if (id < 0) return;  // no unk token: dropped, as the reference does
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1});
    if (n > 0) syms[n - 1].next = n;
  };
  if (byte_level_) {
    for (char c : piece) push(byte_ids_[static_cast<unsigned char>(c)]);
  } else {
    for (size_t i = 0, n = 0; i < piece.size(); i += n) {
      utf8_decode(piece, i, &n);
      auto it = vocab_.find(piece.substr(i, n));
      if (it != vocab_.end()) {
        push(it->second);
        continue;
      }
      bool all = byte_fallback_;
      for (size_t k = 0; all && k < n; ++k) all = byte_ids_[static_cast<unsigned char>(piece[i + k])] >= 0;
      if (!all) {
        push(-1);
        continue;
      }
      for (size_t k = 0; k < n; ++k) push(byte_ids_[static_cast<unsigned char>(piece[i + k])]);
    }
  }
  // Merges, lowest rank first, leftmost first among equal ranks: (rank << 32 | position).
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    auto it = merges_.find(pair_key(syms[pos].id, syms[syms[pos].next].id));
    if (it != merges_.end())
      queue.push((static_cast<uint64_t>(it->second.rank) << 32) | static_cast<uint32_t>(pos));
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) consider(i);
  while (!queue.empty()) {
    const uint64_t top = queue.top();
    queue.pop();
    const auto pos = static_cast<int32_t>(top & 0xffffffffu);
    const auto rank = static_cast<int32_t>(top >> 32);
    Sym& s = syms[pos];
    if (s.id < 0 || s.next < 0) continue;
    auto it = merges_.find(pair_key(s.id, syms[s.next].id));
    if (it == merges_.end() || it->second.rank != rank) continue;  // stale
    Sym& r = syms[s.next];
    s.id = it->second.id;
    r.id = -1;
    s.next = r.next;
    if (s.next >= 0) syms[s.next].prev = pos;
    consider(s.prev);
    consider(pos);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

// ---- Decoding -------------------------------------------------------------------------------

std::string JsonBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size())
      throw DataError(fmt::format("data.tokenizer '{}': id {} is outside the vocabulary (0..{})",
                                  path(), id, id_to_token_.size() - 1));
    toks.push_back(id_to_token_[id]);
  }
  if (!has_decoder_) {
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s.append(i ? " " : "").append(toks[i]);
    return s;
  }
  const auto& bu = byte_unicode();
  for (const DecStep& d : decoder_) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecStep::kByteLevel: {
        std::string bytes;
        for (const std::string& t : toks) {
          std::string mapped;
          bool all = true;
          for (size_t i = 0, n = 0; all && i < t.size(); i += n) {
            size_t c = 0;
            if (utf8_seq(t, i, &c) == 0) {
              all = false;
              break;
            }
            auto it = bu.to_byte.find(utf8_decode(t, i, &n));
            if (it == bu.to_byte.end()) all = false;
            else mapped += static_cast<char>(it->second);
          }
          bytes += all ? mapped : t;
        }
        next.push_back(std::move(bytes));
        break;
      }
      case DecStep::kByteFallback: {
        std::string run;
        bool in_run = false;
        for (const std::string& t : toks) {
          unsigned v = 0;
          const bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                               std::isxdigit(static_cast<unsigned char>(t[3])) &&
                               std::isxdigit(static_cast<unsigned char>(t[4])) &&
                               std::sscanf(t.c_str() + 3, "%2x", &v) == 1;
          if (is_byte) {
            run += static_cast<char>(v);
            in_run = true;
            continue;
          }
          if (in_run) next.push_back(std::move(run)), run.clear(), in_run = false;
          next.push_back(t);
        }
        if (in_run) next.push_back(std::move(run));
        break;
      }
      case DecStep::kFuse: {
        std::string s;
        for (const std::string& t : toks) s += t;
        next.push_back(std::move(s));
        break;
      }
      case DecStep::kReplace:
        for (const std::string& t : toks) {
          std::string r;
          size_t at = 0;
          for (size_t p; (p = t.find(d.from, at)) != std::string::npos; at = p + d.from.size())
            r.append(t, at, p - at).append(d.to);
          next.push_back(r.append(t, at));
        }
        break;
      case DecStep::kStrip:
        for (const std::string& t : toks) {
          std::string_view v = t;
          for (int64_t k = 0; k < d.start && !d.from.empty() && v.starts_with(d.from); ++k)
            v.remove_prefix(d.from.size());
          for (int64_t k = 0; k < d.stop && !d.from.empty() && v.ends_with(d.from); ++k)
            v.remove_suffix(d.from.size());
          next.emplace_back(v);
        }
        break;
    }
    toks.swap(next);
  }
  std::string s;
  for (const std::string& t : toks) s += t;
  return s;
}

}  // namespace

std::unique_ptr<Tokenizer> BpeTokenizer::load(const std::string& path) {
  return std::make_unique<JsonBpeTokenizer>(path);
}

}  // namespace ring::data
