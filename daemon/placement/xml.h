// A small XML reader for nvidia-smi's `-q -x` output (internal to daemon/placement).
//
// nvidia-smi writes plain XML: a prolog, a DOCTYPE, elements, attributes, text and the five
// predefined entities. This reader handles exactly that (plus comments, CDATA and numeric
// character references) so ringd needs no XML library; anything else is an error with a line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ring::placement::xml {

struct Element {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attributes;
  std::string text;  // concatenated character data directly inside this element, trimmed
  std::vector<std::unique_ptr<Element>> children;
  int line = 0;  // 1-based line of the start tag

  // First child with this name, or nullptr.
  const Element* child(std::string_view child_name) const;
  // Text of the first child with this name, or nullptr when there is none.
  const std::string* child_text(std::string_view child_name) const;
  const std::string* attribute(std::string_view attribute_name) const;
};

// Parses a whole document and returns its root element. Throws TopologyParseError
// ("<source>:<line>: ...") on malformed input.
std::unique_ptr<Element> parse(std::string_view text, const std::string& source);

}  // namespace ring::placement::xml
