// A model's parameters as stored (llm.c's flat params_memory, torchtitan's FSDP parameters and
// mixed-precision policy): the flat fp32 master weights and gradients, the host copy of the
// weights off the CPU, the bf16 compute copy, and the FSDP units' hold and give-back. A model
// lays its parameters out (ParamInfo offsets and groups, models/model.h) and then reads them
// only through this store: weights(), weight_bf16(offset) and grads() between acquire(u) and
// release(u) of the unit it computes with. What shards them (parallel/fsdp.h) sees the store
// and its ParamHooks; the model knows nothing of ranks.
//
// Precision. Without a compute copy the kernels read the fp32 masters. With one (bf16 mixed
// precision) each unit's copy of [copy_base, n) is remade at its first acquire after its
// weights changed (param_data() for writing, unit_param_data, device_param_data); frozen,
// release_masters() gives back the fp32 pages of the ranges read only through the copy.
//
// Pure bf16 (training.dtype bfloat16, Options::bf16_masters): trainable, and release_masters()
// makes the copy the only master of those ranges (2 bytes per parameter instead of 6). An update
// widens one unit's bf16 masters to fp32 (update_begin), updates them with the fp32 kernels and
// rounds them back stochastically (update_end); the other ranges (norms, an untied embedding)
// keep fp32 masters.
//
// Device. Built on a device's memory, the weights live there and param_data() is a host copy
// kept in step (models/device_params.h); the gradients and the compute copy are device memory.
// Sharded, the flat buffers are reserved address ranges with memory only behind held ranges.
#pragma once
#include <cstdint>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/models/device_params.h"

namespace titan::ops {
struct Backend;
}

namespace titan::models {

// FSDP units (torchtitan's fully_shard of each block): the parameters fall into units, each a
// consecutive range of the flat buffers: the token embedding (unit 0), each decoder layer
// (1..L), the head (L+1: final norm and an untied lm_head; a tied lm_head is unit 0's storage).
struct ParamUnit {
  int64_t begin = 0, end = 0;
};
// A range of the flat parameter buffer (ParamInfo offsets): a rank's shard is a list of them
// (FSDP: its block of every unit).
struct FlatRange {
  int64_t begin = 0, len = 0;
};

// What a trainer that shards the parameters (parallel/fsdp.h) learns of their use. The store calls
// these around every use of a unit; without hooks its parameters are always whole. The model
// knows nothing of ranks: the hooks gather and reshard.
class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  // A forward pass begins; a backward of the same microbatch follows it or not (evaluation).
  virtual void begin_pass(bool /*backward_follows*/) {}
  // Unit u's parameters are about to be read, in the forward or (backward = true) in the backward
  // (a recomputation included); they must be whole in unit_param_data() when this returns, and
  // the gradients this pass writes of them held (ParamStore::hold): a layer's from its backward,
  // the first and last units' from the forward when a backward follows.
  virtual void acquire(int64_t u, bool backward) = 0;
  // This pass is done with them (their last use in the forward, or in the backward). Returns
  // whether they were resharded (the model then drops what it derived from them: a compute copy).
  virtual bool release(int64_t u, bool backward) = 0;
  // Unit u's gradients of this microbatch are complete in grad_data(); the hook may take them
  // away, leaving zeros.
  virtual void grads_ready(int64_t u) = 0;
};

class ParamStore {
 public:
  struct Layout {
    int64_t n = 0;                     // flat parameters (unique)
    std::vector<ParamUnit> units;      // consecutive ranges of [0, n): the FSDP units
    int64_t copy_base = 0;             // the compute copy covers [copy_base, n)
    std::vector<FlatRange> copy_only;  // ranges read only through the copy (a frozen model's)
  };
  struct Options {
    bool compute_copy = false;  // keep a bf16 compute copy
    bool trainable = true;      // false: frozen, no gradients
    bool sharded = false;       // reserved ranges held unit by unit (BuildOptions::sharded)
    bool bf16_masters = false;  // trainable, the copy-only ranges' masters in bf16 (pure bf16)
  };
  // The layout and options only (a plan-only model's sizes); allocate() adds the storage in the
  // memory of be (whose to_bf16 makes the compute copy).
  ParamStore(Layout layout, Options o, const ops::Backend& be);
  void allocate();

  int64_t size() const { return lay_.n; }
  const std::vector<ParamUnit>& units() const { return lay_.units; }
  bool trainable() const { return o_.trainable; }
  bool on_device() const { return params_.on_device(); }

  // ---- what the model computes with (no synchronization; sync_device() before a pass)
  const float* weights() const { return params_.data(); }
  const uint16_t* weight_bf16(int64_t offset) const {
    return copy_.data() + (offset - lay_.copy_base);
  }
  // The gradients (null when frozen), and the gradient of the parameter at offset off.
  float* grads() { return o_.trainable ? grads_.data() : nullptr; }
  float* grad_at(int64_t off) { return o_.trainable ? grads_.data() + off : nullptr; }
  void zero_grads() {
    if (o_.trainable) grads_.zero();
  }
  // The host copy's writes sent to the device (every pass first).
  void sync_device() { params_.sync_device(); }

