// luminamoon._luminav: the native engine for Python. Group-level entry points for the "cpu"
// and "aot" backends (python/luminamoon/optimizer/native.py) take tensor addresses as ints
// (data_ptr()) and the CUDA stream as an int; nothing here touches torch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "engine/group_launch.h"
#include "engine/thread_pool.h"
#include "aot/manifest.h"
#include "luminav/cuda_driver.h"
#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "luminav/error.h"
#include "luminav/luminav.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using luminav::DType;
using luminav::GroupConfig;
using luminav::TensorRow;

// One table row from Python: (param, grad, exp_avg, exp_avg_sq, p_init, step, numel,
// elem_offset, param_index, global_numel), addresses as ints.
using RowTuple = std::tuple<std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                            std::uintptr_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

template <class T>
T* ptr(std::uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

GroupConfig make_config(int param_dtype, int grad_dtype, int state_dtype, double beta1, double beta2, double eps,
                        double weight_decay, double clip, int bound_mode, double bound, bool maximize,
                        int nonfinite, bool stochastic_rounding, std::uint64_t seed) {
  GroupConfig cfg;
  cfg.param_dtype = luminav::dtype_from_int(param_dtype, "param_dtype");
  cfg.grad_dtype = luminav::dtype_from_int(grad_dtype, "grad_dtype");
  cfg.state_dtype = luminav::dtype_from_int(state_dtype, "state_dtype");
  luminav::Hyper& h = cfg.hyper;
  h.lr = 0.0;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.clip = clip;
  h.bound_mode = luminav::bound_mode_from_int(bound_mode);
  h.bound = bound;
  h.maximize = maximize;
  h.nonfinite = luminav::nonfinite_from_int(nonfinite);
  h.stochastic_rounding = stochastic_rounding;
  h.state_dtype = cfg.state_dtype;
  luminav::validate_hyper(h);
  cfg.seed = seed;
  return cfg;
}

std::vector<TensorRow> make_rows(const std::vector<RowTuple>& rows, bool bounded) {
  std::vector<TensorRow> out;
  out.reserve(rows.size());
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const RowTuple& r = rows[j];
    TensorRow t;
    t.param = ptr<void>(std::get<0>(r));
    t.grad = ptr<const void>(std::get<1>(r));
    t.exp_avg = ptr<void>(std::get<2>(r));
    t.exp_avg_sq = ptr<void>(std::get<3>(r));
    t.p_init = ptr<void>(std::get<4>(r));
    t.step = ptr<std::int64_t>(std::get<5>(r));
    t.numel = std::get<6>(r);
    t.elem_offset = std::get<7>(r);
    t.param_index = std::get<8>(r);
    t.global_numel = std::get<9>(r);
    const std::string who = "row " + std::to_string(j);
    if (t.numel < 0) throw luminav::Error(luminav::Status::kInvalidArgument, who + ": numel must be >= 0, got " + std::to_string(t.numel));
    if (!t.step) throw luminav::Error(luminav::Status::kInvalidArgument, who + ": the step counter address is 0");
    if (t.numel > 0 && (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq)) {
      throw luminav::Error(luminav::Status::kInvalidArgument, who + ": a param/grad/exp_avg/exp_avg_sq address is 0");
    }
    if (bounded && t.numel > 0 && !t.p_init) {
      throw luminav::Error(luminav::Status::kInvalidArgument, who + ": bound_mode is not none but the p_init address is 0");
    }
    if (t.global_numel < t.elem_offset + t.numel) {
      throw luminav::Error(luminav::Status::kInvalidArgument,
                           who + ": global_numel " + std::to_string(t.global_numel) + " < elem_offset + numel = " +
                               std::to_string(t.elem_offset + t.numel));
    }
    out.push_back(t);
  }
  return out;
}

// Worker pools by size, made on first use (never at import).
std::shared_ptr<luminav::cpu::ThreadPool> pool_for(int num_threads) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<luminav::cpu::ThreadPool>>* pools =
      new std::map<int, std::shared_ptr<luminav::cpu::ThreadPool>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& p = (*pools)[num_threads];
  if (!p) p = luminav::cpu::make_thread_pool(num_threads);
  return p;
}

