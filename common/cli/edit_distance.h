// Edit distance for "did you mean" suggestions (unknown spec keys, flags and subcommands).
#pragma once

#include <cstddef>
#include <string_view>

namespace ring::cli {

// Levenshtein distance: insertions, deletions and substitutions each cost 1. With ignore_case,
// ASCII letters compare without case ("Model" vs "model": 0).
size_t edit_distance(std::string_view a, std::string_view b, bool ignore_case = false);

}  // namespace ring::cli