  // ---- a unit's use in a pass (ParamHooks around it; acquire also remakes a stale copy)
  void set_hooks(ParamHooks* h) { hooks_ = h; }
  void begin_pass(bool backward_follows) {
    if (hooks_) hooks_->begin_pass(backward_follows);
  }
  void acquire(int64_t u, bool backward);
  void release(int64_t u, bool backward);
  void grads_ready(int64_t u) {
    if (hooks_) hooks_->grads_ready(u);
  }

  // ---- the masters
  // The writable fp32 masters in host memory (the compute copy is remade before its next use).
  // Off the CPU the weights live in device memory and this is a host copy kept in step with
  // them: reading fetches the device's when they changed, writing sends the host's before the
  // next pass.
  float* param_data() {
    restore_masters();
    mark_stale();
    return params_.host_writable();
  }
  // Reading while the copy-only ranges' fp32 masters are given back (release_masters) throws:
  // widen_masters() first.
  const float* param_data() const;
  // Unit u's writable weights where the kernels read them (what FSDP gathers into; only that
  // unit's compute copy is remade).
  float* unit_param_data(int64_t u) {
    restore_masters();
    stale_[static_cast<size_t>(u)] = 1;
    return params_.on_device() ? params_.for_device_update() : params_.host_writable();
  }
  // The weights where the kernels read them, for an optimizer that updates them there (the host
  // copy is fetched again when next read).
  float* device_param_data();
  // What a sharding hook does with the flat range [begin, begin + len) of the weights or of the
  // gradients between its uses. give_back: zeroed (the host copy too), its memory given back
  // (the host's whole pages; a device's whole granules when sharded). hold: memory behind it
  // again before it is written (gathered into; a pass's gradients), reading zero where it was
  // given back. Without hooks the buffers are whole.
  enum class Flat { params, grads };
  void give_back(Flat which, int64_t begin, int64_t len);
  void hold(Flat which, int64_t begin, int64_t len);
  // Off the CPU, sharded: the weights' range, whole on the device, kept in the host copy until
  // give_back and its device memory given back, so that the host holds the whole weights while
  // the device holds one unit at a time. Nothing elsewhere.
  void give_back_device(int64_t begin, int64_t len) { params_.give_back_device(begin, len); }
  // A frozen model under bf16, or a trainable one with bf16_masters: the copy made unit by unit
  // and the copy-only ranges' fp32 pages given back; param_data() widens them back first.
  void release_masters();
  bool masters_released() const { return masters_released_; }
  // Options::bf16_masters, and the ranges whose masters are then bf16 (sorted, disjoint).
  bool bf16_masters() const { return o_.bf16_masters; }
  const std::vector<FlatRange>& copy_only() const { return lay_.copy_only; }
  // The most copy-only elements in one unit (what update_begin widens at most, bf16_masters).
  int64_t largest_widened_unit() const;
  // The fp32 masters whole again, widened from the copy; release_masters() gives them back again.
  void widen_masters() { restore_masters(); }
  // Elements [begin, begin + n) of the fp32 weights into dst, those of given-back masters widened
  // from their bf16 copy on the way (a checkpoint's streaming read: nothing widened in place).
  void read_weights(int64_t begin, int64_t n, float* dst) const;
  // Whether [begin, begin + n) of param_data() can be read in place (no given-back master in it).
  bool weights_in_place(int64_t begin, int64_t n) const;
  // One update of unit u's weights in place (an optimizer step): update_begin returns the fp32
  // weights (the whole array; unit u's range valid and writable), update_end ends it. With
  // released bf16 masters, u's copy-only ranges are widened into fp32 pages by update_begin and
  // rounded back into the copy by update_end, stochastically: element i's random bits are
  // adamw_math.h's sr_bits(key, i), i its flat offset (the same for any unit order and thread
  // count), and the fp32 pages are given back. Otherwise update_begin is unit_param_data(u) and
  // update_end does nothing.
  float* update_begin(int64_t u);
  void update_end(int64_t u, uint64_t key);
  // Bytes of the fp32 weights held (after release_masters: those still read in fp32), and of
  // the compute copy.
  int64_t master_bytes() const;
  int64_t compute_copy_bytes() const { return o_.compute_copy ? 2 * (lay_.n - lay_.copy_base) : 0; }
  // Every unit's compute copy is stale (its weights were written).
  void mark_stale() { std::fill(stale_.begin(), stale_.end(), 1); }

 private:
  void restore_masters();
  // Unit i's compute copy remade from its fp32 weights if they changed (acquire, without the
  // hooks).
  void remake_copy(size_t i);
  // Calls fn(begin, len) for each copy-only range's part inside [lo, hi), in order.
  template <typename Fn>
  void for_copy_only(int64_t lo, int64_t hi, Fn&& fn) const;

  Layout lay_;
  Options o_;
  const ops::Backend& be_;
  DeviceParams params_;
  Buffer<float> grads_;
  Buffer<uint16_t> copy_;    // the bf16 copy of [copy_base, n)
  std::vector<char> stale_;  // per unit: its weights changed since its copy was made
  bool masters_released_ = false;
  ParamHooks* hooks_ = nullptr;
};

}  // namespace titan::models
