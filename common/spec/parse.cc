#include "common/spec/parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "common/cli/edit_distance.h"
#include "common/spec/keys.h"

namespace ring::spec {
namespace {

Location loc(const YAML::Mark& m) {
  if (m.is_null()) return {};
  return {m.line + 1, m.column + 1};
}

// Shortens a scalar for messages and makes control bytes visible.
std::string shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 60)) {
    if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > 60) out += "...";
  return "'" + out + "'";
}

const char* node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return "a scalar";
    default: return "an undefined node";
  }
}

// Finds the first byte that is not valid UTF-8 (overlongs, surrogates and >U+10FFFF rejected).
std::optional<size_t> first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;
    unsigned min;
    if ((c & 0xe0) == 0xc0) n = 1, min = 0x80, c &= 0x1f;
    else if ((c & 0xf0) == 0xe0) n = 2, min = 0x800, c &= 0x0f;
    else if ((c & 0xf8) == 0xf0) n = 3, min = 0x10000, c &= 0x07;
    else return i;
    unsigned cp = c;
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size() || (p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += n + 1;
  }
  return std::nullopt;
}

// Whether any line holds something other than blanks, comments and document markers.
bool has_content(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t end = s.find('\n', i);
    if (end == std::string_view::npos) end = s.size();
    std::string_view line = s.substr(i, end - i);
    size_t b = line.find_first_not_of(" \t\r");
    if (b != std::string_view::npos && line[b] != '#' && line.substr(b) != "---" &&
        line.substr(b) != "...")
      return true;
    i = end + 1;
  }
  return false;
}

Location offset_to_location(std::string_view s, size_t off) {
  Location l{1, 1};
  for (size_t i = 0; i < off && i < s.size(); ++i) {
    if (s[i] == '\n') {
      ++l.line;
      l.column = 1;
    } else {
      ++l.column;
    }
  }
  return l;
}

int levenshtein(std::string_view a, std::string_view b) {
  return static_cast<int>(cli::edit_distance(a, b, /*ignore_case=*/true));
}

// Counts documents (and remembers where the second starts) without building nodes.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++starts_ == 2) second_start = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  YAML::Mark second_start = YAML::Mark::null_mark();

 private:
  int starts_ = 0;
};

class Parser {
 public:
  Parser(std::string name, LoadResult& out, const std::vector<Override>& overrides = {})
      : name_(std::move(name)), out_(out), overrides_(overrides) {
    out_.source.file = name_;
  }

  // The document after the overrides (defined once run() got that far).
  const YAML::Node& root() const { return root_; }

  void error(Location where, std::string key, std::string msg) {
    out_.diagnostics.push_back(
        {Diagnostic::Severity::kError, name_, where, std::move(key), std::move(msg)});
  }

