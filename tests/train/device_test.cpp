// Training on a device other than the CPU (models::Model::device(), BuildOptions::device,
// training.device), checked on a stand-in device: "hostdev", whose backend is the CPU kernels
// over memory of its own (host memory through its alloc/copy/memset). What a device run adds to
// a CPU run is data movement: the weights' host copy fetched and sent, the batch copied, the MoE
// statistics fetched, the expert biases sent, AdamW's moments staged for checkpoints. With the
// same kernels in the same order a device run must give the CPU run's bits exactly; a missing
// copy shows as a different loss. hostdev also reserves address ranges and commits them a page at
// a time (FSDP's flat buffers), pages given back made inaccessible, so that a touch of memory
// given back faults; "hostwhole" is the same device without that (buffers allocated whole).
// (That device pointers are never dereferenced on the host is what a real GPU checks:
// scripts/gpu-check.sh.)
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/run_util.h"
#include "test_util.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/core/error.h"
#include "titan/dist/communicator.h"
#include "titan/dist/device_group.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/spec.h"
#include "titan/models/registry.h"
#include "titan/ops/backend.h"
#include "titan/ops/experts_op.h"
#include "titan/ops/rope_op.h"
#include "titan/optim/kernels.h"
#include "titan/plugin/registry.h"
#include "titan/tools/check_kernel.h"
#include "titan/tools/memory_plan.h"
#include "titan/train/evaluate.h"
#include "titan/train/trainer.h"

namespace titan::train {
namespace {

int g_allocs = 0;
void* dev_alloc(size_t n) {
  ++g_allocs;
  void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}
// hostdev's reserved ranges (core/device.h reserve/commit/decommit) with a page for granule: an
// inaccessible mapping (PROT_NONE) whose pages commit makes readable and writable and decommit
// gives back and makes inaccessible again, so that a touch of memory FSDP gave back faults, as
// it would on a GPU.
struct Reserved {
  size_t size = 0;
  std::vector<char> committed;  // per page
};
std::map<uintptr_t, Reserved> g_reserved;  // by base
int64_t g_committed_pages = 0, g_peak_committed_pages = 0;
size_t page_bytes() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }
std::pair<uintptr_t, Reserved*> reserved_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_reserved.upper_bound(a);
  if (it == g_reserved.begin() || a >= std::prev(it)->first + std::prev(it)->second.size)
    throw std::logic_error("hostdev: commit/decommit outside every reserved range");
  return {std::prev(it)->first, &std::prev(it)->second};
}
void* dev_reserve(size_t n) {
  const size_t P = page_bytes(), size = (n + P - 1) / P * P;
  void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  g_reserved[reinterpret_cast<uintptr_t>(p)] = {size, std::vector<char>(size / P, 0)};
  return p;
}
void dev_commit(void* p, size_t n) {
  const auto [base, r] = reserved_of(p);
  const size_t P = page_bytes(), lo = reinterpret_cast<uintptr_t>(p) - base;
  for (size_t g = lo / P; g <= (lo + n - 1) / P; ++g) {
    if (r->committed[g]) continue;
    if (::mprotect(reinterpret_cast<void*>(base + g * P), P, PROT_READ | PROT_WRITE) != 0)
      throw std::bad_alloc();
    r->committed[g] = 1;  // reads zero: fresh, or given back with MADV_DONTNEED
    g_peak_committed_pages = std::max(g_peak_committed_pages, ++g_committed_pages);
  }
}
void dev_decommit(void* p, size_t n) {
  const auto [base, r] = reserved_of(p);
  const size_t P = page_bytes(), lo = reinterpret_cast<uintptr_t>(p) - base, hi = lo + n;
  for (size_t g = lo / P; g * P < hi; ++g) {
    if (!r->committed[g]) continue;
    const size_t a = std::max(lo, g * P), z = std::min(hi, (g + 1) * P);
    if (z - a < P) {  // in part: zeroed, kept
      std::memset(reinterpret_cast<void*>(base + a), 0, z - a);
      continue;
    }
    void* page = reinterpret_cast<void*>(base + g * P);
    if (::madvise(page, P, MADV_DONTNEED) != 0 || ::mprotect(page, P, PROT_NONE) != 0)
      throw std::logic_error("hostdev: decommit failed");
    r->committed[g] = 0;
    --g_committed_pages;
  }
}
void dev_free(void* p) {
  const auto it = g_reserved.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_reserved.end()) {
    std::free(p);
    return;
  }
  for (char c : it->second.committed) g_committed_pages -= c;
  ::munmap(p, it->second.size);
  g_reserved.erase(it);
}
void dev_copy(void* d, const void* s, size_t n) {
  if (n) std::memcpy(d, s, n);
}
void dev_memset(void* d, int v, size_t n) {
  if (n) std::memset(d, v, n);
}

