// A named set of tensors to read weights from (a safetensors set today): what a model's Hugging
// Face adapter loads through, so that models/ does not depend on the checkpoint format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace titan {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual std::vector<std::string> names() const = 0;  // sorted
  // The tensor's shape, or nullptr when the source has no tensor of that name.
  virtual const std::vector<int64_t>* shape_of(const std::string& name) const = 0;
  // Copies elements [begin, end) of tensor `name` (flattened, row-major) converted to fp32 into
  // dst; throws titan::Error naming the source and the tensor when it is absent, has another
  // shape or a dtype that does not convert, or the range is not within it.
  virtual void read_f32_range(const std::string& name, const std::vector<int64_t>& shape,
                              int64_t begin, int64_t end, float* dst) const = 0;
  // The whole tensor.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    read_f32_range(name, shape, 0, n, dst);
  }
};

}  // namespace titan
