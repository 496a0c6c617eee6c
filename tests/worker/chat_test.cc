// Chat / instruction data (worker/data/chat.h): the two built-in templates against hand-written
// strings, the loss mask's positions, bad JSONL named by file, line and field, the mask through
// the packing loader (labels -1 except on assistant targets, long conversations continuing in
// the next sequence, exact resume), and the mask through the token format (v2 .mask written and
// read back, a v1 file written by the previous writer still read, ringctl tokenize on JSONL).
//
// The tokenizer.json of these tests is byte-level BPE without merges, so a text's ids are its
// bytes and the expected ids can be written by hand; the special tokens are ids 256 and up.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "worker/data/chat.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/token_corpus.h"
#include "worker/data/token_file.h"

namespace fs = std::filesystem;
using namespace ring::data;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "ring_chat_test_XXXXXX").string();
    path_ = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& rel, const std::string& bytes) const {
    const fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string operator/(const std::string& rel) const { return (fs::path(path_) / rel).string(); }

 private:
  std::string path_;
};

const std::vector<std::string> kSpecials = {"<|begin_of_text|>", "<|start_header_id|>",
                                            "<|end_header_id|>", "<|eot_id|>",
                                            "<|im_start|>",      "<|im_end|>"};
constexpr int32_t kBot = 256, kSh = 257, kEh = 258, kEot = 259, kImStart = 260, kImEnd = 261;

// GPT-2's byte -> printable character map (tokenizer.json byte-level vocab keys).
std::string byte_char(int b) {
  int c = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    c = 256 + n;
  }
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Byte-level BPE without merges: text id = byte; `specials` as added tokens from id 256.
std::string write_tokenizer(const TempDir& dir, const std::vector<std::string>& specials) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", 256 + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  nlohmann::json t = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return dir.write("tok/tokenizer.json", t.dump());
}

std::vector<int32_t> bytes(const std::string& s) {
  return std::vector<int32_t>(s.begin(), s.end());
}

