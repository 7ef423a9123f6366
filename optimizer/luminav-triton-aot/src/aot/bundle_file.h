// src/aot/bundle_file.h: reading a bundle's files as the rule book allows: regular files inside
// the bundle folder, read with a size limit, never blocking (docs/bundle-format.md, "Files")
//
// The Python tooling reads them the same way (python/luminamoon/aot/files.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace luminav {

// dir/name, joined with one '/'.
std::string bundle_path(const std::string& dir, const std::string& name);

// The bytes of <dir>/<name>. Throws BundleError (aot/bundle_rules.h) naming the file and
// `field`: missing_file (no such file, or a dangling link), not_regular_file (a FIFO, socket,
// device, directory, or a link that resolves outside `dir`), too_large (more than `limit`
// bytes), unreadable (anything else the system refuses). The file is opened non-blocking and
// checked again on the open descriptor, so one swapped for a FIFO in between cannot make the
// read wait, and it is read only up to limit + 1 bytes.
std::vector<unsigned char> read_bundle_file(const std::string& dir, const std::string& name, std::uint64_t limit,
                                            const std::string& field);

// The same checks without reading: the file's size, for a loader that reads it later.
std::uint64_t stat_bundle_file(const std::string& dir, const std::string& name, std::uint64_t limit,
                               const std::string& field);

}  // namespace luminav