  void run(std::string_view text, JobSpec& spec) {
    if (text.size() > kMaxSpecBytes) {
      error({}, "", fmt::format("file is {} bytes; a spec may be at most {} bytes", text.size(),
                                kMaxSpecBytes));
      return;
    }
    if (auto bad = first_invalid_utf8(text)) {
      error(offset_to_location(text, *bad), "",
            fmt::format("invalid UTF-8 (byte 0x{:02x} at offset {}); specs must be UTF-8 text",
                        static_cast<unsigned char>(text[*bad]), *bad));
      return;
    }
    if (text.find('\0') != std::string_view::npos) {
      error(offset_to_location(text, text.find('\0')), "", "NUL byte in file; specs are text");
      return;
    }
    // YAML::LoadAll loops forever on some inputs (a ',' at document level: the parser never
    // consumes it), so load the first document with YAML::Load and count documents with a
    // bounded number of HandleNextDocument calls.
    YAML::Node root;
    int documents = 0;
    YAML::Mark second_document;
    try {
      const std::string str(text);
      root = YAML::Load(str);
      std::istringstream in(str);
      YAML::Parser parser(in);
      DocumentCounter counter;
      while (documents < 2 && parser.HandleNextDocument(counter)) ++documents;
      second_document = counter.second_start;
    } catch (const YAML::Exception& e) {
      error(loc(e.mark), "", "YAML syntax error: " + e.msg);
      return;
    } catch (const std::exception& e) {
      error({}, "", std::string("YAML parser failed: ") + e.what());
      return;
    }
    if (!root.IsDefined() || root.IsNull()) {
      if (has_content(text))
        error({1, 1}, "", "the first YAML document has no value (a stray ',' or flow token at "
                          "the top level?); expected a mapping with sections job, model, ...");
      else
        error({1, 1}, "", "empty spec: expected a mapping with sections job, model, data, ...");
      return;
    }
    if (documents > 1) {
      error(loc(second_document), "",
            "more than one YAML document in the file; a spec is exactly one document");
    }
    if (!root.IsMap()) {
      error(loc(root.Mark()), "",
            fmt::format("top level is {}; expected a mapping of sections (job:, model:, ...)",
                        node_kind(root)));
      return;
    }
    apply_overrides(root);
    root_ = root;
    std::set<std::string> seen_sections;
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node k = it->first;  // a copy: it-> points into a temporary
      const YAML::Node v = it->second;
      if (!k.IsScalar()) {
        error(loc(k.Mark()), "", "section names must be plain words, not " +
                                     std::string(node_kind(k)));
        continue;
      }
      const std::string sec = k.Scalar();
      if (!is_section(sec)) {
        std::string hint;
        if (find_key_by_name(sec)) hint = fmt::format("; did you mean '{}' inside a section?",
                                                      find_key_by_name(sec)->path);
        else if (auto s = suggest_section(sec); !s.empty()) hint = "; did you mean '" + s + "'?";
        error(loc(k.Mark()), sec, "unknown section" + hint + section_list_hint(hint));
        continue;
      }
      if (!seen_sections.insert(sec).second) {
        error(loc(k.Mark()), sec,
              fmt::format("duplicate section (first at line {})", out_.source.sections[sec].line));
        continue;
      }
      out_.source.sections[sec] = loc(k.Mark());
      if (v.IsNull()) continue;  // "slurm:" with nothing under it: all defaults
      if (!v.IsMap()) {
        error(loc(v.Mark()), sec,
              fmt::format("section is {}; expected a mapping of keys", node_kind(v)));
        continue;
      }
      parse_section(sec, v, spec);
    }
    for (const auto& kd : spec_keys()) {
      if (kd.required && !(kd.train_only && spec.job.kind == JobKind::kGenerate) &&
          !out_.source.keys.count(kd.path)) {
        Location where = out_.source.sections.count(kd.section())
                             ? out_.source.sections[kd.section()]
                             : Location{1, 1};
        error(where, kd.path, "required key is missing: " + kd.description);
      }
    }
  }

 private:
  // Each --set KEY=VALUE replaces (or adds) KEY in the document before anything is checked. An
  // unknown KEY is an error naming it, with the closest key; VALUE is judged by the key's type
  // and range below like a value of the file.
  void apply_overrides(YAML::Node& root) {
    for (const auto& o : overrides_) {
      const std::string sec = o.key.substr(0, o.key.find('.'));
      const std::string name =
          o.key.find('.') == std::string::npos ? "" : o.key.substr(o.key.find('.') + 1);
      auto refuse = [&](const std::string& msg) {
        error({}, o.key, msg + " (--set " + o.arg() + ")");
      };
      if (!find_key(o.key)) {
        std::string hint;
        if (!is_section(sec)) {
          auto s = find_key_by_name(o.key) ? find_key_by_name(o.key)->path : suggest_section(sec);
          hint = s.empty() ? section_list_hint("") : "; did you mean '" + s + "'?";
          refuse((name.empty() ? "not a key: --set takes SECTION.KEY=VALUE" : "unknown section") +
                 hint);
        } else if (name.empty()) {
          refuse("a section, not a key: --set takes SECTION.KEY=VALUE (keys of " + sec + ": " +
                 keys_of(sec) + ")");
        } else {
          auto s = suggest_key(sec, name);
          refuse(s.empty() ? fmt::format("unknown key (keys of {}: {})", sec, keys_of(sec))
                           : fmt::format("unknown key; did you mean '{}'?", s));
        }
        continue;
      }
      YAML::Node value;
      try {
        value = YAML::Load(o.value);
      } catch (const YAML::Exception& e) {
        refuse("value " + shown(o.value) + " is not a YAML value: " + e.msg);
        continue;
      }
      const YAML::Node& const_root = root;  // a lookup that adds nothing
      if (!const_root[sec] || const_root[sec].IsNull()) {
        root[sec] = YAML::Node(YAML::NodeType::Map);
      } else if (!const_root[sec].IsMap()) {
        continue;  // the section's own error is reported with the file's
      }
      YAML::Node section = root[sec];
      section[name] = value;
      out_.source.overrides[o.key] = o.arg();
    }
  }

  static bool is_section(const std::string& s) {
    for (const auto& [name, _] : spec_sections())
      if (name == s) return true;
    return false;
  }

  static const KeyDef* find_key_by_name(const std::string& name) {
    for (const auto& k : spec_keys())
      if (k.name() == name) return &k;
    return nullptr;
  }

  static std::string suggest_section(const std::string& s) {
    std::string best;
    int best_d = 3;
    for (const auto& [name, _] : spec_sections()) {
      int d = levenshtein(s, name);
      if (d < best_d) best_d = d, best = name;
    }
    return best;
  }

  static std::string section_list_hint(const std::string& already) {
    if (!already.empty()) return "";
    std::string s = " (sections:";
    for (const auto& [name, _] : spec_sections()) s += " " + name;
    return s + ")";
  }

  void parse_section(const std::string& sec, const YAML::Node& m, JobSpec& spec) {
    std::set<std::string> seen;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const YAML::Node k = it->first;  // a copy: it-> points into a temporary
      const YAML::Node v = it->second;
      if (!k.IsScalar()) {
        error(loc(k.Mark()), sec, "keys must be plain words, not " + std::string(node_kind(k)));
        continue;
      }
      const std::string path = sec + "." + k.Scalar();
      const KeyDef* kd = find_key(path);
      if (!kd) {
        std::string s = suggest_key(sec, k.Scalar());
        error(loc(k.Mark()), path,
              s.empty() ? fmt::format("unknown key (keys of {}: {})", sec, keys_of(sec))
                        : fmt::format("unknown key; did you mean '{}'?", s));
        continue;
      }
      if (!seen.insert(path).second) {
        error(loc(k.Mark()), path,
              fmt::format("duplicate key (first at line {})", out_.source.keys[path].line));
        continue;
      }
      out_.source.keys[path] = out_.source.overrides.count(path)
                                   ? Location{}
                                   : loc(v.Mark().is_null() ? k.Mark() : v.Mark());
      if (auto val = convert(*kd, v)) kd->set(spec, *val);
    }
  }

  static std::string keys_of(const std::string& sec) {
    std::string s;
    for (const auto& k : spec_keys())
      if (k.section() == sec) s += (s.empty() ? "" : ", ") + k.name();
    return s;
  }

  // Plain (unquoted) scalars are numbers/booleans; quoted ones are strings.
  static bool quoted(const YAML::Node& n) { return n.Tag() == "!"; }

  std::optional<int64_t> to_int(const KeyDef& kd, const YAML::Node& n, const std::string& path) {
    const std::string& s = n.Scalar();
    if (quoted(n)) {
      error(loc(n.Mark()), path, fmt::format("value {} is a quoted string; expected an integer",
                                             shown(s)));
      return std::nullopt;
    }
    int64_t v = 0;
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (b != e && *b == '+') ++b;
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc() && p == e && b != e) return v;
    if (ec == std::errc::result_out_of_range) {
      error(loc(n.Mark()), path,
            fmt::format("value {} is out of range; allowed {}", shown(s), range_text(kd)));
      return std::nullopt;
    }
    // Accept exact integers written in exponent form (seq_len: 1e6).
    double d = 0;
    auto [p2, ec2] = std::from_chars(b, e, d);
    if (ec2 == std::errc() && p2 == e && std::isfinite(d) && d == std::floor(d) &&
        std::fabs(d) <= 9.007199254740992e15) {
      return static_cast<int64_t>(d);
    }
    error(loc(n.Mark()), path, fmt::format("value {} is not an integer", shown(s)));
    return std::nullopt;
  }

  bool check_range(const KeyDef& kd, double v, const YAML::Node& n, const std::string& path,
                   const std::string& text) {
    bool ok = true;
    if (kd.min) ok = ok && (kd.min_exclusive ? v > *kd.min : v >= *kd.min);
    if (kd.max) ok = ok && v <= *kd.max;
    if (!ok) {
      error(loc(n.Mark()), path,
            fmt::format("value {} is out of range; allowed {}", text, range_text(kd)));
    }
    return ok;
  }

  std::optional<Value> convert(const KeyDef& kd, const YAML::Node& n) {
    const std::string& path = kd.path;
    if (n.IsNull()) {
      error(loc(n.Mark()), path,
            fmt::format("key has no value; give a {} or remove the key to use the default ({})",
                        to_string(kd.type), default_text(kd)));
      return std::nullopt;
    }
    bool list = kd.type == KeyType::kStringList || kd.type == KeyType::kIntList;
    if (!list && !n.IsScalar()) {
      error(loc(n.Mark()), path,
            fmt::format("value is {}; expected {}", node_kind(n), to_string(kd.type)));
      return std::nullopt;
    }
    switch (kd.type) {
      case KeyType::kInt: {
        auto v = to_int(kd, n, path);
        if (!v || !check_range(kd, static_cast<double>(*v), n, path, std::to_string(*v)))
          return std::nullopt;
        return Value{*v};
      }
      case KeyType::kFloat: {
        const std::string& s = n.Scalar();
        if (quoted(n)) {
          error(loc(n.Mark()), path,
                fmt::format("value {} is a quoted string; expected a number", shown(s)));
          return std::nullopt;
        }
        static const std::set<std::string> kYamlSpecial = {
            ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF",
            "-.inf", "-.Inf", "-.INF", "nan", "inf", "-inf", "+inf"};
        if (kYamlSpecial.count(s)) {
          error(loc(n.Mark()), path, fmt::format("value {} is not a finite number", shown(s)));
          return std::nullopt;
        }
        double d = 0;
        const char* b = s.data();
        const char* e = s.data() + s.size();
        if (b != e && *b == '+') ++b;
        auto [p, ec] = std::from_chars(b, e, d);
        if (ec != std::errc() || p != e || b == e) {
          error(loc(n.Mark()), path, fmt::format("value {} is not a number", shown(s)));
          return std::nullopt;
        }
        if (!std::isfinite(d)) {
          error(loc(n.Mark()), path, fmt::format("value {} is not a finite number", shown(s)));
          return std::nullopt;
        }
        if (!check_range(kd, d, n, path, s)) return std::nullopt;
        return Value{d};
      }
      case KeyType::kBool: {
        const std::string& s = n.Scalar();
        if (!quoted(n) && (s == "true" || s == "True" || s == "TRUE")) return Value{true};
        if (!quoted(n) && (s == "false" || s == "False" || s == "FALSE")) return Value{false};
        error(loc(n.Mark()), path, fmt::format("value {} is not a boolean; use true or false",
                                               shown(s)));
        return std::nullopt;
      }
      case KeyType::kString: {
        if (n.Scalar().size() > 4096) {
          error(loc(n.Mark()), path, "value is longer than 4096 characters");
          return std::nullopt;
        }
        return Value{n.Scalar()};
      }
      case KeyType::kEnum: {
        const std::string& s = n.Scalar();
        for (size_t i = 0; i < kd.choices.size(); ++i)
          if (kd.choices[i] == s) return Value{static_cast<int64_t>(i)};
        std::string hint;
        for (const auto& c : kd.choices)
          if (levenshtein(c, s) <= 2 || (s.size() > 0 && c.size() == s.size() &&
                                         levenshtein(c, s) <= 1))
            hint = fmt::format("; did you mean '{}'?", c);
        error(loc(n.Mark()), path,
              fmt::format("value {} is not one of {}{}", shown(s), range_text(kd), hint));
        return std::nullopt;
      }
      case KeyType::kStringList: {
        std::vector<std::string> out;
        if (n.IsScalar()) return Value{std::vector<std::string>{n.Scalar()}};
        if (!n.IsSequence()) {
          error(loc(n.Mark()), path,
                fmt::format("value is {}; expected a list of strings", node_kind(n)));
          return std::nullopt;
        }
        if (n.size() > 4096) {
          error(loc(n.Mark()), path, fmt::format("list has {} items; at most 4096", n.size()));
          return std::nullopt;
        }
        bool ok = true;
        for (size_t i = 0; i < n.size(); ++i) {
          const YAML::Node e = n[i];
          if (!e.IsScalar()) {
            error(loc(e.Mark()), fmt::format("{}[{}]", path, i),
                  fmt::format("item is {}; expected a string", node_kind(e)));
            ok = false;
            continue;
          }
          out.push_back(e.Scalar());
        }
        if (!ok) return std::nullopt;
        return Value{out};
      }
      case KeyType::kIntList: {
        std::vector<int64_t> out;
        if (!n.IsSequence()) {
          error(loc(n.Mark()), path,
                fmt::format("value is {}; expected a list of integers", node_kind(n)));
          return std::nullopt;
        }
        if (n.size() > 65536) {
          error(loc(n.Mark()), path, fmt::format("list has {} items; at most 65536", n.size()));
          return std::nullopt;
        }
        bool ok = true;
        for (size_t i = 0; i < n.size(); ++i) {
          const YAML::Node e = n[i];
          std::string ipath = fmt::format("{}[{}]", path, i);
          if (!e.IsScalar()) {
            error(loc(e.Mark()), ipath, fmt::format("item is {}; expected an integer",
                                                    node_kind(e)));
            ok = false;
            continue;
          }
          auto v = to_int(kd, e, ipath);
          if (!v || !check_range(kd, static_cast<double>(*v), e, ipath, std::to_string(*v))) {
            ok = false;
            continue;
          }
          out.push_back(*v);
        }
        if (!ok) return std::nullopt;
        return Value{out};
      }
    }
    return std::nullopt;
  }

  std::string name_;
  LoadResult& out_;
  const std::vector<Override>& overrides_;
  YAML::Node root_;
};

