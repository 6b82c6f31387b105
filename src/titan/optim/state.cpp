#include "titan/optim/state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "titan/core/error.h"
#include "titan/optim/adamw_math.h"

namespace titan::optim {

AdamWState::AdamWState(DType dtype, int64_t n, const DeviceMemory& mem,
                       const std::vector<int64_t>& starts)
    : dtype_(dtype), n_(n) {
  check(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::I8,
        std::string("AdamW moments are stored in float32, bfloat16 or int8, not ") +
            dtype_op_name(dtype));
  const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
  m_.resize(bytes, mem);
  v_.resize(bytes, mem);
  if (dtype != DType::I8) return;
  // Blocks of kQ8Block from each start (and from 0), cut at the next start.
  std::vector<int64_t> cuts{0};
  for (const int64_t s : starts) {
    check(s >= cuts.back() && s <= n, "AdamWState: parameter starts must ascend within [0, n)");
    if (s > cuts.back() && s < n) cuts.push_back(s);
  }
  cuts.push_back(n);
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    for (int64_t b = cuts[i]; b < cuts[i + 1]; b += kQ8Block) host_begin_.push_back(b);
  host_begin_.push_back(n);
  const auto nb = static_cast<int64_t>(host_begin_.size()) - 1;
  absmax_m_.resize(nb, mem);
  absmax_v_.resize(nb, mem);
  begin_.resize(nb + 1, mem);
  const size_t bytes_begin = host_begin_.size() * sizeof(int64_t);
  if (mem.host())
    std::memcpy(begin_.data(), host_begin_.data(), bytes_begin);
  else
    mem.copy(begin_.data(), host_begin_.data(), bytes_begin);
}

std::pair<int64_t, int64_t> AdamWState::blocks_of(int64_t at, int64_t len) const {
  check(at >= 0 && len >= 0 && at + len <= n_, "AdamWState: range out of bounds");
  const auto find = [&](int64_t i) {
    const auto it = std::lower_bound(host_begin_.begin(), host_begin_.end(), i);
    check(it != host_begin_.end() && *it == i,
          "AdamWState: element " + std::to_string(i) +
              " is inside an 8-bit block; ranges of the int8 state start at parameters");
    return static_cast<int64_t>(it - host_begin_.begin());
  };
  return {find(at), find(at + len)};
}

// Off the host, the range's codes and scales go through host copies.
void AdamWState::decode(bool first, int64_t at, int64_t len, float* out) const {
  check(dtype_ == DType::I8, "AdamWState::decode: the state is not int8");
  const auto [b0, b1] = blocks_of(at, len);
  const DeviceMemory& mem = memory();
  const uint8_t* q = (first ? m_ : v_).data() + at;
  const float* scale = (first ? absmax_m_ : absmax_v_).data() + b0;
  std::vector<uint8_t> hq;
  std::vector<float> hs;
  if (!mem.host()) {
    hq.resize(static_cast<size_t>(len));
    hs.resize(static_cast<size_t>(b1 - b0));
    mem.copy(hq.data(), q, hq.size());
    mem.copy(hs.data(), scale, hs.size() * sizeof(float));
    q = hq.data();
    scale = hs.data();
  }
  const float* map = q8_map(first);
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t i = host_begin_[b]; i < host_begin_[b + 1]; ++i) {
      const uint8_t c = q[i - at];
      out[i - at] = c == 0 && first ? -scale[b - b0] : map[c] * scale[b - b0];
    }
}

void AdamWState::encode(bool first, int64_t at, int64_t len, const float* in) {
  check(dtype_ == DType::I8, "AdamWState::encode: the state is not int8");
  const auto [b0, b1] = blocks_of(at, len);
  const DeviceMemory& mem = memory();
  uint8_t* q = (first ? m_ : v_).data() + at;
  float* scale = (first ? absmax_m_ : absmax_v_).data() + b0;
  std::vector<uint8_t> hq(mem.host() ? 0 : static_cast<size_t>(len));
  std::vector<float> hs(mem.host() ? 0 : static_cast<size_t>(b1 - b0));
  uint8_t* wq = mem.host() ? q : hq.data();
  float* ws = mem.host() ? scale : hs.data();
  const float* map = q8_map(first);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = host_begin_[b] - at, n = host_begin_[b + 1] - host_begin_[b];
    float top = 0;
    for (int64_t i = 0; i < n; ++i) top = std::max(top, std::fabs(in[i0 + i]));
    ws[b - b0] = top;
    q8_encode_block(in + i0, n, top, map, wq + i0);
  }
  if (!mem.host()) {
    mem.copy(q, hq.data(), hq.size());
    mem.copy(scale, hs.data(), hs.size() * sizeof(float));
  }
}

void AdamWState::step_range(const Kernels& k, float* p, const float* g, int64_t begin, int64_t len,
                            const AdamWConfig& c, float lr, int64_t step, uint64_t key) {
  check(begin >= 0 && len >= 0 && begin + len <= n_, "AdamWState::step_range out of range");
  p += begin;
  g += begin;
  if (dtype_ == DType::F32) {
    k.adamw_step(p, g, static_cast<float*>(m()) + begin, static_cast<float*>(v()) + begin, len, c,
                 lr, step);
    return;
  }
  check_kernels_for(k, dtype_);
  if (dtype_ == DType::I8) {
    const auto [b0, b1] = blocks_of(begin, len);
    k.adamw_step_q8(p - begin, g - begin, static_cast<uint8_t*>(m()), static_cast<uint8_t*>(v()),
                    absmax_m_.data() + b0, absmax_v_.data() + b0, begin_.data() + b0, b1 - b0, c,
                    lr, step);
    return;
  }
  // The rounding bits of element i hash key + i·φ (optim/adamw_math.h sr_bits): shifting the key
  // by begin·φ gives the range the bits its elements have in the whole array.
  k.adamw_step_bf16(p, g, static_cast<uint16_t*>(m()) + begin, static_cast<uint16_t*>(v()) + begin,
                    len, c, lr, step, key + static_cast<uint64_t>(begin) * kGoldenGamma);
}

void check_kernels_for(const Kernels& k, DType dtype) {
  check(dtype != DType::I8 || k.adamw_step_q8 != nullptr,
        "optimizer.state_dtype int8: device " + k.device +
            " has no AdamW kernel for 8-bit moments; use optimizer.state_dtype bfloat16");
  check(dtype != DType::BF16 || k.adamw_step_bf16 != nullptr,
        "optimizer.state_dtype bfloat16: device " + k.device +
            " has no AdamW kernel for bfloat16 moments; use optimizer.state_dtype float32");
}

DType state_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "int8") return DType::I8;
  throw Error("optimizer.state_dtype '" + name + "' must be float32, bfloat16 or int8");
}

}  // namespace titan::optim
