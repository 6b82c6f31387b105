#include "titan/checkpoint/checkpointer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "titan/checkpoint/checksums.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/core/file_io.h"
#include "titan/core/log.h"
#include "titan/core/progress.h"
#include "titan/core/test_hooks.h"

namespace titan::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

DType export_dtype(const std::string& name) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  throw Error("checkpoint.export_dtype '" + name + "' must be float32, bfloat16 or float16");
}

// Tensors of the model under their titan FQNs (or HF keys), converted to dt; storage holds the
// converted bytes.
std::vector<WriteTensor> model_tensors(const models::Model& model, DType dt, bool hf_keys,
                                       std::vector<std::vector<uint8_t>>* storage) {
  std::vector<WriteTensor> out;
  auto add = [&](const std::string& key, const std::vector<int64_t>& shape, const float* src) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const void* data = src;
    if (dt != DType::F32) {
      storage->emplace_back(static_cast<size_t>(numel) * dtype_size(dt));
      f32_to(dt, src, numel, storage->back().data());
      data = storage->back().data();
    }
    out.push_back({key, dt, shape, data});
  };
  if (hf_keys) {
    for (const auto& t : model.hf_tensors()) add(t.key, t.shape, model.param_data() + t.offset);
    return out;
  }
  for (const auto& p : model.params())
    if (!p.alias) add(p.fqn, p.shape, model.param_data() + p.offset);
  for (const auto& b : model.buffers()) add(b.fqn, b.shape, b.data);  // MoE expert bias
  return out;
}

void write_json(const fs::path& path, const json& j) {
  io::write_file_atomic(path.string(), j.dump(2) + "\n");
}

json read_json(const fs::path& path) {
  std::ifstream f(path);
  check(f.good(), "cannot read " + path.string());
  json j = json::parse(f, nullptr, false);
  check(!j.is_discarded(), path.string() + ": invalid JSON");
  return j;
}

std::string step_name(int64_t step) { return "step-" + std::to_string(step); }

// "step-N" -> N; -1 for other names.
int64_t parse_step(const std::string& name) {
  const std::string digits = name.rfind("step-", 0) == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.size() >= 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

// Moves from -> to, throwing titan::Error naming both.
void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  check(!ec, "cannot rename " + from.string() + " to " + to.string() + " (" + ec.message() + ")");
}

// Puts the complete directory tmp at dst (see the header: one atomic swap when dst exists).
void commit_dir(const fs::path& tmp, const fs::path& dst) {
  const std::string parent = dst.parent_path().string();
  std::error_code ec;
  if (!fs::exists(dst, ec)) {
    rename_or_throw(tmp, dst);
    io::fsync_dir(parent);
    return;
  }
  if (!test::disabled("rename_exchange") &&
      ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) == 0) {
    io::fsync_dir(parent);
    test::kill_point("save:replace");
    fs::remove_all(tmp, ec);  // the previous copy
    return;
  }
  const int e = errno;
  check(test::disabled("rename_exchange") || e == EINVAL || e == ENOSYS || e == EOPNOTSUPP,
        "cannot replace " + dst.string() + " with " + tmp.string() + " (" + io::errno_message(e) +
            ")");
  // No RENAME_EXCHANGE here: two renames; a crash between them leaves step-N.old-PID, which
  // the next run renames back (clean_stale).
  const fs::path old = dst.string() + ".old-" + std::to_string(getpid());
  io::rename_aside(dst.string(), old.string());
  test::kill_point("save:replace");
  try {
    rename_or_throw(tmp, dst);
  } catch (const Error&) {
    fs::rename(old, dst, ec);  // put the previous copy back
    throw;
  }
  io::fsync_dir(parent);
  fs::remove_all(old, ec);
}

// A fresh, empty step-N.tmp-PID beside dst.
fs::path temp_sibling(const fs::path& dst) {
  fs::path tmp = io::temp_name(dst.string());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  check(!ec, "cannot create " + tmp.string() + " (" + ec.message() + ")");
  return tmp;
}

// What a step-N directory holds.
enum class Kind { Full, ModelOnly, Incomplete };
struct StepDir {
  int64_t step;
  fs::path path;
  Kind kind;
  std::string lacks;  // Incomplete: the first missing file
};

StepDir classify(int64_t step, const fs::path& dir) {
  std::error_code ec;
  const bool state = fs::exists(dir / "train_state.json", ec);
  if (fs::exists(dir / kShardedIndexName, ec))
    return {step, dir, state ? Kind::Full : Kind::Incomplete, state ? "" : "train_state.json"};
  const bool opt = fs::exists(dir / "optimizer.safetensors", ec);
  const bool model = fs::exists(dir / "model.safetensors", ec) ||
                     fs::exists(dir / "model.safetensors.index.json", ec);
  if (state && opt && model) return {step, dir, Kind::Full, ""};
  if (!state && !opt && model) return {step, dir, Kind::ModelOnly, ""};
  const char* lacks = !model ? "model.safetensors"
                      : !opt ? "optimizer.safetensors"
                             : "train_state.json";
  return {step, dir, Kind::Incomplete, lacks};
}

// Every step-N directory of folder, sorted by N.
std::vector<StepDir> step_dirs(const fs::path& folder) {
  std::vector<StepDir> r;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return r;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const int64_t step = parse_step(e.path().filename().string());
    std::error_code dec;
    if (step >= 0 && e.is_directory(dec)) r.push_back(classify(step, e.path()));
  }
  std::sort(r.begin(), r.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return r;
}

// The newest full checkpoint before `step` ("" message part when there is none).
std::string older_hint(const std::vector<StepDir>& dirs, int64_t step) {
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (it->step < step && it->kind == Kind::Full)
      return "; step " + std::to_string(it->step) + " is the newest older complete checkpoint: " +
             "resume it with --checkpoint.load_step " + std::to_string(it->step);
  return "; no older complete checkpoint exists";
}

