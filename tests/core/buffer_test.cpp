// core/buffer.h: Storage alignment, zeroing and padding; Buffer<T> over it; Arena alignment,
// accounting and overflow.
#include "titan/core/buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace titan {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// The allocation is padded to 64 bytes; every byte of it, padding included, starts zero.
bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != 0) return false;
  return true;
}

TEST(Storage, EmptyByDefault) {
  Storage s;
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(s.nbytes(), 0u);
  EXPECT_TRUE(s.memory().host());
  s.zero();
  s.resize(0);
  EXPECT_EQ(s.data(), nullptr);
}

TEST(Storage, AlignedZeroedPadded) {
  for (size_t n : {1, 63, 64, 65, 100, 4096, 100001}) {
    Storage s(n);
    EXPECT_EQ(s.nbytes(), n);
    EXPECT_TRUE(aligned64(s.data())) << n;
    EXPECT_TRUE(all_zero(s.data(), (n + 63) / 64 * 64)) << n;
  }
}

TEST(Storage, ResizeAndZero) {
  Storage s(100);
  auto* b = static_cast<uint8_t*>(s.data());
  for (int i = 0; i < 100; ++i) b[i] = 0xAB;
  s.zero();
  EXPECT_TRUE(all_zero(s.data(), 100));
  for (int i = 0; i < 100; ++i) b[i] = 0xAB;
  s.resize(200);
  EXPECT_EQ(s.nbytes(), 200u);
  EXPECT_TRUE(aligned64(s.data()));
  EXPECT_TRUE(all_zero(s.data(), 256));
}

TEST(Storage, MoveLeavesSourceEmpty) {
  Storage a(10);
  void* p = a.data();
  Storage b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.nbytes(), 10u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.nbytes(), 0u);
  Storage c(20);
  void* q = c.data();
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), q);  // swapped, freed with b
}

TEST(Storage, AllocationFailureThrowsBadAlloc) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on an impossible allocation";
#else
  Storage s(16);
  EXPECT_THROW(s.resize(size_t{1} << 62), std::bad_alloc);
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(s.nbytes(), 0u);
#endif
}

TEST(Buffer, TypedView) {
  Buffer<float> f(5);
  EXPECT_EQ(f.size(), 5);
  EXPECT_EQ(f.storage().nbytes(), 5 * sizeof(float));
  EXPECT_TRUE(f.memory().host());
  EXPECT_TRUE(aligned64(f.data()));
  EXPECT_TRUE(all_zero(f.data(), 64));
  for (int64_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i + 1);
  EXPECT_EQ(f.data()[4], 5.0f);
  f.zero();
  for (int64_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], 0.0f);
  f[0] = 1.0f;
  f.resize(3);
  EXPECT_EQ(f.size(), 3);
  EXPECT_EQ(f[0], 0.0f);

  Buffer<int32_t> i32(17);
  EXPECT_EQ(i32.size(), 17);
  EXPECT_TRUE(all_zero(i32.data(), 128));
  Buffer<uint8_t> u8(1);
  EXPECT_EQ(u8.size(), 1);
  EXPECT_TRUE(aligned64(u8.data()));
  EXPECT_TRUE(all_zero(u8.data(), 64));

  Buffer<float> empty;
  EXPECT_EQ(empty.size(), 0);
  EXPECT_EQ(empty.data(), nullptr);
  empty.zero();
}

TEST(Buffer, MoveSwaps) {
  Buffer<float> a(4), b(8);
  a[0] = 1.0f;
  b[0] = 2.0f;
  a = std::move(b);
  EXPECT_EQ(a.size(), 8);
  EXPECT_EQ(a[0], 2.0f);
  EXPECT_EQ(b.size(), 4);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b[0], 1.0f);
  Buffer<float> c(std::move(a));
  EXPECT_EQ(c.size(), 8);
  EXPECT_EQ(a.size(), 0);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.data(), nullptr);
}