// The spec text the overrides made: the document as YAML under a comment naming the file and
// the overrides. Deterministic: the same file and overrides give the same bytes (a resumed run
// compares them).
std::string overridden_text(const std::string& name, const YAML::Node& root,
                            const std::vector<Override>& overrides) {
  auto comment = [](std::string_view s) {
    std::string out;
    for (unsigned char c : s) out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
    return out;
  };
  std::string t = "# " + comment(name) + " with these overrides (its comments are not kept):\n";
  for (const auto& o : overrides) t += "#   --set " + comment(o.arg()) + "\n";
  YAML::Emitter e;
  e << root;
  return t + e.c_str() + "\n";
}

// Whether `text` names the key path `key` as a whole ("model.heads (5)", not "model.heads_x").
bool mentions(std::string_view text, std::string_view key) {
  auto word = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  };
  for (size_t at = text.find(key); at != std::string_view::npos; at = text.find(key, at + 1)) {
    bool start = at == 0 || !word(text[at - 1]);
    const size_t e = at + key.size();
    // A full stop ends a sentence; a dot before a letter continues a path.
    bool end = e == text.size() || !word(text[e]) ||
               (text[e] == '.' && (e + 1 == text.size() || !word(text[e + 1])));
    if (start && end) return true;
  }
  return false;
}

