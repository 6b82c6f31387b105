// Built with -mavx512f (CMakeLists.txt); called only on CPUs with AVX-512F (xxh3.cpp).
#define XXH3_VARIANT avx512
#include "titan/checkpoint/xxh3_variant.inc"
