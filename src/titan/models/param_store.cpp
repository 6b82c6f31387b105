#include "titan/models/param_store.h"

#include <algorithm>

#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/stochastic_round.h"
#include "titan/ops/backend.h"

namespace titan::models {

ParamStore::ParamStore(Layout layout, Options o, const ops::Backend& be)
    : lay_(std::move(layout)), o_(o), be_(be) {
  stale_.assign(lay_.units.size(), 1);
  check(!o_.bf16_masters || (o_.compute_copy && o_.trainable),
        "bf16 master weights need a trainable model with a bf16 compute copy");
}

template <typename Fn>
void ParamStore::for_copy_only(int64_t lo, int64_t hi, Fn&& fn) const {
  for (const auto& r : lay_.copy_only) {
    const int64_t b = std::max(lo, r.begin), e = std::min(hi, r.begin + r.len);
    if (b < e) fn(b, e - b);
  }
}

const float* ParamStore::param_data() const {
  check(!masters_released_,
        "the fp32 master weights are given back (bf16 masters); widen them first");
  return params_.host();
}

bool ParamStore::weights_in_place(int64_t begin, int64_t n) const {
  bool released = false;
  if (masters_released_)
    for_copy_only(begin, begin + n, [&](int64_t, int64_t) { released = true; });
  return !released;
}

void ParamStore::read_weights(int64_t begin, int64_t n, float* dst) const {
  const float* host = params_.host();
  int64_t at = begin;  // copied up to here
  if (masters_released_)
    for_copy_only(begin, begin + n, [&](int64_t b, int64_t len) {
      std::copy(host + at, host + b, dst + (at - begin));
      to_f32(DType::BF16, copy_.data() + (b - lay_.copy_base), len, dst + (b - begin));
      at = b + len;
    });
  std::copy(host + at, host + begin + n, dst + (at - begin));
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
  remake_copy(static_cast<size_t>(u));
}

void ParamStore::remake_copy(size_t i) {
  if (o_.compute_copy && stale_[i]) {  // the unit's compute copy, remade after its weights changed
    const int64_t lo = std::max(lay_.units[i].begin, lay_.copy_base), hi = lay_.units[i].end;
    auto remake = [&](int64_t b, int64_t len) {
      uint16_t* copy = copy_.data() + (b - lay_.copy_base);
      commit(copy_.storage(), copy, 2 * static_cast<size_t>(len));
      be_.to_bf16(params_.data() + b, len, copy);
    };
    if (lo < hi && !masters_released_) {
      remake(lo, hi - lo);
    } else if (lo < hi) {  // the copy-only ranges' copy is their master: the gaps between them
      int64_t at = lo;
      for_copy_only(lo, hi, [&](int64_t b, int64_t len) {
        if (at < b) remake(at, b - at);
        at = b + len;
      });
      if (at < hi) remake(at, hi - at);
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

float* ParamStore::update_begin(int64_t u) {
  if (!masters_released_) return unit_param_data(u);
  const ParamUnit& r = lay_.units[static_cast<size_t>(u)];
  float* p = params_.data();
  for_copy_only(r.begin, r.end, [&](int64_t b, int64_t len) {
    to_f32(DType::BF16, copy_.data() + (b - lay_.copy_base), len, p + b);
  });
  stale_[static_cast<size_t>(u)] = 1;  // the rest of its copy is remade from the fp32 masters
  return p;
}

void ParamStore::update_end(int64_t u, uint64_t key) {
  if (!masters_released_) return;
  const ParamUnit& r = lay_.units[static_cast<size_t>(u)];
  float* p = params_.data();
  for_copy_only(r.begin, r.end, [&](int64_t b, int64_t len) {
    round_bf16_stochastic(p + b, len, key, b, copy_.data() + (b - lay_.copy_base));
    zero_and_release(p + b, len);
  });
}

int64_t ParamStore::largest_widened_unit() const {
  int64_t most = 0;
  for (const auto& u : lay_.units) {
    int64_t n = 0;
    for_copy_only(u.begin, u.end, [&](int64_t, int64_t len) { n += len; });
    most = std::max(most, n);
  }
  return most;
}

void ParamStore::release_masters() {
  if (!o_.compute_copy || (o_.trainable && !o_.bf16_masters) || masters_released_ ||
      params_.on_device())
    return;
  for (size_t u = 0; u < lay_.units.size(); ++u) {  // unit by unit: fp32 and copy never both whole
    remake_copy(u);
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