// A non-negative integer field of train_state.json.
int64_t state_int(const json& j, const std::string& path, const char* key, bool required) {
  if (!j.contains(key)) {
    check(!required, path + ": missing \"" + key + "\"");
    return 0;
  }
  const json& v = j[key];
  check(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0) &&
            v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
        path + ": \"" + key + "\" must be a non-negative integer, got " + v.dump());
  return v.get<int64_t>();
}

// train_state.json of step directory `dir`, every field type-checked.
TrainState read_train_state(const fs::path& dir, int64_t step) {
  const fs::path p = dir / "train_state.json";
  const std::string path = p.string();
  const json j = read_json(p);
  check(j.is_object(), path + ": not a JSON object");
  TrainState st;
  st.path = path;
  st.step = state_int(j, path, "step", true);
  check(st.step == step, path + ": \"step\" is " + std::to_string(st.step) + " but the folder is " +
                             step_name(step));
  st.tokens_seen = state_int(j, path, "tokens_seen", false);
  for (const char* key : {"dataloader", "data"}) {
    const json v = j.value(key, json());
    check(v.is_null() || v.is_object(),
          path + ": \"" + key + "\" must be a JSON object, got " + v.dump().substr(0, 60));
    (std::string(key) == "dataloader" ? st.dataloader : st.data) = v;
  }
  return st;
}

void write_train_state(const fs::path& dir, const TrainState& st) {
  write_json(dir / "train_state.json", {{"step", st.step},
                                        {"tokens_seen", st.tokens_seen},
                                        {"dataloader", st.dataloader},
                                        {"data", st.data}});
}

std::string shard_file_name(int64_t rank, int64_t shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05lld-of-%05lld.safetensors", static_cast<long long>(rank),
                static_cast<long long>(shards));
  return buf;
}

// A parameter's part of a shard: elements [begin, end) of the data held for it (the whole
// tensor, or its tensor/expert-parallel slice, flattened), at element `at` of the shard's buffers.
struct Slice {
  const models::ParamInfo* p;
  int64_t begin, end, at;
};