TEST(Arena, TakesAre64ByteAligned) {
  Arena a;
  a.reserve(100);
  EXPECT_TRUE(a.memory().host());
  float* p0 = a.take(1);
  EXPECT_TRUE(aligned64(p0));
  EXPECT_TRUE(all_zero(p0, 100 * sizeof(float)));
  EXPECT_EQ(a.used(), 16);
  float* p1 = a.take(17);
  EXPECT_EQ(p1, p0 + 16);
  EXPECT_EQ(a.used(), 48);
  EXPECT_EQ(a.used_bytes(), 48 * 4);
  float* p2 = a.take(0);
  EXPECT_EQ(p2, p0 + 48);
  EXPECT_EQ(a.used(), 48);
  float* p3 = a.take(48);  // exactly up to 96 of 100
  EXPECT_EQ(p3, p0 + 48);
  EXPECT_EQ(a.used(), 96);
  EXPECT_THROW(a.take(1), std::bad_alloc);  // would need 112
  EXPECT_EQ(a.used(), 96);
  a.reset();
  EXPECT_EQ(a.used(), 0);
  EXPECT_EQ(a.take(100 - 4), p0);  // 96 floats
  a.reset();
  EXPECT_THROW(a.take(97), std::bad_alloc);  // rounds to 112 > 100
  EXPECT_EQ(a.take(96), p0);
}

TEST(Arena, ExactFitAndUnreserved) {
  Arena a;
  EXPECT_EQ(a.take(0), nullptr);
  EXPECT_THROW(a.take(1), std::bad_alloc);
  a.reserve(32);
  float* p = a.take(16);
  EXPECT_EQ(a.take(16), p + 16);
  EXPECT_EQ(a.used(), 32);
  EXPECT_THROW(a.take(1), std::bad_alloc);
}

TEST(Arena, TypedTakes) {
  Arena a;
  a.reserve(64);                     // 256 bytes
  auto* h = a.take_as<uint16_t>(1);  // 64 bytes
  EXPECT_TRUE(aligned64(h));
  EXPECT_EQ(a.used_bytes(), 64);
  EXPECT_EQ(a.used(), 16);
  auto* d = a.take_as<double>(9);  // 72 -> 128 bytes
  EXPECT_EQ(reinterpret_cast<uint8_t*>(d), reinterpret_cast<uint8_t*>(h) + 64);
  EXPECT_EQ(a.used_bytes(), 192);
  auto* i = a.take_as<int32_t>(16);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(i), reinterpret_cast<uint8_t*>(h) + 192);
  EXPECT_EQ(a.used(), 64);
  EXPECT_THROW(a.take_as<uint8_t>(1), std::bad_alloc);
}

// A stand-in device: host memory through counting functions, so the tests see which memory a
// Storage uses and that it gives it back.
struct FakeDevice {
  static inline int allocs = 0, frees = 0, memsets = 0;
  static void* alloc(size_t n) {
    ++allocs;
    return std::aligned_alloc(64, n);
  }
  static void free(void* p) {
    ++frees;
    std::free(p);
  }
  static void copy(void* d, const void* s, size_t n) { std::memcpy(d, s, n); }
  static void memset(void* d, int v, size_t n) {
    ++memsets;
    std::memset(d, v, n);
  }
  static DeviceMemory memory() { return {&alloc, &free, &copy, &memset}; }
};