// Registers a stand-in device's backends and optimizer kernels (once per process) and its RoPE
// and grouped-experts ops (again after a test reset the op table): "hostdev", and "hostwhole",
// the same without reserve/commit/decommit (a device whose buffers are allocated whole).
void register_device(const std::string& name, bool reserve) {
  static std::vector<std::string> done;
  if (std::find(done.begin(), done.end(), name) == done.end()) {
    done.push_back(name);
    for (ops::Backend b : {ops::cpu_backend(), ops::cpu_bf16_backend()}) {
      b.device = name;
      b.alloc = &dev_alloc;
      b.free = &dev_free;
      b.copy = &dev_copy;
      b.memset = &dev_memset;
      if (reserve) {
        b.reserve = &dev_reserve;
        b.commit = &dev_commit;
        b.decommit = &dev_decommit;
      }
      ops::register_backend(b);
    }
    optim::Kernels k = optim::kernels("cpu");
    k.device = name;
    optim::register_kernels(k);
  }
  plugin::Registry& reg = plugin::Registry::global();
  if (reg.ops().has(ops::RopeOp::kKind, "cos_sin_rope", name, "float32")) return;
  for (ops::RopeOp op : {ops::cos_sin_rope_op()}) {
    op.device = name;
    reg.add_op(op);
  }
  for (ops::GroupedExpertsOp op : {ops::grouped_experts_op(), ops::grouped_experts_bf16_op()}) {
    op.device = name;
    reg.add_op(op);
  }
}
void register_hostdev() { register_device("hostdev", true); }

config::JobConfig job(const std::string& device, bool moe, bool bf16) {
  config::JobConfig c = titan::testing::tiny_model_job();
  if (moe) {
    c.model.flavor = "debugmodel_moe";
    c.model.num_experts = 4;
    c.model.top_k = 2;
    c.model.moe_hidden_dim = 32;
    c.model.load_balance_coeff = 1e-3;  // the expert biases: sent to the device every pass
    c.model.router_aux_loss = true;     // the aux loss's sums: fetched from it
  }
  c.training.device = device;
  c.training.local_batch_size = 2;
  c.training.global_batch_size = 4;  // two microbatches: gradients accumulate on the device
  c.training.seq_len = 32;
  c.training.steps = 4;
  c.training.mixed_precision_param = bf16 ? "bfloat16" : "float32";
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 11;
  c.metrics.peak_flops = 1e12;  // no GEMM probe
  return c;
}

struct Trained {
  std::vector<double> loss, norm, aux;
  std::vector<StepMetrics::ExpertLoad> load;
  std::vector<float> params;
  // hostdev's reserved ranges (FSDP's flat buffers): pages reserved, committed at most during
  // the run, and committed once it ended (between steps nothing is gathered).
  int64_t reserved_pages = 0, peak_pages = 0, pages_after = 0;
};

Trained train_steps(const config::JobConfig& c, int steps) {
  g_peak_committed_pages = g_committed_pages;
  Trainer t(c, titan::testing::fox_docs());
  Trained r;
  for (int i = 0; i < steps; ++i) {
    const StepResult s = t.step();
    r.loss.push_back(s.loss);
    r.norm.push_back(s.grad_norm);
    r.aux.push_back(s.aux_loss);
    r.load.insert(r.load.end(), s.expert_load.begin(), s.expert_load.end());
  }
  const models::Model& m = t.model();
  r.params.assign(m.store().param_data(), m.store().param_data() + m.num_params());
  for (const auto& [base, range] : g_reserved)
    r.reserved_pages += static_cast<int64_t>(range.committed.size());
  r.peak_pages = g_peak_committed_pages;
  r.pages_after = g_committed_pages;
  return r;
}

