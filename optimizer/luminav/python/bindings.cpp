// python/bindings.cpp: the nanobind module luminamoon._luminav: the launch groups of the "cpu" and
// "aot" backends, manifest inspection, the random streams, and the constants Python checks
// against C++ (tests/test_contract.py)
//
// Only nb::class_ and m.def here; what they wrap is in src/ (engine/group.h for the groups).
// Tensor addresses (data_ptr()) and CUDA streams come in as ints; nothing here touches torch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "aot/bundle_rules.h"
#include "aot/hip_driver.h"
#include "aot/manifest.h"
#include "engine/cpu_kernels.h"
#include "engine/cpu_quant.h"
#include "engine/engine.h"
#include "engine/group.h"
#include "engine/group_launch.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"
#include "luminav/luminav.h"

namespace nb = nanobind;
using namespace nb::literals;

using luminav::AotGroup;
using luminav::CpuGroup;
using luminav::GroupConfig;
using luminav::HipAotGroup;
using luminav::RowTuple;

namespace {

luminav::CUstream stream_of(std::uintptr_t stream) { return reinterpret_cast<luminav::CUstream>(stream); }
luminav::hipStream_t hip_stream_of(std::uintptr_t stream) { return reinterpret_cast<luminav::hipStream_t>(stream); }

// A Python str of library text: UTF-8, any stray byte kept as a \\xNN escape.
PyObject* text(const std::string& s) {
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "backslashreplace");
}

void set_error(PyObject* type, const std::string& message) {
  PyObject* msg = text(message);
  if (msg == nullptr) return;  // the decoder's own error is set
  PyErr_SetObject(type, msg);
  Py_DECREF(msg);
}

