// Where ringmaster's programs and plugins are, found from the running executable: an installed
// tree (<prefix>/bin, <prefix>/lib/ringmaster), then the build tree only when the executable runs
// from one, then PATH. No path of the build tree is compiled in: an installed binary never
// depends on the build tree still being there (tests/install checks the binaries).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ring::install {

// The directory of the running executable (/proc/self/exe); empty when it cannot be read.
std::filesystem::path self_dir();

// The root of the build tree the running executable belongs to: the nearest ancestor (at most four
// levels up) holding the marker file that CMake writes into the build tree. Empty when installed.
std::filesystem::path build_root();

// Directories to search for plugins (transports, the CUDA kernels library), best first: the
// installed plugin directory relative to the executable (<bin>/../lib/ringmaster), the configured
// install directory, then - only when running from a build tree - that tree's `build_subdir`
// ("plugins", "lib"). Directories that do not exist are left out.
std::vector<std::string> plugin_dirs(const std::string& build_subdir);

// A ringmaster program (ring-worker, ringd, ring-coord). Looks in order at: the first of
// `env_names` that is set (the first name is the documented one; later ones are deprecated
// aliases and print a warning on stderr) - a set variable is the answer, executable here or not
// (a path on the compute nodes for `ringctl submit`; callers that run it check);
// next to the running executable; the configured install bindir; the build tree's
// `build_subdir`/name when running from a build tree; PATH. Each place looked at is appended to
// `tried` when given. Returns the path, or "" when nothing executable was found.
std::string find_program(const std::string& name, const std::vector<std::string>& env_names,
                         const std::string& build_subdir, std::vector<std::string>* tried);

}  // namespace ring::install
