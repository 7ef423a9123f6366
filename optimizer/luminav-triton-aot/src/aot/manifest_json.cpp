// src/aot/manifest_json.cpp: the manifest's JSON profile through nlohmann's SAX interface
#include "aot/manifest_json.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "aot/bundle_rules.h"

namespace luminav {

namespace {

using json = nlohmann::json;

class StrictSax {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(number_integer_t v) { return put(json(v)); }
  bool number_unsigned(number_unsigned_t v) {
    if (v > static_cast<number_unsigned_t>(std::numeric_limits<std::int64_t>::max())) {
      return refuse("the number " + std::to_string(v) + " is outside the int64 range");
    }
    return put(json(static_cast<number_integer_t>(v)));
  }
  bool number_float(number_float_t, const string_t& text) {
    return refuse("the number " + printable(text, 24) + " is not an integer (the manifest holds integers only)");
  }
  bool string(string_t& v) { return put(json(std::move(v))); }
  bool binary(binary_t&) { return refuse("binary data"); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool key(string_t& k) {
    if (stack_.back()->contains(k)) return refuse("the key \"" + printable(k, 80) + "\" twice in one object");
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // e.what() quotes the last token, which may hold any byte: printable() keeps it valid UTF-8
    return refuse("unparsable text at byte " + std::to_string(position) + " (" + printable(e.what(), 160) + ")");
  }

  json root;
  std::string why;  // set when a handler refused

 private:
  bool refuse(std::string reason) {
    if (why.empty()) why = std::move(reason);
    return false;
  }
  json* insert(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool put(json&& v) {
    insert(std::move(v));
    return true;
  }
  bool open(json&& container) {
    if (static_cast<int>(stack_.size()) + 1 > kJsonMaxDepth) {
      return refuse("nesting deeper than " + std::to_string(kJsonMaxDepth));
    }
    stack_.push_back(insert(std::move(container)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  std::vector<json*> stack_;  // the open containers; a parent gets no element while a child is open
  std::string key_;
};

}  // namespace

json parse_manifest_json(const std::string& text) {
  if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xef && static_cast<unsigned char>(text[1]) == 0xbb &&
      static_cast<unsigned char>(text[2]) == 0xbf) {
    throw ManifestJsonError("a UTF-8 byte-order mark");
  }
  // nlohmann's lexer takes a NUL byte for the end of the input, and would accept what follows
  // unread; no JSON text holds a raw NUL (inside a string it must be escaped).
  const std::size_t nul = text.find('\0');
  if (nul != std::string::npos) throw ManifestJsonError("a NUL byte at byte " + std::to_string(nul));
  StrictSax sax;
  bool ok = false;
  try {
    ok = json::sax_parse(text, &sax, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw ManifestJsonError("unparsable text (" + printable(e.what(), 160) + ")");
  }
  if (!ok) throw ManifestJsonError(sax.why.empty() ? std::string("unparsable text") : sax.why);
  return std::move(sax.root);
}

}  // namespace luminav
