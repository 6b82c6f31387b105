// An owned, 64-byte aligned, zero-initialized float/int buffer. Allocated once at build time;
// the training step only takes views into buffers that already exist.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace titan {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t n) { resize(n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~Buffer() { std::free(p_); }

  // Reallocates to n zeroed elements (old contents dropped).
  void resize(int64_t n) {
    std::free(p_);
    p_ = nullptr;
    n_ = n;
    if (n == 0) return;
    size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
    p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
    std::memset(static_cast<void*>(p_), 0, bytes);
  }
  void zero() {
    if (n_) std::memset(static_cast<void*>(p_), 0, static_cast<size_t>(n_) * sizeof(T));
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }
  T& operator[](int64_t i) { return p_[i]; }
  const T& operator[](int64_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// Bump allocator over one Buffer: carve views at build time, reset per phase.
class Arena {
 public:
  void reserve(int64_t floats) { buf_.resize(floats); }
  float* take(int64_t n) {
    int64_t aligned = (n + 15) / 16 * 16;
    if (used_ + aligned > buf_.size()) throw std::bad_alloc();
    float* p = buf_.data() + used_;
    used_ += aligned;
    return p;
  }
  int64_t used() const { return used_; }
  void reset() { used_ = 0; }

 private:
  Buffer<float> buf_;
  int64_t used_ = 0;
};

}  // namespace titan
