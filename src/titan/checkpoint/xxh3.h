// XXH3-64 (xxHash, the header of Debian's libxxhash-dev in its inline mode) with the widest
// vector code the CPU runs: AVX2 where available (xxh3_avx2.cpp, built with -mavx2), else SSE2
// (xxh3_sse2.cpp). The packaged shared library is built for the generic x86-64 baseline and
// hashes about 4x slower than the AVX2 code, which would make checksum verification a
// noticeable part of a checkpoint load. Both give the same hashes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace titan::ckpt::xxh3 {

uint64_t hash(const void* data, size_t n);

// Streaming: the hash of the concatenated updates.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void reset();
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;
};

// hash(data, n), calling visit(ctx, offset, length) on consecutive pieces of about `piece` bytes
// (multiples of XXH3's 1 KiB block; the last one the rest) each right after it was hashed, while
// its bytes are still in the L1/L2 cache: a reader that copies the pieces out reads memory once.
uint64_t hash_visit(const void* data, size_t n, size_t piece, void (*visit)(void*, size_t, size_t),
                    void* ctx);

// "avx512", "avx2" or "sse2": the code in use (what the CPU has).
const char* variant();

// For tests: every build this CPU can run (the one in use first), and hash_visit through one.
std::vector<const char*> runnable_variants();
uint64_t hash_visit_as(const char* variant, const void* data, size_t n, size_t piece,
                       void (*visit)(void*, size_t, size_t), void* ctx);

}  // namespace titan::ckpt::xxh3
