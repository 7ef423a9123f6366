// examples/cpp/train_logreg.cpp: logistic regression on synthetic data, trained with the
// LuminaMoon engine from plain C++ (the C++ API, luminav.hpp)
//
// The program computes its own gradients, checkpoints mid-run (parameters + optimizer state to a
// file), finishes the run, then resumes a fresh optimizer from the checkpoint and checks that the
// resumed run ends bitwise where the uninterrupted one did.
//
//   luminav_train_logreg [--device cpu|cuda] [--bundle DIR] [--epochs N] [--checkpoint-epoch E]
//                        [--threads T] [--checkpoint FILE]
// On CUDA the parameters and gradients live in device memory (cuMemAlloc); gradients are
// computed on the host and copied over before every step.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "luminav/cuda_driver.h"
#include "luminav/luminav.hpp"

namespace {

struct Args {
  std::string device = "cpu";
  std::string bundle;
  int epochs = 12;
  int checkpoint_epoch = 6;
  int threads = 0;
  std::string checkpoint = "luminav_logreg.ckpt";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--device") a.device = value();
    else if (k == "--bundle") a.bundle = value();
    else if (k == "--epochs") a.epochs = std::stoi(value());
    else if (k == "--checkpoint-epoch") a.checkpoint_epoch = std::stoi(value());
    else if (k == "--threads") a.threads = std::stoi(value());
    else if (k == "--checkpoint") a.checkpoint = value();
    else throw std::invalid_argument("unknown option " + k + " (see the comment at the top of train_logreg.cpp)");
  }
  if (a.device != "cpu" && a.device != "cuda") throw std::invalid_argument("--device must be cpu or cuda, got " + a.device);
  if (a.device == "cuda" && a.bundle.empty()) throw std::invalid_argument("--device cuda needs --bundle DIR (luminamoon aot build)");
  if (a.checkpoint_epoch <= 0 || a.checkpoint_epoch >= a.epochs)
    throw std::invalid_argument("--checkpoint-epoch must be in [1, epochs), got " + std::to_string(a.checkpoint_epoch));
  return a;
}

constexpr int kFeatures = 32;
constexpr int kSamples = 4096;
constexpr int kBatch = 256;

struct Data {
  std::vector<float> x;  // [kSamples, kFeatures]
  std::vector<float> y;  // 0 or 1
};

Data make_data() {
  std::mt19937 gen(2024);
  std::normal_distribution<float> nd;
  std::vector<float> w_true(kFeatures);
  for (auto& w : w_true) w = nd(gen);
  Data d;
  d.x.resize(static_cast<std::size_t>(kSamples) * kFeatures);
  d.y.resize(kSamples);
  for (int i = 0; i < kSamples; ++i) {
    float z = 0.3f * nd(gen);
    for (int j = 0; j < kFeatures; ++j) {
      const float v = nd(gen);
      d.x[static_cast<std::size_t>(i) * kFeatures + j] = v;
      z += v * w_true[j];
    }
    d.y[i] = z > 0 ? 1.0f : 0.0f;
  }
  return d;
}

