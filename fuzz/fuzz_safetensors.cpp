// Fuzzes the safetensors reader: a file's 8-byte header length, JSON header (dtypes, shapes,
// data_offsets, __metadata__) and data buffer, as SafetensorsFile::open validates them, then
// every tensor read to fp32 as a loader would.
#include <vector>

#include "fuzz_util.h"
#include "titan/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = titan::fuzz::write_input(data, size, "model.safetensors");
  return titan::fuzz::expect_error_or_ok([&] {
    const auto set = titan::ckpt::SafetensorsSet::open(path);
    for (const auto& name : set.names()) {
      const auto* t = set.find(name);
      if (t->numel() > (int64_t{1} << 24)) continue;  // the file holds its bytes: bounded by size
      std::vector<float> out(static_cast<size_t>(t->numel()));
      set.read_f32(name, t->shape, out.data());
    }
  });
}
