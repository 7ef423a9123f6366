// examples/cpp_torch/train_mlp.cpp: a small libtorch MLP trained with the LuminaMoon engine
// through luminav/torch.hpp (no Python)
//
// Regression of y = sin(x t) + noise on 256 samples of 16 features with a 16-32-1 MLP (ReLU),
// minibatches of 64, autograd for the gradients. Two param groups: the weights (stochastically
// rounded bfloat16 moments, decay, clip, a "rel" bound) and the biases (float32 moments, no decay).
//
//   luminav_train_mlp [--device cpu|cuda] [--bundle DIR] [--steps N] [--seed S]
//                     [--torch-threads T] [--dump DIR]
//
// --device cuda needs --bundle (an AOT bundle: `luminamoon aot default` prints the wheel's).
// --dump DIR writes what tests/test_torch_adapter.py needs to take the same steps in Python:
// meta.json (hyperparameters as the engine holds them, shapes, steps) and raw little-endian
// float32 files: the data (x, y), each parameter before (init_*) and after (final_*), the losses.
// The exit status is 0 when the loss fell to less than half its first value.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "luminav/torch.hpp"

namespace {

struct Args {
  std::string device = "cpu";
  std::string bundle;
  int steps = 60;
  std::uint64_t seed = 1234;
  int torch_threads = 1;
  std::string dump;
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
    else if (k == "--steps") a.steps = std::stoi(value());
    else if (k == "--seed") a.seed = std::stoull(value());
    else if (k == "--torch-threads") a.torch_threads = std::stoi(value());
    else if (k == "--dump") a.dump = value();
    else throw std::invalid_argument("unknown option " + k + " (see the comment at the top of train_mlp.cpp)");
  }
  if (a.device != "cpu" && a.device != "cuda") throw std::invalid_argument("--device must be cpu or cuda, got " + a.device);
  if (a.device == "cuda" && a.bundle.empty())
    throw std::invalid_argument("--device cuda needs --bundle DIR (`luminamoon aot default` prints the wheel's bundle)");
  if (a.steps < 1) throw std::invalid_argument("--steps must be >= 1, got " + std::to_string(a.steps));
  if (a.torch_threads < 1) throw std::invalid_argument("--torch-threads must be >= 1, got " + std::to_string(a.torch_threads));
  return a;
}

constexpr int kSamples = 256, kFeatures = 16, kHidden = 32, kBatch = 64;

void write_f32(const std::string& path, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(c.numel() * sizeof(float)));
  if (!f) throw std::runtime_error("could not write " + path);
}

