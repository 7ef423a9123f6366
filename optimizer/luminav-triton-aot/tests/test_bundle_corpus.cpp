// tests/test_bundle_corpus.cpp: the shared corpus of tests/data/bundles against the C++ loader
//
// Each case of cases.json (written by tests/data/bundles/make_corpus.py) is a list of operations
// on a copy of base/ (four real cubins of Triton 3.6, sm_80 to sm_100, and their manifest) and
// the reason code and field every loader must refuse the result with (none for a good bundle).
// Here the C++ loader judges them (AotManifest::load with CubinCheck::kNow, as `luminav verify`
// and the native module do); tests/test_bundle_rules.py runs the same cases through Python.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aot/bundle_rules.h"
#include "aot/manifest.h"
#include "fakes/fake_bundle.h"

using luminav::AotManifest;
using luminav_test::json;
using luminav_test::TempDir;

namespace {

const std::string kCorpus = LUMINAV_TEST_CORPUS_DIR;

std::vector<json> load_cases() {
  std::ifstream f(kCorpus + "/cases.json");
  if (!f) return {};
  return json::parse(f)["cases"].get<std::vector<json>>();
}

std::vector<unsigned char> from_hex(const std::string& hex) {
  std::vector<unsigned char> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<unsigned char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

void apply(const json& op, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string kind = op["op"];
  const std::string manifest = dir + "/manifest.json";
  const std::string path = op.contains("file") ? dir + "/" + op["file"].get<std::string>() : dir;
  if (kind == "json" || kind == "rehash") {
    json doc = json::parse(luminav_test::read_text(manifest));
    if (kind == "json") {
      const json::json_pointer ptr(op["path"].get<std::string>());
      if (op.value("remove", false)) {
        json& parent = doc.at(ptr.parent_pointer());
        if (parent.is_array()) {
          parent.erase(static_cast<std::size_t>(std::stoul(ptr.back())));
        } else {
          parent.erase(ptr.back());
        }
      } else {
        doc[ptr] = op["value"];
      }
    } else {
      const auto bytes = luminav_test::read_bytes(path);
      for (json& e : doc["kernels"]) {
        if (e.value("cubin", json()) == op["file"] || e.value("hsaco", json()) == op["file"]) e["sha256"] = luminav::sha256_hex(bytes.data(), bytes.size());
      }
    }
    luminav_test::write_text(manifest, doc.dump(2));
  } else if (kind == "write") {
    if (op.contains("hex")) {
      luminav_test::write_bytes(path, from_hex(op["hex"]));
    } else {
      luminav_test::write_text(path, op["text"].get<std::string>());
    }
  } else if (kind == "patch") {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(op["offset"].get<std::streamoff>());
    const auto bytes = from_hex(op["hex"]);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  } else if (kind == "truncate") {
    ASSERT_EQ(::truncate(path.c_str(), op["size"].get<off_t>()), 0) << path;
  } else if (kind == "copy") {
    fs::copy_file(dir + "/" + op["from"].get<std::string>(), dir + "/" + op["to"].get<std::string>(),
                  fs::copy_options::overwrite_existing);
  } else if (kind == "remove") {
    fs::remove(path);
  } else if (kind == "mkfifo") {
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  } else if (kind == "mkdir") {
    fs::create_directory(path);
  } else if (kind == "symlink") {
    fs::create_symlink(op["target"].get<std::string>(), path);
  } else {
    FAIL() << "unknown corpus operation " << kind;
  }
}

class BundleCorpus : public ::testing::TestWithParam<json> {};

}  // namespace

TEST_P(BundleCorpus, TheLoaderRefusesWithTheCaseCodeAndField) {
  const json& c = GetParam();
  TempDir tmp;
  const std::string dir = tmp.file("bundle");
  std::filesystem::copy(kCorpus + "/base", dir);
  for (const json& op : c["ops"]) apply(op, dir);
  std::string code = "accepted", field;
  try {
    AotManifest::load(dir, luminav::CubinCheck::kNow);
  } catch (const luminav::BundleError& e) {
    code = e.code();
    field = e.field();
  }
  const std::string want_code = c["code"].is_null() ? "accepted" : c["code"].get<std::string>();
  const std::string want_field = c["field"].is_null() ? "" : c["field"].get<std::string>();
  EXPECT_EQ(code, want_code) << c["name"];
  EXPECT_EQ(field, want_field) << c["name"];
}

INSTANTIATE_TEST_SUITE_P(Cases, BundleCorpus, ::testing::ValuesIn(load_cases()),
                         [](const ::testing::TestParamInfo<json>& info) {
                           std::string name = info.param["name"];
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(BundleCorpusFiles, AreThere) {
  EXPECT_GE(load_cases().size(), 100u) << "no corpus at " << kCorpus;
}