// The slices of the (non-alias) parameters that the segments hold.
std::vector<Slice> slices_in(const models::Model& model, const Segments& segs) {
  std::vector<Slice> r;
  int64_t base = 0;
  for (const FlatRange& sg : segs) {
    for (const auto& p : model.params()) {
      const int64_t a = std::max(sg.begin, p.offset),
                    z = std::min(sg.begin + sg.len, p.offset + p.numel);
      if (!p.alias && a < z) r.push_back({&p, a - p.offset, z - p.offset, base + a - sg.begin});
    }
    base += sg.len;
  }
  return r;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// fn(p) for every (non-alias) parameter; with unit_done, unit by unit, unit_done(u) after each.
template <typename Fn>
void for_each_unit(const models::Model& model, const UnitDone& unit_done, Fn&& fn) {
  const int64_t units = unit_done ? static_cast<int64_t>(model.param_units().size()) : 1;
  for (int64_t u = 0; u < units; ++u) {
    for (const auto& p : model.params())
      if (!p.alias && (!unit_done || p.group == u)) fn(p);
    if (unit_done) unit_done(u);
  }
}

// The index entries of one file's elements of a tensor: elements [begin, begin + len) of the
// flattened tensor at element `at` of the file's 1-D tensor, then `count` such runs, run i at
// begin + i·stride in the tensor and at + i·len in the file. JSON: [file, begin, end] (at 0, one
// run: FSDP's ranges) or [file, begin, end, at, count, stride] (a tensor-parallel slice's rows).
struct RunGroup {
  int64_t begin = 0, len = 0, at = 0, count = 1, stride = 0;
  json to_json(const std::string& file) const {
    if (at == 0 && count == 1) return json::array({file, begin, begin + len});
    return json::array({file, begin, begin + len, at, count, stride});
  }
};

// The runs of the whole tensor that elements [a, z) of the data held for p (its slice) fill, as
// groups: fn(group), where group.at counts from a.
template <typename Fn>
void run_groups(const models::ParamInfo& p, int64_t a, int64_t z, Fn&& fn) {
  RunGroup g;
  bool open = false;
  models::for_each_whole_run(p, a, z, [&](int64_t w, int64_t l, int64_t n) {
    if (open && n == g.len &&
        (g.count == 1 ? w > g.begin + g.len - 1 : w == g.begin + g.count * g.stride)) {
      if (g.count == 1) g.stride = w - g.begin;
      ++g.count;
      return;
    }
    if (open) fn(g);
    g = {w, n, l - a, 1, 0};
    open = true;
  });
  if (open) fn(g);
}

// A sharded step directory's index and its files, opened and checked against checksums.json.
class ShardedDir {
 public:
  ShardedDir(const std::string& dir, const std::optional<std::map<std::string, FileSum>>& sums)
      : dir_(dir), index_path_((fs::path(dir) / kShardedIndexName).string()) {
    const json idx = read_json(index_path_);
    check(idx.is_object() && idx.value("format", json()) == "titan-sharded-checkpoint",
          index_path_ + ": \"format\" must be \"titan-sharded-checkpoint\"");
    const json version = idx.value("version", json());
    check(version == 1 || version == 2,
          index_path_ + ": version " + version.dump() +
              " is not supported (this titan reads versions 1 and 2)");
    check(idx.contains("tensors") && idx["tensors"].is_object(),
          index_path_ + ": \"tensors\" must be an object");
    for (const auto& [name, e] : idx["tensors"].items()) {
      const std::string at = index_path_ + ": tensor '" + name + "'";
      check(e.is_object() && e.contains("shape") && e["shape"].is_array() && e.contains("slices") &&
                e["slices"].is_array(),
            at + " must have \"shape\" and \"slices\"");
      Entry& t = tensors_[name];
      for (const auto& d : e["shape"]) {
        check(d.is_number_integer() && d.get<int64_t>() >= 0, at + ": bad \"shape\"");
        t.shape.push_back(d.get<int64_t>());
      }
      const int64_t numel = numel_of(t.shape);
      for (const auto& sl : e["slices"]) {
        const bool strided = version == 2 && sl.is_array() && sl.size() == 6;
        bool ok = sl.is_array() && (sl.size() == 3 || strided) && sl[0].is_string();
        for (size_t i = 1; ok && i < sl.size(); ++i) ok = sl[i].is_number_integer();
        check(ok, at + ": every slice must be [file, begin, end]" +
                      std::string(version == 2 ? " or [file, begin, end, at, count, stride]" : ""));
        const std::string file = sl[0].get<std::string>();
        check(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
              at + ": '" + file + "' is not a file name");
        RunGroup g;
        g.begin = sl[1].get<int64_t>();
        g.len = sl[2].get<int64_t>() - g.begin;
        if (strided) {
          g.at = sl[3].get<int64_t>();
          g.count = sl[4].get<int64_t>();
          g.stride = sl[5].get<int64_t>();
        }
        // Divisions, not products, so that no value of the file can overflow.
        check(numel > 0 && g.begin >= 0 && g.len > 0 && g.begin <= numel - g.len && g.at >= 0 &&
                  g.count >= 1 &&
                  (g.count == 1 ||
                   (g.stride >= g.len && g.count - 1 <= (numel - g.len - g.begin) / g.stride)),
              at + ": slice " + sl.dump() + " lies outside its " + std::to_string(numel) +
                  " elements");
        auto f = files_.find(file);
        if (f == files_.end()) {
          const std::string path = (fs::path(dir) / file).string();
          check(!sums || sums->count(file), path + ": not listed in " +
                                                std::string(kChecksumsName) +
                                                "; the directory was changed after it was saved");
          f = files_.emplace(file, SafetensorsFile::open(path)).first;
        }
        // The runs must lie in the file's data (so their number is bounded by its size).
        const int64_t held = static_cast<int64_t>(f->second.size() / sizeof(float));
        check(
            g.at <= held && g.count <= (held - g.at) / g.len,
            at + ": slice " + sl.dump() + " holds more elements than " + f->second.path() + " has");
        for (int64_t i = 0; i < g.count; ++i)
          t.runs.push_back({&f->second, g.begin + i * g.stride, g.begin + i * g.stride + g.len,
                            g.at + i * g.len});
      }
      // The slices must cover the tensor exactly once.
      std::sort(t.runs.begin(), t.runs.end(),
                [](const Run& a, const Run& b) { return a.begin < b.begin; });
      int64_t next = 0;
      for (const auto& r : t.runs) {
        check(r.begin == next,
              at + ": its slices leave a gap or overlap at element " + std::to_string(next));
        next = r.end;
      }
      check(next == numel, at + ": its slices cover " + std::to_string(next) + " of its " +
                               std::to_string(numel) + " elements");
    }
    if (sums) {  // every listed file, the shards hashed from the mappings just opened
      std::map<std::string, Mapped> mapped;
      for (const auto& [name, f] : files_) mapped[name] = {f.bytes(), f.size()};
      verify_checksums(dir, mapped);
    }
  }

  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

  // dst[0 : hi − lo) = elements [lo, hi) of tensor `name` (flattened), whose shape must be `shape`.
  void read(const std::string& name, const std::vector<int64_t>& shape, int64_t lo, int64_t hi,
            float* dst) const {
    copy_range(entry(name, shape), name, lo, hi, dst);
  }

  // Elements [a, z) of the data held for parameter p (its slice in a tensor/expert-parallel
  // model) of tensor `name` (p's, or a moment's) into dst.
  void read_held(const std::string& name, const models::ParamInfo& p, int64_t a, int64_t z,
                 float* dst) const {
    const Entry& e = entry(name, p.shape);
    models::for_each_whole_run(p, a, z, [&](int64_t w, int64_t l, int64_t n) {
      copy_range(e, name, w, w + n, dst + (l - a));
    });
  }

  // The model's parameters (whole, or the slices it holds; unit by unit with unit_done) and
  // buffers (those the index has).
  void read_weights(models::Model& model, const UnitDone& unit_done = {}) const {
    for_each_unit(model, unit_done, [&](const models::ParamInfo& p) {
      read_held(p.fqn, p, 0, p.numel, model.param_data() + p.offset);
    });
    for (const auto& b : model.buffers())
      if (has(b.fqn)) read(b.fqn, b.shape, 0, numel_of(b.shape), b.data);
  }

 private:
  struct Entry;
  // Tensor `name` of the index, whose shape must be `shape`.
  const Entry& entry(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = tensors_.find(name);
    check(it != tensors_.end(), index_path_ + " lacks tensor '" + name + "'");
    check(it->second.shape == shape, index_path_ + ": tensor '" + name + "' has shape " +
                                         json(it->second.shape).dump() + ", the model's is " +
                                         json(shape).dump());
    return it->second;
  }
  // dst[0 : hi − lo) = elements [lo, hi) of e (tensor `name`), from the runs that hold them.
  void copy_range(const Entry& e, const std::string& name, int64_t lo, int64_t hi,
                  float* dst) const;

  struct Run {  // elements [begin, end) of the tensor, at element `at` of its tensor in file
    const SafetensorsFile* file;
    int64_t begin, end, at;
  };
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<Run> runs;  // sorted by begin
  };
  std::string dir_, index_path_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, SafetensorsFile> files_;
};

void ShardedDir::copy_range(const Entry& e, const std::string& name, int64_t lo, int64_t hi,
                            float* dst) const {
  auto r = std::upper_bound(e.runs.begin(), e.runs.end(), lo,
                            [](int64_t x, const Run& run) { return x < run.end; });
  for (; r != e.runs.end() && r->begin < hi; ++r) {
    const int64_t a = std::max(lo, r->begin), z = std::min(hi, r->end);
    const TensorView* t = r->file->find(name);
    check(t != nullptr && t->dtype == DType::F32 && t->shape.size() == 1 &&
              t->shape[0] >= r->at + (r->end - r->begin),
          r->file->path() + ": tensor '" + name + "' must be F32 of at least " +
              std::to_string(r->at + r->end - r->begin) + " elements as " + kShardedIndexName +
              " says");
    std::memcpy(dst + (a - lo), t->data + (r->at + a - r->begin) * 4,
                static_cast<size_t>(z - a) * sizeof(float));
  }
}

}  // namespace