void expect_same(const Trained& a, const Trained& b, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_EQ(a.loss[i], b.loss[i]) << what << " step " << i + 1;
    EXPECT_EQ(a.norm[i], b.norm[i]) << what << " step " << i + 1;
    if (!std::isnan(a.aux[i])) {
      EXPECT_EQ(a.aux[i], b.aux[i]) << what << " step " << i + 1;
    }
  }
  ASSERT_EQ(a.load.size(), b.load.size());
  for (size_t i = 0; i < a.load.size(); ++i) {
    EXPECT_EQ(a.load[i].min, b.load[i].min) << what;
    EXPECT_EQ(a.load[i].max, b.load[i].max) << what;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), 4 * a.params.size()), 0) << what;
}

TEST(DeviceTraining, DenseAndMoeFp32AndBf16GiveTheCpuRunsBits) {
  register_hostdev();
  for (const bool moe : {false, true})
    for (const bool bf16 : {false, true}) {
      const std::string what = std::string(moe ? "moe" : "dense") + (bf16 ? " bf16" : " fp32");
      const int before = g_allocs;
      const Trained cpu = train_steps(job("cpu", moe, bf16), 3);
      EXPECT_EQ(g_allocs, before) << what << ": a CPU run allocated device memory";
      const Trained dev = train_steps(job("hostdev", moe, bf16), 3);
      EXPECT_GT(g_allocs, before) << what << ": the device run used no device memory";
      EXPECT_LT(cpu.loss[2], cpu.loss[0]) << what;
      if (moe) {
        EXPECT_FALSE(std::isnan(cpu.aux[0])) << what;
      }
      expect_same(cpu, dev, what);
    }
}

// LoRA on a device: the adapters, their gradients, scratch and dropout masks in its memory, the
// frozen base there too; the CPU run's bits, fp32 and bf16 (the base's GEMMs in bf16, the adapters
// in fp32).
TEST(DeviceTraining, LoraGivesTheCpuRunsBits) {
  register_hostdev();
  for (const bool bf16 : {false, true}) {
    config::JobConfig cpu = job("cpu", false, bf16), dev = job("hostdev", false, bf16);
    for (auto* c : {&cpu, &dev}) {
      c->lora.rank = 4;
      c->lora.alpha = 8;
      c->lora.dropout = 0.1;  // the masks drawn on the device (ops::dropout)
      c->optimizer.lr = 1e-2;
    }
    const Trained a = train_steps(cpu, 3), b = train_steps(dev, 3);
    EXPECT_LT(a.loss[2], a.loss[0]) << (bf16 ? "bf16" : "fp32");
    expect_same(a, b, bf16 ? "lora bf16" : "lora fp32");
  }
}

// A checkpoint saved by a device run (weights fetched, AdamW's moments staged through the host)
// resumes on the device, and on the CPU, to the uninterrupted run's bits.
TEST(DeviceTraining, CheckpointsResumeOnTheDeviceAndOnTheCpu) {
  register_hostdev();
  const std::string dir = titan::testing::fresh_temp_dir("device_ckpt");
  config::JobConfig c = job("hostdev", true, false);
  const Trained whole = train_steps(c, 4);
  c.dump_folder = dir;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.last_save_model_only = false;  // step 2 is the run's last: keep the full state
  c.training.steps = 2;
  {
    Trainer t(c, titan::testing::fox_docs());
    t.train();
  }
  for (const std::string device : {"hostdev", "cpu"}) {
    config::JobConfig r = c;
    r.training.device = device;
    r.training.steps = 4;
    Trainer t(r, titan::testing::fox_docs());
    ASSERT_EQ(t.current_step(), 2) << device;
    for (int i = 2; i < 4; ++i) {
      const StepResult s = t.step();
      EXPECT_EQ(s.loss, whole.loss[static_cast<size_t>(i)]) << device << " step " << i + 1;
      EXPECT_EQ(s.grad_norm, whole.norm[static_cast<size_t>(i)]) << device << " step " << i + 1;
    }
  }
  std::filesystem::remove_all(dir);
}

