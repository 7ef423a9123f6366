// tools/bench/bench.cpp: `luminav bench`: how long the engine takes to come up, and how much host
// time a step costs
//
//   luminav bench BUNDLE|- [--device cuda|cpu] [--device-index N] [--groups G] [--tensors T]
//                 [--numel N | --shapes gpt2] [--dtype fp32|bf16] [--state-dtype fp32|bf16|q8]
//                 [--clip C] [--nonfinite skip|propagate] [--bound none|abs|rel]
//                 [--steps S] [--warmup W] [--threads N] [--csv FILE]
//
// The model: G param groups of T tensors of N elements each (or GPT-2 small's 148 tensors,
// split into G contiguous groups), params and grads of --dtype, moments of --state-dtype, filled
// from a host RNG. On CUDA they live in device memory (cuMemAlloc + cuMemcpyHtoD), on the CPU in
// host memory. The engine is luminav::Engine (engine.h), the object every other API wraps.
//
// Reported:
// - cold start: steady_clock from main()'s first statement to the first step finished (driver
//   loaded, context up, data uploaded, engine created with its bundle, params added, step()
//   returned and the stream synchronised), phase by phase; also without the data fill (the RNG
//   is the benchmark's, not the optimizer's), and the delay from the process's start to main()
//   (/proc/self/stat starttime, in clock ticks: about 10 ms resolution).
// - host time per step: steady_clock around each step() with no sync in between, averaged over
//   S steps after W warm-up steps; the stream is synchronised only after the batch. Device time
//   per step: two CUDA events around the same batch, divided by S. On the CPU, step() is
//   synchronous and its wall time is the step time.
// - driver calls: the CUDA path runs through a counting copy of the driver table
//   (ScopedDriverOverride), so the report gives the launches per step and every synchronising
//   or allocating driver call a timed step made. The engine promises none once the first step
//   has built its tables (nonfinite='raise' reads a flag on the host; bench does not offer it).
// Exit codes: 0 done, 1 failure, 2 usage, as the other subcommands.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/cli_args.h"
#include "common/counting_driver.h"
#include "common/cuda_session.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"

namespace luminav {
namespace tools {

namespace bench {
namespace {

// Refuses a device the driver does not see, pointing at the CPU engine when there is none.
void check_device_index(const CudaDriverApi& api, int ordinal) {
  int count = 0;
  check(api, api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (count == 0) {
    throw Error(Status::kNotFound, "the CUDA driver sees no device (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
                                   "`luminav bench - --device cpu` measures the CPU engine");
  }
  if (ordinal >= count) {
    throw Error(Status::kNotFound, "CUDA device " + std::to_string(ordinal) + " does not exist: the driver sees " +
                                       std::to_string(count) + " device(s); pick --device-index below " +
                                       std::to_string(count) + " (and check CUDA_VISIBLE_DEVICES)");
  }
}

constexpr std::uint64_t kSeed = 0x5EEDB0A7ULL;

void summarise_host(std::vector<double>& us, Results& r) {
  double total = 0;
  for (double v : us) total += v;
  r.host_us_mean = total / static_cast<double>(us.size());
  r.host_us_max = *std::max_element(us.begin(), us.end());
  std::nth_element(us.begin(), us.begin() + static_cast<std::ptrdiff_t>(us.size() / 2), us.end());
  r.host_us_median = us[us.size() / 2];
}

// Every parameter has taken 1 + warmup + steps steps (the grads are finite, nothing is skipped):
// the timings are of real steps.
void check_steps_applied(const Engine& engine, const BenchOptions& o) {
  const std::int64_t expected = 1 + static_cast<std::int64_t>(o.warmup) + o.steps;
  for (std::size_t k = 0; k < engine.num_params(); ++k) {
    const std::int64_t got = engine.param_step(k);
    if (got != expected) {
      throw Error(Status::kInternal, "parameter " + std::to_string(k) + " took " + std::to_string(got) +
                                         " steps, expected " + std::to_string(expected) +
                                         " (1 + warmup + steps): the timings do not describe full steps");
    }
  }
  const std::int64_t skipped = engine.skipped_steps();
  if (skipped != 0) {
    throw Error(Status::kInternal, "the engine skipped " + std::to_string(skipped) +
                                       " steps on finite gradients: the timings do not describe full steps");
  }
}

// Host wall time of each of `steps` calls of `step`, in microseconds; nothing waits in between.
template <class StepFn>
std::vector<double> time_host(int steps, StepFn&& step) {
  std::vector<double> us(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    const Clock::time_point t = Clock::now();
    step();
    us[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }
  return us;
}

Results run_cpu(const BenchOptions& o, const Model& model) {
  Results r;
  r.driver = "-";
  HostStorage storage;
  const ModelData data = make_data(storage, model, o);
  r.phases.push_back({"data: host RNG fill", Clock::now(), true});
  Engine engine(engine_options(DeviceType::kCpu, 0, o.threads, kSeed, ""));
  r.phases.push_back({"engine created (thread pool)", Clock::now()});
  add_params(engine, data, make_hyper(o));
  r.phases.push_back({"parameters added (moments allocated)", Clock::now()});
  engine.step();
  r.phases.push_back({"first step finished", Clock::now()});

  for (int i = 0; i < o.warmup; ++i) engine.step();
  std::vector<double> us = time_host(o.steps, [&] { engine.step(); });
  summarise_host(us, r);
  check_steps_applied(engine, o);
  r.threads = engine.num_threads();
  r.device_name = cpu_name() + " (" + std::to_string(r.threads) + " threads)";
  return r;
}

Results run_cuda(const BenchOptions& o, const Model& model) {
  Results r;
  const CudaDriverApi* real = nullptr;
  try {
    real = &cuda_driver();  // dlopen + cuInit, once per process
  } catch (const Error& e) {
    throw Error(e.status(), std::string(e.what()) + " (`luminav bench - --device cpu` measures the CPU engine)");
  }
  r.phases.push_back({"CUDA driver loaded (dlopen, cuInit)", Clock::now()});
  // Declared before everything that calls the driver, so it outlives all of it.
  CountingDriver counting(*real);
  ScopedDriverOverride counted(&counting.table);
  const CudaDriverApi& api = counting.table;
  check_device_index(api, o.device_index);
  CudaSession session(api, o.device_index, "device " + std::to_string(o.device_index), /*timing=*/true);
  r.phases.push_back({"context, stream, events", Clock::now()});
  int major = 0, minor = 0, sms = 0;
  check(api, api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, session.device()),
        "cuDeviceGetAttribute");
  check(api, api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, session.device()),
        "cuDeviceGetAttribute");
  check(api, api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, session.device()),
        "cuDeviceGetAttribute");
  r.device_name = cuda_device_name(*real, session.device(), o.device_index) + " (sm_" + std::to_string(major) +
                  std::to_string(minor) + ", " + std::to_string(sms) + " SMs)";
  r.driver = real->driver_version > 0 ? std::to_string(real->driver_version / 1000) + "." +
                                            std::to_string((real->driver_version % 1000) / 10)
                                      : "unknown";