void check_dump_folder(const config::JobConfig& cfg) {
  check(!cfg.dump_folder.empty(),
        "dump_folder is empty: metrics.jsonl would go to the file-system root and checkpoints to "
        "the current directory; give a directory, e.g. --dump_folder ./outputs");
}

namespace {

// The files of the sets that lie in dir, by name.
std::map<std::string, const SafetensorsFile*> files_in(
    const std::string& dir, std::initializer_list<const SafetensorsSet*> sets) {
  std::map<std::string, const SafetensorsFile*> r;
  std::error_code ec;
  const fs::path d = fs::weakly_canonical(dir, ec);
  for (const SafetensorsSet* set : sets)
    for (const auto& f : set->files()) {
      const fs::path p(f.path());
      std::error_code pec;
      if (!ec && fs::weakly_canonical(p.parent_path(), pec) == d && !pec)
        r[p.filename().string()] = &f;
    }
  return r;
}

// dir's checksums.json with every listed file's presence and size checked (before the files
// are opened, so a truncated file is named as such); nullopt, with a warning, when there is none.
std::optional<std::map<std::string, FileSum>> precheck_dir(const std::string& dir) {
  auto sums = read_checksums(dir);
  if (!sums) {
    log::warn(dir + " has no " + kChecksumsName +
              " (written by an older titan or another tool); its files are not verified");
    return sums;
  }
  std::set<std::string> all;
  for (const auto& [name, s] : *sums) all.insert(name);
  verify_checksums(dir, {}, all);
  return sums;
}

// Hashes the listed files that read_native does not check while reading the sets' (which must
// be listed).
void verify_rest(const std::string& dir, const std::optional<std::map<std::string, FileSum>>& sums,
                 std::initializer_list<const SafetensorsSet*> sets) {
  if (!sums) return;
  std::set<std::string> streamed;
  for (const auto& [name, f] : files_in(dir, sets)) {
    check(sums->count(name), f->path() + ": not listed in " + kChecksumsName +
                                 "; the directory was changed after it was saved");
    streamed.insert(name);
  }
  verify_checksums(dir, {}, streamed);
}

// What to read from a native set: tensor name, expected shape, fp32 destination.
struct Want {
  std::string name;
  std::vector<int64_t> shape;
  float* dst;
};

// Reads `wants` from set, one verified pass per file (read_verified) when sums are given.
void read_native(const SafetensorsSet& set, const std::vector<Want>& wants,
                 const std::optional<std::map<std::string, FileSum>>& sums) {
  std::vector<std::vector<TensorRead>> per_file(set.files().size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < set.files().size(); ++i) index[set.files()[i].path()] = i;
  for (const auto& w : wants) {
    const TensorView* t = set.find(w.name);
    check(t != nullptr, set.path() + ": tensor '" + w.name + "' not found");
    const std::string& file = set.file_of(w.name);
    const std::string at = file + ": tensor '" + w.name + "'";
    auto shape_str = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    check(t->shape == w.shape,
          at + " has shape " + shape_str(t->shape) + ", expected " + shape_str(w.shape));
    check(t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16 ||
              t->dtype == DType::F64,
          at + " has dtype " + dtype_name(t->dtype) +
              "; only F32, F16, BF16 and F64 convert to fp32");
    per_file[index.at(file)].push_back({t, w.dst});
  }
  int64_t total = 0;
  for (const auto& f : set.files()) total += static_cast<int64_t>(f.size());
  Progress progress("loading " + set.path(), total);
  for (size_t i = 0; i < set.files().size(); ++i) {
    const SafetensorsFile& f = set.files()[i];
    const FileSum* sum = nullptr;
    if (sums) {
      auto it = sums->find(fs::path(f.path()).filename().string());
      if (it != sums->end()) sum = &it->second;
    }
    read_verified(f.path(), f.bytes(), f.size(), std::move(per_file[i]), sum, &progress);
  }
}

void check_params_present(const models::Model& model, const SafetensorsSet& set,
                          const std::string& path) {
  std::vector<std::string> missing;
  for (const auto& p : model.params())
    if (!p.alias && !set.find(p.fqn)) missing.push_back(p.fqn);
  check(missing.empty(), path + ": native checkpoint lacks " + std::to_string(missing.size()) +
                             " parameter(s), e.g. '" + (missing.empty() ? "" : missing[0]) +
                             "'; for a Hugging Face directory set checkpoint.initial_load_in_hf");
}

// The data held for p (all of it, or its tensor/expert-parallel slice), elements [a, z), of
// tensor `name` of a native set.
void read_held(const SafetensorsSet& set, const std::string& name, const models::ParamInfo& p,
               int64_t a, int64_t z, float* dst) {
  models::for_each_whole_run(p, a, z, [&](int64_t w, int64_t l, int64_t len) {
    set.read_f32_range(name, p.shape, w, w + len, dst + (l - a));
  });
}

// A native set's weights into a model that holds slices (or, with unit_done, unit by unit): the
// files of `sets` checked first (one hashing pass over the mappings), then only the data held
// read, and the buffers the set has.
void read_weights_held(models::Model& model, const SafetensorsSet& weights, const std::string& dir,
                       const std::optional<std::map<std::string, FileSum>>& sums,
                       const UnitDone& unit_done,
                       std::initializer_list<const SafetensorsSet*> sets) {
  if (sums) {
    std::map<std::string, Mapped> mapped;
    for (const auto& [name, f] : files_in(dir, sets)) mapped[name] = {f->bytes(), f->size()};
    verify_checksums(dir, mapped);
  }
  check_params_present(model, weights, dir);
  for_each_unit(model, unit_done, [&](const models::ParamInfo& p) {
    read_held(weights, p.fqn, p, 0, p.numel, model.param_data() + p.offset);
  });
  for (const auto& b : model.buffers())
    if (weights.find(b.fqn)) weights.read_f32(b.fqn, b.shape, b.data);
}

void read_weights(models::Model& model, const SafetensorsSet& set, const std::string& path, bool hf,
                  const std::optional<std::map<std::string, FileSum>>& sums, const Segments* only) {
  if (hf) {
    Progress progress("loading " + path, set.total_bytes());
    set.set_progress(&progress);
    try {
      model.load_hf(set, path, only);
    } catch (...) {
      set.set_progress(nullptr);
      throw;
    }
    set.set_progress(nullptr);
    return;
  }
  if (std::any_of(model.params().begin(), model.params().end(),
                  [](const models::ParamInfo& p) { return p.split_dim >= 0; })) {
    read_weights_held(model, set, path, sums, {}, {&set});
    return;
  }
  check_params_present(model, set, path);
  std::vector<Want> wants;
  for (const auto& p : model.params())
    if (!p.alias) wants.push_back({p.fqn, p.shape, model.param_data() + p.offset});
  for (const auto& b : model.buffers())  // absent in a model-only export: stays zero
    if (set.find(b.fqn)) wants.push_back({b.fqn, b.shape, b.data});
  read_native(set, wants, sums);
}

}  // namespace

