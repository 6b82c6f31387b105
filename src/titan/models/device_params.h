// A model's flat fp32 parameters in the memory of its device, with the host copy that
// models/model.h promises off the CPU: param_data() reads (host()) fetch the device's values when
// they changed since the last fetch; writes (host_writable()) are sent before the device's next
// use (sync_device(), which every pass calls first); an optimizer on the device updates data()
// after for_device_update(), and the host copy is fetched again at its next read. On the CPU
// (host memory) there is one buffer and every call returns it.
#pragma once
#include <cstdint>

#include "titan/core/buffer.h"

namespace titan::models {

class DeviceParams {
 public:
  // n zeroed parameters in mem's memory (and their host copy when it is a device's).
  void resize(int64_t n, const DeviceMemory& mem) {
    dev_.resize(n, mem);
    if (!mem.host()) host_.resize(n);
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
      dev_.memory().copy(host_.data(), dev_.data(), bytes());
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
    dev_.memory().copy(dev_.data(), host_.data(), bytes());
    device_stale_ = false;
  }
  float* for_device_update() {
    sync_device();
    host_stale_ = on_device();
    return dev_.data();
  }

 private:
  size_t bytes() const { return sizeof(float) * static_cast<size_t>(dev_.size()); }
  Buffer<float> dev_;
  mutable Buffer<float> host_;
  mutable bool host_stale_ = false;  // the device's values changed since the host copy was made
  bool device_stale_ = false;        // the host copy was written since it was sent
};

}  // namespace titan::models
