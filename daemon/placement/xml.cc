#include "daemon/placement/xml.h"

#include <fmt/format.h>

#include <cstdint>

#include "daemon/placement/errors.h"

namespace ring::placement::xml {

const Element* Element::child(std::string_view child_name) const {
  for (const auto& c : children)
    if (c->name == child_name) return c.get();
  return nullptr;
}

const std::string* Element::child_text(std::string_view child_name) const {
  const Element* c = child(child_name);
  return c ? &c->text : nullptr;
}

const std::string* Element::attribute(std::string_view attribute_name) const {
  for (const auto& [k, v] : attributes)
    if (k == attribute_name) return &v;
  return nullptr;
}

namespace {

// Deeper nesting than this is not nvidia-smi output; refusing it bounds the recursion.
constexpr int kMaxDepth = 64;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == ':';
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

void append_utf8(std::string& out, uint32_t cp) {
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

class Reader {
 public:
  Reader(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  std::unique_ptr<Element> document() {
    skip_misc();
    if (eof()) fail("no root element (empty document)");
    if (peek() != '<') fail("text before the root element");
    auto root = element(0);
    skip_misc();
    if (!eof()) fail("content after the root element </" + root->name + ">");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw TopologyParseError(fmt::format("{}:{}: malformed XML: {}", source_, line_, what));
  }
  bool eof() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  bool starts(std::string_view s) const { return text_.substr(pos_, s.size()) == s; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < text_.size(); ++i)
      if (text_[pos_++] == '\n') ++line_;
  }
  void skip_space() {
    while (!eof() && is_space(peek())) advance();
  }
  void skip_until(std::string_view end, const char* what) {
    size_t at = text_.find(end, pos_);
    if (at == std::string_view::npos) fail(fmt::format("unterminated {}", what));
    advance(at + end.size() - pos_);
  }
  // Whitespace, the prolog, DOCTYPE, comments and processing instructions around the root.
  void skip_misc() {
    for (;;) {
      skip_space();
      if (starts("<?")) {
        skip_until("?>", "processing instruction");
      } else if (starts("<!--")) {
        skip_until("-->", "comment");
      } else if (starts("<!DOCTYPE")) {
        skip_until(">", "DOCTYPE");
      } else {
        return;
      }
    }
  }
  std::string name() {
    size_t b = pos_;
    while (!eof() && is_name_char(peek())) advance();
    if (b == pos_)
      fail(eof() ? "unexpected end of input" : fmt::format("expected a name at '{}'", peek()));
    return std::string(text_.substr(b, pos_ - b));
  }
  // Character data with entities resolved, up to (not including) `stop`.
  void chars(std::string& out, char stop) {
    while (!eof() && peek() != stop) {
      if (peek() == '&') {
        size_t semi = text_.find(';', pos_);
        if (semi == std::string_view::npos || semi - pos_ > 12) fail("unterminated entity");
        std::string_view ent = text_.substr(pos_ + 1, semi - pos_ - 1);
        if (ent == "amp")
          out += '&';
        else if (ent == "lt")
          out += '<';
        else if (ent == "gt")
          out += '>';
        else if (ent == "quot")
          out += '"';
        else if (ent == "apos")
          out += '\'';
        else if (ent.size() > 1 && ent[0] == '#') {
          uint32_t cp = 0;
          bool hex = ent[1] == 'x' || ent[1] == 'X';
          std::string_view digits = ent.substr(hex ? 2 : 1);
          if (digits.empty()) fail(fmt::format("bad character reference &{};", ent));
          for (char c : digits) {
            int d = (c >= '0' && c <= '9')          ? c - '0'
                    : (hex && c >= 'a' && c <= 'f') ? c - 'a' + 10
                    : (hex && c >= 'A' && c <= 'F') ? c - 'A' + 10
                                                    : -1;
            if (d < 0 || cp > 0x10FFFF) fail(fmt::format("bad character reference &{};", ent));
            cp = cp * (hex ? 16 : 10) + static_cast<uint32_t>(d);
          }
          if (cp == 0 || cp > 0x10FFFF) fail(fmt::format("bad character reference &{};", ent));
          append_utf8(out, cp);
        } else {
          fail(fmt::format("unknown entity &{};", ent));
        }
        advance(semi + 1 - pos_);
      } else {
        out += peek();
        advance();
      }
    }
  }
  std::unique_ptr<Element> element(int depth) {
    if (depth > kMaxDepth) fail(fmt::format("elements nested deeper than {}", kMaxDepth));
    auto e = std::make_unique<Element>();
    e->line = line_;
    advance();  // '<'
    e->name = name();
    for (;;) {
      skip_space();
      if (eof()) fail(fmt::format("unterminated start tag <{}>", e->name));
      if (starts("/>")) {
        advance(2);
        return e;
      }
      if (peek() == '>') {
        advance();
        break;
      }
      std::string key = name();
      skip_space();
      if (eof() || peek() != '=')
        fail(fmt::format("attribute {} of <{}> has no value", key, e->name));
      advance();
      skip_space();
      if (eof() || (peek() != '"' && peek() != '\'')) {
        fail(fmt::format("attribute {} of <{}> is not quoted", key, e->name));
      }
      char quote = peek();
      advance();
      std::string value;
      chars(value, quote);
      if (eof()) fail(fmt::format("unterminated attribute {} of <{}>", key, e->name));
      advance();
      e->attributes.emplace_back(std::move(key), std::move(value));
    }
    std::string text;
    for (;;) {
      chars(text, '<');
      if (eof()) fail(fmt::format("element <{}> (line {}) is not closed", e->name, e->line));
      if (starts("</")) {
        advance(2);
        std::string closing = name();
        skip_space();
        if (eof() || peek() != '>') fail(fmt::format("unterminated end tag </{}>", closing));
        advance();
        if (closing != e->name) {
          fail(fmt::format("</{}> closes <{}> opened on line {}", closing, e->name, e->line));
        }
        e->text = trim(text);
        return e;
      }
      if (starts("<!--")) {
        skip_until("-->", "comment");
      } else if (starts("<![CDATA[")) {
        advance(9);
        size_t end = text_.find("]]>", pos_);
        if (end == std::string_view::npos) fail("unterminated CDATA section");
        text += text_.substr(pos_, end - pos_);
        advance(end + 3 - pos_);
      } else if (starts("<?")) {
        skip_until("?>", "processing instruction");
      } else {
        e->children.push_back(element(depth + 1));
      }
    }
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::unique_ptr<Element> parse(std::string_view text, const std::string& source) {
  return Reader(text, source).document();
}

}  // namespace ring::placement::xml
