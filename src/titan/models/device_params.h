// A model's flat fp32 parameters in the memory of its device, with the host copy that
// models/model.h promises off the CPU: param_data() reads (host()) fetch the device's values when
// they changed since the last fetch; writes (host_writable()) are sent before the device's next
// use (sync_device(), which every pass calls first); an optimizer on the device updates data()
// after for_device_update(), and the host copy is fetched again at its next read. On the CPU
// (host memory) there is one buffer and every call returns it.
//
// Sharded (FSDP, resize(.., sharded = true) on a device with reserve, core/device.h): the device's
// buffer is an address range with memory only behind the ranges held (hold(): a unit being
// gathered or computed); outside them both copies read zero (give_back() zeroes both and gives
// the memory back), so fetches and sends move the held ranges only.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "titan/core/buffer.h"

namespace titan::models {

class DeviceParams {
 public:
  // n zeroed parameters in mem's memory (and their host copy when it is a device's).
  void resize(int64_t n, const DeviceMemory& mem, bool sharded = false) {
    if (sharded)
      dev_.reserve(n, mem);
    else
      dev_.resize(n, mem);
    if (!mem.host()) host_.resize(n);
    held_.clear();
    host_stale_ = device_stale_ = false;
  }
  // Where the kernels read them (no synchronization).
  float* data() { return dev_.data(); }
  const float* data() const { return dev_.data(); }
  int64_t size() const { return dev_.size(); }
  bool on_device() const { return !dev_.memory().host(); }

  const float* host() const {
    if (!on_device()) return dev_.data();
    if (host_stale_) {
      move([this](int64_t b, int64_t n) { copy(host_.data() + b, dev_.data() + b, n); });
      host_stale_ = false;
    }
    return host_.data();
  }
  float* host_writable() {
    float* p = const_cast<float*>(host());
    device_stale_ = on_device();
    return p;
  }
  void sync_device() {
    if (!device_stale_) return;
    move([this](int64_t b, int64_t n) { copy(dev_.data() + b, host_.data() + b, n); });
    device_stale_ = false;
  }
  float* for_device_update() {
    sync_device();
    host_stale_ = on_device();
    return dev_.data();
  }

  // [begin, begin + len) is not needed until held again: zeroed in both copies, their memory
  // given back (the host's whole pages, a reserved device range's whole granules).
  void give_back(int64_t begin, int64_t len) {
    if (len <= 0) return;
    const size_t bytes = sizeof(float) * static_cast<size_t>(len);
    zero_and_release(dev_.storage(), dev_.data() + begin, bytes);
    if (on_device()) zero_and_release(host_.data() + begin, len);
    drop(begin);
  }
  // Off the CPU, on a sharded buffer: [begin, begin + len) fetched into the host copy, which keeps
  // it until give_back(), and the device's memory behind it given back (a read of the whole
  // weights on the host, gathered a unit at a time). Elsewhere nothing (the device keeps it).
  void give_back_device(int64_t begin, int64_t len) {
    if (len <= 0 || !dev_.storage().reserved()) return;
    copy(host_.data() + begin, dev_.data() + begin, len);
    zero_and_release(dev_.storage(), dev_.data() + begin, sizeof(float) * static_cast<size_t>(len));
    drop(begin);
  }
  // Memory behind [begin, begin + len) again (reading zero where it was given back) before it is
  // written; on a sharded device buffer, a range fetches and sends move from now on.
  void hold(int64_t begin, int64_t len) {
    if (len <= 0 || !dev_.storage().reserved()) return;
    commit(dev_.storage(), dev_.data() + begin, sizeof(float) * static_cast<size_t>(len));
    for (const auto& h : held_)
      if (h.first == begin) return;
    held_.emplace_back(begin, len);
  }

 private:
  void drop(int64_t begin) {
    for (size_t i = 0; i < held_.size(); ++i)
      if (held_[i].first == begin) {
        held_[i] = held_.back();
        held_.pop_back();
        return;
      }
  }
  void copy(float* dst, const float* src, int64_t n) const {
    dev_.memory().copy(dst, src, sizeof(float) * static_cast<size_t>(n));
  }
  // fn(begin, len) over what the two copies may differ in: everything, or the held ranges.
  template <typename Fn>
  void move(Fn&& fn) const {
    if (!dev_.storage().reserved()) {
      fn(0, dev_.size());
      return;
    }
    for (const auto& [b, n] : held_) fn(b, n);
  }
  Buffer<float> dev_;
  mutable Buffer<float> host_;
  // (begin, len) of a reserved dev_, a few at a time: a vector, so that after the first steps
  // holding and giving back allocate nothing.
  std::vector<std::pair<int64_t, int64_t>> held_;
  mutable bool host_stale_ = false;  // the device's values changed since the host copy was made
  bool device_stale_ = false;        // the host copy was written since it was sent
};

}  // namespace titan::models
