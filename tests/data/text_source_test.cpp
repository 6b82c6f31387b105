// Document sources: JSON lines (field, malformed lines, missing fields, empty documents), plain
// text, directories, globs and lists, invalid UTF-8 replaced and counted, empty datasets.
#include "titan/data/text_source.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "titan/core/error.h"

namespace titan::data {
namespace {

using titan::testing::error_of;

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = dir + "/" + name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

SourceOptions opts(const std::string& dataset, const std::string& path) {
  SourceOptions o;
  o.dataset = dataset;
  o.path = path;
  return o;
}

TEST(JsonLines, ReadsTheFieldAndSkipsEmptyDocuments) {
  const std::string d = titan::testing::fresh_temp_dir("jsonl");
  const std::string f = write(d, "c4.jsonl",
                              "{\"text\": \"first doc\", \"url\": \"x\"}\n"
                              "\n"
                              "{\"text\": \"\"}\n"
                              "{\"text\": \"line\\nbreak \\u00e9\"}\r\n"
                              "{\"text\": \"  \"}\n");
  SourceStats st;
  auto docs = read_documents(opts("jsonl", f), &st);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "first doc");
  EXPECT_EQ(docs[1], "line\nbreak \xc3\xa9");
  EXPECT_EQ(st.empty, 2);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(describe_problems(st, "text"), "skipped 2 empty document(s)");

