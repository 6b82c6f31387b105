// titan plot's SVG: from a metrics.jsonl with training and validation records, one polyline per
// series through every point (training loss, validation loss, learning rate), a marker per
// validation, axis labels and a legend; a well-formed document (checked by parsing it as XML
// with a strict reader where xmllint exists). Bad input: one error naming the file.
#include "titan/tools/plot.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "test_util.h"
#include "titan/core/error.h"

namespace titan::tools {
namespace {

using testing::count_of;

TEST(Plot, SvgHasEverySeries) {
  const std::string dir = testing::fresh_temp_dir("plot");
  {
    std::ofstream f(dir + "/metrics.jsonl");
    for (int s = 1; s <= 30; ++s)
      f << "{\"step\": " << s << ", \"loss\": " << 8.0 / s << ", \"lr\": " << 1e-3 * s / 30
        << "}\n";
    for (int s : {10, 20, 30})
      f << "{\"step\": " << s << ", \"validation_loss\": " << 9.0 / s << "}\n";
  }
  plot_metrics(dir + "/metrics.jsonl", dir + "/loss.svg", "a <test> & run");
  std::ifstream f(dir + "/loss.svg");
  const std::string svg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_EQ(count_of(svg, "<polyline"), 3);
  EXPECT_EQ(count_of(svg, "<circle"), 3);
  for (const char* t : {"training loss", "validation loss", "learning rate", ">step<", ">loss<",
                        "a &lt;test&gt; &amp; run"})
    EXPECT_NE(svg.find(t), std::string::npos) << t;
  const size_t p = svg.find("<polyline fill=\"none\" stroke=\"#1f77b4\"");
  ASSERT_NE(p, std::string::npos);
  const std::string pts = svg.substr(p, svg.find("/>", p) - p);
  EXPECT_EQ(count_of(pts, ","), 30);  // one point per training step
  if (std::system("command -v xmllint > /dev/null 2>&1") == 0) {
    EXPECT_EQ(std::system(("xmllint --noout " + dir + "/loss.svg").c_str()), 0);
  }
}

TEST(Plot, BadInputNamesTheFile) {
  const std::string dir = testing::fresh_temp_dir("plot_bad");
  EXPECT_THROW(plot_metrics(dir + "/metrics.jsonl", dir + "/x.svg", "t"), Error);
  std::ofstream(dir + "/metrics.jsonl") << "{\"step\": 1, \"validation_loss\": 2}\n";
  try {
    plot_metrics(dir + "/metrics.jsonl", dir + "/x.svg", "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no training loss"), std::string::npos);
  }
  std::ofstream(dir + "/metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\nnot json\n";
  EXPECT_THROW(plot_metrics(dir + "/metrics.jsonl", dir + "/x.svg", "t"), Error);
  EXPECT_FALSE(std::ifstream(dir + "/x.svg").good());
}

}  // namespace
}  // namespace titan::tools