void load_model_weights(models::Model& model, const std::string& path, bool hf, bool verify,
                        const Segments* only) {
  std::error_code ec;
  std::optional<std::map<std::string, FileSum>> sums;
  if (verify && fs::is_directory(path, ec) && fs::exists(fs::path(path) / kChecksumsName, ec))
    sums = precheck_dir(path);
  if (!hf && fs::exists(fs::path(path) / kShardedIndexName, ec)) {
    ShardedDir(path, sums).read_weights(model);
    return;
  }
  // Adapters (PEFT's adapter_model.safetensors) in a directory: that file.
  const bool adapter =
      hf && model.hf_weights_file() != "model.safetensors" && fs::is_directory(path, ec);
  SafetensorsSet set =
      SafetensorsSet::open(adapter ? (fs::path(path) / model.hf_weights_file()).string() : path);
  if (sums && hf) {  // the model reads in its own order: check first, hashing the mappings
    std::map<std::string, Mapped> mapped;
    for (const auto& [name, f] : files_in(path, {&set})) mapped[name] = {f->bytes(), f->size()};
    verify_checksums(path, mapped);
    sums.reset();
  }
  verify_rest(path, sums, {&set});
  read_weights(model, set, path, hf, sums, only);
}

void load_model_and_adapter(models::Model& model, const std::string& path, bool hf,
                            const std::string& adapter_path) {
  models::Model* base = model.frozen_base();
  load_model_weights(base ? *base : model, path, hf);
  if (base) base->release_masters();  // frozen under bf16: the projections as their copy only
  if (adapter_path.empty()) return;
  check(base != nullptr,
        "lora.adapter_path '" + adapter_path + "' given to a model without adapters");
  load_model_weights(model, adapter_path, true);
  log::info("LoRA: adapters from " + adapter_path);
}

// Beside an export's weights: config.json (from the source's, for the fields titan does not
// model), generation_config.json and the source's tokenizer files.
void write_hf_extras(const fs::path& tmp, const models::Model& model, const std::string& dtype,
                     const std::string& source_dir) {
  json base;
  if (!source_dir.empty() && fs::exists(fs::path(source_dir) / "config.json"))
    base = read_json(fs::path(source_dir) / "config.json");
  write_json(tmp / model.hf_config_file(), model.hf_config(base, dtype));
  test::kill_point("export:config");
  json gen = {{"_from_model_config", true}};
  if (!source_dir.empty() && fs::exists(fs::path(source_dir) / "generation_config.json")) {
    gen = read_json(fs::path(source_dir) / "generation_config.json");
  } else {
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (base.contains(k)) gen[k] = base[k];
  }
  write_json(tmp / "generation_config.json", gen);
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"})
    if (!source_dir.empty() && fs::exists(fs::path(source_dir) / f)) {
      fs::copy_file(fs::path(source_dir) / f, tmp / f, ec);
      check(!ec, "cannot copy " + (fs::path(source_dir) / f).string() + " to " +
                     (tmp / f).string() + " (" + ec.message() + ")");
    }
}

void HfPart::add_unit(const models::Model& model, int64_t unit, const std::string& dtype) {
  const DType dt = export_dtype(dtype);
  for (const auto& t : model.hf_tensors()) {
    if (model.param(t.fqn).group != unit) continue;
    const int64_t n = numel_of(t.shape);
    storage_.emplace_back(static_cast<size_t>(n) * dtype_size(dt));
    f32_to(dt, model.param_data() + t.offset, n, storage_.back().data());
    tensors_.push_back({t.key, dt, t.shape, storage_.back().data()});
  }
}

json HfPart::write(const std::string& tmp, int64_t part, int64_t parts) const {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors",
                static_cast<long long>(part + 1), static_cast<long long>(parts));
  const std::string path = (fs::path(tmp) / name).string();
  write_file(path, tensors_, {{"format", "pt"}});
  json map = json::object();
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    map[tensors_[i].name] = name;
    bytes += static_cast<int64_t>(storage_[i].size());
  }
  return {
      {"weight_map", map}, {"total_size", bytes}, {"sums", {{name, file_checksum_entry(path)}}}};
}

