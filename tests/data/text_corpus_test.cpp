// Text read in place: gzip files give the documents of the same file unpacked (one member or
// several, read in order and in any order across access points), a saved index is reused and
// made again when the file or the options change or the index is damaged, and a corrupt or
// truncated gzip file is an error naming it.
#include "titan/data/text_corpus.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "test_util.h"
#include "titan/core/error.h"
#include "titan/data/gzip_file.h"

namespace titan::data {
namespace {

namespace fs = std::filesystem;
using titan::testing::error_of;

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = dir + "/" + name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// gzip -c src > dst (gzip is part of every Debian system).
void gzip_to(const std::string& src, const std::string& dst) {
  ASSERT_EQ(std::system(("gzip -c -6 '" + src + "' > '" + dst + "'").c_str()), 0);
}

SourceOptions opts(const std::string& dataset, const std::string& path) {
  SourceOptions o;
  o.dataset = dataset;
  o.path = path;
  return o;
}

std::vector<std::string> all(const TextCorpus& c) {
  std::vector<std::string> v(static_cast<size_t>(c.size()));
  for (size_t i = 0; i < v.size(); ++i) c.text(static_cast<int64_t>(i), &v[i]);
  return v;
}

// About `bytes` of JSON lines with documents of varied length (some blank, one with invalid
// UTF-8), so that gzip makes several access points.
std::string jsonl_corpus(size_t bytes) {
  std::mt19937 rng(7);
  std::string s;
  for (int i = 0; s.size() < bytes; ++i) {
    std::string text;
    const int words = static_cast<int>(rng() % 400);
    for (int w = 0; w < words; ++w) {
      text += 'w';
      text += std::to_string(rng() % 100000);
      text += ' ';
    }
    if (i % 97 == 3) text = "  ";
    s += "{\"text\": \"doc " + std::to_string(i) + " " + text + "\", \"url\": \"u\"}\n";
    if (i == 5) s += "{\"text\": \"bad \xff byte\"}\n";
  }
  return s;
}

TEST(TextCorpus, GzipFilesReadAsTheSameFilesUnpacked) {
  const std::string d = titan::testing::fresh_temp_dir("corpus_gz");
  fs::create_directories(d + "/plain");
  fs::create_directories(d + "/gz");
  const std::string jl = write(d, "plain/a.jsonl", jsonl_corpus(9u << 20));
  const std::string tx = write(d, "plain/b.txt", "one\n\n two \r\nthree");
  const std::string ft = write(d, "plain/c", "a\n%\n\n%\nb\nc\n%\nlast");
  gzip_to(jl, d + "/gz/a.jsonl.gz");
  gzip_to(tx, d + "/gz/b.txt.gz");
  gzip_to(ft, d + "/gz/c.gz");
  for (const char* dataset : {"auto", "fortunes"}) {
    SourceStats sp, sg;
    const auto plain = open_text_corpus(opts(dataset, d + "/plain"), "", &sp);
    const auto gz = open_text_corpus(opts(dataset, d + "/gz"), "", &sg);
    ASSERT_GT(plain->size(), 1000);
    EXPECT_EQ(all(*gz), all(*plain)) << dataset;
    EXPECT_EQ(sg.documents, sp.documents);
    EXPECT_EQ(sg.empty, sp.empty);
    EXPECT_EQ(sg.utf8_replaced, 1);
    EXPECT_EQ(sp.utf8_replaced, 1);
    // Any order: each document through the access point before it, or read on from the last.
    std::vector<int64_t> order(static_cast<size_t>(plain->size()));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937(3));
    order.resize(120);
    std::string a, b;
    for (int64_t i : order) {
      plain->text(i, &a);
      gz->text(i, &b);
      ASSERT_EQ(a, b) << "document " << i;
    }
  }
}

TEST(TextCorpus, GzipMembersBackToBackReadAsOneStream) {
  const std::string d = titan::testing::fresh_temp_dir("corpus_members");
  const std::string a = write(d, "a.txt", jsonl_corpus(5u << 20));
  const std::string b = write(d, "b.txt", "tail one\ntail two\n");
  gzip_to(a, d + "/a.gz");
  gzip_to(b, d + "/b.gz");
  ASSERT_EQ(
      std::system(("cat '" + d + "/a.gz' '" + d + "/b.gz' '" + d + "/a.gz' > '" + d +
                   "/all.txt.gz'; cat '" + a + "' '" + b + "' '" + a + "' > '" + d + "/all.txt'")
                      .c_str()),
      0);
  const auto plain = open_text_corpus(opts("text", d + "/all.txt"), "");
  const auto gz = open_text_corpus(opts("text", d + "/all.txt.gz"), "");
  ASSERT_EQ(gz->size(), plain->size());
  std::string x, y;
  for (int64_t i = gz->size() - 1; i >= 0; i -= 37) {  // backwards: every read seeks
    plain->text(i, &x);
    gz->text(i, &y);
    ASSERT_EQ(x, y) << "document " << i;
  }
  EXPECT_EQ(read_gzip(d + "/b.gz"), "tail one\ntail two\n");
}

TEST(TextCorpus, SavedIndexIsReusedAndMadeAgainWhenStale) {
  const std::string d = titan::testing::fresh_temp_dir("corpus_index");
  const std::string idx = d + "/index";
  const std::string f = write(d, "data.jsonl", jsonl_corpus(200000));
  gzip_to(f, d + "/data.jsonl.gz");
  const auto inode = [](const std::string& dir) {
    std::vector<ino_t> v;
    for (const auto& e : fs::directory_iterator(dir)) {
      struct stat sb {};
      ::stat(e.path().c_str(), &sb);
      v.push_back(sb.st_ino);
    }
    return v;
  };
  for (const std::string& file : {f, d + "/data.jsonl.gz"}) {
    SourceStats s1, s2;
    const auto first = open_text_corpus(opts("jsonl", file), idx, &s1);
    const std::vector<ino_t> made = inode(idx);
    const auto again = open_text_corpus(opts("jsonl", file), idx, &s2);
    EXPECT_EQ(inode(idx), made) << "the saved index was made again, not reused";
    EXPECT_EQ(all(*again), all(*first));
    EXPECT_EQ(s2.documents, s1.documents);
    EXPECT_EQ(s2.utf8_replaced, 1);
    EXPECT_EQ(s2.first_utf8, s1.first_utf8);
    EXPECT_EQ(s2.empty, s1.empty);
  }
  std::vector<std::string> saved;
  for (const auto& e : fs::directory_iterator(idx)) saved.push_back(e.path().string());
  ASSERT_EQ(saved.size(), 2u);

  // Other options: the index is made again, not reused.
  SourceOptions other = opts("jsonl", f);
  other.text_field = "url";
  other.skip_malformed = true;
  const int64_t urls = open_text_corpus(other, idx)->size();
  EXPECT_EQ(urls, open_text_corpus(other, "")->size());
  EXPECT_NE(urls, open_text_corpus(opts("jsonl", f), idx)->size());

  // The file grows: the new documents are there.
  const int64_t before = open_text_corpus(opts("jsonl", f), idx)->size();
  std::ofstream(f, std::ios::app) << "{\"text\": \"appended\"}\n";
  const auto grown = open_text_corpus(opts("jsonl", f), idx);
  ASSERT_EQ(grown->size(), before + 1);
  std::string last;
  grown->text(before, &last);
  EXPECT_EQ(last, "appended");

  // A damaged index (cut short, or garbage) is made again, never trusted.
  for (const std::string& p : saved) fs::resize_file(p, fs::file_size(p) / 2);
  EXPECT_EQ(open_text_corpus(opts("jsonl", d + "/data.jsonl.gz"), idx)->size(),
            open_text_corpus(opts("jsonl", d + "/data.jsonl.gz"), "")->size());
  for (const std::string& p : saved) write(p, "", std::string(4000, 'x'));
  EXPECT_EQ(open_text_corpus(opts("jsonl", f), idx)->size(), before + 1);
}

TEST(TextCorpus, CorruptGzipIsAnErrorNamingTheFile) {
  const std::string d = titan::testing::fresh_temp_dir("corpus_bad_gz");
  const std::string f = write(d, "data.jsonl", jsonl_corpus(300000));
  gzip_to(f, d + "/ok.jsonl.gz");
  const std::string whole = read_gzip(d + "/ok.jsonl.gz");
  std::ifstream in(d + "/ok.jsonl.gz", std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  const std::string cut = write(d, "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  EXPECT_NE(error_of([&] { open_text_corpus(opts("jsonl", cut), ""); }).find("ends early"),
            std::string::npos);
  std::string flipped = gz;
  for (size_t i = 100; i < 140; ++i) flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
  const std::string bad = write(d, "bad.jsonl.gz", flipped);
  const std::string e = error_of([&] { open_text_corpus(opts("jsonl", bad), ""); });
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  const std::string plain = write(d, "plain.jsonl.gz", "{\"text\": \"not compressed\"}\n");
  EXPECT_NE(error_of([&] { open_text_corpus(opts("jsonl", plain), ""); }).find("not a gzip file"),
            std::string::npos);
  EXPECT_EQ(whole.size(), fs::file_size(f));
}

}  // namespace
}  // namespace titan::data
