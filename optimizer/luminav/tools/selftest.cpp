// tools/selftest.cpp: `luminav selftest BUNDLE [--device N] [--steps S]`: the CUDA engine (the
// bundle's kernels) against the CPU engine, on the same inputs, one run per update variant the
// device can load
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "aot/manifest.h"
#include "common/cli_args.h"
#include "common/cuda_session.h"
#include "engine/cpu_kernels.h"
#include "engine/cpu_quant.h"
#include "engine/engine.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"

namespace luminav {
namespace tools {

namespace {

struct UpdateVariant {
  std::string key;
  DType p = DType::kFloat32, g = DType::kFloat32, s = DType::kFloat32;
  bool sr = false;
  BoundMode bound = BoundMode::kNone;
  bool clip = false;
  bool check_flag = false;
};

// The update variants of a bundle (its pass2 and single_pass kernels), read from each kernel's
// constexprs (P_DTYPE, G_DTYPE, S_DTYPE, SR, BOUND_MODE, USE_CLIP, CHECK_FLAG: the names the kernels
// take, docs/bundle-format.md); a kernel whose values are not codes this engine knows is left out.
std::optional<UpdateVariant> update_variant(const KernelMetadata& k) {
  const bool pass2 = k.kernel == "pass2";
  if (!pass2 && k.kernel != "single_pass") return std::nullopt;
  auto value = [&](const char* name, std::int64_t max) -> std::optional<int> {
    auto it = k.constexprs.find(name);
    if (it == k.constexprs.end() || it->second < 0 || it->second > max) return std::nullopt;
    return static_cast<int>(it->second);
  };
  // S_DTYPE 3: q8 moments (a state dtype only)
  const auto p = value("P_DTYPE", 2), g = value("G_DTYPE", 2), s = value("S_DTYPE", 3);
  const auto sr = value("SR", 1), b = value("BOUND_MODE", 2);
  if (!p || !g || !s || !sr || !b) return std::nullopt;
  UpdateVariant v;
  v.key = k.key;
  v.p = static_cast<DType>(*p);
  v.g = static_cast<DType>(*g);
  v.s = static_cast<DType>(*s);
  v.sr = *sr == 1;
  v.bound = static_cast<BoundMode>(*b);
  if (pass2) {
    const auto c = value("USE_CLIP", 1), f = value("CHECK_FLAG", 1);
    if (!c || !f) return std::nullopt;
    v.clip = *c == 1;
    v.check_flag = *f == 1;
  }
  return v;
}

float to_float(DType d, const unsigned char* p) {
  if (d == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::kBFloat16 ? cpu::bf16_to_float(h) : cpu::f16_to_float(h);
}

void from_float(DType d, float x, unsigned char* p) {
  if (d == DType::kFloat32) {
    std::memcpy(p, &x, 4);
    return;
  }
  const std::uint16_t h = d == DType::kBFloat16 ? cpu::float_to_bf16_rne(x) : cpu::float_to_f16_rne(x);
  std::memcpy(p, &h, 2);
}

// Distance in representable values of the storage dtype (the order of the bit patterns).
std::int64_t storage_ulps(DType d, const unsigned char* a, const unsigned char* b) {
  auto ordered = [d](const unsigned char* p) -> std::int64_t {
    if (d == DType::kFloat32) {
      std::int32_t i;
      std::memcpy(&i, p, 4);
      return i < 0 ? -static_cast<std::int64_t>(i & 0x7fffffff) : i;
    }
    std::int16_t h;
    std::memcpy(&h, p, 2);
    return h < 0 ? -static_cast<std::int64_t>(h & 0x7fff) : h;
  };
  const std::int64_t x = ordered(a), y = ordered(b);
  return x > y ? x - y : y - x;
}

// A host image in device memory (at least 1 byte), freed with the session.
CUdeviceptr upload(CudaSession& dev, const std::vector<unsigned char>& host) {
  const CUdeviceptr p = dev.alloc(std::max<std::size_t>(host.size(), 1), "selftest buffers");
  dev.write(p, host.data(), host.size());
  return p;
}

constexpr const char* kWaiting = "waiting for the selftest step";

struct SelftestTensor {
  std::int64_t numel;
  std::int64_t row_len = 0;               // q8: the elements of a block row
  std::vector<unsigned char> p, m, v, g;  // host images (CPU engine's storage)
  std::vector<unsigned char> sm, sv;      // q8: the float32 block scales of m and v
  CUdeviceptr dp = 0, dm = 0, dv = 0, dg = 0, dsm = 0, dsv = 0;
  std::vector<unsigned char> gpu_p, gpu_m, gpu_v, gpu_sm, gpu_sv;  // read back from the device
};

// Tolerances of the comparison, each with its reason:
// - float32 storage: the GPU kernels and the CPU engine run the same float32 operations, but
//   tanh/sqrt/division come from different math libraries (libdevice vs libm) and the GPU may
//   contract a*b+c into an FMA; after a few steps that is a few ulps of the result. Allowed:
//   |a - b| <= 1e-5 * max(|a|, |b|) + 1e-6 * rms(tensor).
// - 16-bit storage (bf16, fp16): the float32 results agree to a few ulps, so the stored values
//   differ only where q sits at a rounding edge: at most 1 storage ulp apart, and on at most
//   1% of the elements.
// - q8 codes: m' and v' agree to a few float32 ulps (their block scales are compared as float32
//   values above), so a code differs only where the stochastic decision falls within that of its
//   threshold: at most 1 code apart, on at most 1% of the elements. Such a code moves its
//   element's later updates by a code step, so with q8 moments a float32 param may be beyond the
//   float32 tolerance on those elements: at most 1% of them (`rare_outliers`).
struct Comparison {
  std::int64_t differing = 0;
  std::int64_t worst_ulps = 0;
  double worst_rel = 0;
  bool ok = true;
};

Comparison compare(DType d, const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                   std::int64_t n, bool rare_outliers = false) {
  Comparison c;
  if (d == DType::kQ8) {
    for (std::int64_t i = 0; i < n; ++i) {
      const int x = a[static_cast<std::size_t>(i)], y = b[static_cast<std::size_t>(i)];
      if (x == y) continue;
      ++c.differing;
      c.worst_ulps = std::max<std::int64_t>(c.worst_ulps, std::abs(x - y));
    }
    c.ok = c.worst_ulps <= 1 && c.differing * 100 <= n;
    return c;
  }
  const std::size_t es = dtype_size(d);
  double sumsq = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = to_float(d, a.data() + i * es);
    if (std::isfinite(x)) sumsq += x * x;
  }
  const double rms = n > 0 ? std::sqrt(sumsq / static_cast<double>(n)) : 0.0;
  std::int64_t outliers = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const unsigned char* pa = a.data() + i * es;
    const unsigned char* pb = b.data() + i * es;
    if (std::memcmp(pa, pb, es) == 0) continue;
    ++c.differing;
    const std::int64_t u = storage_ulps(d, pa, pb);
    c.worst_ulps = std::max(c.worst_ulps, u);
    const double x = to_float(d, pa), y = to_float(d, pb);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      c.ok = false;
      continue;
    }
    const double diff = std::fabs(x - y);
    c.worst_rel = std::max(c.worst_rel, diff / std::max({std::fabs(x), std::fabs(y), 1e-30}));
    if (d == DType::kFloat32) {
      if (diff > 1e-5 * std::max(std::fabs(x), std::fabs(y)) + 1e-6 * rms) {
        ++outliers;
        if (!rare_outliers) c.ok = false;
      }
    } else if (u > 1) {
      c.ok = false;
    }
  }
  if (rare_outliers && outliers * 100 > n) c.ok = false;
  if (d != DType::kFloat32 && c.differing * 100 > n) c.ok = false;
  return c;
}

// Runs one update variant: the same params, grads and seed through a CPU engine and a CUDA
// engine for `steps` steps (a non-finite gradient on step 2 where the variant skips such steps),
// comparing params, m, v, step counters and the skipped count after every step.
bool selftest_variant(const UpdateVariant& var, const BundleOptions& o, CudaSession& dev, std::string& detail) {
  Hyper h;
  h.lr = 1e-2;  // large enough that every step moves the params visibly
  h.weight_decay = 0.01;
  h.clip = var.clip ? 1.0 : 0.0;  // 1 RMS: clips a sizeable share of the elements
  h.bound_mode = var.bound;
  h.bound = var.bound == BoundMode::kAbs ? 0.015 : 0.01;  // reached within the steps run
  h.nonfinite = var.check_flag ? NonFinite::kSkip : NonFinite::kPropagate;
  if (!var.clip && var.check_flag) h.nonfinite = NonFinite::kSkip;
  h.stochastic_rounding = var.sr;
  h.state_dtype = var.s;
  const std::uint64_t seed = 0x5EEDF00DULL;

  const std::vector<std::int64_t> sizes = {1, 3001, 2 * 2048 + 77};  // none a multiple of the block
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<SelftestTensor> ts;
  const bool q8 = var.s == DType::kQ8;
  for (std::int64_t n : sizes) {
    SelftestTensor t;
    t.numel = n;
    t.p.resize(static_cast<std::size_t>(n) * dtype_size(var.p));
    // q8: m at its zero code (128); the largest tensor as 3 rows (a short last block a row)
    t.m.assign(static_cast<std::size_t>(n) * dtype_size(var.s), q8 ? cpu::quant::kZeroCodeM : 0);
    t.v.assign(static_cast<std::size_t>(n) * dtype_size(var.s), 0);
    if (q8) {
      t.row_len = n % 3 == 0 && n > 3 ? n / 3 : n;
      const auto blocks = static_cast<std::size_t>(cpu::quant::num_blocks(n, t.row_len));
      t.sm.assign(blocks * sizeof(float), 0);
      t.sv.assign(blocks * sizeof(float), 0);
      t.dsm = upload(dev, t.sm);
      t.dsv = upload(dev, t.sv);
    }
    t.g.resize(static_cast<std::size_t>(n) * dtype_size(var.g));
    for (std::int64_t i = 0; i < n; ++i) from_float(var.p, normal(rng), t.p.data() + i * dtype_size(var.p));
    t.dp = upload(dev, t.p);
    t.dm = upload(dev, t.m);
    t.dv = upload(dev, t.v);
    t.dg = upload(dev, t.g);
    ts.push_back(std::move(t));
  }

  Engine cpu_engine(engine_options(DeviceType::kCpu, 0, 0, seed, ""));
  Engine gpu_engine(engine_options(DeviceType::kCuda, o.device, 0, seed, o.bundle));
  const std::size_t cg = cpu_engine.add_group(h);
  const std::size_t gg = gpu_engine.add_group(h);
  for (SelftestTensor& t : ts) {
    ParamDesc c;
    c.data = t.p.data();
    c.dtype = var.p;
    c.grad = t.g.data();
    c.grad_dtype = var.g;
    c.numel = t.numel;
    c.exp_avg = t.m.data();
    c.exp_avg_sq = t.v.data();
    if (q8) {
      c.row_len = t.row_len;
      c.exp_avg_scale = reinterpret_cast<float*>(t.sm.data());
      c.exp_avg_sq_scale = reinterpret_cast<float*>(t.sv.data());
      c.scale_numel = cpu::quant::num_blocks(t.numel, t.row_len);
    }
    cpu_engine.add_param(cg, c);
    ParamDesc d = c;
    d.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(t.dp));
    d.grad = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(t.dg));
    d.exp_avg = reinterpret_cast<void*>(static_cast<std::uintptr_t>(t.dm));
    d.exp_avg_sq = reinterpret_cast<void*>(static_cast<std::uintptr_t>(t.dv));
    if (q8) {
      d.exp_avg_scale = reinterpret_cast<float*>(static_cast<std::uintptr_t>(t.dsm));
      d.exp_avg_sq_scale = reinterpret_cast<float*>(static_cast<std::uintptr_t>(t.dsv));
    }
    gpu_engine.add_param(gg, d);
  }

  std::ostringstream out;
  bool ok = true;
  for (int step = 1; step <= o.steps; ++step) {
    const bool poison = var.check_flag && step == 2;
    for (std::size_t j = 0; j < ts.size(); ++j) {
      SelftestTensor& t = ts[j];
      for (std::int64_t i = 0; i < t.numel; ++i) {
        from_float(var.g, 0.1f * normal(rng), t.g.data() + i * dtype_size(var.g));
      }
      if (poison && j == 1) from_float(var.g, std::nanf(""), t.g.data() + 7 * dtype_size(var.g));
      dev.write(t.dg, t.g.data(), t.g.size());
    }
    cpu_engine.step();
    gpu_engine.step(nullptr);
    for (std::size_t j = 0; j < ts.size(); ++j) {
      SelftestTensor& t = ts[j];
      t.gpu_p.resize(t.p.size());
      t.gpu_m.resize(t.m.size());
      t.gpu_v.resize(t.v.size());
      dev.read(t.gpu_p.data(), t.dp, t.gpu_p.size(), kWaiting);
      dev.read(t.gpu_m.data(), t.dm, t.gpu_m.size(), kWaiting);
      dev.read(t.gpu_v.data(), t.dv, t.gpu_v.size(), kWaiting);
      if (q8) {
        t.gpu_sm.resize(t.sm.size());
        t.gpu_sv.resize(t.sv.size());
        dev.read(t.gpu_sm.data(), t.dsm, t.gpu_sm.size(), kWaiting);
        dev.read(t.gpu_sv.data(), t.dsv, t.gpu_sv.size(), kWaiting);
      }
      const struct {
        const char* name;
        DType d;
        const std::vector<unsigned char>* cpu;
        const std::vector<unsigned char>* gpu;
      } fields[] = {{"param", var.p, &t.p, &t.gpu_p}, {"exp_avg", var.s, &t.m, &t.gpu_m},
                    {"exp_avg_sq", var.s, &t.v, &t.gpu_v}};
      std::vector<std::tuple<const char*, DType, const std::vector<unsigned char>*,
                             const std::vector<unsigned char>*, std::int64_t>> compared;
      for (const auto& f : fields) compared.emplace_back(f.name, f.d, f.cpu, f.gpu, t.numel);
      const bool rare_outliers = q8;  // params, where a q8 code fell the other way
      if (q8) {  // the block scales, as float32 values
        const std::int64_t blocks = cpu::quant::num_blocks(t.numel, t.row_len);
        compared.emplace_back("exp_avg_scale", DType::kFloat32, &t.sm, &t.gpu_sm, blocks);
        compared.emplace_back("exp_avg_sq_scale", DType::kFloat32, &t.sv, &t.gpu_sv, blocks);
      }
      for (const auto& [name, dtype, cpu_bytes, gpu_bytes, count] : compared) {
        const Comparison c =
            compare(dtype, *cpu_bytes, *gpu_bytes, count, rare_outliers && std::string(name) == "param");
        if (!c.ok) {
          ok = false;
          out << " step " << step << " tensor " << j << " (" << t.numel << " elements) " << name << ": "
              << c.differing << " differ, worst " << c.worst_ulps << " ulps / " << c.worst_rel << " relative;";
        }
      }
      if (cpu_engine.param_step(j) != gpu_engine.param_step(j)) {
        ok = false;
        out << " step " << step << " tensor " << j << ": step counter CPU " << cpu_engine.param_step(j) << ", GPU "
            << gpu_engine.param_step(j) << ";";
      }
    }
    if (cpu_engine.skipped_steps() != gpu_engine.skipped_steps()) {
      ok = false;
      out << " step " << step << ": skipped steps CPU " << cpu_engine.skipped_steps() << ", GPU "
          << gpu_engine.skipped_steps() << ";";
    }
    if (poison && gpu_engine.skipped_steps() != 1) {
      ok = false;
      out << " step " << step << ": a non-finite gradient did not skip the step;";
    }
  }
  detail = out.str();
  return ok;
}

}  // namespace

