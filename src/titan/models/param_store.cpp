#include "titan/models/param_store.h"

#include <algorithm>

#include "titan/core/dtype.h"
#include "titan/ops/backend.h"

namespace titan::models {

ParamStore::ParamStore(Layout layout, Options o, const ops::Backend& be)
    : lay_(std::move(layout)), o_(o), be_(be) {
  stale_.assign(lay_.units.size(), 1);
}

void ParamStore::allocate() {
  const DeviceMemory mem = be_.memory();
  // Sharded: on a device with reserve, the flat buffers are address ranges whose units take
  // memory only while gathered (core/buffer.h Storage::reserve; the host's take it when written).
  auto flat = [&](auto& buf, int64_t n) { o_.sharded ? buf.reserve(n, mem) : buf.resize(n, mem); };
  params_.resize(lay_.n, mem, o_.sharded);
  if (o_.trainable) flat(grads_, lay_.n);
  if (o_.compute_copy) flat(copy_, lay_.n - lay_.copy_base);
}

float* ParamStore::device_param_data() {
  if (!params_.on_device()) return param_data();
  mark_stale();  // the compute copy is remade after the update
  return params_.for_device_update();
}

void ParamStore::acquire(int64_t u, bool backward) {
  if (hooks_) hooks_->acquire(u, backward);
  const auto i = static_cast<size_t>(u);
  if (o_.compute_copy && stale_[i] &&
      !masters_released_) {  // the unit's compute copy, remade after its weights changed
    const int64_t lo = std::max(lay_.units[i].begin, lay_.copy_base), hi = lay_.units[i].end;
    if (lo < hi) {
      uint16_t* copy = copy_.data() + (lo - lay_.copy_base);
      commit(copy_.storage(), copy, 2 * static_cast<size_t>(hi - lo));
      be_.to_bf16(params_.data() + lo, hi - lo, copy);
    }
  }
  stale_[i] = 0;
}

void ParamStore::release(int64_t u, bool backward) {
  if (!hooks_ || !hooks_->release(u, backward)) return;
  // Resharded: the unit's compute copy goes too, remade at its next use.
  const auto i = static_cast<size_t>(u);
  const int64_t lo = std::max(lay_.units[i].begin, lay_.copy_base), hi = lay_.units[i].end;
  if (o_.compute_copy && lo < hi)
    zero_and_release(copy_.storage(), copy_.data() + (lo - lay_.copy_base),
                     2 * static_cast<size_t>(hi - lo));
  stale_[i] = 1;
}

void ParamStore::give_back(Flat which, int64_t begin, int64_t len) {
  if (which == Flat::params)
    params_.give_back(begin, len);
  else if (o_.trainable && len > 0)
    zero_and_release(grads_.storage(), grads_.data() + begin,
                     sizeof(float) * static_cast<size_t>(len));
}

void ParamStore::hold(Flat which, int64_t begin, int64_t len) {
  if (which == Flat::params)
    params_.hold(begin, len);
  else if (o_.trainable && len > 0)
    commit(grads_.storage(), grads_.data() + begin, sizeof(float) * static_cast<size_t>(len));
}

int64_t ParamStore::master_bytes() const {
  int64_t n = lay_.n;
  for (const auto& r : lay_.copy_only) n -= r.len;  // given back under a frozen bf16 model
  return 4 * n;
}

void ParamStore::release_masters() {
  if (!o_.compute_copy || o_.trainable || masters_released_ || params_.on_device()) return;
  for (size_t u = 0; u < lay_.units.size(); ++u) {  // unit by unit: fp32 and copy never both whole
    acquire(static_cast<int64_t>(u), false);
    for (const auto& r : lay_.copy_only)
      if (r.begin >= lay_.units[u].begin && r.begin < lay_.units[u].end)
        zero_and_release(params_.data() + r.begin, r.len);
  }
  masters_released_ = true;
}

void ParamStore::restore_masters() {
  if (!masters_released_) return;
  for (const auto& r : lay_.copy_only)
    to_f32(DType::BF16, copy_.data() + (r.begin - lay_.copy_base), r.len, params_.data() + r.begin);
  masters_released_ = false;
}

}  // namespace titan::models
