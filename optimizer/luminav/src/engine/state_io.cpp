// src/engine/state_io.cpp: an Engine's state as bytes (format LVSTATE1: seed, skipped count, per
// parameter its step, moments and p_init), exported and imported with every field checked
//
// A parameter of q8 moments (state dtype 3) stores its uint8 codes as the moments, then its block
// row's length (int64) and the float32 block scales of m and of v.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu_quant.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"

namespace luminav {

namespace {
constexpr char kStateMagic[8] = {'L', 'V', 'S', 'T', 'A', 'T', 'E', '1'};
constexpr std::uint32_t kStateFormatVersion = 1;

struct Writer {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(const T& v) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), b, b + sizeof(T));
  }
  std::uint8_t* grow(std::size_t n) {
    out.resize(out.size() + n);
    return out.data() + out.size() - n;
  }
};

struct Reader {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  void need(std::size_t n, const char* what) {
    if (size - pos < n) {
      throw Error(Status::kInvalidArgument, std::string("optimizer state is truncated: ") + what + " needs " +
                                                std::to_string(n) + " bytes at offset " + std::to_string(pos) +
                                                ", the buffer has " + std::to_string(size) + " in all");
    }
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  const std::uint8_t* bytes(std::size_t n, const char* what) {
    need(n, what);
    const std::uint8_t* p = data + pos;
    pos += n;
    return p;
  }
};

// Bytes of each moment's q8 scales (0 unless q8).
std::size_t scale_bytes(std::int64_t numel, std::int64_t row_len) {
  return static_cast<std::size_t>(cpu::quant::num_blocks(numel, row_len)) * sizeof(float);
}
}  // namespace

std::vector<std::uint8_t> Engine::export_state() const {
  const Impl& s = *impl_;
  Writer w;
  w.out.insert(w.out.end(), kStateMagic, kStateMagic + 8);
  w.put(kStateFormatVersion);
  w.put(s.seed);
  w.put(s.device->skipped());
  w.put(static_cast<std::uint64_t>(s.groups.size()));
  w.put(static_cast<std::uint64_t>(s.params.size()));
  std::vector<std::int64_t> steps(s.params.size(), 0);
  if (!steps.empty()) s.device->to_host(steps.data(), s.steps, steps.size() * sizeof(std::int64_t));
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    const Impl::Param& p = s.params[k];
    const DType sd = s.groups[p.group].hyper.state_dtype;
    w.put(static_cast<std::uint64_t>(p.group));
    w.put(p.desc.numel);
    w.put(static_cast<std::int32_t>(p.desc.dtype));
    w.put(static_cast<std::int32_t>(sd));
    const std::int32_t has_p0 = (p.p0 && p.p0_ready) ? 1 : 0;
    w.put(has_p0);
    w.put(steps[k]);
    const std::size_t sb = static_cast<std::size_t>(p.desc.numel) * dtype_size(sd);
    const std::size_t pb = static_cast<std::size_t>(p.desc.numel) * dtype_size(p.desc.dtype);
    if (sb) {
      s.device->to_host(w.grow(sb), p.m, sb);
      s.device->to_host(w.grow(sb), p.v, sb);
    }
    if (sd == DType::kQ8) {
      w.put(p.row_len);
      const std::size_t qb = scale_bytes(p.desc.numel, p.row_len);
      if (qb) {
        s.device->to_host(w.grow(qb), p.sm, qb);
        s.device->to_host(w.grow(qb), p.sv, qb);
      }
    }
    if (has_p0 && pb) s.device->to_host(w.grow(pb), p.p0, pb);
  }
  return w.out;
}

