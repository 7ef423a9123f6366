// src/aot/manifest_json.h: the JSON profile of a bundle manifest (docs/bundle-format.md, rules
// J1-J5), the same as python/luminamoon/aot/manifest.py parse_manifest_bytes
//
// UTF-8 JSON with no byte-order mark, no raw NUL byte, no lone surrogate, no object key twice, nesting at most
// kJsonMaxDepth deep, and integers only, each in the int64 range (a fraction, an exponent or a
// bigger number is refused rather than rounded). Parsed without recursion (a SAX handler), so
// no input exhausts the stack.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace luminav {

class ManifestJsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The document; every number in it is a number_integer. Throws ManifestJsonError saying what
// broke the profile (printable: no raw input bytes).
nlohmann::json parse_manifest_json(const std::string& text);

}  // namespace luminav
