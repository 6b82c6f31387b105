#define XXH3_VARIANT sse2
#include "titan/checkpoint/xxh3_variant.inc"
