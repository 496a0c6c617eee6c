// ring-spec-doc: prints docs/spec-reference.md, generated from the spec key table.
// Build-time tool (not installed); tests compare its output with the checked-in file.
#include <iostream>

#include "common/spec/parse.h"

int main() {
  std::cout << ring::spec::spec_reference_markdown();
  return 0;
}
