// Owned memory for tensors. Storage is the untyped owner: nbytes bytes in host memory or, made
// with a DeviceMemory (core/device.h), in a device's, 64-byte aligned, zero-initialized, the
// allocation padded to a multiple of 64 bytes.
// Buffer<T> is a typed float/int buffer over one Storage; Arena is a bump allocator over one.
// Allocated once at build time; the training step only takes views into buffers that already
// exist.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "titan/core/device.h"

namespace titan {

// A failed allocation of tensor memory (Storage, a backend's alloc): a std::bad_alloc that says
// how many bytes were asked, so that the error line can name the size.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(size_t bytes) : bytes_(bytes) {}
  size_t bytes() const { return bytes_; }
  const char* what() const noexcept override { return "titan::OutOfMemory"; }

 private:
  size_t bytes_;
};
// The memory plan's total for this process's run (noted by the plan's check before anything is
// allocated), for the message of an allocation that fails anyway; 0 when no plan was made.
void note_planned_bytes(int64_t bytes);
int64_t planned_bytes();

// Zeroes x[0:n) and gives the whole memory pages inside it back to the OS (madvise
// MADV_DONTNEED: they read as zeros and take memory again only when written); the partial pages
// at either end are zeroed in place. How FSDP reshards a unit's parameters and gradients.
void zero_and_release(void* p, size_t bytes);
inline void zero_and_release(float* x, int64_t n) {
  if (n > 0) zero_and_release(static_cast<void*>(x), static_cast<size_t>(n) * sizeof(float));
}

class Storage;
// The same for bytes [p, p+bytes) of s, wherever s lives: host memory as above; a reserved range
// of a device's (Storage::reserve) decommitted (zeroed, whole granules given back); other device
// memory zeroed.
void zero_and_release(const Storage& s, void* p, size_t bytes);
// Memory behind bytes [p, p+bytes) of s again before they are written: a reserved range of a
// device's commits its granules (zeroed where they had none, so what zero_and_release gave back
// reads zero); host pages are faulted in, zeroed where given back, in one call
// (MADV_POPULATE_WRITE) rather than one fault per page as they are written; other device memory:
// nothing to do.
void commit(const Storage& s, void* p, size_t bytes);

class Storage {
 public:
  Storage() = default;
  explicit Storage(size_t nbytes, const DeviceMemory& mem = {}) : mem_(mem) { resize(nbytes); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  Storage(Storage&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)),
        nbytes_(std::exchange(o.nbytes_, 0)),
        mapped_(std::exchange(o.mapped_, 0)),
        reserved_(std::exchange(o.reserved_, false)),
        mem_(o.mem_) {}
  Storage& operator=(Storage&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(nbytes_, o.nbytes_);
    std::swap(mapped_, o.mapped_);
    std::swap(reserved_, o.reserved_);
    std::swap(mem_, o.mem_);
    return *this;
  }
  ~Storage() { release(); }

  // Reallocates to nbytes zeroed bytes (old contents dropped; freed before the new allocation).
  // The allocation is padded to a multiple of 64 bytes, the padding zeroed too. From kMapBytes
  // on it is a fresh anonymous mapping, whose zero pages take memory only once written (FSDP's
  // gradients and unit buffers stay unresident until used), with transparent huge pages
  // requested (MADV_HUGEPAGE: a unit gathered again faults in 2 MiB pages, not 4 KiB ones).
  // Device memory comes from its alloc and is zeroed with its memset. Throws std::bad_alloc on
  // failure, leaving the storage empty.
  void resize(size_t nbytes);
  // The same, moving the storage to mem's memory first (dropping the old allocation).
  void resize(size_t nbytes, const DeviceMemory& mem) {
    release();
    mem_ = mem;
    resize(nbytes);
  }
  // The same, but on a device with reserve (core/device.h) only the address range (throwing what
  // the device's reserve throws when there is none left): nothing is behind it until commit()
  // (above) puts memory behind a part before it is written; what is committed stays until
  // zero_and_release gives it back (FSDP's flat buffers on a GPU). On the host (whose large
  // allocations take memory only once written anyway) and on devices without reserve:
  // resize(nbytes, mem).
  void reserve(size_t nbytes, const DeviceMemory& mem);
  static constexpr size_t kMapBytes = size_t{1} << 20;
  // Zeroes the first nbytes() bytes (not the padding); a reserved range is given back whole.
  void zero() {
    if (!nbytes_) return;
    if (reserved_)
      mem_.decommit(p_, nbytes_);
    else if (mem_.host())
      std::memset(p_, 0, nbytes_);
    else
      mem_.memset(p_, 0, nbytes_);
  }
  void* data() { return p_; }
  const void* data() const { return p_; }
  size_t nbytes() const { return nbytes_; }
  // Where the bytes live: host memory unless made with a device's.
  const DeviceMemory& memory() const { return mem_; }
  // Made by reserve() on a device that has it: memory only where committed.
  bool reserved() const { return reserved_; }