Conversation sample_conversation() {
  return Conversation{{{ChatRole::kSystem, "Be brief."},
                       {ChatRole::kUser, "Hi"},
                       {ChatRole::kAssistant, " Hello!\n"},
                       {ChatRole::kUser, "2+2?"},
                       {ChatRole::kAssistant, "4"}},
                      "test"};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// Meta-Llama-3-8B-Instruct's chat_template: bos, then per message
// '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'.
TEST(ChatTemplate, Llama3RendersTheOfficialString) {
  const std::string expected =
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>";
  EXPECT_EQ(render_chat_text(chat_template("llama3"), sample_conversation()), expected);
}

// ChatML (Qwen2): '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n', no trim.
TEST(ChatTemplate, ChatmlRendersTheOfficialString) {
  const std::string expected =
      "<|im_start|>system\nBe brief.<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\n Hello!\n<|im_end|>\n"
      "<|im_start|>user\n2+2?<|im_end|>\n"
      "<|im_start|>assistant\n4<|im_end|>\n";
  EXPECT_EQ(render_chat_text(chat_template("chatml"), sample_conversation()), expected);
}

TEST(ChatTemplate, MaskCoversAssistantContentAndEndOfTurnOnly) {
  TempDir dir;
  auto tok = Tokenizer::load(write_tokenizer(dir, kSpecials));
  // llama3: by hand, token by token.
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  auto add = [&](const std::vector<int32_t>& v, bool target) {
    ids.insert(ids.end(), v.begin(), v.end());
    mask.insert(mask.end(), v.size(), target ? 1 : 0);
  };
  auto header = [&](const std::string& role) {
    add({kSh}, false);
    add(bytes(role), false);
    add({kEh}, false);
    add(bytes("\n\n"), false);
  };
  add({kBot}, false);
  header("system");
  add(bytes("Be brief."), false);
  add({kEot}, false);
  header("user");
  add(bytes("Hi"), false);
  add({kEot}, false);
  header("assistant");
  add(bytes("Hello!"), true);
  add({kEot}, true);
  header("user");
  add(bytes("2+2?"), false);
  add({kEot}, false);
  header("assistant");
  add(bytes("4"), true);
  add({kEot}, true);
  EncodedChat e = ChatEncoder(chat_template("llama3"), tok.get()).encode(sample_conversation());
  EXPECT_EQ(e.ids, ids);
  EXPECT_EQ(e.mask, mask);

  // chatml: the separator "\n" after <|im_end|> is not a target.
  ids.clear();
  mask.clear();
  for (const ChatMessage& m : sample_conversation().messages) {
    const bool a = m.role == ChatRole::kAssistant;
    add({kImStart}, false);
    add(bytes(std::string(to_string(m.role)) + "\n"), false);
    add(bytes(m.content), a);
    add({kImEnd}, a);
    add(bytes("\n"), false);
  }
  e = ChatEncoder(chat_template("chatml"), tok.get()).encode(sample_conversation());
  EXPECT_EQ(e.ids, ids);
  EXPECT_EQ(e.mask, mask);
}

TEST(ChatTemplate, MissingSpecialTokensAreRefused) {
  TempDir dir;
  auto tok = Tokenizer::load(write_tokenizer(dir, {"<|begin_of_text|>", "<|eot_id|>"}));
  std::string m = error_of([&] { ChatEncoder(chat_template("chatml"), tok.get()); });
  EXPECT_NE(m.find("data.chat_template 'chatml': the tokenizer"), std::string::npos) << m;
  EXPECT_NE(m.find("has no special token '<|im_start|>'"), std::string::npos) << m;
  m = error_of([&] { ChatEncoder(chat_template("llama3"), tok.get()); });
  EXPECT_NE(m.find("'<|start_header_id|>'"), std::string::npos) << m;
  m = error_of([&] { ChatEncoder(chat_template("llama3"), nullptr); });
  EXPECT_NE(m.find("needs data.tokenizer"), std::string::npos) << m;
}

TEST(ChatTemplate, UserTemplateFile) {
  TempDir dir;
  const std::string path =
      dir.write("t.yaml",
                "bos: \"<s>\"\n"
                "special_tokens: [\"<s>\"]\n"
                "user: {prefix: \"[INST] \", end: \" [/INST]\"}\n"
                "assistant: {prefix: \" \", end: \"</s>\", separator: \"\"}\n");
  ChatTemplate t = chat_template(path);
  Conversation c{{{ChatRole::kUser, "a"}, {ChatRole::kAssistant, "b"}}, "x"};
  EXPECT_EQ(render_chat_text(t, c), "<s>[INST] a [/INST] b</s>");
  // The system role is not defined by this template.
  c.messages.insert(c.messages.begin(), {ChatRole::kSystem, "s"});
  std::string m = error_of([&] { render_chat_text(t, c); });
  EXPECT_NE(m.find("role system is not defined by data.chat_template"), std::string::npos) << m;
  // Unknown keys, and a missing role, name the key.
  m = error_of([&] { chat_template(dir.write("u.yaml", "user: {prefix: a, suffix: b}\n")); });
  EXPECT_NE(m.find("user.suffix: unknown key"), std::string::npos) << m;
  m = error_of([&] { chat_template(dir.write("v.yaml", "user: {prefix: a}\n")); });
  EXPECT_NE(m.find("assistant: missing"), std::string::npos) << m;
  m = error_of([&] { chat_template(dir / "none.yaml"); });
  EXPECT_NE(m.find("not a built-in template (llama3, chatml) and the file cannot be read"),
            std::string::npos)
      << m;
}

TEST(ChatData, JsonlBothShapes) {
  TempDir dir;
  const std::string p =
      dir.write("a.jsonl",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                "\"content\":\"r\"}]}\n\n"
                "{\"system\":\"s\",\"prompt\":\"q2\",\"response\":\"r2\",\"id\":7}\n");
  auto c = read_chat_jsonl(p);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].messages.size(), 2u);
  ASSERT_EQ(c[1].messages.size(), 3u);
  EXPECT_EQ(c[1].messages[0].role, ChatRole::kSystem);
  EXPECT_EQ(c[1].messages[1].content, "q2");
  EXPECT_EQ(c[1].messages[2].role, ChatRole::kAssistant);
  EXPECT_EQ(c[1].where, p + ":3");
}

