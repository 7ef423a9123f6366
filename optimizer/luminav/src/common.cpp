// src/common.cpp: the enums' names and codes, and hyperparameter validation, shared by the engine,
// the C API and the bindings
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "engine/engine.h"

namespace luminav {

namespace {

// Each enum's names, indexed by its code (the order of kDTypes, kBoundModes, kNonFinites).
constexpr const char* kDTypeNames[] = {"float32", "bfloat16", "float16", "q8"};
constexpr const char* kDTypeWords[] = {"fp32", "bf16", "fp16", "q8"};
// The element dtypes (codes 0-2): kDTypeNames without q8, for dtype_from_int's choices.
constexpr const char* kElementDTypeNames[] = {"float32", "bfloat16", "float16"};
constexpr const char* kBoundModeNames[] = {"none", "abs", "rel"};
constexpr const char* kNonFiniteNames[] = {"skip", "raise", "propagate"};

template <class E, std::size_t N>
const char* name_of(const char* const (&names)[N], E value, const char* unknown) noexcept {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : unknown;
}

// The enum value of `code`, or Error(kInvalidArgument): "<prefix>0 (a), 1 (b) or 2 (c), got <code>".
template <class E, std::size_t N>
E from_int(int code, const char* const (&names)[N], const std::string& prefix) {
  if (code < 0 || code >= static_cast<int>(N)) {
    std::string choices;
    for (std::size_t i = 0; i < N; ++i) {
      choices += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::to_string(i) + " (" + names[i] + ")";
    }
    throw Error(Status::kInvalidArgument, prefix + choices + ", got " + std::to_string(code));
  }
  return static_cast<E>(code);
}

}  // namespace

const char* dtype_name(DType d) noexcept { return name_of(kDTypeNames, d, "unknown"); }
const char* dtype_word(DType d) noexcept { return name_of(kDTypeWords, d, "?"); }
std::size_t dtype_size(DType d) noexcept {
  return d == DType::kFloat32 ? 4 : d == DType::kQ8 ? 1 : 2;
}
const char* bound_mode_name(BoundMode m) noexcept { return name_of(kBoundModeNames, m, "?"); }
const char* nonfinite_name(NonFinite n) noexcept { return name_of(kNonFiniteNames, n, "?"); }

DType dtype_from_int(int code, const char* what) {
  return from_int<DType>(code, kElementDTypeNames, std::string(what) + " must be a dtype code ");
}
DType state_dtype_from_int(int code) {
  if (code == 0 || code == 1 || code == 3) return static_cast<DType>(code);
  throw Error(Status::kInvalidArgument,
              "state_dtype must be float32 (0), bfloat16 (1) or q8 (3: one-byte codes with a float32 "
              "scale a block of 256), got " + (code == 2 ? std::string("float16 (2)") : std::to_string(code)));
}
BoundMode bound_mode_from_int(int code) { return from_int<BoundMode>(code, kBoundModeNames, "bound_mode must be "); }
NonFinite nonfinite_from_int(int code) { return from_int<NonFinite>(code, kNonFiniteNames, "nonfinite must be "); }
NonFinite nonfinite_from_name(const std::string& name) {
  for (NonFinite n : kNonFinites) {
    if (name == nonfinite_name(n)) return n;
  }
  throw Error(Status::kInvalidArgument, "nonfinite must be \"skip\", \"raise\" or \"propagate\", got \"" + name + "\"");
}

namespace {

// The messages that predate the float32 checks print 17 significant digits ("-0.10000000000000001");
// the float32 checks print the shortest text that reads back as the same value, as Python's repr
// does ("0.999999999999", "1e+39"), so that Python's checks can say the same words.
std::string num(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}
std::string shortest(double x) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}
std::string shortest(float x) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(x));
    if (std::strtof(buf, nullptr) == x) break;
  }
  return buf;
}
[[noreturn]] void bad(const std::string& msg) { throw Error(Status::kInvalidArgument, msg); }

// Hyperparameters are rounded to float32 once (docs/internals.md); each is checked as the kernels
// will see it. `x` rounds (to nearest even) to a finite float32 below 2^128 - 2^103; the test
// avoids converting a larger value, which C++ leaves undefined.
bool finite_in_float32(double x) { return std::isfinite(x) && std::fabs(x) < 0x1.ffffffp+127; }

void check_float32(const char* name, double x) {
  if (!finite_in_float32(x)) bad(std::string(name) + " must be finite in float32, got " + shortest(x));
}
// For a value that must stay > 0: one that rounds to 0 would turn it into another setting.
void check_nonzero_float32(const char* name, double x, const char* fix) {
  if (x > 0 && static_cast<float>(x) == 0.0f) {
    bad(std::string(name) + " rounds to 0 in float32 (got " + shortest(x) + "); " + fix);
  }
}
void check_beta_float32(int i, double beta) {
  if (static_cast<float>(beta) >= 1.0f) {
    bad("betas[" + std::to_string(i) + "] rounds to 1.0 in float32 (got " + shortest(beta) + "); use a value <= " +
        shortest(std::nextafter(1.0f, 0.0f)));
  }
}

}  // namespace

void validate_lr(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) bad("lr must be a finite number >= 0, got " + num(lr));
  check_float32("lr", lr);
}

void validate_hyper(const Hyper& h) {
  validate_lr(h.lr);
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0)) bad("beta1 must be in [0, 1), got " + num(h.beta1));
  check_beta_float32(0, h.beta1);
  if (!(h.beta2 >= 0.0 && h.beta2 < 1.0)) bad("beta2 must be in [0, 1), got " + num(h.beta2));
  check_beta_float32(1, h.beta2);
  if (!(h.eps > 0.0) || !std::isfinite(h.eps)) bad("eps must be a finite number > 0, got " + num(h.eps));
  check_float32("eps", h.eps);
  check_nonzero_float32("eps", h.eps, "use eps >= 1e-38");
  if (!(h.weight_decay >= 0.0) || !std::isfinite(h.weight_decay))
    bad("weight_decay must be a finite number >= 0, got " + num(h.weight_decay));
  check_float32("weight_decay", h.weight_decay);
  if (!(h.clip >= 0.0) || !std::isfinite(h.clip))
    bad("clip must be a finite number >= 0 (0 turns clipping off), got " + num(h.clip));
  check_float32("clip", h.clip);
  // A clip that rounds to 0 would run the clipping kernels with tau = 0: every update 0.
  check_nonzero_float32("clip", h.clip, "use clip = 0 to turn clipping off, or clip >= 1e-38");
  (void)bound_mode_from_int(static_cast<int>(h.bound_mode));
  if (h.bound_mode != BoundMode::kNone) {
    if (!(h.bound > 0.0) || !std::isfinite(h.bound)) {
      bad(std::string("bound must be a finite number > 0 when bound_mode='") + bound_mode_name(h.bound_mode) +
          "', got " + num(h.bound));
    }
    check_float32("bound", h.bound);
    check_nonzero_float32("bound", h.bound, "use bound >= 1e-38");
  }
  (void)nonfinite_from_int(static_cast<int>(h.nonfinite));
  (void)state_dtype_from_int(static_cast<int>(h.state_dtype));
}

}  // namespace luminav