 private:
  void release();
  void* p_ = nullptr;
  size_t nbytes_ = 0;
  size_t mapped_ = 0;      // bytes mapped with mmap (0: aligned_alloc or a device's alloc)
  bool reserved_ = false;  // from mem_.reserve
  DeviceMemory mem_;       // host memory when its functions are null
};

// n elements of T in one Storage. T is a trivially copyable element type (float, int32_t, ...).
template <typename T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  Buffer() = default;
  explicit Buffer(int64_t n) { resize(n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept = default;
  Buffer& operator=(Buffer&& o) noexcept = default;  // swaps, as Storage does

  // Reallocates to n zeroed elements (old contents dropped).
  void resize(int64_t n) { s_.resize(static_cast<size_t>(n) * sizeof(T)); }
  void resize(int64_t n, const DeviceMemory& mem) {
    s_.resize(static_cast<size_t>(n) * sizeof(T), mem);
  }
  void reserve(int64_t n, const DeviceMemory& mem) {
    s_.reserve(static_cast<size_t>(n) * sizeof(T), mem);
  }
  void zero() { s_.zero(); }
  T* data() { return static_cast<T*>(s_.data()); }
  const T* data() const { return static_cast<const T*>(s_.data()); }
  int64_t size() const { return static_cast<int64_t>(s_.nbytes() / sizeof(T)); }
  T& operator[](int64_t i) { return data()[i]; }
  const T& operator[](int64_t i) const { return data()[i]; }
  const Storage& storage() const { return s_; }
  const DeviceMemory& memory() const { return s_.memory(); }

 private:
  Storage s_;
};

// Bump allocator over one Storage: carve views at build time, reset per phase. Every take starts
// 64-byte aligned (16 floats); a take past the reserved size throws std::bad_alloc.
class Arena {
 public:
  void reserve(int64_t floats) { buf_.resize(static_cast<size_t>(floats) * sizeof(float)); }
  void reserve_bytes(int64_t bytes) { buf_.resize(static_cast<size_t>(bytes)); }
  void reserve_bytes(int64_t bytes, const DeviceMemory& mem) {
    buf_.resize(static_cast<size_t>(bytes), mem);
  }
  // n elements of T, the size rounded up to a multiple of 64 bytes.
  template <typename T>
  T* take_as(int64_t n) {
    static_assert(64 % sizeof(T) == 0, "an element must tile the 64-byte alignment");
    constexpr int64_t per = 64 / static_cast<int64_t>(sizeof(T));
    constexpr int64_t size = static_cast<int64_t>(sizeof(T));
    const int64_t aligned = (n + per - 1) / per * per;
    if (aligned > (static_cast<int64_t>(buf_.nbytes()) - used_) / size) throw std::bad_alloc();
    T* p = reinterpret_cast<T*>(static_cast<uint8_t*>(buf_.data()) + used_);
    used_ += aligned * size;
    return p;
  }
  float* take(int64_t n) { return take_as<float>(n); }
  // In floats, as reserve() counts.
  int64_t used() const { return used_ / static_cast<int64_t>(sizeof(float)); }
  int64_t used_bytes() const { return used_; }
  void reset() { used_ = 0; }
  const DeviceMemory& memory() const { return buf_.memory(); }

 private:
  Storage buf_;
  int64_t used_ = 0;  // bytes
};

}  // namespace titan
