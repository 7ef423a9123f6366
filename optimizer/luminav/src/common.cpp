// dtype helpers and hyperparameter validation shared by the engine, the C API and the bindings.
#include <cmath>
#include <sstream>
#include <string>

#include "engine/engine.h"

namespace luminav {

const char* dtype_name(DType d) noexcept {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

const char* dtype_word(DType d) noexcept {
  switch (d) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "?";
}

std::size_t dtype_size(DType d) noexcept { return d == DType::kFloat32 ? 4 : 2; }

const char* bound_mode_name(BoundMode m) noexcept {
  switch (m) {
    case BoundMode::kNone: return "none";
    case BoundMode::kAbs: return "abs";
    case BoundMode::kRel: return "rel";
  }
  return "?";
}

const char* nonfinite_name(NonFinite n) noexcept {
  switch (n) {
    case NonFinite::kSkip: return "skip";
    case NonFinite::kRaise: return "raise";
    case NonFinite::kPropagate: return "propagate";
  }
  return "?";
}

DType dtype_from_int(int code, const char* what) {
  if (code < 0 || code > 2) {
    throw Error(Status::kInvalidArgument,
                std::string(what) + " must be a dtype code 0 (float32), 1 (bfloat16) or 2 (float16), got " +
                    std::to_string(code));
  }
  return static_cast<DType>(code);
}

BoundMode bound_mode_from_int(int code) {
  if (code < 0 || code > 2) {
    throw Error(Status::kInvalidArgument,
                "bound_mode must be 0 (none), 1 (abs) or 2 (rel), got " + std::to_string(code));
  }
  return static_cast<BoundMode>(code);
}

NonFinite nonfinite_from_int(int code) {
  if (code < 0 || code > 2) {
    throw Error(Status::kInvalidArgument,
                "nonfinite must be 0 (skip), 1 (raise) or 2 (propagate), got " + std::to_string(code));
  }
  return static_cast<NonFinite>(code);
}

namespace {
std::string num(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::kInvalidArgument, msg); }
}  // namespace

void validate_lr(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) bad("lr must be a finite number >= 0, got " + num(lr));
}

void validate_hyper(const Hyper& h) {
  validate_lr(h.lr);
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0)) bad("beta1 must be in [0, 1), got " + num(h.beta1));
  if (!(h.beta2 >= 0.0 && h.beta2 < 1.0)) bad("beta2 must be in [0, 1), got " + num(h.beta2));
  if (!(h.eps > 0.0) || !std::isfinite(h.eps)) bad("eps must be a finite number > 0, got " + num(h.eps));
  if (!(h.weight_decay >= 0.0) || !std::isfinite(h.weight_decay))
    bad("weight_decay must be a finite number >= 0, got " + num(h.weight_decay));
  if (!(h.clip >= 0.0) || !std::isfinite(h.clip))
    bad("clip must be a finite number >= 0 (0 turns clipping off), got " + num(h.clip));
  const int mode = static_cast<int>(h.bound_mode);
  if (mode < 0 || mode > 2) bad("bound_mode must be 0 (none), 1 (abs) or 2 (rel), got " + std::to_string(mode));
  if (h.bound_mode != BoundMode::kNone && (!(h.bound > 0.0) || !std::isfinite(h.bound))) {
    bad(std::string("bound must be a finite number > 0 when bound_mode='") + bound_mode_name(h.bound_mode) +
        "', got " + num(h.bound));
  }
  const int nf = static_cast<int>(h.nonfinite);
  if (nf < 0 || nf > 2) bad("nonfinite must be 0 (skip), 1 (raise) or 2 (propagate), got " + std::to_string(nf));
  if (h.state_dtype != DType::kFloat32 && h.state_dtype != DType::kBFloat16) {
    const int code = static_cast<int>(h.state_dtype);
    bad(std::string("state_dtype must be float32 (0) or bfloat16 (1), got ") +
        (code == 2 ? "float16 (2)" : std::to_string(code)));
  }
}

}  // namespace luminav