void Engine::import_state(const std::uint8_t* data, std::size_t size) {
  Impl& s = *impl_;
  if (!data) throw Error(Status::kInvalidArgument, "optimizer state buffer is null");
  Reader r{data, size};
  const std::uint8_t* magic = r.bytes(8, "the magic");
  if (std::memcmp(magic, kStateMagic, 8) != 0) {
    throw Error(Status::kInvalidArgument, "not a luminav optimizer state: the first 8 bytes are not \"LVSTATE1\"");
  }
  const auto version = r.get<std::uint32_t>("format_version");
  if (version != kStateFormatVersion) {
    throw Error(Status::kInvalidArgument, "optimizer state format_version " + std::to_string(version) +
                                              " is not supported; this library reads version " +
                                              std::to_string(kStateFormatVersion));
  }
  const auto seed = r.get<std::uint64_t>("seed");
  const auto skipped = r.get<std::int64_t>("skipped");
  const auto ngroups = r.get<std::uint64_t>("group count");
  const auto nparams = r.get<std::uint64_t>("parameter count");
  if (ngroups != s.groups.size() || nparams != s.params.size()) {
    throw Error(Status::kInvalidArgument, "optimizer state holds " + std::to_string(ngroups) + " groups and " +
                                              std::to_string(nparams) + " parameters, this optimizer has " +
                                              std::to_string(s.groups.size()) + " and " +
                                              std::to_string(s.params.size()) +
                                              "; add the same groups and parameters before importing");
  }
  if (skipped < 0) throw Error(Status::kInvalidArgument, "optimizer state has a negative skipped count " + std::to_string(skipped));
  struct Entry {
    std::int64_t step;
    const std::uint8_t *m, *v, *p0, *sm, *sv;
  };
  std::vector<Entry> entries(s.params.size());
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    const Impl::Param& p = s.params[k];
    const std::string who = "parameter " + std::to_string(k);
    const auto group = r.get<std::uint64_t>("group");
    const auto numel = r.get<std::int64_t>("numel");
    const auto pd = r.get<std::int32_t>("param dtype");
    const auto sd = r.get<std::int32_t>("state dtype");
    const auto has_p0 = r.get<std::int32_t>("p_init flag");
    const auto step = r.get<std::int64_t>("step");
    const DType want_sd = s.groups[p.group].hyper.state_dtype;
    if (group != p.group || numel != p.desc.numel || pd != static_cast<int>(p.desc.dtype) ||
        sd != static_cast<int>(want_sd)) {
      throw Error(Status::kInvalidArgument,
                  "optimizer state does not fit " + who + ": the state has group " + std::to_string(group) + ", numel " +
                      std::to_string(numel) + ", param dtype " + std::to_string(pd) + ", state dtype " +
                      std::to_string(sd) + "; the optimizer has group " + std::to_string(p.group) + ", numel " +
                      std::to_string(p.desc.numel) + ", param dtype " + std::to_string(static_cast<int>(p.desc.dtype)) +
                      ", state dtype " + std::to_string(static_cast<int>(want_sd)));
    }
    if (step < 0) throw Error(Status::kInvalidArgument, who + " has a negative step " + std::to_string(step) + " in the state");
    if (has_p0 != 0 && has_p0 != 1) throw Error(Status::kInvalidArgument, who + ": bad p_init flag " + std::to_string(has_p0));
    if (has_p0 && !p.p0) {
      throw Error(Status::kInvalidArgument, who + ": the state has p_init but the param group's bound_mode is none");
    }
    if (p.p0 && !has_p0 && step > 0 && p.desc.numel > 0) {
      throw Error(Status::kInvalidArgument, who + " is bounded and has taken " + std::to_string(step) +
                                                " steps, but the state has no p_init for it");
    }
    const std::size_t sb = static_cast<std::size_t>(numel) * dtype_size(want_sd);
    const std::size_t pb = static_cast<std::size_t>(numel) * dtype_size(p.desc.dtype);
    Entry e{step, nullptr, nullptr, nullptr, nullptr, nullptr};
    if (sb) {
      e.m = r.bytes(sb, "exp_avg");
      e.v = r.bytes(sb, "exp_avg_sq");
    }
    if (want_sd == DType::kQ8) {
      const auto row_len = r.get<std::int64_t>("q8 row_len");
      if (row_len != p.row_len) {
        throw Error(Status::kInvalidArgument, "optimizer state does not fit " + who + ": its q8 blocks are rows of " +
                                                  std::to_string(row_len) + " elements, the optimizer's of " +
                                                  std::to_string(p.row_len) + "; add the parameter with the same row_len");
      }
      const std::size_t qb = scale_bytes(numel, row_len);
      if (qb) {
        e.sm = r.bytes(qb, "exp_avg_scale");
        e.sv = r.bytes(qb, "exp_avg_sq_scale");
      }
    }
    if (has_p0 && pb) e.p0 = r.bytes(pb, "p_init");
    entries[k] = e;
  }
  if (r.pos != size) {
    throw Error(Status::kInvalidArgument, "optimizer state has " + std::to_string(size - r.pos) +
                                              " trailing bytes after the last parameter");
  }
  // Everything checked: now apply.
  std::vector<std::int64_t> steps(s.params.size());
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    Impl::Param& p = s.params[k];
    const Entry& e = entries[k];
    steps[k] = e.step;
    const std::size_t sb = static_cast<std::size_t>(p.desc.numel) * dtype_size(s.groups[p.group].hyper.state_dtype);
    if (sb) {
      s.device->from_host(p.m, e.m, sb);
      s.device->from_host(p.v, e.v, sb);
    }
    if (e.sm) {
      const std::size_t qb = scale_bytes(p.desc.numel, p.row_len);
      s.device->from_host(p.sm, e.sm, qb);
      s.device->from_host(p.sv, e.sv, qb);
    }
    if (e.p0) s.device->from_host(p.p0, e.p0, static_cast<std::size_t>(p.desc.numel) * dtype_size(p.desc.dtype));
    p.p0_ready = e.p0 != nullptr;
  }
  if (!steps.empty()) s.device->from_host(s.steps, steps.data(), steps.size() * sizeof(std::int64_t));
  s.device->set_skipped(skipped);
  s.seed = seed;
}

}  // namespace luminav
