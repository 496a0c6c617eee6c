#include "worker/data/chat.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kRoleNames[] = {"system", "user", "assistant"};

ChatTemplate llama3_template() {
  ChatTemplate t;
  t.name = "llama3";
  t.bos = "<|begin_of_text|>";
  for (int r = 0; r < 3; ++r)
    t.roles[r] = {true, fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n", kRoleNames[r]),
                  "<|eot_id|>", ""};
  t.trim = true;
  t.special_tokens = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>"};
  return t;
}

ChatTemplate chatml_template() {
  ChatTemplate t;
  t.name = "chatml";
  for (int r = 0; r < 3; ++r)
    t.roles[r] = {true, fmt::format("<|im_start|>{}\n", kRoleNames[r]), "<|im_end|>", "\n"};
  t.special_tokens = {"<|im_start|>", "<|im_end|>"};
  return t;
}

// A YAML template file (docs/data.md): bos, trim, special_tokens, system/user/assistant maps of
// prefix, end, separator. Unknown keys are refused.
ChatTemplate load_template_file(const std::string& path) {
  auto fail = [&](const std::string& key, const std::string& what) {
    return DataError(fmt::format("data.chat_template '{}': {}: {}", path, key, what));
  };
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw DataError(fmt::format(
        "data.chat_template '{}': not a built-in template (llama3, chatml) and the file cannot "
        "be read",
        path));
  } catch (const YAML::Exception& e) {
    throw DataError(fmt::format("data.chat_template '{}': not valid YAML: {}", path, e.what()));
  }
  if (!root.IsMap()) throw fail("(top level)", "must be a mapping of template keys");
  auto str = [&](const YAML::Node& n, const std::string& key) {
    if (!n.IsScalar()) throw fail(key, "must be a string");
    return n.as<std::string>();
  };
  ChatTemplate t;
  t.name = path;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "bos") {
      t.bos = str(v, key);
    } else if (key == "trim") {
      try {
        t.trim = v.as<bool>();
      } catch (const YAML::Exception&) {
        throw fail(key, "must be true or false");
      }
    } else if (key == "special_tokens") {
      if (!v.IsSequence()) throw fail(key, "must be a list of strings");
      for (size_t i = 0; i < v.size(); ++i) {
        t.special_tokens.push_back(str(v[i], fmt::format("special_tokens[{}]", i)));
        if (t.special_tokens.back().empty())
          throw fail(fmt::format("special_tokens[{}]", i), "must not be empty");
      }
    } else if (key == "system" || key == "user" || key == "assistant") {
      const int r = key == "system" ? 0 : key == "user" ? 1 : 2;
      if (!v.IsMap()) throw fail(key, "must be a mapping with prefix, end and separator");
      ChatTemplate::Role& role = t.roles[r];
      role.defined = true;
      for (const auto& f : v) {
        const std::string field = f.first.as<std::string>();
        const std::string at = key + "." + field;
        if (field == "prefix") {
          role.prefix = str(f.second, at);
        } else if (field == "end") {
          role.end = str(f.second, at);
        } else if (field == "separator") {
          role.separator = str(f.second, at);
        } else {
          throw fail(at, "unknown key (a role has prefix, end and separator)");
        }
      }
    } else {
      throw fail(key,
                 "unknown key (a template has bos, trim, special_tokens, system, user, "
                 "assistant)");
    }
  }
  if (!t.role(ChatRole::kUser).defined || !t.role(ChatRole::kAssistant).defined)
    throw fail(t.role(ChatRole::kUser).defined ? "assistant" : "user",
               "missing: a template defines at least the user and assistant roles");
  return t;
}

