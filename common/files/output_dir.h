// A directory that receives files written for the user (ringctl import and export, the outputs
// of tokenize, trace, metrics and plan): made when missing (0700, parents too), and refused when
// another user could change or redirect what is written there.
//
//   const std::string out = ring::files::prepare_output_dir(o.out, "--out");
//
// Refused, naming the directory, what was found and what to do: not a directory; owned by
// another user; writable by group or others (they could swap files in after the write, or plant
// links at the names written next); a symbolic link that is not the user's own (another user's
// link could point the output at the victim's own files).
#pragma once

#include <stdexcept>
#include <string>

namespace ring::files {

class OutputDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Returns the directory's absolute path. `what` names it in messages ("--out", "-o").
std::string prepare_output_dir(const std::string& dir, const std::string& what);

}  // namespace ring::files