void export_hf(const std::string& dir, const models::Model& model, const std::string& dtype,
               const std::string& source_dir, int64_t max_shard_bytes) {
  const DType dt = export_dtype(dtype);
  const fs::path dst(dir);
  std::error_code ec;
  fs::create_directories(dst.parent_path().empty() ? "." : dst.parent_path(), ec);
  check(!ec, "cannot create " + dst.parent_path().string() + " (" + ec.message() + ")");
  const fs::path tmp = temp_sibling(dst);
  try {
    std::vector<std::vector<uint8_t>> storage;
    if (model.hf_weights_file() == "model.safetensors")
      write_model(tmp.string(), model_tensors(model, dt, true, &storage), max_shard_bytes,
                  {{"format", "pt"}});
    else  // adapters (PEFT's adapter_model.safetensors): small, one file
      write_file((tmp / model.hf_weights_file()).string(), model_tensors(model, dt, true, &storage),
                 {{"format", "pt"}});
    test::kill_point("export:model");
    write_hf_extras(tmp, model, dtype, source_dir);
    write_checksums(tmp.string());
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const Error& e) {
    fs::remove_all(tmp, ec);
    throw Error("cannot export the model to " + dir + " (nothing was left there): " + e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

Checkpointer::Checkpointer(const config::JobConfig& cfg) : cfg_(cfg) {
  check_dump_folder(cfg);
  folder_ = (fs::path(cfg.dump_folder) / cfg.checkpoint.folder).string();
}

void Checkpointer::clean_stale() {
  std::error_code ec;
  if (!fs::is_directory(folder_, ec)) return;
  std::vector<std::string> removed, restored;
  for (const auto& e : fs::directory_iterator(folder_, ec)) {
    std::string base, kind;
    int64_t pid = 0;
    const std::string name = e.path().filename().string();
    if (!io::parse_temp_name(name, &base, &kind, &pid) || parse_step(base) < 0 ||
        io::owner_alive(pid, e.path().string()))
      continue;
    const fs::path step_dir = fs::path(folder_) / base;
    std::error_code rec;
    if (kind == "old" && !fs::exists(step_dir, rec)) {
      rename_or_throw(e.path(), step_dir);  // killed between the two renames of a replacement
      restored.push_back(name);
      continue;
    }
    fs::remove_all(e.path(), rec);
    check(!rec, "cannot remove " + e.path().string() + ", left by a killed run (" + rec.message() +
                    "); remove it by hand");
    removed.push_back(name);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string r;
    for (const auto& n : v) r += (r.empty() ? "" : ", ") + n;
    return r;
  };
  if (!removed.empty())
    log::info("Removed " + std::to_string(removed.size()) + " unfinished folder(s) left in " +
              folder_ + " by a killed run: " + join(removed));
  if (!restored.empty())
    log::info("Restored " + join(restored) + " in " + folder_ +
              " (a run was killed while replacing it)");
}

std::optional<TrainState> Checkpointer::load(models::Model& model, float* exp_avg,
                                             float* exp_avg_sq, const Segments& opt,
                                             const UnitDone& unit_done) {
  const auto& k = cfg_.checkpoint;
  const int64_t steps = cfg_.training.steps;
  const Segments* slices = unit_done ? &opt : nullptr;
  const bool held = std::any_of(model.params().begin(), model.params().end(),
                                [](const models::ParamInfo& p) { return p.split_dim >= 0; });
  if (k.enable) clean_stale();
  const std::vector<StepDir> dirs = k.enable ? step_dirs(folder_) : std::vector<StepDir>{};
  if (!dirs.empty()) {
    const StepDir* pick = &dirs.back();
    if (k.load_step >= 0) {
      auto it = std::find_if(dirs.begin(), dirs.end(),
                             [&](const StepDir& d) { return d.step == k.load_step; });
      if (it == dirs.end()) {
        std::string have;
        for (const auto& d : dirs) have += (have.empty() ? "" : ", ") + std::to_string(d.step);
        throw Error("checkpoint.load_step " + std::to_string(k.load_step) +
                    " has no checkpoint in " + folder_ + " (steps there: " + have + ")");
      }
      pick = &*it;
    }
    const std::string dir = pick->path.string();
    check(pick->step <= steps,
          dir + " is at step " + std::to_string(pick->step) +
              ", past training.steps = " + std::to_string(steps) +
              ": raise --training.steps, resume an earlier step with --checkpoint.load_step, "
              "or use another dump_folder");
    if (pick->kind == Kind::Incomplete)
      throw Error(dir + " lacks " + pick->lacks + " (an incomplete or damaged checkpoint)" +
                  older_hint(dirs, pick->step));
    if (pick->kind == Kind::ModelOnly) {
      if (pick->step == steps) {
        TrainState st;
        st.step = pick->step;
        st.finished = true;
        st.path = dir;
        log::info(dir + " holds the model exported at the end of training");
        return st;
      }
      const std::string why = dir +
                              " holds only the model exported at the end of a run "
                              "(checkpoint.last_save_model_only), which cannot resume "
                              "training";
      auto full = std::find_if(dirs.rbegin(), dirs.rend(),
                               [&](const StepDir& d) { return d.kind == Kind::Full; });
      check(k.load_step < 0 && full != dirs.rend() && full->step < pick->step,
            why + "; to train on from its weights, use --checkpoint.initial_load_path " + dir +
                " with another dump_folder");
      log::warn(why + "; resuming from " + full->path.string() +
                ", the newest full checkpoint, instead");
      pick = &*full;
    }
    try {
      return load_full(model, exp_avg, exp_avg_sq, opt, unit_done, pick->path.string(), pick->step);
    } catch (const Error& e) {
      if (k.load_step >= 0) throw;
      throw Error(std::string(e.what()) + older_hint(dirs, pick->step));
    }
  }
  if (!k.initial_load_path.empty()) {
    load_model_weights(model, k.initial_load_path, k.initial_load_in_hf, true, slices);
    log::info("Loaded initial weights from " + k.initial_load_path +
              ((slices && k.initial_load_in_hf) || held ? " (this rank's slices)" : ""));
  } else if (k.initial_load_in_hf) {
    load_model_weights(model, cfg_.model.hf_assets_path, true, true, slices);
    log::info("Loaded Hugging Face weights from " + cfg_.model.hf_assets_path +
              (slices || held ? " (this rank's slices)" : ""));
  }
  return std::nullopt;
}

TrainState Checkpointer::load_full(models::Model& model, float* exp_avg, float* exp_avg_sq,
                                   const Segments& segs, const UnitDone& unit_done,
                                   const std::string& dir, int64_t step) {
  const int64_t n = model.num_params();
  const Segments opt = segs.empty() ? Segments{{0, n}} : segs;
  const auto sums = precheck_dir(dir);
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kShardedIndexName, ec)) {
    const ShardedDir sharded(dir, sums);
    TrainState st = read_train_state(dir, step);
    sharded.read_weights(model, unit_done);
    // The moments' slices that overlap this rank's range.
    for (const Slice& sl : slices_in(model, opt)) {
      sharded.read_held("exp_avg." + sl.p->fqn, *sl.p, sl.begin, sl.end, exp_avg + sl.at);
      sharded.read_held("exp_avg_sq." + sl.p->fqn, *sl.p, sl.begin, sl.end, exp_avg_sq + sl.at);
    }
    log::info("Resuming from sharded checkpoint " + dir + " at step " + std::to_string(st.step));
    return st;
  }
  SafetensorsSet weights = SafetensorsSet::open(dir);
  SafetensorsSet opt_set = SafetensorsSet::open((fs::path(dir) / "optimizer.safetensors").string());
  verify_rest(dir, sums, {&weights, &opt_set});  // train_state.json
  TrainState st = read_train_state(dir, step);
  const bool whole = opt.size() == 1 && opt[0].begin == 0 && opt[0].len == n &&
                     std::none_of(model.params().begin(), model.params().end(),
                                  [](const models::ParamInfo& p) { return p.split_dim >= 0; });
  if (!whole || unit_done) {
    // A shard of the state: every file checked first (one hashing pass over the mappings), then
    // the weights copied unit by unit and only this rank's slices of the moments.
    read_weights_held(model, weights, dir, sums, unit_done, {&weights, &opt_set});
    for (const Slice& sl : slices_in(model, opt))
      for (const auto& [name, dst] : {std::pair{"exp_avg." + sl.p->fqn, exp_avg},
                                      std::pair{"exp_avg_sq." + sl.p->fqn, exp_avg_sq}}) {
        const TensorView* t = opt_set.find(name);
        check(t != nullptr && t->dtype == DType::F32 && t->shape == sl.p->shape,
              opt_set.path() + ": tensor '" + name + "' must be F32 of the parameter's shape");
        read_held(opt_set, name, *sl.p, sl.begin, sl.end, dst + sl.at);
      }
    log::info("Resuming from checkpoint " + dir + " at step " + std::to_string(st.step));
    return st;
  }
  read_weights(model, weights, dir, false, sums, nullptr);
  std::vector<Want> moments;
  for (const auto& p : model.params()) {
    if (p.alias) continue;
    moments.push_back({"exp_avg." + p.fqn, p.shape, exp_avg + p.offset});
    moments.push_back({"exp_avg_sq." + p.fqn, p.shape, exp_avg_sq + p.offset});
  }
  read_native(opt_set, moments, sums);
  log::info("Resuming from checkpoint " + dir + " at step " + std::to_string(st.step));
  return st;
}

void Checkpointer::maybe_save(const TrainState& st, bool last, const models::Model& model,
                              const float* exp_avg, const float* exp_avg_sq) {
  const auto& k = cfg_.checkpoint;
  if (!due(st.step, last)) return;
  const fs::path dst = fs::path(folder_) / step_name(st.step);
  std::error_code ec;
  fs::create_directories(folder_, ec);
  check(!ec, "cannot create the checkpoint folder " + folder_ + " (" + ec.message() + ")");
  if (last && k.last_save_model_only) {
    if (k.last_save_in_hf && cfg_.lora.merge_on_export && model.frozen_base_weights() > 0) {
      // LoRA merged into the base weights for the export, which then get their own bits back.
      auto& m = const_cast<models::Model&>(model);
      m.merge_adapters(true);
      try {
        export_hf(dst.string(), *m.frozen_base(), k.export_dtype, cfg_.model.hf_assets_path);
      } catch (...) {
        m.merge_adapters(false);
        throw;
      }
      m.merge_adapters(false);
    } else if (k.last_save_in_hf) {
      export_hf(dst.string(), model, k.export_dtype, cfg_.model.hf_assets_path);
    } else {
      const fs::path tmp = temp_sibling(dst);
      try {
        std::vector<std::vector<uint8_t>> storage;
        write_file((tmp / "model.safetensors").string(),
                   model_tensors(model, export_dtype(k.export_dtype), false, &storage));
        test::kill_point("export:model");
        write_checksums(tmp.string());
        io::fsync_dir(tmp.string());
        commit_dir(tmp, dst);
      } catch (const Error& e) {
        fs::remove_all(tmp, ec);
        throw Error("cannot export the model to " + dst.string() +
                    " (nothing was left there): " + e.what());
      }
    }
    log::info("Saved the model (" + k.export_dtype + (k.last_save_in_hf ? ", Hugging Face" : "") +
              ") to " + dst.string());
    return;
  }
  const fs::path tmp = temp_sibling(dst);
  try {
    std::vector<std::vector<uint8_t>> storage;
    write_file((tmp / "model.safetensors").string(),
               model_tensors(model, DType::F32, false, &storage));
    test::kill_point("save:model");
    std::vector<WriteTensor> opt;
    for (const auto& p : model.params()) {
      if (p.alias) continue;
      opt.push_back({"exp_avg." + p.fqn, DType::F32, p.shape, exp_avg + p.offset});
      opt.push_back({"exp_avg_sq." + p.fqn, DType::F32, p.shape, exp_avg_sq + p.offset});
    }
    write_file((tmp / "optimizer.safetensors").string(), opt);
    test::kill_point("save:optimizer");
    write_train_state(tmp, st);
    test::kill_point("save:train_state");
    write_checksums(tmp.string());
    test::kill_point("save:checksums");
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const Error& e) {
    fs::remove_all(tmp, ec);
    throw Error("cannot save checkpoint " + dst.string() +
                " (the partial copy was removed; earlier checkpoints are intact): " + e.what());
  }
  log::info("Saved checkpoint " + dst.string());
  purge();
}

std::string Checkpointer::sharded_begin(int64_t step) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  check(!ec, "cannot create the checkpoint folder " + folder_ + " (" + ec.message() + ")");
  return temp_sibling(fs::path(folder_) / step_name(step)).string();
}