TEST(ChatData, BadLinesNameFileLineAndField) {
  TempDir dir;
  const std::string ok = "{\"prompt\":\"q\",\"response\":\"r\"}\n";
  struct Case {
    std::string line, expect;
  } cases[] = {
      {"{\"messages\": [", "line 2: not valid JSON"},
      {"{\"messages\":[{\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}]}",
       "line 2: field 'messages[0].role' is missing"},
      {"{\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}",
       "line 2: field 'messages[0].role' is 'bot', not one of system, user, assistant"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
       "line 2: field 'messages' has no assistant turn"},
      {"{\"messages\":[{\"role\":\"assistant\",\"content\":3}]}",
       "line 2: field 'messages[0].content' must be a string"},
      {"{\"prompt\":\"x\"}", "line 2: field 'response' is missing"},
      {"{\"text\":\"x\"}", "line 2: field 'messages' is missing"},
      {"[1,2]", "line 2: must be a JSON object"},
  };
  for (const auto& c : cases) {
    const std::string p = dir.write("bad.jsonl", ok + c.line + "\n" + ok);
    const std::string m = error_of([&] { read_chat_jsonl(p); });
    EXPECT_NE(m.find("chat data '" + p + "' " + c.expect), std::string::npos)
        << c.line << "\n  -> " << m;
  }
}

namespace {

// Conversations with long assistant turns; byte-level with a user template (no tokenizer).
std::string write_chat_data(const TempDir& dir, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    nlohmann::json j;
    j["messages"] = {{{"role", "user"}, {"content", "question " + std::to_string(i)}},
                     {{"role", "assistant"},
                      {"content", "answer " + std::string(static_cast<size_t>(3 + 7 * i),
                                                          static_cast<char>('a' + i % 26))}}};
    if (i % 3 == 0) j["messages"].push_back({{"role", "user"}, {"content", "thanks"}});
    s += j.dump() + "\n";
  }
  return dir.write("chat.jsonl", s);
}

std::string write_byte_template(const TempDir& dir) {
  return dir.write("bytes.yaml",
                   "user: {prefix: \"<u>\", end: \"</u>\"}\n"
                   "assistant: {prefix: \"<a>\", end: \"</a>\", separator: \"\\n\"}\n");
}

ring::spec::DataSection chat_section(const std::vector<std::string>& paths, const std::string& tmpl,
                                     int64_t seq_len) {
  ring::spec::DataSection d;
  d.source = ring::spec::DataSource::kChat;
  d.paths = paths;
  d.chat_template = tmpl;
  d.seq_len = seq_len;
  d.pack = true;
  d.min_doc_len = 1;
  d.seed = 3;
  return d;
}

}  // namespace

