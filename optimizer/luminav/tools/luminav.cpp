// tools/luminav.cpp: the luminav command line: main, and the inspect, verify and version
// subcommands (selftest.cpp and bench/ hold the others)
//
//   luminav inspect BUNDLE                   the bundle's variants, as a table
//   luminav verify BUNDLE [--device N] [--require-gpu]
//                                            the rule book of docs/bundle-format.md (schema,
//                                            keys, hashes, ELF structure, ABI) with no GPU, each
//                                            refusal as "FAIL [<code>] ..."; with a GPU also
//                                            loads every variant the device can run and checks
//                                            its parameter list
//   luminav selftest BUNDLE [--device N] [--steps S]
//                                            runs the CUDA engine (the bundle's kernels) against
//                                            the CPU engine on the same inputs
//   luminav bench BUNDLE|- [options]         cold start and host time per step (bench/)
//   luminav version
// Exit codes: 0 ok, 1 failure, 2 usage. Errors print the library's message.
#include <chrono>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "aot/bundle_rules.h"
#include "aot/manifest.h"
#include "aot/runtime.h"
#include "common/cli_args.h"
#include "common/table.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"
#include "luminav/luminav.h"

namespace {

using namespace luminav;
using namespace luminav::tools;

constexpr const char* kUsage =
    "usage: luminav <command> [options]\n"
    "  inspect BUNDLE                     list the bundle's kernel variants\n"
    "  verify BUNDLE [--device N] [--require-gpu]\n"
    "                                     check schema, hashes and ABI; on a GPU also load every\n"
    "                                     variant the device can run and check its parameters\n"
    "  selftest BUNDLE [--device N] [--steps S]\n"
    "                                     run each bundled update variant on the GPU and compare\n"
    "                                     with the CPU engine\n"
    "  bench BUNDLE|- [options]           cold start and host time per step (bench --help)\n"
    "  version                            print versions\n";

int cmd_inspect(const BundleOptions& o) {
  const AotManifest m = AotManifest::load(o.bundle);
  print_header(m);
  std::vector<std::vector<std::string>> rows = {
      {"key", "kernel", "dtypes", "arch", "warps", "stages", "shared", "params", "scratch", "file"}};
  for (const auto& k : m.kernels()) {
    // p:g:s of an update kernel's dtype constexprs ("fp32:fp32:q8": q8 moments, S_DTYPE 3)
    std::string dtypes;
    for (const char* name : {"P_DTYPE", "G_DTYPE", "S_DTYPE"}) {
      const auto it = k.constexprs.find(name);
      if (it == k.constexprs.end()) continue;
      dtypes += (dtypes.empty() ? "" : ":") + std::string(dtype_word(static_cast<DType>(it->second)));
    }
    std::string scratch = "-";
    if (k.global_scratch_size > 0 || k.profile_scratch_size > 0) {
      scratch = std::to_string(k.global_scratch_size) + "/" + std::to_string(k.profile_scratch_size) + " B per CTA";
    }
    rows.push_back({k.key, k.kernel, dtypes.empty() ? "-" : dtypes, k.arch_label(), std::to_string(k.num_warps), std::to_string(k.num_stages),
                    std::to_string(k.shared_mem), std::to_string(k.signature.size()) + "+" +
                    std::to_string(k.num_trailing_scratch_ptrs), scratch,
                    std::string(k.file_field()) + " " + human_bytes(k.cubin_bytes)});
  }
  print_table(rows);
  return 0;
}

// One line per refusal: "FAIL [<code>] <field>: <message>", the code of the rule book
// (docs/bundle-format.md) that scripts match on.
void print_refusal(const Error& e) {
  if (const auto* b = dynamic_cast<const BundleError*>(&e)) {
    std::cout << "FAIL [" << b->code() << "] " << b->field() << ": " << e.what() << "\n";
  } else {
    std::cout << "FAIL " << e.what() << "\n";
  }
}

int cmd_verify(const BundleOptions& o) {
  std::shared_ptr<const AotManifest> manifest;
  try {
    manifest = std::make_shared<const AotManifest>(AotManifest::load(o.bundle));
  } catch (const BundleError& e) {
    print_refusal(e);
    std::cout << "FAIL the manifest is refused; nothing of this bundle is loaded\n";
    return 1;
  }
  print_header(*manifest);
  // Every code object (cubin or hsaco) now, not only those a step would load: each one's refusal
  // is reported. Without a GPU this is every check but the load.
  int bad_cubins = 0, hsaco_files = 0;
  for (const auto& k : manifest->kernels()) {
    hsaco_files += k.hip() ? 1 : 0;
    try {
      (void)k.image();
    } catch (const Error& e) {
      ++bad_cubins;
      print_refusal(e);
    }
  }
  if (bad_cubins > 0) {
    std::cout << "FAIL " << bad_cubins << " of " << manifest->kernels().size()
              << " code objects refused; rebuild the bundle (luminamoon aot build)\n";
    return 1;
  }
  std::cout << "ok  schema, keys, sha256 of " << manifest->kernels().size() - hsaco_files << " cubins"
            << (hsaco_files > 0 ? " and " + std::to_string(hsaco_files) + " hsaco files (metadata notes, wavefront sizes)"
                                : std::string())
            << ", ELF structure, entry symbols, archs, parameter lists and block sizes\n";
  if (hsaco_files > 0) {
    std::cout << "skip loading the " << hsaco_files
              << " hsaco files on an AMD device: luminav verify loads on CUDA devices only\n";
  }
  if (hsaco_files == static_cast<int>(manifest->kernels().size())) {
    if (o.require_gpu) std::cout << "FAIL --require-gpu: this bundle has no CUDA entry to load\n";
    return o.require_gpu ? 1 : 0;
  }
  if (!cuda_driver_available()) {
    std::cout << (o.require_gpu ? "FAIL" : "skip") << " on-device checks: " << no_driver_reason() << "\n";
    return o.require_gpu ? 1 : 0;
  }
  AotRuntime rt(manifest);
  const DeviceInfo info = rt.device_info(o.device);
  std::cout << "device " << o.device << ": compute capability " << info.cc_major << "." << info.cc_minor << ", "
            << info.multiprocessors << " SMs, CUDA driver " << rt.driver().driver_version << "\n";
  int loaded = 0, skipped = 0, failed = 0;
  for (const auto& k : manifest->kernels()) {
    if (!k.runs_on(info.cc_major, info.cc_minor)) {
      ++skipped;
      continue;
    }
    try {
      const LoadedKernel& lk = rt.load(k, o.device);
      ++loaded;
      std::cout << "ok   " << k.key << " (" << k.arch_label() << "): loaded, "
                << (lk.params_checked >= 0 ? std::to_string(lk.params_checked) + " parameters match the manifest"
                                           : std::string("parameter count not checked (driver before CUDA 12.4)"))
                << ", " << lk.num_regs << " registers\n";
    } catch (const Error& e) {
      ++failed;
      print_refusal(e);
    }
  }
  std::cout << loaded << " loaded, " << failed << " failed, " << skipped << " for other archs (not loadable on sm_"
            << info.cc_major << info.cc_minor << ")\n";
  if (loaded == 0 && failed == 0) {
    std::cout << "FAIL no variant of this bundle runs on device " << o.device
              << "; fix: luminamoon aot build --arch " << info.cc_major << info.cc_minor << "\n";
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

int cmd_version() {
  std::cout << "luminav " << lv_version_string() << "\n"
            << "bundle format: " << kAotBundleFormat << " v" << kAotBundleFormatVersion << " (newest read)\n";
  if (cuda_driver_available()) {
    const CudaDriverApi& api = cuda_driver();
    int count = 0;
    api.cuDeviceGetCount(&count);
    std::cout << "CUDA driver: " << api.driver_version / 1000 << "." << (api.driver_version % 1000) / 10 << ", "
              << count << " device(s), cuFuncGetParamInfo " << (api.cuFuncGetParamInfo ? "available" : "absent")
              << "\n";
  } else {
    std::cout << "CUDA driver: none (" << no_driver_reason() << ")\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto main_start = std::chrono::steady_clock::now();  // first: bench measures cold start from here
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
      std::cout << kUsage;
      return 0;
    }
    if (cmd == "version" || cmd == "--version") {
      if (!args.empty()) throw UsageError{"version takes no arguments"};
      return cmd_version();
    }
    if (cmd == "inspect") return cmd_inspect(tools::parse_bundle_options(args, false, false));
    if (cmd == "verify") return cmd_verify(tools::parse_bundle_options(args, false, true));
    if (cmd == "selftest") return tools::run_selftest(tools::parse_bundle_options(args, true, false));
    if (cmd == "bench") return tools::run_bench(args, main_start);
    throw UsageError{"unknown command \"" + cmd + "\""};
  } catch (const UsageError& e) {
    std::cerr << "luminav: " << e.message << "\n" << kUsage;
    return 2;
  } catch (const Error& e) {
    std::cerr << "luminav " << cmd << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "luminav " << cmd << ": " << e.what() << "\n";
    return 1;
  }
}
