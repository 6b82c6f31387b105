#include "titan/checkpoint/xxh3.h"

#include <cstdlib>
#include <string_view>

namespace titan::ckpt::xxh3 {

#define TITAN_XXH3_DECLARE(v)                                           \
  namespace v {                                                         \
  uint64_t hash(const void* data, size_t n);                            \
  void* create();                                                       \
  void destroy(void* s);                                                \
  void reset(void* s);                                                  \
  void update(void* s, const void* data, size_t n);                     \
  uint64_t digest(const void* s);                                       \
  uint64_t hash_visit(const void* data, size_t n, size_t piece,         \
                      void (*visit)(void*, size_t, size_t), void* ctx); \
  }
TITAN_XXH3_DECLARE(sse2)
TITAN_XXH3_DECLARE(avx2)
TITAN_XXH3_DECLARE(avx512)
#undef TITAN_XXH3_DECLARE

namespace {

struct Impl {
  const char* name;
  uint64_t (*hash)(const void*, size_t);
  void* (*create)();
  void (*destroy)(void*);
  void (*reset)(void*);
  void (*update)(void*, const void*, size_t);
  uint64_t (*digest)(const void*);
  uint64_t (*hash_visit)(const void*, size_t, size_t, void (*)(void*, size_t, size_t), void*);
};

#define TITAN_XXH3_IMPL(v) \
  Impl { #v, v::hash, v::create, v::destroy, v::reset, v::update, v::digest, v::hash_visit }
// The builds this CPU runs, widest first.
const std::vector<Impl>& runnable_impls() {
  static const std::vector<Impl> r = [] {
    std::vector<Impl> v;
    if (__builtin_cpu_supports("avx512f")) v.push_back(TITAN_XXH3_IMPL(avx512));
    if (__builtin_cpu_supports("avx2")) v.push_back(TITAN_XXH3_IMPL(avx2));
    v.push_back(TITAN_XXH3_IMPL(sse2));
    return v;
  }();
  return r;
}
#undef TITAN_XXH3_IMPL

const Impl& impl() { return runnable_impls().front(); }

}  // namespace

uint64_t hash(const void* data, size_t n) { return impl().hash(data, n); }
const char* variant() { return impl().name; }
uint64_t hash_visit(const void* data, size_t n, size_t piece, void (*visit)(void*, size_t, size_t),
                    void* ctx) {
  return impl().hash_visit(data, n, piece, visit, ctx);
}

std::vector<const char*> runnable_variants() {
  std::vector<const char*> r;
  for (const Impl& i : runnable_impls()) r.push_back(i.name);
  return r;
}

uint64_t hash_visit_as(const char* variant, const void* data, size_t n, size_t piece,
                       void (*visit)(void*, size_t, size_t), void* ctx) {
  for (const Impl& i : runnable_impls())
    if (std::string_view(i.name) == variant) return i.hash_visit(data, n, piece, visit, ctx);
  std::abort();  // a test asked for a build the CPU cannot run
}

Stream::Stream() : state_(impl().create()) { impl().reset(state_); }
Stream::~Stream() { impl().destroy(state_); }
void Stream::reset() { impl().reset(state_); }
void Stream::update(const void* data, size_t n) { impl().update(state_, data, n); }
uint64_t Stream::digest() const { return impl().digest(state_); }

}  // namespace titan::ckpt::xxh3