// Whether two specs hold the same value for every key of the table.
std::string first_difference(const JobSpec& a, const JobSpec& b) {
  for (const auto& k : spec_keys())
    if (k.get && k.get(a) != k.get(b)) return k.path;
  return "";
}

}  // namespace

std::optional<Override> parse_override(std::string_view arg) {
  auto eq = arg.find('=');
  if (eq == std::string_view::npos || eq == 0) return std::nullopt;
  return Override{std::string(arg.substr(0, eq)), std::string(arg.substr(eq + 1))};
}

std::string Diagnostic::str() const {
  std::string s = file;
  if (where.line > 0) s += fmt::format(":{}:{}", where.line, where.column);
  s += severity == Severity::kError ? ": error: " : ": warning: ";
  if (!key.empty()) s += key + ": ";
  return s + message;
}

Location SourceMap::at(const std::string& key) const {
  if (auto it = keys.find(key); it != keys.end()) return it->second;
  auto sec = key.substr(0, key.find('.'));
  if (auto it = sections.find(sec); it != sections.end()) return it->second;
  return {};
}

size_t LoadResult::error_count() const {
  return std::count_if(diagnostics.begin(), diagnostics.end(), [](const Diagnostic& d) {
    return d.severity == Diagnostic::Severity::kError;
  });
}

