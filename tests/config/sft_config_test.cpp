// The sft.* fields of chat fine-tuning: defaults, flags, the TOML form and the refused values.
#include <gtest/gtest.h>

#include "test_util.h"
#include "titan/config/job_config.h"
#include "titan/core/error.h"

namespace titan::config {
namespace {

TEST(SftConfig, DefaultsFlagsAndRefusedValues) {
  JobConfig c;
  EXPECT_FALSE(c.sft.train_on_prompt);
  EXPECT_TRUE(c.sft.packing);
  EXPECT_EQ(c.sft.truncation, "truncate");
  apply_flags(c, {"--sft.train_on_prompt", "--sft.packing", "false", "--sft.truncation=drop",
                  "--dataloader.dataset", "chat"});
  EXPECT_TRUE(c.sft.train_on_prompt);
  EXPECT_FALSE(c.sft.packing);
  EXPECT_EQ(c.sft.truncation, "drop");
  validate(c);
  const std::string toml = to_string(c);
  EXPECT_NE(toml.find("[sft]\ntrain_on_prompt = true\npacking = false\npacking_strategy = \"bfd\"\n"
                      "truncation = \"drop\""),
            std::string::npos)
      << toml;
  c.sft.truncation = "cut";
  const std::string err = titan::testing::error_of([&] { validate(c); });
  EXPECT_NE(err.find("sft.truncation 'cut' must be truncate or drop"), std::string::npos) << err;
  c.sft.truncation = "drop";
  c.sft.packing_strategy = "ffd";
  const std::string e2 = titan::testing::error_of([&] { validate(c); });
  EXPECT_NE(e2.find("sft.packing_strategy 'ffd' must be bfd or wrapped"), std::string::npos) << e2;
}

}  // namespace
}  // namespace titan::config
