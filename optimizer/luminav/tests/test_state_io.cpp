// tests/test_state_io.cpp: an Engine's state as bytes (src/engine/state_io.cpp): a resumed run
// is bitwise the uninterrupted one, and a state that does not fit is refused and changes nothing
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fakes/host_model.h"
#include "luminav/error.h"

using luminav::BoundMode;
using luminav::DType;
using luminav::Hyper;
using namespace luminav_test;

namespace {

class StateIoTest : public ::testing::Test {};

TEST_F(StateIoTest, CheckpointResumeIsBitwiseTheUninterruptedRun) {
  Hyper h;
  h.clip = 2.0;
  h.bound_mode = BoundMode::kAbs;
  h.bound = 0.05;
  h.state_dtype = DType::kBFloat16;
  const std::vector<std::int64_t> sizes = {5, 4096, 777};
  Model full = Model::make(sizes, DType::kBFloat16, 4);
  auto ef = make_engine(full, h, 2, 99);
  for (int step = 0; step < 6; ++step) {
    full.perturb_grads(step);
    ef->step();
  }

  Model part = Model::make(sizes, DType::kBFloat16, 4);
  std::vector<std::uint8_t> ckpt;
  {
    auto e = make_engine(part, h, 2, 99);
    for (int step = 0; step < 3; ++step) {
      part.perturb_grads(step);
      e->step();
    }
    ckpt = e->export_state();
  }
  auto er = make_engine(part, h, 1, /*seed overwritten by the state*/ 5);
  er->import_state(ckpt.data(), ckpt.size());
  EXPECT_EQ(er->seed(), 99u);
  for (int step = 3; step < 6; ++step) {
    part.perturb_grads(step);
    er->step();
  }
  EXPECT_EQ(full.bytes(), part.bytes());
  EXPECT_EQ(ef->export_state(), er->export_state());
}

TEST_F(StateIoTest, ImportRefusesAStateThatDoesNotFitAndChangesNothing) {
  Hyper h;
  Model a = Model::make({10, 20}, DType::kFloat32, 5);
  auto e = make_engine(a, h, 1);
  e->step();
  std::vector<std::uint8_t> state = e->export_state();
  Model b = Model::make({10, 21}, DType::kFloat32, 5);
  auto other = make_engine(b, h, 1);
  const std::vector<std::uint8_t> before = other->export_state();
  try {
    other->import_state(state.data(), state.size());
    FAIL() << "import of a mismatched state succeeded";
  } catch (const luminav::Error& err) {
    EXPECT_EQ(err.status(), luminav::Status::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("numel 20"), std::string::npos) << err.what();
  }
  EXPECT_EQ(other->export_state(), before);
  // Truncated and corrupted buffers.
  EXPECT_THROW(e->import_state(state.data(), state.size() - 3), luminav::Error);
  std::vector<std::uint8_t> bad = state;
  bad[0] = 'X';
  EXPECT_THROW(e->import_state(bad.data(), bad.size()), luminav::Error);
  EXPECT_EQ(e->export_state(), state);
}

}  // namespace
