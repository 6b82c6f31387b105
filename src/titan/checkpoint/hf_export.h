// The Hugging Face export (checkpointer.h: export_hf, HfPart, Checkpointer::hf_parts_commit): the
// export dtype and the files written beside the weights. Internal to the checkpoint code.
#pragma once
#include <filesystem>
#include <string>

#include "titan/core/dtype.h"
#include "titan/models/model.h"

namespace titan::ckpt::detail {

// checkpoint.export_dtype (float32 | bfloat16 | float16) as a DType; throws titan::Error for
// another name.
DType export_dtype(const std::string& name);

// Beside an export's weights: config.json (from the source's, for the fields titan does not
// model), generation_config.json and the source's tokenizer files.
void write_hf_extras(const std::filesystem::path& tmp, const models::Model& model,
                     const std::string& dtype, const std::string& source_dir);

}  // namespace titan::ckpt::detail