  DeviceStorage storage(session);
  const ModelData data = make_data(storage, model, o);
  r.phases.push_back({"data: host RNG fill, cuMemcpyHtoD", Clock::now(), true});
  Engine engine(engine_options(DeviceType::kCuda, o.device_index, 0, kSeed, o.bundle));
  r.phases.push_back({"engine created (manifest read)", Clock::now()});
  add_params(engine, data, make_hyper(o));
  r.phases.push_back({"parameters added (moments allocated)", Clock::now()});

  void* stream = session.stream();
  const CallCounts before_first = counting.counts;
  engine.step(stream);
  r.phases.push_back({"first step enqueued (cubins read, hashed, loaded; tables)", Clock::now()});
  check(api, api.cuStreamSynchronize(session.stream()), "cuStreamSynchronize", "waiting for the first step");
  r.phases.push_back({"first step finished (stream synchronised)", Clock::now()});
  const CallCounts after_first = counting.counts;
  r.first_step_calls = std::to_string(after_first[k_cuLaunchKernel] - before_first[k_cuLaunchKernel]) +
                       " launches, " +
                       std::to_string(after_first[k_cuModuleLoadData] - before_first[k_cuModuleLoadData]) +
                       " module loads; blocking calls: " + describe_blocking(before_first, after_first);

  for (int i = 0; i < o.warmup; ++i) engine.step(stream);
  check(api, api.cuStreamSynchronize(session.stream()), "cuStreamSynchronize", "after the warm-up steps");
  check(api, api.cuEventRecord(session.start(), session.stream()), "cuEventRecord");
  const CallCounts before = counting.counts;
  std::vector<double> us = time_host(o.steps, [&] { engine.step(stream); });
  const CallCounts after = counting.counts;
  check(api, api.cuEventRecord(session.stop(), session.stream()), "cuEventRecord");
  check(api, api.cuEventSynchronize(session.stop()), "cuEventSynchronize", "waiting for the timed steps");
  float ms = 0;
  check(api, api.cuEventElapsedTime(&ms, session.start(), session.stop()), "cuEventElapsedTime");
  r.device_us = static_cast<double>(ms) * 1e3 / o.steps;
  r.launches_per_step = static_cast<double>(after[k_cuLaunchKernel] - before[k_cuLaunchKernel]) / o.steps;
  r.graph_launches_per_step = static_cast<double>(after[k_cuGraphLaunch] - before[k_cuGraphLaunch]) / o.steps;
  r.blocking_per_step = static_cast<double>(blocking_calls(before, after)) / o.steps;
  r.blocking_detail = describe_blocking(before, after);
  summarise_host(us, r);
  check_steps_applied(engine, o);
  return r;
}

}  // namespace
}  // namespace bench

int run_bench(const std::vector<std::string>& args, std::chrono::steady_clock::time_point main_start) {
  using namespace bench;
  try {
    for (const std::string& a : args) {
      if (a == "-h" || a == "--help") {
        std::cout << kBenchUsage;
        return 0;
      }
    }
    const BenchOptions o = parse_bench_options(args);
    const Model model = make_model(o);
    const bool csv_header = !o.csv.empty() && check_csv(o.csv);
    const Clock::time_point parsed = Clock::now();
    Results r = o.device == DeviceType::kCuda ? run_cuda(o, model) : run_cpu(o, model);
    r.phases.insert(r.phases.begin(), Phase{"arguments parsed", parsed});
    const ColdStart c = cold_start(r, main_start);
    print_report(o, model, r, c, main_start);
    if (!o.csv.empty()) append_csv(o, model, r, c, main_start, csv_header);
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "luminav bench: " << e.message << " (luminav bench --help lists the options)\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "luminav bench: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "luminav bench: out of host memory; make the model smaller (--numel, --tensors, --groups)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "luminav bench: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "luminav bench: an unknown exception ended the run\n";
    return 1;
  }
}

}  // namespace tools
}  // namespace luminav
