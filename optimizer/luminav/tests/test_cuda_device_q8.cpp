// tests/test_cuda_device_q8.cpp: q8 moments on the engine's CUDA path, on the fake device
// (fakes/fake_cuda_device.h): the q8 variants (S_DTYPE 3) loaded and launched, the table's q8
// columns (the scales' addresses, ROW_LEN), programs of whole q8 blocks, the fresh state's zero
// codes, and a bundle without q8 variants refused by name before anything is enqueued
#include <gtest/gtest.h>

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/group_launch.h"
#include "fakes/expect_error.h"
#include "fakes/fake_cuda_device.h"
#include "luminav/error.h"

using luminav::CUdeviceptr;
using luminav::DType;
using luminav::Engine;
using luminav::GroupConfig;
using luminav::Hyper;
using luminav::ParamDesc;
using luminav::Status;
using namespace luminav_test;

namespace {

Hyper q8_hyper() {
  Hyper h = clip_skip();
  h.state_dtype = DType::kQ8;
  return h;
}

struct Q8Params {
  std::list<std::vector<float>> p, g;
  // (numel, row_len): one row of 5000 (20 blocks), 17 rows of 257 (2 blocks a row, the second of
  // one element), 4 rows of 1024 (4 blocks a row)
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{5000, 0}, {17 * 257, 257}, {4096, 1024}};
  void add(Engine& e) {
    const std::size_t g = e.add_group(q8_hyper());
    for (const auto& [n, k] : shapes) {
      p.emplace_back(static_cast<std::size_t>(n), 0.25f);
      this->g.emplace_back(static_cast<std::size_t>(n), 0.5f);
      ParamDesc d;
      d.numel = n;
      d.row_len = k;
      d.data = p.back().data();
      d.grad = this->g.back().data();
      e.add_param(g, d);
    }
  }
};

TEST_F(CudaDeviceTest, AQ8GroupLaunchesItsVariantsWithTheQ8ColumnsAndProgramsOfWholeBlocks) {
  const GroupConfig cfg = config(q8_hyper());
  const luminav::gpu::VariantKeys keys = luminav::gpu::variant_keys(cfg);
  EXPECT_NE(keys.pass1.find(".g0s3."), std::string::npos) << keys.pass1;
  EXPECT_NE(keys.pass2.find(".p0g0s3."), std::string::npos) << keys.pass2;
  write_bundle({cfg});
  auto e = engine();
  Q8Params q;
  q.add(*e);
  e->step(nullptr);
  ASSERT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  const Launch& pass2 = dev().launches[2];
  // programs: ceil(R * ceil(K / 256) / 4) per tensor: 20 -> 5, 34 -> 9, 16 -> 4
  EXPECT_EQ(dev().launches[0].grid, 5u + 9u + 4u);
  EXPECT_EQ(pass2.grid, 5u + 9u + 4u);
  constexpr std::size_t kCols = luminav::gpu::kTableCols;
  const std::vector<std::int64_t> t = table(pass2, 3);
  const std::int64_t row_lens[3] = {5000, 257, 1024};
  const std::int64_t blocks[3] = {20, 34, 16};
  std::int64_t start = 0;
  for (std::size_t j = 0; j < 3; ++j) {
    const std::int64_t* row = &t[j * kCols];
    EXPECT_EQ(row[luminav::gpu::kColRowLen], row_lens[j]) << j;
    EXPECT_EQ(row[luminav::gpu::kColBlockStart], start) << j;
    start += (blocks[j] + 3) / 4;
    ASSERT_NE(row[luminav::gpu::kColExpAvgScale], 0) << j;
    ASSERT_NE(row[luminav::gpu::kColExpAvgSqScale], 0) << j;
    EXPECT_NE(row[luminav::gpu::kColExpAvgScale], row[luminav::gpu::kColExpAvgSqScale]) << j;
    // the engine's fresh q8 state: m at its zero code 128, v at 0, every scale 0
    const auto numel = static_cast<std::size_t>(row[luminav::gpu::kColNumel]);
    const auto* m = static_cast<const std::uint8_t*>(fake_mem::at(static_cast<CUdeviceptr>(row[luminav::gpu::kColExpAvg])));
    const auto* v = static_cast<const std::uint8_t*>(fake_mem::at(static_cast<CUdeviceptr>(row[luminav::gpu::kColExpAvgSq])));
    const auto* sm = static_cast<const float*>(fake_mem::at(static_cast<CUdeviceptr>(row[luminav::gpu::kColExpAvgScale])));
    for (std::size_t i = 0; i < numel; ++i) {
      ASSERT_EQ(m[i], 128) << j << " " << i;
      ASSERT_EQ(v[i], 0) << j << " " << i;
    }
    for (std::int64_t b = 0; b < blocks[j]; ++b) ASSERT_EQ(sm[b], 0.0f) << j << " " << b;
  }
}

TEST_F(CudaDeviceTest, ABundleWithoutQ8VariantsIsRefusedByNameBeforeAnythingIsEnqueued) {
  write_bundle({config(clip_skip())});  // float32 moments only
  auto e = engine();
  Q8Params q;
  q.add(*e);
  const std::vector<float> before = q.p.front();
  expect_error([&] { e->step(nullptr); }, Status::kNotFound,
               {"variant " + luminav::gpu::variant_keys(config(q8_hyper())).pass1, "is not in bundle",
                "--dtypes fp32:fp32:q8"});
  EXPECT_TRUE(dev().launches.empty());
  EXPECT_EQ(q.p.front(), before);
  EXPECT_EQ(e->param_step(0), 0);
}

}  // namespace