TEST(Storage, DeviceMemoryAllocatesZeroesAndFreesThroughTheDevice) {
  FakeDevice::allocs = FakeDevice::frees = FakeDevice::memsets = 0;
  {
    Buffer<float> b;
    b.resize(3 << 20, FakeDevice::memory());  // past kMapBytes: still the device's, not mmap
    EXPECT_FALSE(b.memory().host());
    EXPECT_EQ(FakeDevice::allocs, 1);
    EXPECT_EQ(FakeDevice::memsets, 1);  // zero-initialized by the device
    EXPECT_EQ(b[(3 << 20) - 1], 0.0f);
    b[5] = 2.0f;
    b.zero();
    EXPECT_EQ(FakeDevice::memsets, 2);
    EXPECT_EQ(b[5], 0.0f);
    b.resize(16);  // stays on the device
    EXPECT_EQ(FakeDevice::allocs, 2);
    EXPECT_EQ(FakeDevice::frees, 1);
    Buffer<float> moved = std::move(b);
    EXPECT_FALSE(moved.memory().host());
    Arena a;
    a.reserve_bytes(256, FakeDevice::memory());
    EXPECT_FALSE(a.memory().host());
    EXPECT_EQ(FakeDevice::allocs, 3);
  }
  EXPECT_EQ(FakeDevice::frees, 3);
  Buffer<float> h(4);
  EXPECT_TRUE(h.memory().host());
}

// A device with reserve/commit/decommit (core/device.h): reserve() takes only the address range,
// commit() and zero_and_release() pass each range to the device, zero() gives the whole range
// back; a device without them, and the host, allocate as resize() does.
struct FakeReservingDevice {
  static inline int reserves = 0, frees = 0;
  static inline std::vector<std::pair<size_t, size_t>> commits, decommits;  // (offset, bytes)
  static inline uintptr_t base = 0;
  static void* reserve(size_t n) {
    ++reserves;
    void* p = std::aligned_alloc(64, n);
    base = reinterpret_cast<uintptr_t>(p);
    return p;
  }
  static void free(void* p) {
    ++frees;
    std::free(p);
  }
  static void commit(void* p, size_t n) { commits.emplace_back(off(p), n); }
  static void decommit(void* p, size_t n) { decommits.emplace_back(off(p), n); }
  static size_t off(void* p) { return reinterpret_cast<uintptr_t>(p) - base; }
  static DeviceMemory memory() {
    DeviceMemory m = FakeDevice::memory();
    m.free = &free;
    m.reserve = &reserve;
    m.commit = &commit;
    m.decommit = &decommit;
    return m;
  }
};

TEST(Storage, ReserveTakesAddressesOnlyAndPassesRangesToTheDevice) {
  using D = FakeReservingDevice;
  FakeDevice::allocs = FakeDevice::memsets = 0;
  {
    Buffer<float> b;
    b.reserve(1000, D::memory());
    EXPECT_TRUE(b.storage().reserved());
    EXPECT_EQ(D::reserves, 1);
    EXPECT_EQ(FakeDevice::allocs + FakeDevice::memsets, 0);  // nothing allocated or written
    commit(b.storage(), b.data() + 10, 40);
    zero_and_release(b.storage(), b.data() + 10, 40);
    b.zero();
    using R = std::vector<std::pair<size_t, size_t>>;
    EXPECT_EQ(D::commits, (R{{40, 40}}));
    EXPECT_EQ(D::decommits, (R{{40, 40}, {0, 4000}}));
  }
  EXPECT_EQ(D::frees, 1);
  // A device without reserve, and the host: whole allocations; commit does nothing,
  // zero_and_release zeroes.
  Buffer<float> d, h;
  d.reserve(8, FakeDevice::memory());
  h.reserve(8, {});
  EXPECT_FALSE(d.storage().reserved());
  EXPECT_FALSE(h.storage().reserved());
  EXPECT_EQ(FakeDevice::allocs, 1);
  EXPECT_TRUE(h.memory().host());
  d[3] = h[3] = 1.0f;
  commit(d.storage(), d.data(), 32);
  commit(h.storage(), h.data(), 32);
  zero_and_release(d.storage(), d.data() + 3, 4);
  zero_and_release(h.storage(), h.data() + 3, 4);
  EXPECT_EQ(d[3], 0.0f);
  EXPECT_EQ(h[3], 0.0f);
  EXPECT_EQ(D::commits.size(), 1u);
}

}  // namespace
}  // namespace titan