// The model's parameters: weights [kFeatures] and bias [1], on the host or the device.
class Storage {
 public:
  Storage(bool cuda, std::size_t n) : cuda_(cuda), n_(n), host_(n, 0.0f) {
    if (cuda_) {
      const auto& api = luminav::cuda_driver();
      luminav::check(api.cuMemAlloc(&dev_, n * sizeof(float)), "cuMemAlloc");
    }
  }
  ~Storage() {
    if (cuda_ && dev_) luminav::cuda_driver().cuMemFree(dev_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  // The address the optimizer sees.
  void* data() { return cuda_ ? reinterpret_cast<void*>(static_cast<std::uintptr_t>(dev_)) : host_.data(); }
  std::vector<float>& host() { return host_; }
  void upload() {
    if (cuda_) luminav::check(luminav::cuda_driver().cuMemcpyHtoD(dev_, host_.data(), n_ * sizeof(float)), "cuMemcpyHtoD");
  }
  void download() {
    if (cuda_) {
      luminav::check(luminav::cuda_driver().cuCtxSynchronize(), "cuCtxSynchronize");
      luminav::check(luminav::cuda_driver().cuMemcpyDtoH(host_.data(), dev_, n_ * sizeof(float)), "cuMemcpyDtoH");
    }
  }

 private:
  bool cuda_;
  std::size_t n_;
  std::vector<float> host_;
  luminav::CUdeviceptr dev_ = 0;
};

struct Trainer {
  bool cuda;
  Storage w, b, gw, gb;
  luminav::Optimizer opt;

  Trainer(const Args& a, std::uint64_t seed)
      : cuda(a.device == "cuda"), w(cuda, kFeatures), b(cuda, 1), gw(cuda, kFeatures), gb(cuda, 1),
        opt(make_options(a, seed)) {
    const auto g = opt.add_group(luminav::Hyperparams()
                                     .with_lr(0.05)
                                     .with_weight_decay(1e-3)
                                     .with_clip(4.0)
                                     .with_state_dtype(LV_DTYPE_BFLOAT16)  // stochastically rounded moments
                                     .with_bound(LV_BOUND_ABS, 10.0));
    opt.add_param(g, luminav::ParamRef(w.data(), LV_DTYPE_FLOAT32, gw.data(), LV_DTYPE_FLOAT32, kFeatures));
    opt.add_param(g, luminav::ParamRef(b.data(), LV_DTYPE_FLOAT32, gb.data(), LV_DTYPE_FLOAT32, 1));
  }
  static luminav::OptimizerOptions make_options(const Args& a, std::uint64_t seed) {
    luminav::OptimizerOptions o;
    o.threads(a.threads).with_seed(seed);
    if (a.device == "cuda") o.cuda(0, a.bundle);
    return o;
  }

  // One epoch of minibatch steps; returns the mean loss over the epoch's batches.
  double epoch(const Data& d) {
    double total = 0;
    int batches = 0;
    for (int start = 0; start < kSamples; start += kBatch) {
      w.download();
      b.download();
      std::vector<float>& W = w.host();
      const float B = b.host()[0];
      std::vector<float>& GW = gw.host();
      float GB = 0;
      std::fill(GW.begin(), GW.end(), 0.0f);
      double loss = 0;
      for (int i = start; i < start + kBatch; ++i) {
        const float* xi = &d.x[static_cast<std::size_t>(i) * kFeatures];
        float z = B;
        for (int j = 0; j < kFeatures; ++j) z += W[j] * xi[j];
        const float p = 1.0f / (1.0f + std::exp(-z));
        loss += -(d.y[i] * std::log(p + 1e-7f) + (1 - d.y[i]) * std::log(1 - p + 1e-7f));
        const float dz = (p - d.y[i]) / kBatch;  // d(mean loss)/dz
        for (int j = 0; j < kFeatures; ++j) GW[j] += dz * xi[j];
        GB += dz;
      }
      gb.host()[0] = GB;
      gw.upload();
      gb.upload();
      opt.step();
      total += loss / kBatch;
      ++batches;
    }
    return total / batches;
  }

  void save(const std::string& path) {
    w.download();
    b.download();
    const std::vector<std::uint8_t> state = opt.export_state();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(w.host().data()), kFeatures * sizeof(float));
    f.write(reinterpret_cast<const char*>(b.host().data()), sizeof(float));
    const std::uint64_t n = state.size();
    f.write(reinterpret_cast<const char*>(&n), sizeof(n));
    f.write(reinterpret_cast<const char*>(state.data()), static_cast<std::streamsize>(n));
    if (!f) throw std::runtime_error("could not write the checkpoint " + path);
  }
  void load(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::uint64_t n = 0;
    f.read(reinterpret_cast<char*>(w.host().data()), kFeatures * sizeof(float));
    f.read(reinterpret_cast<char*>(b.host().data()), sizeof(float));
    f.read(reinterpret_cast<char*>(&n), sizeof(n));
    if (!f || n > (1u << 30)) throw std::runtime_error("checkpoint " + path + " is truncated or corrupt");
    std::vector<std::uint8_t> state(n);
    f.read(reinterpret_cast<char*>(state.data()), static_cast<std::streamsize>(n));
    if (!f) throw std::runtime_error("checkpoint " + path + " is truncated");
    w.upload();
    b.upload();
    opt.import_state(state);
  }
  std::vector<float> params() {
    w.download();
    b.download();
    std::vector<float> out = w.host();
    out.push_back(b.host()[0]);
    return out;
  }
};

double accuracy(const Data& d, const std::vector<float>& p) {
  int right = 0;
  for (int i = 0; i < kSamples; ++i) {
    float z = p[kFeatures];
    for (int j = 0; j < kFeatures; ++j) z += p[j] * d.x[static_cast<std::size_t>(i) * kFeatures + j];
    right += (z > 0) == (d.y[i] > 0.5f);
  }
  return static_cast<double>(right) / kSamples;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.device == "cuda") {
      const auto& api = luminav::cuda_driver();
      luminav::CUdevice dev = 0;
      luminav::CUcontext ctx = nullptr;
      luminav::check(api.cuDeviceGet(&dev, 0), "cuDeviceGet");
      luminav::check(api.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      luminav::check(api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    }
    const Data data = make_data();
    std::printf("logistic regression, %d samples x %d features, device %s\n", kSamples, kFeatures, a.device.c_str());

    std::vector<float> uninterrupted;
    {
      Trainer t(a, 42);
      for (int e = 1; e <= a.epochs; ++e) {
        const double loss = t.epoch(data);
        std::printf("epoch %2d  loss %.6f\n", e, loss);
        if (e == a.checkpoint_epoch) {
          t.save(a.checkpoint);
          std::printf("          checkpoint written to %s\n", a.checkpoint.c_str());
        }
      }
      uninterrupted = t.params();
      std::printf("accuracy after %d epochs: %.4f\n", a.epochs, accuracy(data, uninterrupted));
    }

    Trainer resumed(a, /*seed: replaced by the checkpoint's*/ 7);
    resumed.load(a.checkpoint);
    std::printf("resumed from %s at epoch %d (seed %llu)\n", a.checkpoint.c_str(), a.checkpoint_epoch,
                static_cast<unsigned long long>(resumed.opt.seed()));
    for (int e = a.checkpoint_epoch + 1; e <= a.epochs; ++e) std::printf("epoch %2d  loss %.6f (resumed)\n", e, resumed.epoch(data));
    const std::vector<float> after = resumed.params();
    const bool same = std::memcmp(after.data(), uninterrupted.data(), after.size() * sizeof(float)) == 0;
    std::printf("resumed run %s the uninterrupted run bitwise\n", same ? "EQUALS" : "DIFFERS FROM");
    std::remove(a.checkpoint.c_str());
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "luminav_train_logreg: %s\n", e.what());
    return 2;
  }
}