int run_selftest(const BundleOptions& o) {
  const AotManifest manifest = AotManifest::load(o.bundle);
  print_header(manifest);
  if (!cuda_driver_available()) {
    std::cout << "FAIL selftest needs a CUDA device: " << no_driver_reason() << "\n";
    return 1;
  }
  const CudaDriverApi& api = cuda_driver();
  int count = 0;
  check(api, api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (o.device >= count) {
    throw Error(Status::kNotFound, "CUDA device " + std::to_string(o.device) + " does not exist: the driver sees " +
                                       std::to_string(count) + " device(s)");
  }
  CudaSession dev(api, o.device, "selftest on device " + std::to_string(o.device), /*timing=*/false);
  int major = 0, minor = 0;
  CUdevice d = 0;
  check(api, api.cuDeviceGet(&d, o.device), "cuDeviceGet");
  check(api, api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d), "cuDeviceGetAttribute");
  check(api, api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d), "cuDeviceGetAttribute");

  // One run per update variant the device can load (the engine picks pass1/reduce/commit).
  std::map<std::string, UpdateVariant> variants;
  for (const auto& k : manifest.kernels()) {
    if (!k.runs_on(major, minor)) continue;
    if (auto v = update_variant(k)) variants.emplace(k.key, *v);
  }
  if (variants.empty()) {
    std::cout << "FAIL no pass2/single_pass variant of this bundle runs on device " << o.device << " (sm_" << major
              << minor << "); fix: luminamoon aot build --arch " << major << minor << "\n";
    return 1;
  }
  int passed = 0, failed = 0;
  for (const auto& [key, var] : variants) {
    std::string detail;
    bool ok = false;
    try {
      ok = selftest_variant(var, o, dev, detail);
    } catch (const Error& e) {
      detail = std::string(" ") + e.what();
    }
    (ok ? passed : failed)++;
    std::cout << (ok ? "ok   " : "FAIL ") << key << " (" << o.steps << " steps, 3 tensors)" << detail << "\n";
  }
  std::cout << passed << " passed, " << failed << " failed (GPU engine vs CPU engine on device " << o.device
            << ", sm_" << major << minor << ")\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace tools
}  // namespace luminav