std::string trim_ws(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// One JSONL line -> a conversation. `at` is "chat data 'FILE' line N".
Conversation parse_line(const std::string& line, const std::string& at) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", at, e.what()));
  }
  if (!j.is_object())
    throw DataError(
        fmt::format("{}: must be a JSON object with \"messages\" or \"prompt\" and "
                    "\"response\"",
                    at));
  auto text = [&](const json& o, const char* field, const std::string& name) -> std::string {
    auto it = o.find(field);
    if (it == o.end()) throw DataError(fmt::format("{}: field '{}' is missing", at, name));
    if (!it->is_string())
      throw DataError(
          fmt::format("{}: field '{}' must be a string, not {}", at, name, it->type_name()));
    return it->get<std::string>();
  };
  Conversation c;
  if (j.contains("messages")) {
    const json& m = j["messages"];
    if (!m.is_array() || m.empty())
      throw DataError(fmt::format("{}: field 'messages' must be a non-empty array", at));
    for (size_t i = 0; i < m.size(); ++i) {
      const std::string name = fmt::format("messages[{}]", i);
      if (!m[i].is_object())
        throw DataError(
            fmt::format("{}: field '{}' must be an object with role and content", at, name));
      const std::string role = text(m[i], "role", name + ".role");
      const auto* r = std::find(std::begin(kRoleNames), std::end(kRoleNames), role);
      if (r == std::end(kRoleNames))
        throw DataError(fmt::format(
            "{}: field '{}.role' is '{}', not one of system, user, assistant", at, name, role));
      c.messages.push_back({static_cast<ChatRole>(r - std::begin(kRoleNames)),
                            text(m[i], "content", name + ".content")});
    }
  } else if (j.contains("prompt") || j.contains("response")) {
    if (j.contains("system"))
      c.messages.push_back({ChatRole::kSystem, text(j, "system", "system")});
    c.messages.push_back({ChatRole::kUser, text(j, "prompt", "prompt")});
    c.messages.push_back({ChatRole::kAssistant, text(j, "response", "response")});
  } else {
    throw DataError(
        fmt::format("{}: field 'messages' is missing (a line holds \"messages\" or \"prompt\" and "
                    "\"response\")",
                    at));
  }
  if (std::none_of(c.messages.begin(), c.messages.end(),
                   [](const ChatMessage& m) { return m.role == ChatRole::kAssistant; }))
    throw DataError(fmt::format(
        "{}: field 'messages' has no assistant turn (nothing to train on: every label would be "
        "masked)",
        at));
  return c;
}

}  // namespace

const char* to_string(ChatRole r) {
  return kRoleNames[static_cast<int>(r)];
}

ChatTemplate chat_template(const std::string& name_or_path) {
  if (name_or_path == "llama3") return llama3_template();
  if (name_or_path == "chatml") return chatml_template();
  if (name_or_path.empty())
    throw DataError(
        "data.chat_template: data.source chat needs a template: llama3, chatml or "
        "the path of a YAML template file");
  return load_template_file(name_or_path);
}

std::vector<Conversation> read_chat_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("chat data '{}': cannot be read", path));
  std::vector<Conversation> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = fmt::format("chat data '{}' line {}", path, n);
    out.push_back(parse_line(line, at));
    out.back().where = fmt::format("{}:{}", path, n);
  }
  return out;
}

std::vector<Conversation> read_chat_paths(const std::vector<std::string>& paths) {
  if (paths.empty()) throw DataError("data.paths: no chat JSONL file given for the chat source");
  std::vector<Conversation> out;
  auto add = [&](const std::string& file) {
    auto c = read_chat_jsonl(file);
    out.insert(out.end(), std::make_move_iterator(c.begin()), std::make_move_iterator(c.end()));
  };
  for (const std::string& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      add(p);
      continue;
    }
    std::vector<std::string> files;
    for (auto it = fs::recursive_directory_iterator(
             p, fs::directory_options::follow_directory_symlink, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->path().extension() == ".jsonl" && it->is_regular_file(ec))
        files.push_back(it->path().string());
    if (ec)
      throw DataError(fmt::format("data.paths: cannot read directory '{}': {}", p, ec.message()));
    std::sort(files.begin(), files.end());
    for (const auto& f : files) add(f);
  }
  if (out.empty())
    throw DataError(
        fmt::format("data.paths: no conversation in the chat data ({} path(s))", paths.size()));
  return out;
}

