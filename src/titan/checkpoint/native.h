// The native (titan) checkpoint format (checkpointer.h): the model's tensors as written, and the
// reading of weights and AdamW moments from safetensors sets, checked against checksums.json.
// Internal to the checkpoint code (load_model_weights itself is declared in checkpointer.h).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpointer.h"
#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/dtype.h"
#include "titan/models/model.h"

namespace titan::ckpt::detail {

// Weights [offset, offset + numel of shape) of store as a tensor to write in dt: read in place
// when they are fp32 masters saved as such, else converted (bf16 masters widened) slice by slice
// as they are written (store must outlive the write).
WriteTensor weight_tensor(const models::ParamStore& store, std::string name,
                          std::vector<int64_t> shape, int64_t offset, DType dt);

// Tensors of the model under their titan FQNs (or HF keys), in dt (weight_tensor; the buffers
// too: the MoE expert bias).
std::vector<WriteTensor> model_tensors(const models::Model& model, DType dt, bool hf_keys);

// dir's checksums.json with every listed file's presence and size checked (before the files
// are opened, so a truncated file is named as such); nullopt, with a warning, when there is none.
std::optional<std::map<std::string, FileSum>> precheck_dir(const std::string& dir);

// Hashes the listed files that read_native does not check while reading the sets' (which must
// be listed).
void verify_rest(const std::string& dir, const std::optional<std::map<std::string, FileSum>>& sums,
                 std::initializer_list<const SafetensorsSet*> sets);

// What to read from a native set: tensor name, expected shape, fp32 destination.
struct Want {
  std::string name;
  std::vector<int64_t> shape;
  float* dst;
};

// Reads `wants` from set, one verified pass per file (read_verified) when sums are given.
void read_native(const SafetensorsSet& set, const std::vector<Want>& wants,
                 const std::optional<std::map<std::string, FileSum>>& sums);

// The data held for p (all of it, or its tensor/expert-parallel slice), elements [a, z), of
// tensor `name` of a native set.
void read_held(const SafetensorsSet& set, const std::string& name, const models::ParamInfo& p,
               int64_t a, int64_t z, float* dst);

// A native set's weights into a model that holds slices (or, with unit_done, unit by unit): the
// files of `sets` checked first (one hashing pass over the mappings), then only the data held
// read, and the buffers the set has.
void read_weights_held(models::Model& model, const SafetensorsSet& weights, const std::string& dir,
                       const std::optional<std::map<std::string, FileSum>>& sums,
                       const UnitDone& unit_done,
                       std::initializer_list<const SafetensorsSet*> sets);

// The model's weights from a Hugging Face set (hf: models::Model::load_hf, within `only`) or a
// native one (read_weights_held for a model holding slices, else read_native).
void read_weights(models::Model& model, const SafetensorsSet& set, const std::string& path, bool hf,
                  const std::optional<std::map<std::string, FileSum>>& sums, const Segments* only);

}  // namespace titan::ckpt::detail