std::string suggest_key(std::string_view section, std::string_view name) {
  std::string best;
  int best_d = std::max<int>(2, static_cast<int>(name.size()) / 3) + 1;
  for (const auto& k : spec_keys()) {
    if (k.section() != section) continue;
    int d = levenshtein(name, k.name());
    if (d < best_d) best_d = d, best = k.path;
  }
  if (!best.empty()) return best;
  for (const auto& k : spec_keys())  // right key, wrong section (seq_len under model)
    if (k.name() == name) return k.path;
  return "";
}

LoadResult load_spec_string(std::string_view text, const std::string& name,
                            const LoadOptions& options) {
  LoadResult r;
  if (text.size() <= kMaxSpecBytes) r.text = std::string(text);
  JobSpec spec = default_spec();
  Parser parser(name, r, options.overrides);
  parser.run(text, spec);
  if (r.error_count() == 0) {
    auto more = validate_spec(spec, r.source, options);
    r.diagnostics.insert(r.diagnostics.end(), more.begin(), more.end());
  }
  // A problem with an overridden key names the override; one about the key itself has no place
  // in the file. A cross-field rule names every override among the keys its message mentions.
  for (auto& d : r.diagnostics) {
    std::string named;
    for (const auto& [key, arg] : r.source.overrides) {
      if (d.key.substr(0, d.key.find('[')) == key)
        d.where = {};
      else if (!mentions(d.message, key))
        continue;
      named += (named.empty() ? " (--set " : ", --set ") + arg;
    }
    if (!named.empty()) d.message += named + ")";
  }
  if (r.error_count() == 0 && !options.overrides.empty()) {
    // What callers submit and record: the spec the overrides made, checked to read back the same.
    r.text = overridden_text(name, parser.root(), options.overrides);
    LoadOptions plain = options;
    plain.overrides.clear();
    auto back = load_spec_string(r.text, name, plain);
    std::string diff = back.spec ? first_difference(*back.spec, spec) : "the whole spec";
    if (!diff.empty())
      r.diagnostics.push_back({Diagnostic::Severity::kError,
                               name,
                               {},
                               diff,
                               "the spec with the --set overrides does not read back the same "
                               "(an internal error: please report it with the spec)"});
  }
  if (r.error_count() == 0) {
    resolve_spec(spec);
    r.spec = std::move(spec);
  }
  return r;
}

