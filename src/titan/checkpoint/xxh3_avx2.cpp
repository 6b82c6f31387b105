// Built with -mavx2 (CMakeLists.txt); called only on CPUs with AVX2 (xxh3.cpp).
#define XXH3_VARIANT avx2
#include "titan/checkpoint/xxh3_variant.inc"