// Labels are the next token where that token is a target, -1 elsewhere; a conversation longer
// than the sequence continues in the next one with its mask.
TEST(ChatLoader, LabelsFollowTheMaskAcrossSequences) {
  TempDir dir;
  const auto data = write_chat_data(dir, 12);
  const auto tmpl = write_byte_template(dir);
  // max_doc_len 0 -> seq_len; a longer max_doc_len keeps whole conversations (the last ones are
  // longer than seq_len 64).
  auto d = chat_section({data}, tmpl, 64);
  d.max_doc_len = 1000;
  auto src = make_source(d);
  auto* loader = dynamic_cast<TextLoader*>(src.get());
  ASSERT_NE(loader, nullptr);
  const auto& corpus = dynamic_cast<const TokenCorpus&>(loader->corpus());
  EXPECT_EQ(std::string(corpus.source_name()), "chat");
  ASSERT_TRUE(corpus.has_mask());
  // Independently of the encoder: in the rendered bytes, the targets are exactly each assistant
  // content and its "</a>".
  const ChatTemplate t = chat_template(tmpl);
  const auto convs = read_chat_jsonl(data);
  int64_t longest = 0;
  for (int64_t i = 0; i < corpus.num_docs(); ++i) {
    const std::vector<int32_t> ids = corpus.doc(i);
    const std::string text(ids.begin(), ids.end());
    EXPECT_EQ(text, render_chat_text(t, convs[i]));
    std::vector<uint8_t> expect(text.size(), 0);
    for (size_t at = text.find("<a>"); at != std::string::npos; at = text.find("<a>", at + 1)) {
      const size_t end = text.find("</a>", at) + 4;
      std::fill(expect.begin() + static_cast<std::ptrdiff_t>(at + 3),
                expect.begin() + static_cast<std::ptrdiff_t>(end), 1);
    }
    EXPECT_EQ(corpus.doc_mask(i), expect) << "conversation " << i;
    longest = std::max<int64_t>(longest, corpus.doc_len(i));
  }
  ASSERT_GT(longest, 64) << "no conversation longer than a sequence: the test is not sharp";
  // Through the loader, over two epochs: each label either -1 or the next token of the segment,
  // and -1 exactly where the document's next token is not a target.
  int64_t valid = 0, masked = 0, continued = 0;
  for (int s = 0; s < 40; ++s) {
    Sequence seq = loader->next_sequence();
    check_sequence(seq, 256);
    for (int64_t g = 0; g < seq.num_segments(); ++g) {
      const auto& src_seg = seq.segments[g];
      const int64_t b = seq.cu_seqlens[g], e = seq.cu_seqlens[g + 1];
      if (src_seg.offset > 0) ++continued;
      const auto mask = corpus.doc_mask(src_seg.doc);
      for (int64_t k = b; k + 1 < e; ++k) {
        const bool target = mask[src_seg.offset + (k - b) + 1] != 0;
        EXPECT_EQ(seq.labels[k], target ? seq.tokens[k + 1] : kIgnoreLabel);
        (target ? valid : masked) += 1;
      }
      EXPECT_EQ(seq.labels[e - 1], kIgnoreLabel);
    }
  }
  EXPECT_GT(valid, 0);
  EXPECT_GT(masked, 0);
  EXPECT_GT(continued, 0) << "no conversation continued in a next sequence";
}

TEST(ChatLoader, CursorResumeIsExactAndHashCoversTheMask) {
  TempDir dir;
  const auto data = write_chat_data(dir, 9);
  const auto tmpl = write_byte_template(dir);
  auto d = chat_section({data}, tmpl, 48);
  auto ref = make_source(d);
  for (int s = 0; s < 7; ++s) ref->next_sequence();
  const std::string saved = nlohmann::json(ref->cursor()).dump();
  auto resumed = make_source(d);
  resumed->seek(nlohmann::json::parse(saved).get<Cursor>());
  for (int s = 0; s < 10; ++s) {
    Sequence a = ref->next_sequence(), b = resumed->next_sequence();
    EXPECT_EQ(a.tokens, b.tokens) << s;
    EXPECT_EQ(a.labels, b.labels) << s;
    EXPECT_EQ(a.cu_seqlens, b.cu_seqlens) << s;
  }
  // The same ids with another mask (user and assistant swap their text) are other data.
  const auto swapped = dir.write("swapped.yaml",
                                 "user: {prefix: \"<a>\", end: \"</a>\", separator: \"\\n\"}\n"
                                 "assistant: {prefix: \"<u>\", end: \"</u>\"}\n");
  const auto swapped_data = dir.write("s.jsonl",
                                      "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\"},"
                                      "{\"role\":\"user\",\"content\":\"y\"}]}\n");
  const auto plain_data = dir.write("p.jsonl",
                                    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                                    "{\"role\":\"assistant\",\"content\":\"y\"}]}\n");
  auto a = make_source(chat_section({swapped_data}, swapped, 16));
  auto b = make_source(chat_section({plain_data}, tmpl, 16));
  EXPECT_EQ(a->next_sequence().tokens, b->next_sequence().tokens);    // the same ids...
  EXPECT_NE(a->identity().content_hash, b->identity().content_hash);  // ...another mask
  const std::string m = error_of([&] { a->seek(b->cursor()); });
  EXPECT_NE(m.find("content"), std::string::npos) << m;
}

