// Chat / instruction data (data.source: chat): conversations read from JSONL, rendered with a
// chat template and encoded to token ids with a loss mask that trains on the assistant turns only.
//
//   ChatTemplate t = chat_template("chatml");                 // or "llama3", or a YAML file
//   std::vector<Conversation> c = read_chat_jsonl("sft.jsonl");
//   ChatEncoder enc(t, tokenizer.get());                      // nullptr: byte-level
//   EncodedChat e = enc.encode(c[0]);                         // e.ids [n], e.mask [n] (1: target)
//
// JSONL: one conversation per line (blank lines skipped), either
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
// or {"prompt": "...", "response": "..."} (with an optional "system"), read as system?, user,
// assistant. Every conversation needs at least one assistant turn (nothing to train on
// otherwise). Other fields are ignored. Errors name the file, the line and the field.
//
// A template (docs/data.md, "Chat data") is a per-role prefix / end / separator:
//   [bos] then for each message: prefix(role) content end(role) separator(role)
// with content stripped of surrounding whitespace when `trim` is set. The mask marks the TARGETS:
// an assistant message's content and its end (the end-of-turn token, <|eot_id|> or <|im_end|>, so
// the model learns to stop, as common SFT recipes do); bos, prefixes, separators and every other
// role's tokens are not targets. Template text is split at the template's special tokens, each
// encoded as its one id (looked up in the tokenizer's added / special tokens, refused when
// missing); the text between them and every content are encoded with Tokenizer::encode (no
// BOS/EOS framing: the template gives it). Each part is encoded on its own, so a token never
// straddles a target boundary.
//
// Built in, the strings of the official templates (Hugging Face chat_template of
// Meta-Llama-3-8B-Instruct and the ChatML of Qwen2/2.5 without a default system message):
//   llama3  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>...
//           (content trimmed, as the official `| trim`)
//   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n...
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/data/tokenizer.h"

namespace ring::data {

enum class ChatRole { kSystem, kUser, kAssistant };
const char* to_string(ChatRole r);

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
};

struct Conversation {
  std::vector<ChatMessage> messages;
  std::string where;  // "file:line", for messages
};

struct ChatTemplate {
  struct Role {
    bool defined = false;
    std::string prefix;     // before the content, never a target
    std::string end;        // after the content; a target for the assistant
    std::string separator;  // after the end, never a target
  };
  std::string name;  // "llama3", "chatml" or the file's path
  std::string bos;   // once at the start of each conversation, never a target
  Role roles[3];     // indexed by ChatRole
  bool trim = false;
  // Strings of the template text encoded as single ids (looked up in the tokenizer).
  std::vector<std::string> special_tokens;

  const Role& role(ChatRole r) const { return roles[static_cast<int>(r)]; }
};

// "llama3", "chatml", or a path to a YAML template file (docs/data.md). Throws DataError naming
// data.chat_template, the file and the key.
ChatTemplate chat_template(const std::string& name_or_path);

// Reads one JSONL file. Throws DataError "chat data 'FILE' line N: FIELD ..." for a line that is
// not a JSON object, a missing or non-string field, an unknown role, or no assistant turn.
std::vector<Conversation> read_chat_jsonl(const std::string& path);
// Files in order; a directory is read recursively (*.jsonl files, sorted by name).
std::vector<Conversation> read_chat_paths(const std::vector<std::string>& paths);

// One piece of a rendered conversation.
struct ChatPart {
  std::string text;
  bool target = false;    // assistant content and end
  bool template_ = true;  // template text (split at special tokens); false: message content
};

// The conversation as the template renders it, part by part; concatenating the texts gives the
// string the official template produces.
std::vector<ChatPart> render_chat(const ChatTemplate& t, const Conversation& c);
std::string render_chat_text(const ChatTemplate& t, const Conversation& c);

struct EncodedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // [ids] 1: the token is a training target
};

class ChatEncoder {
 public:
  // `tok` nullptr: byte-level (ids 0..255; the template may then have no special tokens).
  // Throws DataError naming data.chat_template and the token when the tokenizer lacks a special
  // token of the template. `tok` must outlive the encoder.
  ChatEncoder(ChatTemplate t, const Tokenizer* tok);
  EncodedChat encode(const Conversation& c) const;
  int64_t max_token() const;

 private:
  void encode_text(const std::string& s, bool split, bool target, EncodedChat& out) const;

  ChatTemplate t_;
  const Tokenizer* tok_;
  std::vector<int32_t> special_ids_;  // [t_.special_tokens]
};

}  // namespace ring::data