json Checkpointer::write_shard(const std::string& tmp, int64_t writer, int64_t writers,
                               const Segments& segs, const models::Model& model,
                               const float* params, const float* exp_avg, const float* exp_avg_sq,
                               bool with_replicated) const {
  const std::string name = shard_file_name(writer, writers);
  const std::string path = (fs::path(tmp) / name).string();
  std::vector<WriteTensor> tensors;
  json slices = json::object();
  for (const Slice& sl : slices_in(model, segs)) {
    if (!with_replicated && sl.p->split_dim < 0) continue;
    const std::vector<int64_t> shape{sl.end - sl.begin};
    const float* w = params ? params + sl.at : model.param_data() + sl.p->offset + sl.begin;
    tensors.push_back({sl.p->fqn, DType::F32, shape, w});
    tensors.push_back({"exp_avg." + sl.p->fqn, DType::F32, shape, exp_avg + sl.at});
    tensors.push_back({"exp_avg_sq." + sl.p->fqn, DType::F32, shape, exp_avg_sq + sl.at});
    json entries = json::array();
    run_groups(*sl.p, sl.begin, sl.end,
               [&](const RunGroup& g) { entries.push_back(g.to_json(name)); });
    for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."})
      for (const auto& e : entries) slices[prefix + sl.p->fqn].push_back(e);
  }
  if (writer == 0)
    for (const auto& b : model.buffers()) {
      tensors.push_back({b.fqn, DType::F32, {numel_of(b.shape)}, b.data});
      slices[b.fqn].push_back(json::array({name, 0, numel_of(b.shape)}));
    }
  write_file(path, tensors, {{"titan_shard", std::to_string(writer)}});
  test::kill_point("save:shard");
  return {{"sums", {{name, file_checksum_entry(path)}}}, {"slices", slices}};
}

