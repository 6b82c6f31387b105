// Element types of stored tensors and the fp32 <-> F16/BF16 conversions. The names are the
// safetensors header spelling ("BF16"); dtype_op_name gives the torch spelling ("bfloat16") used
// by the op registry and the config.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace titan {

enum class DType {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  F8_E4M3,
  F8_E5M2
};

// Bytes per element, and the safetensors spelling ("BF16", ...).
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
// The inverse of dtype_name. Throws titan::Error for a string that is not one of the above.
DType parse_dtype(const std::string& s);
// As parse_dtype, but returns false (leaving *out alone) instead of throwing.
bool try_parse_dtype(const std::string& s, DType* out);
// Every dtype_name, comma separated, for error messages.
std::string dtype_name_list();
// The torch spelling: "float32", "bfloat16", "float16", "int64", "float8_e4m3fn", ...
const char* dtype_op_name(DType dt);

// fp32 -> storage, dt in {F32, F16, BF16}: BF16 and F16 round to nearest even; NaN stays NaN
// (quiet, sign kept); F16 handles subnormals and overflows to inf. dst need not be aligned.
void f32_to(DType dt, const float* src, int64_t n, void* dst);
// storage -> fp32, dt in {F32, F16, BF16, F64} (F64 rounds to nearest). src need not be aligned.
void to_f32(DType dt, const void* src, int64_t n, float* dst);
// x rounded to bf16 (nearest even, as f32_to) and back to fp32.
float round_to_bf16(float x);

}  // namespace titan