TEST(ChatTokens, MaskWrittenAndReadBack) {
  TempDir dir;
  const auto data = write_chat_data(dir, 10);
  const auto tmpl = write_byte_template(dir);
  auto chats = read_chat_jsonl(data);
  ChatEncoder enc(chat_template(tmpl), nullptr);
  {
    TokenFileWriter w(dir / "c", 2, 256, /*with_mask=*/true);
    for (const auto& c : chats) {
      EncodedChat e = enc.encode(c);
      w.add_document(e.ids, e.mask);
    }
    w.finish();
  }
  auto f = TokenFile::open(dir / "c");
  EXPECT_EQ(f->version(), kTokenIdxVersion);
  ASSERT_NE(f->mask(), nullptr);
  // The tokens source gives the chat source's sequences, labels included.
  auto from_chat = make_source(chat_section({data}, tmpl, 64));
  auto d = chat_section({dir / "c"}, "", 64);
  d.source = ring::spec::DataSource::kTokens;
  auto from_tokens = make_source(d);
  for (int s = 0; s < 12; ++s) {
    Sequence a = from_chat->next_sequence(), b = from_tokens->next_sequence();
    ASSERT_EQ(a.tokens, b.tokens) << s;
    ASSERT_EQ(a.labels, b.labels) << s;
  }
  // A mask of the wrong size, a mask for a dataset without one, unknown flags: named.
  { std::ofstream(dir / "c.mask", std::ios::binary | std::ios::trunc) << "x"; }
  std::string m = error_of([&] { TokenFile::open(dir / "c"); });
  EXPECT_NE(m.find("c.mask': 1 bytes"), std::string::npos) << m;
  {
    TokenFileWriter w(dir / "c", 2, 256, true);
    std::vector<int32_t> ids{1, 2, 3};
    m = error_of([&] { w.add_document(ids); });
    EXPECT_NE(m.find("has 0 mask entries for 3 ids"), std::string::npos) << m;
  }
}

// A dataset written by the writer before loss masks (format version 1, checked in) still reads,
// every token a target.
TEST(ChatTokens, Version1FileStillReads) {
  const std::string fixture = std::string(RING_SOURCE_DIR) + "/tests/worker/fixtures/v1-tokens";
  auto f = TokenFile::open(fixture);
  EXPECT_EQ(f->version(), 1u);
  EXPECT_EQ(f->mask(), nullptr);
  auto c = TokenCorpus::open({fixture}, 0, 1);
  ASSERT_EQ(c->num_docs(), 3);
  EXPECT_EQ(c->doc(0), (std::vector<int32_t>{5, 6, 7, 1}));
  EXPECT_EQ(c->doc(2), (std::vector<int32_t>{3, 4, 2, 2, 1}));
  EXPECT_FALSE(c->has_mask());
  EXPECT_EQ(c->doc_mask(1), (std::vector<uint8_t>{1, 1, 1}));
}

#ifdef RINGCTL
// ringctl tokenize --chat-template on JSONL: the dataset holds the chat source's ids and mask.
TEST(ChatTokens, RingctlTokenizeChat) {
  TempDir dir;
  const auto tok = write_tokenizer(dir, kSpecials);
  const auto data = write_chat_data(dir, 8);
  const std::string cmd = std::string(RINGCTL) + " tokenize -q --tokenizer " + tok +
                          " --chat-template chatml -o " + (dir / "out") + " " + data + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto d = chat_section({data}, "chatml", 64);
  d.tokenizer = tok;
  auto from_chat = make_source(d);
  d.source = ring::spec::DataSource::kTokens;
  d.paths = {dir / "out"};
  auto from_tokens = make_source(d);
  ASSERT_TRUE(dynamic_cast<TextLoader&>(*from_tokens).corpus().has_mask());
  for (int s = 0; s < 8; ++s) {
    Sequence a = from_chat->next_sequence(), b = from_tokens->next_sequence();
    ASSERT_EQ(a.tokens, b.tokens) << s;
    ASSERT_EQ(a.labels, b.labels) << s;
  }
  // A bad line fails the command with the file and line.
  const auto bad =
      dir.write("bad.jsonl", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}\n");
  const std::string cmd2 = std::string(RINGCTL) + " tokenize -q --tokenizer " + tok +
                           " --chat-template chatml -o " + (dir / "bad") + " " + bad + " > " +
                           (dir / "err.txt") + " 2>&1";
  EXPECT_NE(std::system(cmd2.c_str()), 0);
  std::ifstream in(dir / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("chat data '" + bad + "' line 1: field 'messages' has no assistant turn"),
            std::string::npos)
      << err;
}
#endif
