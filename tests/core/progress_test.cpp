// Progress when the output is not a terminal (logs): nothing for work that ends within the quiet
// time; after it, one line per 10% crossed with the amount, percentage and rate.
#include "titan/core/progress.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "titan/core/log.h"

namespace titan {
namespace {

using testing::count_of;

TEST(Progress, OneLinePerTenPercentInLogs) {
  if (log::interactive()) GTEST_SKIP() << "stdout is a terminal: the line is rewritten in place";
  ::testing::internal::CaptureStdout();
  {
    Progress p("tokenizing corpus.txt", 200, false, "documents", 0.0);
    for (int i = 0; i < 100; ++i) p.add(2);
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(count_of(out, "tokenizing corpus.txt: "), 10) << out;
  EXPECT_NE(out.find("100 documents / 200 documents (50%)"), std::string::npos) << out;
  EXPECT_NE(out.find("200 documents / 200 documents (100%)"), std::string::npos) << out;
  EXPECT_NE(out.find("documents/s"), std::string::npos) << out;

  ::testing::internal::CaptureStdout();
  {
    Progress p("loading x", int64_t{3} << 30);  // bytes, quiet for the default 2 s
    p.add(int64_t{3} << 30);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
}

}  // namespace
}  // namespace titan
