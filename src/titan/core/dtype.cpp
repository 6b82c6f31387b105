// DType names and sizes, and the fp32 <-> F16/BF16 conversions. The table, the scalar
// conversions and f32_to / to_f32 moved here from checkpoint/safetensors.cpp unchanged; the torch
// spellings (dtype_op_name) and round_to_bf16 are additions.
#include "titan/core/dtype.h"

#include <cstring>

#include "titan/core/error.h"
#include "titan/core/stochastic_round.h"

namespace titan {
namespace {

struct DTypeInfo {
  DType dt;
  const char* name;
  size_t size;
  const char* op_name;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1, "bool"},
    {DType::U8, "U8", 1, "uint8"},
    {DType::I8, "I8", 1, "int8"},
    {DType::I16, "I16", 2, "int16"},
    {DType::U16, "U16", 2, "uint16"},
    {DType::F16, "F16", 2, "float16"},
    {DType::BF16, "BF16", 2, "bfloat16"},
    {DType::I32, "I32", 4, "int32"},
    {DType::U32, "U32", 4, "uint32"},
    {DType::F32, "F32", 4, "float32"},
    {DType::F64, "F64", 8, "float64"},
    {DType::I64, "I64", 8, "int64"},
    {DType::U64, "U64", 8, "uint64"},
    {DType::F8_E4M3, "F8_E4M3", 1, "float8_e4m3fn"},
    {DType::F8_E5M2, "F8_E5M2", 1, "float8_e5m2"},
};

const DTypeInfo& info(DType dt) {
  for (const auto& d : kDTypes)
    if (d.dt == dt) return d;
  throw Error("safetensors: invalid DType value " + std::to_string(static_cast<int>(dt)));
}

// ---- Scalar conversions.

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  // NaN: truncation could clear every mantissa bit and make it inf; keep the sign and the top of
  // the payload and set the quiet bit.
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7FFFu + ((x >> 16) & 1u);  // round to nearest, ties to even; carries into the exponent
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u)  // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  // 65520 is halfway between 65504 (max half, odd mantissa) and 65536: ties to even -> inf.
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (ax < 0x38800000u) {  // below 2^-14: a half subnormal, in units of 2^-24
    const uint32_t e = ax >> 23;
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value = m * 2^(e-150) = (m >> shift) * 2^-24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t v = ax - 0x38000000u;  // rebias the exponent 127 -> 15
  v += 0xFFFu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t x;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    std::memcpy(&x, &v, 4);
    x |= sign;
  } else if (e == 31) {
    x = sign | 0x7F800000u | (m << 13);
  } else {
    x = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace

bool try_parse_dtype(const std::string& s, DType* out) {
  for (const auto& d : kDTypes) {
    if (s == d.name) {
      *out = d.dt;
      return true;
    }
  }
  return false;
}

std::string dtype_name_list() {
  std::string r;
  for (const auto& d : kDTypes) r += (r.empty() ? "" : ", ") + std::string(d.name);
  return r;
}

size_t dtype_size(DType dt) { return info(dt).size; }
const char* dtype_name(DType dt) { return info(dt).name; }
const char* dtype_op_name(DType dt) { return info(dt).op_name; }

DType parse_dtype(const std::string& s) {
  DType dt = DType::U8;
  check(try_parse_dtype(s, &dt),
        "unknown safetensors dtype '" + s + "' (expected one of " + dtype_name_list() + ")");
  return dt;
}

// ---- Conversions

void f32_to(DType dt, const float* src, int64_t n, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  switch (dt) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case DType::F16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    default:
      throw Error(std::string("f32_to: cannot convert fp32 to ") + dtype_name(dt) +
                  " (F32, F16 or BF16 only)");
  }
}

void to_f32(DType dt, const void* src, int64_t n, float* dst) {
  const auto* in = static_cast<const uint8_t*>(src);
  switch (dt) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(in + 2 * i));
      return;
    case DType::F16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(in + 2 * i));
      return;
    case DType::F64:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, in + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    default:
      throw Error(std::string("to_f32: cannot convert ") + dtype_name(dt) +
                  " to fp32 (F32, F16, BF16 or F64 only)");
  }
}

float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

void round_bf16_stochastic(const float* x, int64_t n, uint64_t key, int64_t first, uint16_t* out) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = bf16_stochastic(x[i], sr_bits(key, static_cast<uint64_t>(first + i)));
}

}  // namespace titan