// A launch group of the "cpu" backend: the config and the rows, built once per table.
class CpuGroup {
 public:
  CpuGroup(GroupConfig cfg, const std::vector<RowTuple>& rows, int num_threads)
      : cfg_(cfg), rows_(make_rows(rows, cfg.hyper.bound_mode != luminav::BoundMode::kNone)), pool_(pool_for(num_threads)) {
    if (num_threads < 0) throw luminav::Error(luminav::Status::kInvalidArgument, "num_threads must be >= 0, got " + std::to_string(num_threads));
  }
  void pass1(std::uintptr_t stats, std::uintptr_t found_inf) {
    nb::gil_scoped_release release;
    luminav::cpu::pass1(cfg_, rows_.data(), rows_.size(), ptr<float>(stats), ptr<std::int32_t>(found_inf), *pool_);
  }
  void pass2(double lr, std::uintptr_t stats, std::uintptr_t found_inf) {
    luminav::validate_lr(lr);
    nb::gil_scoped_release release;
    luminav::cpu::pass2(cfg_, rows_.data(), rows_.size(), static_cast<float>(lr), ptr<const float>(stats),
                        ptr<const std::int32_t>(found_inf), *pool_);
  }
  void commit(std::uintptr_t found_inf) {
    luminav::cpu::commit(cfg_, rows_.data(), rows_.size(), ptr<const std::int32_t>(found_inf));
  }
  std::int64_t first_nonfinite() {
    nb::gil_scoped_release release;
    return luminav::cpu::first_nonfinite(cfg_, rows_.data(), rows_.size(), *pool_);
  }
  std::size_t size() const { return rows_.size(); }
  int num_threads() const { return pool_->size(); }

 private:
  GroupConfig cfg_;
  std::vector<TensorRow> rows_;
  std::shared_ptr<luminav::cpu::ThreadPool> pool_;
};

// A launch group of the "aot" backend: its kernels loaded from a bundle on one device. The
// Python side owns the device tables and buffers (torch tensors) and passes their addresses.
class AotGroup {
 public:
  AotGroup(const std::string& bundle_dir, int device, GroupConfig cfg)
      : kernels_(luminav::gpu::runtime_for_bundle(bundle_dir), device, cfg) {}
  using P = std::uintptr_t;
  void pass1(P table, P block_map, std::int64_t nblocks, P partial_sum, P partial_bad, P stream) {
    nb::gil_scoped_release release;
    kernels_.pass1(table, block_map, nblocks, partial_sum, partial_bad, reinterpret_cast<luminav::CUstream>(stream));
  }
  void reduce(P table, P partial_sum, P partial_bad, P stats, P found_inf, std::int32_t ntensors, P stream) {
    nb::gil_scoped_release release;
    kernels_.reduce(table, partial_sum, partial_bad, stats, found_inf, ntensors, reinterpret_cast<luminav::CUstream>(stream));
  }
  void update(P table, P block_map, std::int64_t nblocks, P stats, P found_inf, P lr, P stream) {
    nb::gil_scoped_release release;
    kernels_.update(table, block_map, nblocks, stats, found_inf, lr, reinterpret_cast<luminav::CUstream>(stream));
  }
  void commit(P table, P found_inf, std::int32_t ntensors, P stream) {
    nb::gil_scoped_release release;
    kernels_.commit(table, found_inf, ntensors, reinterpret_cast<luminav::CUstream>(stream));
  }

 private:
  luminav::gpu::GroupKernels kernels_;
};

nb::dict kernel_dict(const luminav::KernelMetadata& k) {
  nb::dict d;
  d["key"] = k.key;
  d["kernel"] = k.kernel;
  d["name"] = k.name;
  d["entry"] = k.entry;
  d["cubin"] = k.cubin;
  d["sha256"] = k.sha256;
  d["arch"] = k.arch;
  d["warp_size"] = k.warp_size;
  d["triton_version"] = k.triton_version;
  d["num_warps"] = k.num_warps;
  d["num_ctas"] = k.num_ctas;
  d["shared_mem"] = k.shared_mem;
  d["arg_names"] = k.arg_names;
  d["signature"] = k.signature;
  d["constexprs"] = k.constexprs;
  d["num_params"] = k.num_params;
  d["num_trailing_scratch_ptrs"] = k.num_trailing_scratch_ptrs;
  d["global_scratch_size"] = k.global_scratch_size;
  d["profile_scratch_size"] = k.profile_scratch_size;
  return d;
}

}  // namespace