// luminamoon.aot.rules.BundleError(code, path, field, expected, found, message=<the library's>),
// or a RuntimeError with the message where that module cannot be imported.
void set_bundle_error(const luminav::BundleError& e) {
  PyObject* module = PyImport_ImportModule("luminamoon.aot.rules");
  PyObject* cls = module ? PyObject_GetAttrString(module, "BundleError") : nullptr;
  Py_XDECREF(module);
  if (cls == nullptr) {
    PyErr_Clear();
    set_error(PyExc_RuntimeError, e.what());
    return;
  }
  PyObject* path = PyUnicode_DecodeFSDefaultAndSize(e.file().data(), static_cast<Py_ssize_t>(e.file().size()));
  PyObject* args = path ? Py_BuildValue("(sNNNN)", e.code(), path, text(e.field()), text(e.expected()),
                                        text(e.found()))
                        : nullptr;
  PyObject* kwargs = args ? Py_BuildValue("{sN}", "message", text(e.what())) : nullptr;
  PyObject* exc = kwargs ? PyObject_Call(cls, args, kwargs) : nullptr;
  Py_XDECREF(args);
  Py_XDECREF(kwargs);
  if (exc != nullptr) {
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
  } else {
    PyErr_Clear();
    set_error(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(cls);
}

// The one reader of Python's hyperparameter record (optimizer/_groups.py, Hyper): each field of
// engine/engine.h's Hyper by its name, bound_mode as its code, nonfinite as its name. lr and
// state_dtype are not part of it (make_config sets them).
luminav::Hyper hyper_from(nb::handle h) {
  luminav::Hyper out;
  out.beta1 = nb::cast<double>(h.attr("beta1"));
  out.beta2 = nb::cast<double>(h.attr("beta2"));
  out.eps = nb::cast<double>(h.attr("eps"));
  out.weight_decay = nb::cast<double>(h.attr("weight_decay"));
  out.clip = nb::cast<double>(h.attr("clip"));
  out.bound_mode = luminav::bound_mode_from_int(nb::cast<int>(h.attr("bound_mode")));
  out.bound = nb::cast<double>(h.attr("bound"));
  out.maximize = nb::cast<bool>(h.attr("maximize"));
  out.nonfinite = luminav::nonfinite_from_name(nb::cast<std::string>(h.attr("nonfinite")));
  out.stochastic_rounding = nb::cast<bool>(h.attr("stochastic_rounding"));
  return out;
}

nb::dict kernel_dict(const luminav::KernelMetadata& k) {
  nb::dict d;
  d["key"] = k.key;
  d["kernel"] = k.kernel;
  d["name"] = k.name;
  d["entry"] = k.entry;
  d[k.file_field()] = k.cubin;  // "cubin", or "hsaco" for a HIP entry
  d["sha256"] = k.sha256;
  d["backend"] = k.backend;
  if (k.hip()) {
    d["arch"] = k.gfx;  // "gfx942"
  } else {
    d["arch"] = k.arch;  // 90
  }
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

  // luminav::BundleError -> luminamoon.aot.BundleError with the same code, file, field, expected
  // and found (a ValueError); other luminav::Error -> ValueError for user errors,
  // FloatingPointError for 'raise', LookupError for what is not found, RuntimeError for the
  // rest. The message is the library's.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const luminav::BundleError& e) {
      set_bundle_error(e);
    } catch (const luminav::Error& e) {
      switch (e.status()) {
        case luminav::Status::kInvalidArgument: set_error(PyExc_ValueError, e.what()); break;
        case luminav::Status::kNonFinite: set_error(PyExc_FloatingPointError, e.what()); break;
        case luminav::Status::kNotFound: set_error(PyExc_LookupError, e.what()); break;
        default: set_error(PyExc_RuntimeError, e.what()); break;
      }
    }
  });

  // The rule book's codes (aot/bundle_rules.h), for the Python <-> C++ contract test.
  nb::list rules;
  for (int i = 0; i < luminav::kBundleRuleCount; ++i) {
    rules.append(nb::make_tuple(luminav::bundle_rules()[i].code, luminav::bundle_rules()[i].description));
  }
  m.attr("BUNDLE_RULES") = nb::tuple(rules);

  m.def("api_version", &lv_api_version, "The C API version of the compiled library.");
  m.def("has_cuda_driver", [] { return luminav::cuda_driver_available(); },
        "True when libcuda.so.1 loads (the aot backend and the engine's CUDA path need it).");
  m.def("has_hip_runtime", [] { return luminav::hip_driver_available(); },
        "True when libamdhip64.so loads and hipInit succeeds (what launching a bundle's hsaco files needs).");

  m.def("load_manifest", [](nb::object dir) {
    // Any path Python has (str, bytes, os.PathLike; surrogate-escaped bytes included), as bytes.
    const nb::bytes raw(nb::module_::import_("os").attr("fsencode")(dir));
    const std::string path(raw.c_str(), raw.size());
    luminav::AotManifest man;
    {
      nb::gil_scoped_release unlocked;  // file reads and hashing only
      man = luminav::AotManifest::load(path, luminav::CubinCheck::kNow);
    }
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
  }, "dir"_a, "Loads and verifies <dir>/manifest.json and its cubins by the rule book (docs/bundle-format.md); "
                "returns its content as a dict, or raises luminamoon.aot.BundleError.");

  m.def("cpu_isa", [] { return luminav::cpu::cpu_isa_name(luminav::cpu::cpu_isa()); },
        "Vector width of the CPU engine's loops: 'avx512', 'avx2' or 'baseline' (the widest this CPU has, or "
        "$LUMINAV_CPU_ISA); every width gives the same bits.");

  m.def("cpu_thread_pool", [] {
        auto pool = luminav::pool_for(0);
        return std::make_tuple(pool->kind(), pool->size());
      },
      "(kind, threads) of the pool the cpu backend's groups share by default: kind 'openmp (<library>)' "
      "(the team of the OpenMP runtime loaded in the process, torch's) or 'threads' (the engine's own).");

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
    luminav::cpu::random_words(key, first, count, stream, reinterpret_cast<std::uint32_t*>(out));
  }, "out"_a, "key"_a, "first"_a, "count"_a, "stream"_a,
     "Writes R(i, stream) for i in [first, first + count) into `count` uint32 words at address `out`.");

  nb::class_<GroupConfig>(m, "GroupConfig",
                          "A launch group's constants (lr excluded): the (param, grad, state) dtype codes, the "
                          "hyperparameter record (luminamoon.optimizer._groups.Hyper) and the seed. Validated on "
                          "construction.")
      .def("__init__",
           [](GroupConfig* self, const std::tuple<int, int, int>& dtypes, nb::handle hyper, std::uint64_t seed) {
             const luminav::Hyper h = hyper_from(hyper);
             new (self) GroupConfig(
                 luminav::make_config(std::get<0>(dtypes), std::get<1>(dtypes), std::get<2>(dtypes), h, seed));
           },
           "dtypes"_a, "hyper"_a, "seed"_a)
      .def_prop_ro("seed", [](const GroupConfig& c) { return c.seed; });

  nb::class_<CpuGroup>(m, "CpuGroup", "A launch group of the cpu backend (docs/internals.md, run on CPU threads).")
      .def(nb::init<const GroupConfig&, const std::vector<RowTuple>&, int>(), "config"_a, "rows"_a,
           "num_threads"_a = 0)
      .def("pass1", &CpuGroup::pass1, "stats"_a, "found_inf"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("pass2", &CpuGroup::pass2, "lr"_a, "stats"_a, "found_inf"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("commit", &CpuGroup::commit, "found_inf"_a)
      .def("first_nonfinite", &CpuGroup::first_nonfinite, nb::call_guard<nb::gil_scoped_release>())
      .def("set_grads", &CpuGroup::set_grads, "grads"_a)
      .def("__len__", &CpuGroup::size)
      .def_prop_ro("num_threads", &CpuGroup::num_threads)
      .def_prop_ro("thread_pool", &CpuGroup::thread_pool,
                   "'threads' (the engine's own) or 'openmp (<library>)': the OpenMP team of a runtime "
                   "already loaded in the process (torch's), which runs the passes");

  m.def("cpu_step",
        [](const std::vector<std::tuple<CpuGroup*, double, std::uintptr_t, std::uintptr_t,
                                        std::optional<std::vector<std::uintptr_t>>>>& items,
           std::uintptr_t skip_flag, std::uintptr_t skipped) {
          std::vector<luminav::CpuStepItem> steps;
          steps.reserve(items.size());
          for (const auto& [group, lr, stats, found_inf, grads] : items)
            steps.push_back({group, lr, stats, found_inf, grads ? &*grads : nullptr});
          nb::gil_scoped_release release;
          luminav::cpu_step(steps, skip_flag, skipped);
        },
        "items"_a, "skip_flag"_a, "skipped"_a,
        "A whole step of CPU launch groups in one call (engine/group.h): items are (group, lr, "
        "stats address, flag address, new gradient addresses or None); skipped += the skip "
        "flag, every flag cleared.");
  m.def("variant_keys", [](const GroupConfig& config) {
    const luminav::gpu::VariantKeys k = luminav::gpu::variant_keys(config);
    nb::dict d;
    if (!k.pass1.empty()) d["pass1"] = k.pass1;
    if (!k.reduce.empty()) d["reduce"] = k.reduce;
    if (!k.pass2.empty()) d["pass2"] = k.pass2;
    if (!k.single_pass.empty()) d["single_pass"] = k.single_pass;
    d["commit"] = k.commit;
    return d;
  }, "config"_a, "The AOT variant keys the engine launches for one launch group.");

  m.def("build_tables", [](const std::vector<RowTuple>& rows) {
    bool q8 = false;  // q8 rows carry a row_len (the group's rows all do, or none)
    for (const RowTuple& row : rows) q8 = q8 || std::get<12>(row) != 0;
    const std::vector<luminav::TensorRow> r = luminav::make_rows(rows, false, q8);
    luminav::gpu::HostTables t = luminav::gpu::build_tables(r.data(), r.size());
    return std::make_tuple(std::move(t.table), std::move(t.block_map), t.nblocks);
  }, "rows"_a,
        "(table, block_map, nblocks) as C++ writes them (build_tables) for rows of (param, grad, exp_avg, "
        "exp_avg_sq, p_init, step, numel, elem_offset, param_index, global_numel, scale_m, scale_v, row_len): "
        "table is ntensors x TABLE_COLS int64 values, row by row.");

  // q8 moments: the codebooks as engine/cpu_quant.cpp computes them (tests/test_contract.py
  // compares them with kernels/quant.py's), and the codes of zero.
  m.def("q8_codebook", [](bool is_signed) {
    const float* t = is_signed ? luminav::cpu::quant::codebook_m_table() : luminav::cpu::quant::codebook_v_table();
    return std::vector<float>(t, t + 256);
  }, "signed"_a, "The 256 float32 values of the signed (m) or unsigned (v) q8 codebook, ascending.");
  m.attr("Q8_ZERO_CODES") = nb::make_tuple(luminav::cpu::quant::kZeroCodeM, luminav::cpu::quant::kZeroCodeV);
  m.attr("Q8_BLOCK") = luminav::cpu::quant::kBlock;
  m.attr("S_DTYPE_Q8") = static_cast<int>(luminav::DType::kQ8);

  // The contract constants, each read from its one C++ owner (tests/test_contract.py compares
  // them with Python's): the table layout, the pointer alignment, the launch shapes, the codes.
  namespace gpu = luminav::gpu;
  m.attr("TABLE_COLS") = gpu::kTableCols;
  m.attr("GPU_TABLE_COLS") = gpu::kTableCols;
  m.attr("COL_PARAM") = gpu::kColParam;
  m.attr("COL_GRAD") = gpu::kColGrad;
  m.attr("COL_EXP_AVG") = gpu::kColExpAvg;
  m.attr("COL_EXP_AVG_SQ") = gpu::kColExpAvgSq;
  m.attr("COL_P_INIT") = gpu::kColPInit;
  m.attr("COL_STEP") = gpu::kColStep;
  m.attr("COL_NUMEL") = gpu::kColNumel;
  m.attr("COL_BLOCK_START") = gpu::kColBlockStart;
  m.attr("COL_ELEM_OFFSET") = gpu::kColElemOffset;
  m.attr("COL_PARAM_INDEX") = gpu::kColParamIndex;
  m.attr("COL_GLOBAL_NUMEL") = gpu::kColGlobalNumel;
  m.attr("COL_CACHE") = gpu::kColCache;
  m.attr("COL_EXP_AVG_SCALE") = gpu::kColExpAvgScale;
  m.attr("COL_EXP_AVG_SQ_SCALE") = gpu::kColExpAvgSqScale;
  m.attr("COL_ROW_LEN") = gpu::kColRowLen;
  m.attr("ALIGN_BYTES") = gpu::kAlignBytes;
  m.attr("GPU_BLOCK") = gpu::kBlock;
  m.attr("GPU_BLOCK_WARPS") = gpu::kBlockWarps;
  m.attr("REDUCE_RBLOCK") = gpu::kReduceRBlock;
  m.attr("REDUCE_WARPS") = gpu::kReduceWarps;
  m.attr("COMMIT_TBLOCK") = gpu::kCommitTBlock;
  m.attr("COMMIT_WARPS") = gpu::kCommitWarps;
  nb::dict dtype_codes, bound_modes, nonfinite_codes;
  for (luminav::DType d : luminav::kDTypes) dtype_codes[luminav::dtype_name(d)] = static_cast<int>(d);
  for (luminav::BoundMode b : luminav::kBoundModes) bound_modes[luminav::bound_mode_name(b)] = static_cast<int>(b);
  for (luminav::NonFinite n : luminav::kNonFinites) nonfinite_codes[luminav::nonfinite_name(n)] = static_cast<int>(n);
  m.attr("DTYPE_CODES") = dtype_codes;
  m.attr("BOUND_MODES") = bound_modes;
  m.attr("NONFINITE_CODES") = nonfinite_codes;

  nb::class_<AotGroup>(m, "AotGroup",
                       "A launch group's AOT kernels loaded on one CUDA device, launched on the engine's bound "
                       "path: bind() the buffers once per layout, then each launch takes only the stream.")
      .def(nb::init<const std::string&, int, const GroupConfig&>(), "bundle_dir"_a, "device"_a, "config"_a)
      .def("bind", &AotGroup::bind, "table"_a, "block_map"_a, "nblocks"_a, "partial_sum"_a, "partial_bad"_a, "stats"_a,
           "lr"_a, "ntensors"_a, "found_inf"_a, "reduce_flag"_a,
           "Binds every launch to these device buffers (addresses as ints); replaces an earlier binding.")
      .def("set_flags", &AotGroup::set_flags, "found_inf"_a, "reduce_flag"_a)
      .def("set_lr", &AotGroup::set_lr, "lr"_a)
      .def("pass1", [](AotGroup& g, std::uintptr_t s) { g.pass1(stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("reduce", [](AotGroup& g, std::uintptr_t s) { g.reduce(stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("update", [](AotGroup& g, std::uintptr_t s) { g.update(stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("commit", [](AotGroup& g, std::uintptr_t s) { g.commit(stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>());

  // The same on an AMD device: the bundle's HIP entries for `arch` (torch's gcnArchName, e.g.
  // "gfx942:sramecc+:xnack-"), launched through libamdhip64.so; streams are hipStream_t (on a
  // ROCm build of torch, torch.cuda.current_stream().cuda_stream).
  nb::class_<HipAotGroup>(m, "HipAotGroup",
                          "A launch group's AOT kernels loaded on one AMD (HIP) device, launched with the same "
                          "arguments as AotGroup: bind() the buffers once per layout, then each launch takes only the "
                          "stream.")
      .def(nb::init<const std::string&, int, const std::string&, const GroupConfig&>(), "bundle_dir"_a, "device"_a,
           "arch"_a, "config"_a)
      .def("bind", &HipAotGroup::bind, "table"_a, "block_map"_a, "nblocks"_a, "partial_sum"_a, "partial_bad"_a,
           "stats"_a, "lr"_a, "ntensors"_a, "found_inf"_a, "reduce_flag"_a,
           "Binds every launch to these device buffers (addresses as ints); replaces an earlier binding.")
      .def("set_flags", &HipAotGroup::set_flags, "found_inf"_a, "reduce_flag"_a)
      .def("set_lr", &HipAotGroup::set_lr, "lr"_a)
      .def("pass1", [](HipAotGroup& g, std::uintptr_t s) { g.pass1(hip_stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("reduce", [](HipAotGroup& g, std::uintptr_t s) { g.reduce(hip_stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("update", [](HipAotGroup& g, std::uintptr_t s) { g.update(hip_stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("commit", [](HipAotGroup& g, std::uintptr_t s) { g.commit(hip_stream_of(s)); }, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>());
}