void Checkpointer::sharded_commit(const std::string& tmp_dir, const TrainState& st,
                                  const models::Model& model, const json& written) {
  const fs::path tmp(tmp_dir), dst = fs::path(folder_) / step_name(st.step);
  const int64_t shards = static_cast<int64_t>(written.size());
  try {
    json tensors = json::object(), sums = json::object();
    for (const auto& p : model.params())
      if (!p.alias)
        for (const char* prefix : {"", "exp_avg.", "exp_avg_sq."})
          tensors[prefix + p.fqn] = {{"shape", p.shape}, {"slices", json::array()}};
    for (const auto& b : model.buffers())
      tensors[b.fqn] = {{"shape", b.shape}, {"slices", json::array()}};
    bool strided = false;
    for (const auto& w : written) {
      sums.update(w.at("sums"));
      for (const auto& [name, entries] : w.at("slices").items())
        for (const auto& e : entries) {
          strided = strided || e.size() > 3;
          tensors.at(name)["slices"].push_back(e);
        }
    }
    write_json(tmp / kShardedIndexName, {{"format", "titan-sharded-checkpoint"},
                                         {"version", strided ? 2 : 1},
                                         {"shards", shards},
                                         {"tensors", tensors}});
    write_train_state(tmp, st);
    test::kill_point("save:train_state");
    write_checksums(tmp.string(), sums);
    test::kill_point("save:checksums");
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error("cannot save checkpoint " + dst.string() +
                " (the partial copy was removed; earlier checkpoints are intact): " + e.what());
  }
  log::info("Saved sharded checkpoint " + dst.string() + " (" + std::to_string(shards) +
            " shards written in parallel)");
  purge();
}

void Checkpointer::hf_parts_commit(const std::string& tmp_dir, int64_t step,
                                   const models::Model& model, const json& parts) {
  const auto& k = cfg_.checkpoint;
  const fs::path tmp(tmp_dir), dst = fs::path(folder_) / step_name(step);
  try {
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    json sums = json::object();
    int64_t total = 0;
    for (const auto& p : parts) {
      total += p.at("total_size").get<int64_t>();
      index["weight_map"].update(p.at("weight_map"));
      sums.update(p.at("sums"));
    }
    index["metadata"]["total_size"] = total;
    write_json(tmp / "model.safetensors.index.json", index);
    write_hf_extras(tmp, model, k.export_dtype, cfg_.model.hf_assets_path);
    write_checksums(tmp.string(), sums);
    io::fsync_dir(tmp.string());
    commit_dir(tmp, dst);
  } catch (const Error& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error("cannot export the model to " + dst.string() +
                " (nothing was left there): " + e.what());
  }
  log::info("Saved the model (" + k.export_dtype + ", Hugging Face) to " + dst.string() + " (" +
            std::to_string(parts.size()) + " files written in parallel)");
}

void Checkpointer::purge() {
  const int64_t keep = cfg_.checkpoint.keep_latest_k;
  if (keep <= 0) return;
  std::vector<StepDir> full;
  for (auto& d : step_dirs(folder_))
    if (d.kind == Kind::Full) full.push_back(d);
  for (size_t i = 0; i + static_cast<size_t>(keep) < full.size(); ++i) {
    // Renamed first, so a run killed while removing leaves a .del folder, not a half step-N.
    const fs::path del = full[i].path.string() + ".del-" + std::to_string(getpid());
    std::error_code ec;
    fs::rename(full[i].path, del, ec);
    if (ec) continue;
    test::kill_point("save:purge");
    fs::remove_all(del, ec);
  }
}

}  // namespace titan::ckpt