std::vector<ChatPart> render_chat(const ChatTemplate& t, const Conversation& c) {
  std::vector<ChatPart> parts;
  auto add = [&](std::string s, bool target, bool tmpl) {
    if (!s.empty()) parts.push_back({std::move(s), target, tmpl});
  };
  add(t.bos, false, true);
  for (const ChatMessage& m : c.messages) {
    const ChatTemplate::Role& r = t.role(m.role);
    if (!r.defined)
      throw DataError(fmt::format("chat data {}: role {} is not defined by data.chat_template '{}'",
                                  c.where, to_string(m.role), t.name));
    const bool target = m.role == ChatRole::kAssistant;
    add(r.prefix, false, true);
    add(t.trim ? trim_ws(m.content) : m.content, target, false);
    add(r.end, target, true);
    add(r.separator, false, true);
  }
  return parts;
}

std::string render_chat_text(const ChatTemplate& t, const Conversation& c) {
  std::string s;
  for (const ChatPart& p : render_chat(t, c)) s += p.text;
  return s;
}

ChatEncoder::ChatEncoder(ChatTemplate t, const Tokenizer* tok) : t_(std::move(t)), tok_(tok) {
  for (const std::string& s : t_.special_tokens) {
    if (tok_ == nullptr)
      throw DataError(fmt::format(
          "data.chat_template '{}': its special token '{}' needs data.tokenizer (without one the "
          "data is byte-level and has no special tokens)",
          t_.name, s));
    const int32_t id = tok_->special_token_id(s);
    if (id < 0)
      throw DataError(
          fmt::format("data.chat_template '{}': the tokenizer '{}' has no special token '{}' (a {} "
                      "template needs a tokenizer made for it)",
                      t_.name, tok_->path(), s, t_.name));
    special_ids_.push_back(id);
  }
}

int64_t ChatEncoder::max_token() const {
  return tok_ == nullptr ? 255 : tok_->vocab_size() - 1;
}

void ChatEncoder::encode_text(const std::string& s, bool split, bool target,
                              EncodedChat& out) const {
  auto plain = [&](std::string_view text) {
    if (text.empty()) return;
    const size_t before = out.ids.size();
    if (tok_ == nullptr) {
      for (unsigned char ch : text) out.ids.push_back(ch);
    } else {
      tok_->encode(text, out.ids);
    }
    out.mask.resize(out.ids.size(), 0);
    std::fill(out.mask.begin() + static_cast<std::ptrdiff_t>(before), out.mask.end(),
              target ? 1 : 0);
  };
  if (!split || special_ids_.empty()) return plain(s);
  // Leftmost, then longest, special token.
  size_t at = 0;
  while (at < s.size()) {
    size_t best = std::string::npos, len = 0;
    int32_t id = -1;
    for (size_t k = 0; k < t_.special_tokens.size(); ++k) {
      const std::string& sp = t_.special_tokens[k];
      const size_t p = s.find(sp, at);
      if (p != std::string::npos && (p < best || (p == best && sp.size() > len))) {
        best = p;
        len = sp.size();
        id = special_ids_[k];
      }
    }
    if (best == std::string::npos) break;
    plain(std::string_view(s).substr(at, best - at));
    out.ids.push_back(id);
    out.mask.push_back(target ? 1 : 0);
    at = best + len;
  }
  plain(std::string_view(s).substr(std::min(at, s.size())));
}

EncodedChat ChatEncoder::encode(const Conversation& c) const {
  EncodedChat out;
  for (const ChatPart& p : render_chat(t_, c)) encode_text(p.text, p.template_, p.target, out);
  return out;
}

}  // namespace ring::data