NB_MODULE(_luminav, m) {
  m.doc() = "LuminaMoon native engine (luminav): CPU passes, AOT kernel launches, manifest inspection";
  m.attr("__version__") = lv_version_string();
  m.attr("API_VERSION") = LV_API_VERSION;
  m.attr("CPU_CHUNK") = luminav::cpu::kChunk;

  // luminav::Error -> Python: ValueError for user errors, FloatingPointError for 'raise',
  // RuntimeError for the rest; the message is the library's.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const luminav::Error& e) {
      switch (e.status()) {
        case luminav::Status::kInvalidArgument: PyErr_SetString(PyExc_ValueError, e.what()); break;
        case luminav::Status::kNonFinite: PyErr_SetString(PyExc_FloatingPointError, e.what()); break;
        case luminav::Status::kNotFound: PyErr_SetString(PyExc_LookupError, e.what()); break;
        default: PyErr_SetString(PyExc_RuntimeError, e.what()); break;
      }
    }
  });

  m.def("api_version", &lv_api_version, "The C API version of the compiled library.");
  m.def("has_cuda_driver", [] { return luminav::cuda_driver_available(); },
        "True when libcuda.so.1 loads (the aot backend and the engine's CUDA path need it).");

  m.def("load_manifest", [](const std::string& dir) {
    const luminav::AotManifest man = luminav::AotManifest::load(dir, luminav::CubinCheck::kNow);
    nb::dict d;
    d["dir"] = man.dir();
    d["format_version"] = man.format_version();
    d["table_cols"] = man.table_cols();
    d["created_by"] = man.created_by();
    d["triton_version"] = man.triton_version();
    nb::list kernels;
    for (const auto& k : man.kernels()) kernels.append(kernel_dict(k));
    d["kernels"] = kernels;
    return d;
  }, "dir"_a, "Loads and verifies <dir>/manifest.json and its cubins; returns its content as a dict.");

  // Random streams, for cross-checking against luminamoon.optimizer.rng.
  m.def("splitmix64", &luminav::cpu::splitmix64, "z"_a);
  m.def("stream_key", &luminav::cpu::stream_key, "seed"_a, "t"_a, "k"_a,
        "seed_tk = splitmix64(splitmix64(seed + t) + k)");
  m.def("philox4x32_10", [](std::uint32_t k0, std::uint32_t k1, std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                            std::uint32_t c3) {
    const std::uint32_t ctr[4] = {c0, c1, c2, c3};
    std::uint32_t out[4];
    luminav::cpu::philox4x32_10(k0, k1, ctr, out);
    return std::make_tuple(out[0], out[1], out[2], out[3]);
  }, "key0"_a, "key1"_a, "c0"_a, "c1"_a, "c2"_a, "c3"_a);
  m.def("random_words", [](std::uintptr_t out, std::uint64_t key, std::int64_t first, std::int64_t count,
                           std::uint32_t stream) {
    if (count < 0) throw luminav::Error(luminav::Status::kInvalidArgument, "count must be >= 0, got " + std::to_string(count));
    if (count > 0 && !out) throw luminav::Error(luminav::Status::kInvalidArgument, "out address is 0");
    nb::gil_scoped_release release;
    luminav::cpu::random_words(key, first, count, stream, ptr<std::uint32_t>(out));
  }, "out"_a, "key"_a, "first"_a, "count"_a, "stream"_a,
     "Writes R(i, stream) for i in [first, first + count) into `count` uint32 words at address `out`.");

  nb::class_<CpuGroup>(m, "CpuGroup", "A launch group of the cpu backend (docs/internals.md, run on CPU threads).")
      .def("__init__", [](CpuGroup* self, int param_dtype, int grad_dtype, int state_dtype, double beta1, double beta2,
                          double eps, double weight_decay, double clip, int bound_mode, double bound, bool maximize,
                          int nonfinite, bool stochastic_rounding, std::uint64_t seed, const std::vector<RowTuple>& rows,
                          int num_threads) {
             new (self) CpuGroup(make_config(param_dtype, grad_dtype, state_dtype, beta1, beta2, eps, weight_decay, clip,
                                             bound_mode, bound, maximize, nonfinite, stochastic_rounding, seed),
                                 rows, num_threads);
           },
           "param_dtype"_a, "grad_dtype"_a, "state_dtype"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "clip"_a,
           "bound_mode"_a, "bound"_a, "maximize"_a, "nonfinite"_a, "stochastic_rounding"_a, "seed"_a, "rows"_a,
           "num_threads"_a = 0)
      .def("pass1", &CpuGroup::pass1, "stats"_a, "found_inf"_a)
      .def("pass2", &CpuGroup::pass2, "lr"_a, "stats"_a, "found_inf"_a)
      .def("commit", &CpuGroup::commit, "found_inf"_a)
      .def("first_nonfinite", &CpuGroup::first_nonfinite)
      .def("__len__", &CpuGroup::size)
      .def_prop_ro("num_threads", &CpuGroup::num_threads);

  m.def("variant_keys", [](int param_dtype, int grad_dtype, int state_dtype, double clip, int bound_mode,
                           int nonfinite, bool stochastic_rounding) {
    GroupConfig cfg = make_config(param_dtype, grad_dtype, state_dtype, 0.9, 0.999, 1e-8, 0.0, clip, bound_mode, 1.0,
                                  false, nonfinite, stochastic_rounding, 0);
    const luminav::gpu::VariantKeys k = luminav::gpu::variant_keys(cfg);
    nb::dict d;
    if (!k.pass1.empty()) d["pass1"] = k.pass1;
    if (!k.reduce.empty()) d["reduce"] = k.reduce;
    if (!k.pass2.empty()) d["pass2"] = k.pass2;
    if (!k.single_pass.empty()) d["single_pass"] = k.single_pass;
    d["commit"] = k.commit;
    return d;
  }, "param_dtype"_a, "grad_dtype"_a, "state_dtype"_a, "clip"_a, "bound_mode"_a, "nonfinite"_a,
     "stochastic_rounding"_a, "The AOT variant keys the engine launches for one launch group.");
  m.attr("GPU_BLOCK") = luminav::gpu::kBlock;
  m.attr("GPU_TABLE_COLS") = luminav::gpu::kTableCols;

  nb::class_<AotGroup>(m, "AotGroup", "A launch group's AOT kernels loaded on one CUDA device.")
      .def("__init__", [](AotGroup* self, const std::string& bundle_dir, int device, int param_dtype, int grad_dtype,
                          int state_dtype, double beta1, double beta2, double eps, double weight_decay, double clip,
                          int bound_mode, double bound, bool maximize, int nonfinite, bool stochastic_rounding,
                          std::uint64_t seed) {
             new (self) AotGroup(bundle_dir, device,
                                 make_config(param_dtype, grad_dtype, state_dtype, beta1, beta2, eps, weight_decay, clip,
                                             bound_mode, bound, maximize, nonfinite, stochastic_rounding, seed));
           },
           "bundle_dir"_a, "device"_a, "param_dtype"_a, "grad_dtype"_a, "state_dtype"_a, "beta1"_a, "beta2"_a, "eps"_a,
           "weight_decay"_a, "clip"_a, "bound_mode"_a, "bound"_a, "maximize"_a, "nonfinite"_a, "stochastic_rounding"_a,
           "seed"_a)
      .def("pass1", &AotGroup::pass1, "table"_a, "block_map"_a, "nblocks"_a, "partial_sum"_a, "partial_bad"_a, "stream"_a)
      .def("reduce", &AotGroup::reduce, "table"_a, "partial_sum"_a, "partial_bad"_a, "stats"_a, "found_inf"_a,
           "ntensors"_a, "stream"_a)
      .def("update", &AotGroup::update, "table"_a, "block_map"_a, "nblocks"_a, "stats"_a, "found_inf"_a, "lr"_a,
           "stream"_a)
      .def("commit", &AotGroup::commit, "table"_a, "found_inf"_a, "ntensors"_a, "stream"_a);

}