namespace {

LoadResult file_error(const std::string& path, std::string message) {
  LoadResult r;
  r.source.file = path;
  r.diagnostics.push_back({Diagnostic::Severity::kError, path, {}, "", std::move(message)});
  return r;
}

// What a non-regular file is, for the message.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a named pipe (FIFO)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

// Reads at most kMaxSpecBytes + 1 bytes (enough to say the file is too big), EINTR-safe.
std::optional<std::string> read_capped(int fd, std::string& error) {
  std::string text;
  char buf[65536];
  while (text.size() <= kMaxSpecBytes) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

LoadResult load_spec_file(const std::string& path, const LoadOptions& options) {
  std::string error;
  if (path == "-" && options.allow_stdin) {
    auto text = read_capped(STDIN_FILENO, error);
    if (!text) return file_error("<stdin>", "cannot read standard input: " + error);
    return load_spec_string(*text, "<stdin>", options);
  }
  const std::string rule = "; a spec must be a regular file" +
                           std::string(options.allow_stdin ? " (or '-' for standard input)" : "");
  // stat before open: opening a FIFO blocks until a writer comes, and opening a device can
  // have effects of its own.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return file_error(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return file_error(path, std::string("is ") + file_kind(st.st_mode) + rule);
  // O_NONBLOCK: should the path have been replaced by a FIFO since the stat, open returns at
  // once and the fstat below refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return file_error(path, std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return file_error(path, std::string("is ") + file_kind(st.st_mode) + rule);
  }
  auto text = read_capped(fd, error);
  ::close(fd);
  if (!text) return file_error(path, "read error: " + error);
  return load_spec_string(*text, path, options);
}

}  // namespace ring::spec