  // Another field; and "text" reads .jsonl files as JSON lines by their extension.
  const std::string g = write(d, "other.jsonl", "{\"content\": \"A\"}\n{\"content\": \"B\"}\n");
  SourceOptions o = opts("text", g);
  o.text_field = "content";
  EXPECT_EQ(read_documents(o), (std::vector<std::string>{"A", "B"}));
}

TEST(JsonLines, MalformedLineNamesFileAndLineOrIsSkippedAndCounted) {
  const std::string d = titan::testing::fresh_temp_dir("jsonl_bad");
  const std::string f = write(d, "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"cut\n[1, 2]\n");
  std::string msg = error_of([&] { read_documents(opts("jsonl", f)); });
  EXPECT_NE(msg.find(f + ":2: the line is malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataloader.skip_malformed = true"), std::string::npos) << msg;

  SourceOptions o = opts("jsonl", f);
  o.skip_malformed = true;
  SourceStats st;
  EXPECT_EQ(read_documents(o, &st), std::vector<std::string>{"ok"});
  EXPECT_EQ(st.malformed, 2);  // the cut line and the array
  EXPECT_EQ(st.first_malformed, f + ":2");
  EXPECT_EQ(describe_problems(st, "text"),
            "skipped 2 malformed JSON line(s) (first at " + f + ":2)");

  // A number past a double's range is nlohmann's out_of_range, not a parse_error (the same
  // defect fuzz_tokenizer_json found in the tokenizer loader): a malformed line too.
  const std::string g = write(d, "big.jsonl", "{\"text\": \"ok\", \"n\": 1e999}\n");
  msg = error_of([&] { read_documents(opts("jsonl", g)); });
  EXPECT_NE(msg.find(g + ":1: the line is malformed JSON"), std::string::npos) << msg;
}

TEST(JsonLines, MissingFieldNamesTheField) {
  const std::string d = titan::testing::fresh_temp_dir("jsonl_field");
  const std::string f = write(
      d, "f.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n{\"text\": 3}\n{\"text\": null}\n");
  std::string msg = error_of([&] { read_documents(opts("jsonl", f)); });
  EXPECT_NE(msg.find(f + ":2: no field 'text'; set dataloader.text_field"), std::string::npos)
      << msg;
  const std::string g = write(d, "g.jsonl", "{\"text\": 3}\n");
  msg = error_of([&] { read_documents(opts("jsonl", g)); });
  EXPECT_NE(msg.find(g + ":1: field 'text' is not a string"), std::string::npos) << msg;

  SourceOptions o = opts("jsonl", f);
  o.skip_malformed = true;
  SourceStats st;
  EXPECT_EQ(read_documents(o, &st), std::vector<std::string>{"ok"});
  EXPECT_EQ(st.missing_field, 3);
  EXPECT_NE(describe_problems(st, "text")
                .find("skipped 3 JSON line(s) without a string 'text' "
                      "field (first at " +
                      f + ":2)"),
            std::string::npos);
}

TEST(TextSource, InvalidUtf8IsReplacedAndCounted) {
  const std::string d = titan::testing::fresh_temp_dir("utf8");
  // \xff: one replacement; \xe2\x82 (a truncated 3-byte sequence): one, as Python's
  // errors="replace" does for a maximal invalid subpart.
  const std::string f = write(d, "bad.txt", "fine line\nbad \xff byte\ncut \xe2\x82!\n");
  SourceStats st;
  auto docs = read_documents(opts("text", f), &st);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[1], "bad \xef\xbf\xbd byte");
  EXPECT_EQ(docs[2], "cut \xef\xbf\xbd!");
  EXPECT_EQ(st.utf8_replaced, 2);
  EXPECT_EQ(describe_problems(st, "text"),
            "replaced 2 invalid UTF-8 sequence(s) with U+FFFD (first at " + f + ":2)");
  // Inside JSON strings too.
  const std::string j = write(d, "bad.jsonl", "{\"text\": \"a\xff\"}\n");
  EXPECT_EQ(read_documents(opts("jsonl", j), &st), std::vector<std::string>{"a\xef\xbf\xbd"});
  EXPECT_EQ(st.utf8_replaced, 1);
}

TEST(TextSource, FilesDirectoriesGlobsAndLists) {
  const std::string d = titan::testing::fresh_temp_dir("paths");
  write(d, "a.txt", "a1\na2\n");
  write(d, "b.jsonl", "{\"text\": \"b1\"}\n");
  write(d, "c.txt", "c1\n");
  write(d, ".hidden", "never\n");
  EXPECT_EQ(read_documents(opts("text", d)), (std::vector<std::string>{"a1", "a2", "b1", "c1"}));
  EXPECT_EQ(read_documents(opts("auto", d + "/*.txt")),
            (std::vector<std::string>{"a1", "a2", "c1"}));
  EXPECT_EQ(read_documents(opts("text", d + "/c.txt," + d + "/b.jsonl")),
            (std::vector<std::string>{"c1", "b1"}));
  std::string msg = error_of([&] { read_documents(opts("text", d + "/*.parquet")); });
  EXPECT_NE(msg.find("dataset pattern '" + d + "/*.parquet' matches no files"), std::string::npos)
      << msg;
  msg = error_of([&] { read_documents(opts("text", d + "/missing.txt")); });
  EXPECT_NE(msg.find("dataset path '" + d + "/missing.txt' does not exist"), std::string::npos)
      << msg;
  msg = error_of([&] { read_documents(opts("parquet", d)); });
  EXPECT_NE(msg.find("dataloader.dataset 'parquet' is not a built-in source"), std::string::npos)
      << msg;
  msg = error_of([&] { read_documents(opts("jsonl", "")); });
  EXPECT_NE(msg.find("dataloader.dataset 'jsonl' needs dataloader.dataset_path"), std::string::npos)
      << msg;
}

// torchtitan's C4 names read C4 as it is on disk: gzip-compressed JSON-lines shards in a folder
// (or its en/), c4_test's data.json; a folder without them is an error naming it and the fix.
TEST(TextSource, C4NamesReadTheShardsOnDisk) {
  const std::string d = titan::testing::fresh_temp_dir("c4");
  std::filesystem::create_directories(d + "/en");
  write(d, "en/c4-train.00001-of-01024.json", "{\"text\": \"second\", \"url\": \"u\"}\n");
  write(d, "en/c4-train.00000-of-01024.json", "{\"text\": \"first\", \"timestamp\": \"t\"}\n");
  write(d, "en/c4-validation.00000-of-00008.json", "{\"text\": \"held out\"}\n");
  for (const char* f : {"c4-train.00000-of-01024.json", "c4-train.00001-of-01024.json",
                        "c4-validation.00000-of-00008.json"})
    ASSERT_EQ(std::system(("gzip '" + d + "/en/" + f + "'").c_str()), 0);
  write(d, "en/c4-train.00000-of-01024.json.gz.tmp5", "not yet");
  EXPECT_EQ(read_documents(opts("c4", d)), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(read_documents(opts("c4", d + "/en")), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(read_documents(opts("c4_validation", d)), (std::vector<std::string>{"held out"}));
  write(d, "data.json", "{\"text\": \"test one\"}\n{\"text\": \"test two\"}\n");
  EXPECT_EQ(read_documents(opts("c4_test", d)), (std::vector<std::string>{"test one", "test two"}));
  EXPECT_EQ(read_documents(opts("c4_test", d + "/data.json")),
            (std::vector<std::string>{"test one", "test two"}));
  std::string msg = error_of([&] { read_documents(opts("c4", d + "/en/..//../")); });
  EXPECT_NE(
      msg.find("dataloader.dataset c4 reads C4's training shards (c4-train.*-of-01024.json.gz"),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find("set dataloader.dataset_path to the folder holding them"), std::string::npos);
  msg = error_of([&] { read_documents(opts("c4_test", "")); });
  EXPECT_NE(msg.find("'tests/assets/c4_test' (nor its en/) does not exist"), std::string::npos)
      << msg;
}

TEST(TextSource, FormatByDatasetAndExtension) {
  EXPECT_EQ(file_format("auto", "x.jsonl.gz"), "jsonl");
  EXPECT_EQ(file_format("auto", "c4-train.00000-of-01024.json.GZ"), "jsonl");
  EXPECT_EQ(file_format("auto", "x.txt.gz"), "text");
  EXPECT_EQ(file_format("text", "x.jsonl"), "jsonl");
  EXPECT_EQ(file_format("fortunes", "x.JSON"), "jsonl");
  EXPECT_EQ(file_format("auto", "x.bin"), "tokens");
  EXPECT_EQ(file_format("auto", "x.txt"), "text");
  EXPECT_EQ(file_format("fortunes", "art"), "fortunes");
  EXPECT_EQ(file_format("jsonl", "x.txt"), "jsonl");
  EXPECT_EQ(file_format("tokens", "x"), "tokens");
}

TEST(TextSource, EmptyDatasetNamesThePath) {
  const std::string d = titan::testing::fresh_temp_dir("empty");
  const std::string f = write(d, "e.jsonl", "{\"text\": \"\"}\n\n");
  std::string msg = error_of([&] { read_documents(opts("jsonl", f)); });
  EXPECT_NE(msg.find("dataset 'jsonl' at '" + f + "' has no documents"), std::string::npos) << msg;
  SourceOptions o = opts("auto", write(d, "blank.txt", "\n \n"));
  o.section = "validator";
  msg = error_of([&] { read_documents(o); });
  EXPECT_NE(msg.find("point validator.dataset_path at non-empty text"), std::string::npos) << msg;
}

// An all-malformed JSONL under the default dataset name was reported as dataset 'fortunes'.
TEST(TextSource, EmptyDatasetNamesTheFormatReadAndWhatWasSkipped) {
  const std::string d = titan::testing::fresh_temp_dir("all_bad");
  const std::string f = write(d, "bad.jsonl", "{oops\n{\"text\": 1\n");
  SourceOptions o = opts("fortunes", f);
  o.skip_malformed = true;
  const std::string msg = error_of([&] { read_documents(o); });
  EXPECT_EQ(msg.find("'fortunes'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset 'jsonl' at '" + f +
                     "' has no documents (skipped 2 malformed JSON "
                     "line(s) (first at " +
                     f + ":1))"),
            std::string::npos)
      << msg;
}

// The validator's messages suggested validator.skip_malformed and validator.text_field, which do
// not exist: the validator uses the dataloader's.
TEST(JsonLines, HintsNameOptionsThatExist) {
  const std::string d = titan::testing::fresh_temp_dir("hints");
  const std::string f = write(d, "v.jsonl", "{\"body\": \"x\"}\n");
  SourceOptions o = opts("auto", f);
  o.section = "validator";
  std::string msg = error_of([&] { read_documents(o); });
  EXPECT_NE(msg.find("set dataloader.text_field to the field"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set dataloader.skip_malformed = true"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("validator.skip_malformed"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("validator.text_field"), std::string::npos) << msg;
}

// A .json file holding one JSON array was read as JSON lines and refused.
TEST(JsonArray, ReadsObjectsAndStrings) {
  const std::string d = titan::testing::fresh_temp_dir("json_array");
  const std::string f = write(d, "data.json",
                              "[\n {\"text\": \"first\", \"id\": 1},\n \"second\",\n "
                              "{\"text\": \"\"}\n]\n");
  SourceStats st;
  EXPECT_EQ(read_documents(opts("auto", f), &st), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(st.empty, 1);
  const std::string g = write(d, "bad.json", "[{\"text\": \"ok\"}, 5, {\"body\": \"x\"}]");
  std::string msg = error_of([&] { read_documents(opts("auto", g)); });
  EXPECT_NE(msg.find(g + ": element 1: the element is not a JSON object or string"),
            std::string::npos)
      << msg;
  SourceOptions o = opts("auto", g);
  o.skip_malformed = true;
  EXPECT_EQ(read_documents(o, &st), std::vector<std::string>{"ok"});
  EXPECT_EQ(st.malformed, 1);
  EXPECT_EQ(st.missing_field, 1);
  EXPECT_EQ(st.first_missing, g + ": element 2");
  const std::string h = write(d, "cut.json", "[{\"text\": \"ok\"},");
  msg = error_of([&] { read_documents(opts("auto", h)); });
  EXPECT_NE(msg.find(h + ": not valid JSON"), std::string::npos) << msg;
  // JSON lines in a .json file still read as lines.
  const std::string l = write(d, "lines.json", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  EXPECT_EQ(read_documents(opts("auto", l)), (std::vector<std::string>{"a", "b"}));
}

// dataset auto: the fortunes corpus (read as fortunes records) without a path, else by extension;
// a .txt path under the old default 'fortunes' was split at '%' lines.
TEST(TextSource, AutoIsFortunesOnlyForTheCorpus) {
  const std::string d = titan::testing::fresh_temp_dir("auto_default");
  const std::string f = write(d, "notes.txt", "one\n%\ntwo\n");
  EXPECT_EQ(read_documents(opts("auto", f)), (std::vector<std::string>{"one", "%", "two"}));
  EXPECT_EQ(read_documents(opts("fortunes", f)), (std::vector<std::string>{"one\n", "two\n"}));
  EXPECT_EQ(effective_dataset(opts("auto", "")), "fortunes");
  EXPECT_EQ(effective_dataset(opts("auto", f)), "auto");
  if (std::filesystem::exists(kFortunesDir)) {
    EXPECT_EQ(read_documents(opts("auto", "")), read_documents(opts("fortunes", "")));
    EXPECT_EQ(effective_dataset(opts("auto", kFortunesDir)), "fortunes");
  }
}

TEST(TextSource, WikitextJsonLines) {
  auto docs =
      read_documents(opts("auto", titan::testing::asset("datasets/wikitext-2/valid.jsonl")));
  EXPECT_EQ(docs.size(), 60u);
}

}  // namespace
}  // namespace titan::data