std::string shape_json(const torch::Tensor& t) {
  std::string s = "[";
  for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string group_json(const char* name, const std::vector<std::string>& params, const luminav::Hyperparams& h) {
  const lv_hyperparams& c = h.c;
  std::string s = std::string("    {\"name\": \"") + name + "\", \"params\": [";
  for (std::size_t i = 0; i < params.size(); ++i) s += (i ? ", \"" : "\"") + params[i] + "\"";
  s += "], \"lr\": " + num(c.lr) + ", \"betas\": [" + num(c.beta1) + ", " + num(c.beta2) + "], \"eps\": " + num(c.eps) +
       ", \"weight_decay\": " + num(c.weight_decay) + ", \"clip\": " + num(c.clip) + ", \"bound_mode\": " +
       std::to_string(c.bound_mode) + ", \"bound\": " + num(c.bound) + ", \"maximize\": " + std::to_string(c.maximize) +
       ", \"nonfinite\": " + std::to_string(c.nonfinite) + ", \"stochastic_rounding\": " +
       std::to_string(c.stochastic_rounding) + ", \"state_dtype\": " + std::to_string(c.state_dtype) + "}";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    torch::set_num_threads(a.torch_threads);
    const torch::Device device = a.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);

    // Data and initial weights from torch's CPU generator, then moved: the same on either device.
    torch::manual_seed(0);
    const torch::Tensor x_cpu = torch::randn({kSamples, kFeatures});
    const torch::Tensor t_true = torch::randn({kFeatures, 1});
    const torch::Tensor y_cpu = torch::sin(x_cpu.matmul(t_true)) + 0.05 * torch::randn({kSamples, 1});
    const std::vector<std::string> names = {"w1", "w2", "b1", "b2"};
    std::vector<torch::Tensor> init = {torch::randn({kHidden, kFeatures}) * 0.25,
                                       torch::randn({1, kHidden}) * (1.0 / std::sqrt(double(kHidden))),
                                       torch::zeros({kHidden}), torch::zeros({1})};
    const torch::Tensor x = x_cpu.to(device), y = y_cpu.to(device);
    std::vector<torch::Tensor> params;
    for (const auto& t : init) params.push_back(t.to(device, /*non_blocking=*/false, /*copy=*/true).requires_grad_());
    torch::Tensor &w1 = params[0], &w2 = params[1], &b1 = params[2], &b2 = params[3];

    const luminav::Hyperparams weights = luminav::Hyperparams()
                                             .with_lr(0.02)
                                             .with_weight_decay(0.01)
                                             .with_clip(4.0)
                                             .with_bound(LV_BOUND_REL, 1.0)
                                             .with_state_dtype(LV_DTYPE_BFLOAT16);  // stochastically rounded
    const luminav::Hyperparams biases = luminav::Hyperparams().with_lr(0.02).with_weight_decay(0.0).with_clip(4.0);
    luminav::OptimizerOptions options = luminav::OptimizerOptions().with_seed(a.seed);
    if (device.is_cuda()) options.cuda(0, a.bundle);
    luminav::TorchOptimizer opt({{{w1, w2}, weights}, {{b1, b2}, biases}}, options);

    std::vector<float> losses;
    for (int step = 0; step < a.steps; ++step) {
      const std::int64_t start = (static_cast<std::int64_t>(step) * kBatch) % kSamples;
      const torch::Tensor xb = x.narrow(0, start, kBatch), yb = y.narrow(0, start, kBatch);
      const torch::Tensor h = torch::relu(torch::nn::functional::linear(xb, w1, b1));
      const torch::Tensor loss = torch::mse_loss(torch::nn::functional::linear(h, w2, b2), yb);
      loss.backward();
      opt.step();
      opt.zero_grad();
      losses.push_back(loss.item<float>());
    }
    std::printf("MLP %d-%d-1 on %s, %d steps: loss %.6f -> %.6f (seed %llu, %lld skipped)\n", kFeatures, kHidden,
                device.str().c_str(), a.steps, losses.front(), losses.back(), static_cast<unsigned long long>(opt.seed()),
                static_cast<long long>(opt.skipped_steps()));

    if (!a.dump.empty()) {
      const std::string d = a.dump + "/";
      write_f32(d + "x.f32", x_cpu);
      write_f32(d + "y.f32", y_cpu);
      write_f32(d + "losses.f32", torch::tensor(losses));
      std::string shapes;
      for (std::size_t i = 0; i < names.size(); ++i) {
        write_f32(d + "init_" + names[i] + ".f32", init[i]);
        write_f32(d + "final_" + names[i] + ".f32", params[i]);
        shapes += std::string(i ? ", " : "") + "\"" + names[i] + "\": " + shape_json(init[i]);
      }
      std::ofstream meta(d + "meta.json");
      meta << "{\n  \"device\": \"" << device.str() << "\", \"steps\": " << a.steps << ", \"batch\": " << kBatch
           << ", \"seed\": " << a.seed << ", \"torch_threads\": " << a.torch_threads << ",\n  \"x\": " << shape_json(x_cpu)
           << ", \"y\": " << shape_json(y_cpu) << ",\n  \"shapes\": {" << shapes << "},\n  \"groups\": [\n"
           << group_json("weights", {"w1", "w2"}, weights) << ",\n"
           << group_json("biases", {"b1", "b2"}, biases) << "\n  ]\n}\n";
      if (!meta) throw std::runtime_error("could not write " + d + "meta.json");
    }
    return losses.back() < 0.5f * losses.front() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "luminav_train_mlp: %s\n", e.what());
    return 2;
  }
}