// FSDP, expert and tensor parallelism on a device (train/fsdp.h, train/expert_parallel.h,
// train/tensor_parallel.h): masters, gradient shard, staging, dispatched rows and the TP
// activations in its memory, the copies, bf16 rounding and widening, gradient sums, row moves,
// the vocabulary-parallel embedding and loss through its backend, the collectives over its memory
// (dist/device_group.h; for hostdev, whose memory is the host's, an MPI group). The test runs
// itself on 2 ranks under mpirun; each rank trains FSDP 2 (with EP 2 over the same ranks), or
// TP 2 (sequence parallel on and off), on the CPU and then on hostdev and expects the bits (fp32
// and bf16, dense and MoE), and a sharded checkpoint the hostdev run writes (masters and moments
// fetched) resumes on the CPU to the uninterrupted run's bits.
TEST(DeviceTraining, ParallelismOnTwoRanksGivesTheCpuRunsBits) {
  const std::string name = "DeviceTraining.ParallelismOnTwoRanksGivesTheCpuRunsBits";
  const char* shared = std::getenv("TITAN_DEVICE_FSDP_DIR");
  if (!shared) {  // the launcher
    if (!dist_test::have_mpirun()) GTEST_SKIP() << "mpirun not found";
    const std::string dir = titan::testing::fresh_temp_dir("device_fsdp");
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const auto r = dist_test::sh(dist_test::mpirun(2, "-x TITAN_DEVICE_FSDP_DIR=" + dir) + self +
                                 " --gtest_color=no --gtest_filter=" + name);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(titan::testing::count_of(r.out, "[  PASSED  ] 1 test"), 2) << r.out;
    std::filesystem::remove_all(dir);
    return;
  }
  ASSERT_EQ(dist::world().size(), 2);
  register_hostdev();
  register_device("hostwhole", false);
  for (const char* name : {"hostdev", "hostwhole"})
    if (!dist::has_device_group(name))
      dist::register_device_group(name, [](dist::Communicator& h) { return h.split(0, h.rank()); });
  struct Case {
    bool moe, bf16;
    int ep = 1, tp = 1;
    bool sp = true;
  };
  auto parallel_job = [](const std::string& device, const Case& k) {
    config::JobConfig c = job(device, k.moe, k.bf16);
    c.parallelism.data_parallel_shard_degree = k.tp > 1 ? 1 : 2;
    c.parallelism.expert_parallel_degree = k.ep;
    c.parallelism.tensor_parallel_degree = k.tp;
    c.parallelism.enable_sequence_parallel = k.sp;
    c.training.global_batch_size = k.tp > 1 ? 4 : 8;  // two microbatches per rank
    return c;
  };
  Trained moe_bf16;
  const Case cases[] = {{false, false},
                        {false, true},
                        {true, true},
                        {true, false, 2},
                        {true, true, 2},
                        {false, false, 1, 2},
                        {false, true, 1, 2, false},
                        {true, true, 1, 2}};
  for (const Case& k : cases) {
    const std::string what = std::string(k.moe ? "moe" : "dense") + (k.bf16 ? " bf16" : " fp32") +
                             (k.tp > 1 ? std::string(" TP 2") + (k.sp ? " SP" : "") : " FSDP 2") +
                             (k.ep > 1 ? " EP 2" : "");
    const int before = g_allocs;
    const Trained cpu = train_steps(parallel_job("cpu", k), 4);
    const Trained dev = train_steps(parallel_job("hostdev", k), 4);
    EXPECT_GT(g_allocs, before) << what;
    EXPECT_LT(cpu.loss[3], cpu.loss[0]) << what;
    expect_same(cpu, dev, what);
    if (k.tp == 1) {  // FSDP: the flat buffers take device memory only while units are held
      std::printf("%s: %lld pages reserved, at most %lld committed, %lld after the steps\n",
                  what.c_str(), static_cast<long long>(dev.reserved_pages),
                  static_cast<long long>(dev.peak_pages), static_cast<long long>(dev.pages_after));
      EXPECT_GT(dev.reserved_pages, 0) << what;
      EXPECT_LT(dev.peak_pages, dev.reserved_pages) << what;
      EXPECT_LT(4 * dev.pages_after, dev.reserved_pages) << what;
      // A device without reserve: whole buffers, resharding only zeroes; the same bits.
      const Trained whole = train_steps(parallel_job("hostwhole", k), 4);
      EXPECT_EQ(whole.reserved_pages, 0) << what;
      expect_same(cpu, whole, what + " (hostwhole)");
    }
    if (k.moe && k.bf16 && k.ep == 2) moe_bf16 = dev;
  }
  config::JobConfig c = parallel_job("hostdev", Case{true, true, 2});
  c.dump_folder = shared;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.last_save_model_only = false;
  c.training.steps = 2;
  {
    Trainer t(c, titan::testing::fox_docs());
    t.train();
  }
  c.training.device = "cpu";
  c.training.steps = 4;
  Trainer t(c, titan::testing::fox_docs());
  ASSERT_EQ(t.current_step(), 2);
  for (int i = 2; i < 4; ++i) {
    const StepResult s = t.step();
    EXPECT_EQ(s.loss, moe_bf16.loss[static_cast<size_t>(i)]) << "step " << i + 1;
    EXPECT_EQ(s.grad_norm, moe_bf16.norm[static_cast<size_t>(i)]) << "step " << i + 1;
  }
  // The last save of an FSDP run: the Hugging Face export, each unit gathered whole and written
  // by its rank from the host copy, and the native model-only save, every unit gathered into the
  // host copy (on hostdev one at a time on the device) and written by rank 0: the same files from
  // hostdev as from the CPU.
  for (const bool hf : {true, false}) {
    std::vector<std::vector<uint8_t>> files;
    for (const std::string device : {"cpu", "hostdev", "hostwhole"}) {
      config::JobConfig e;
      e.model.hf_assets_path = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/moe_norm";
      e.checkpoint.initial_load_in_hf = true;
      e.training.device = device;
      e.training.mixed_precision_param = "float32";
      e.training.seq_len = 12;
      e.training.local_batch_size = 2;
      e.training.steps = 2;
      e.parallelism.data_parallel_shard_degree = 2;
      e.metrics.peak_flops = 1e12;
      e.metrics.enable_jsonl = false;
      e.checkpoint.enable = true;
      e.checkpoint.last_save_in_hf = hf;
      e.dump_folder = std::string(shared) + (hf ? "/hf_" : "/native_") + device;
      {
        Trainer t(e, titan::testing::fox_docs());
        t.train();
      }
      dist::world().barrier();  // rank 0's files are written
      std::vector<std::filesystem::path> paths;
      for (const auto& f :
           std::filesystem::recursive_directory_iterator(e.dump_folder + "/checkpoint/step-2"))
        if (f.path().extension() == ".safetensors") paths.push_back(f.path());
      std::sort(paths.begin(), paths.end());
      std::vector<uint8_t> all;
      for (const auto& f : paths) {
        std::ifstream in(f, std::ios::binary);
        all.insert(all.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      EXPECT_EQ(paths.size(), hf ? 2u : 1u) << device;
      files.push_back(std::move(all));
    }
    EXPECT_GT(files[0].size(), 1000u);
    for (size_t d : {1, 2})
      EXPECT_EQ(files[0], files[d]) << (hf ? "the Hugging Face export" : "the native save")
                                    << " of FSDP differs on " << (d == 1 ? "hostdev" : "hostwhole");
  }

  // EP over the TP ranks (each rank routing its own rows) is CPU-only: one line on every rank.
  config::JobConfig both = parallel_job("hostdev", Case{true, true, 2, 2});
  EXPECT_NE(titan::testing::error_of([&] {
              Trainer(both, titan::testing::fox_docs());
            }).find("expert parallelism over the tensor-parallel ranks runs on the CPU only"),
            std::string::npos);
}

// The host copy of the weights: written on the host, used by the next pass; changed by the
// optimizer on the device, fetched when read. And the logits come back to the host.
// The model of c for one row of seq_len tokens on the CPU and on hostdev (the same seeded init).
std::pair<std::unique_ptr<models::Model>, std::unique_ptr<models::Model>> cpu_and_device(
    const config::JobConfig& c, int64_t seq_len, uint64_t seed) {
  models::BuildOptions o;
  o.batch = 1;
  o.seq_len = seq_len;
  o.seed = seed;
  auto cpu = models::build_model(c, o);
  o.device = "hostdev";
  return {std::move(cpu), models::build_model(c, o)};
}

// The memory plan of FSDP on a device: the gathered units alone where the device gives memory
// back a granule at a time (hostdev, like a GPU), the whole weights and gradients where it
// cannot (hostwhole); the initial weights' whole copy is the host's, not the device's.
TEST(DeviceTraining, FsdpPlanCountsWhatTheDeviceGivesBack) {
  register_hostdev();
  register_device("hostwhole", false);
  auto has = [](const tools::MemoryPlan& p, const std::string& what) {
    for (const auto& l : p.lines)
      if (l.what.find(what) != std::string::npos) return true;
    return false;
  };
  for (const std::string device : {"cpu", "hostdev", "hostwhole"}) {
    config::JobConfig c = job(device, true, true);
    c.parallelism.data_parallel_shard_degree = 4;
    c.checkpoint.initial_load_path = "/nonexistent/step-1";  // native weights: read whole first
    const tools::MemoryPlan p = tools::plan_memory(c);
    EXPECT_EQ(has(p, "gathered: head group + 2 largest units"), device != "hostwhole")
        << device << "\n"
        << p.format();
    EXPECT_EQ(has(p, "gathered into: whole weights and gradients"), device == "hostwhole")
        << device << "\n"
        << p.format();
    EXPECT_EQ(has(p, "initial weights: whole before sharding"), device == "cpu") << device << "\n"
                                                                                 << p.format();
  }
}

TEST(DeviceModel, HostCopyOfTheWeightsFollowsBothSides) {
  register_hostdev();
  config::JobConfig c = job("hostdev", false, false);
  auto [cpu, dev] = cpu_and_device(c, 8, 3);
  EXPECT_EQ(dev->device(), "hostdev");
  EXPECT_EQ(cpu->device(), "cpu");
  const std::vector<int32_t> ids = {1, 5, 9, 200, 3, 7, 11, 13}, pos = {0, 1, 2, 3, 4, 5, 6, 7};
  const models::Batch b{1, 8, ids.data(), nullptr, pos.data()};
  const int64_t V = cpu->vocab_size();
  auto logits = [&](models::Model& m) {
    std::vector<float> out(static_cast<size_t>(8 * V));
    m.forward_logits(b, out.data());
    return out;
  };
  EXPECT_EQ(logits(*cpu), logits(*dev));
  const int64_t at = cpu->param("norm.weight").offset;
  cpu->store().param_data()[at] = 3.0f;  // written on the host: sent before the next pass
  dev->store().param_data()[at] = 3.0f;
  EXPECT_EQ(logits(*cpu), logits(*dev));
  dev->store().device_param_data()[at] = 5.0f;  // written on the device: fetched when read
  EXPECT_EQ(static_cast<const models::Model&>(*dev).store().param_data()[at], 5.0f);
  cpu->store().param_data()[at] = 5.0f;
  EXPECT_EQ(logits(*cpu), logits(*dev));
}

// Generation on a device: the key/value cache in its memory, the pointer arrays and key counts
// copied there per layer, the logits back: the CPU's logits for a two-sequence prompt and three
// greedy steps (an MoE model: its router and experts too).
TEST(DeviceModel, GenerationGivesTheCpuLogits) {
  register_hostdev();
  config::JobConfig c = job("hostdev", true, false);
  auto [cpu, dev] = cpu_and_device(c, 16, 5);
  auto kc = cpu->generation().new_kv_cache(2, 16), kd = dev->generation().new_kv_cache(2, 16);
  const int64_t V = cpu->vocab_size();
  std::vector<int32_t> tok = {3, 7, 11, 13, 17}, seq = {0, 0, 0, 1, 1};
  for (int step = 0; step < 4; ++step) {
    std::vector<float> a(static_cast<size_t>(2 * V)), b(a.size());
    const auto n = static_cast<int64_t>(tok.size());
    ASSERT_EQ(cpu->generation().forward_cached(*kc, tok.data(), seq.data(), n, a.data()), 2);
    ASSERT_EQ(dev->generation().forward_cached(*kd, tok.data(), seq.data(), n, b.data()), 2);
    EXPECT_EQ(a, b) << "step " << step;
    auto argmax = [&](size_t r) {
      return static_cast<int32_t>(std::max_element(a.begin() + static_cast<int64_t>(r) * V,
                                                   a.begin() + static_cast<int64_t>(r + 1) * V) -
                                  (a.begin() + static_cast<int64_t>(r) * V));
    };
    tok = {argmax(0), argmax(1)};
    seq = {0, 1};
  }
}

TEST(DeviceTraining, WhatRunsOnTheCpuOnlyIsRefusedInOneLine) {
  register_hostdev();
  config::JobConfig c = job("hostdev", false, false);
  models::BuildOptions o;
  o.seq_len = 8;
  o.device = "hostdev";
  auto m = models::build_model(c, o);
  // A microbatch past the model's allocation: the error before any copy to the device.
  const std::vector<int32_t> ids(16, 1), pos(16, 0);
  EXPECT_NE(titan::testing::error_of([&] {
              m->forward_loss({2, 8, ids.data(), ids.data(), pos.data()});
            }).find("microbatch of 2x8 exceeds the model's allocated 1x8"),
            std::string::npos);
  // The ops a model runs are its device's: CPU ops on a device model are refused.
  EXPECT_NE(titan::testing::error_of([&] {
              qwen3::Qwen3Options o;
              o.max_seq = 8;
              o.device = "hostdev";
              qwen3::Qwen3Model(qwen3::args_from_config(c), std::move(o));
            }).find("RoPE op 'cos_sin_rope' runs on cpu, this model computes on hostdev"),
            std::string::npos);
  config::JobConfig u = c;
  u.training.device = "tpu";
  EXPECT_NE(titan::testing::error_of([&] { Trainer t(u, titan::testing::fox_docs()); })
                .find("training.device 'tpu' is not a known device; use cpu or cuda (devices "
                      "with kernels here: cpu"),
            std::string::npos);
}

// titan eval on a device: Hugging Face weights (an MoE fixture) read into the host copy and sent,
// the loss and the logits brought back: the CPU's bits.
TEST(DeviceEval, HuggingFaceWeightsGiveTheCpuLossAndLogits) {
  register_hostdev();
  const std::string dir = titan::testing::fresh_temp_dir("device_eval");
  std::vector<int64_t> ids(2 * 12);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37 + 5) % 1000);
  ckpt::write_file(dir + "/tokens.safetensors", {{"input_ids", DType::I64, {2, 12}, ids.data()}});
  config::JobConfig c;
  c.model.hf_assets_path = std::string(TITAN_SOURCE_DIR) + "/tests/fixtures/hf/moe_norm";
  c.eval.tokens_path = dir + "/tokens.safetensors";
  c.training.seq_len = 12;  // within the fixture's context
  std::vector<std::vector<uint8_t>> logits;
  std::vector<EvalResult> r;
  for (const std::string device : {"cpu", "hostdev"}) {
    c.training.device = device;
    c.eval.logits_out = dir + "/" + device + ".safetensors";
    r.push_back(evaluate(c));
    std::ifstream in(c.eval.logits_out, std::ios::binary);
    logits.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  EXPECT_EQ(r[0].loss, r[1].loss);
  EXPECT_EQ(r[0].tokens, r[1].tokens);
  EXPECT_GT(logits[0].size(), 2u * 12 * 1000 * 4);
  EXPECT_EQ(logits[0], logits[1]);
  std::filesystem::remove_all(dir);
}

// check-kernel --training.device: the device's ops (here its built-in RoPE and experts) against
// the CPU's, their arrays copied there and back; a plugin op without a kernel for the device is
// one error naming the op and the device.
TEST(DeviceCheckKernel, ComparesTheDevicesOpsWithTheCpuOnes) {
  register_hostdev();
  config::JobConfig c = job("hostdev", true, false);
  c.model.load_balance_coeff = 0;
  c.model.router_aux_loss = false;
  EXPECT_TRUE(tools::check_kernels(c));
  c.override_.imports = std::string(TITAN_PLUGIN_DIR) + "/libtitan_token_experts.so";
  const std::string e = titan::testing::error_of([&] { tools::check_kernels(c); });
  EXPECT_NE(e.find("'token_experts' is registered for hostdev/float32"), std::string::npos) << e;
}

}  // namespace
}  // namespace titan::train
