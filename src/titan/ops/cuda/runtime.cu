// Device discovery and memory for the CUDA ops (ops/cuda/cuda_ops.h): cudaMalloc'd buffers, and
// reserved address ranges whose granules are mapped and unmapped one by one (CUDA's virtual memory
// management, the driver API reached through the runtime's entry-point query), an unmap deferred
// until the kernels queued before it have run, so that giving memory back never waits for the
// GPU.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/runtime.h"

namespace titan::ops::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
    cudaGetLastError();  // clear the sticky error of a failed query
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
}

void set_device(int index) {
  int n = 0;
  TITAN_CUDA_CHECK(cudaGetDeviceCount(&n));
  TITAN_CUDA_CHECK(cudaSetDevice(index % n));
}

namespace {
int n_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
}  // namespace

std::string describe_device() {
  int dev = 0;
  TITAN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  TITAN_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char mem[64];
  std::snprintf(mem, sizeof mem, "%.1f GiB",
                static_cast<double>(p.totalGlobalMem) / static_cast<double>(1ull << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         mem + (n_devices() > 1 ? ", device " + std::to_string(dev) : std::string());
}

namespace {

[[noreturn]] void out_of_memory(size_t bytes) {
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  char msg[320];
  std::snprintf(msg, sizeof msg,
                "out of GPU memory: %.2f GiB asked, %.2f GiB free of %.2f GiB (titan plan "
                "--training.device cuda shows what a run needs; lower training.local_batch_size "
                "or training.seq_len, or set activation_checkpoint.mode full)",
                static_cast<double>(bytes) / (1ull << 30),
                static_cast<double>(free_b) / (1ull << 30),
                static_cast<double>(total) / (1ull << 30));
  throw Error(msg);
}

// The driver's virtual-memory calls, looked up once.
struct Vmm {
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
};

template <typename Fn>
void find_entry(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  TITAN_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || !p)
    throw Error(std::string("CUDA: the driver has no ") + name);
  *fn = reinterpret_cast<Fn>(p);
}

const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm x;
    find_entry("cuMemGetAllocationGranularity", &x.granularity);
    find_entry("cuMemAddressReserve", &x.reserve);
    find_entry("cuMemAddressFree", &x.address_free);
    find_entry("cuMemCreate", &x.create);
    find_entry("cuMemRelease", &x.release);
    find_entry("cuMemMap", &x.map);
    find_entry("cuMemUnmap", &x.unmap);
    find_entry("cuMemSetAccess", &x.set_access);
    return x;
  }();
  return v;
}

void check_cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw Error(std::string("CUDA: ") + what + " failed (CUresult " +
                std::to_string(static_cast<int>(r)) + ")");
}

// A reserved range: its granules and the memory mapped behind each (0: none). A granule given
// back while kernels queued before may still use it is "retiring": mapped until the event after
// them has passed (then unmapped), or taken again by a commit before that (zeroed in stream
// order, no unmap, no wait).
struct Range {
  CUdeviceptr base = 0;
  size_t size = 0, granule = 0;
  CUmemAllocationProp prop{};
  std::vector<CUmemGenericAllocationHandle> mapped;
  std::vector<char> retiring;
};
std::mutex g_mu;
std::map<CUdeviceptr, Range> g_ranges;  // by base
// Granules given back by one decommit: unmapped once `done` (recorded after it) has passed.
struct Retiring {
  CUdeviceptr range = 0;
  std::vector<size_t> granules;
  cudaEvent_t done = nullptr;
};
std::vector<Retiring> g_retiring;

// The reserved range [p, p + bytes) lies in.
Range& range_of(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<CUdeviceptr>(p);
  auto it = g_ranges.upper_bound(a);
  if (it == g_ranges.begin() || a + bytes > std::prev(it)->second.base + std::prev(it)->second.size)
    throw Error("CUDA: commit/decommit of memory outside every reserved range");
  return std::prev(it)->second;
}

// Unmaps the granules of the retiring groups whose event has passed. A granule is in one group
// at most: a commit taking it back removes it from its group.
void reap() {
  if (g_retiring.empty()) return;
  // First the groups whose event passed are taken out of the list, then unmapped: an error
  // part-way leaves granules mapped, never unmapped twice.
  static std::vector<Retiring> ready;  // under g_mu; kept, so reaping allocates nothing
  ready.clear();
  cudaError_t bad = cudaSuccess;
  size_t kept = 0;
  for (size_t i = 0; i < g_retiring.size(); ++i) {
    const cudaError_t q = cudaEventQuery(g_retiring[i].done);
    if (q == cudaSuccess) {
      ready.push_back(std::move(g_retiring[i]));
      continue;
    }
    if (q != cudaErrorNotReady) bad = q;
    if (kept != i) g_retiring[kept] = std::move(g_retiring[i]);
    ++kept;
  }
  g_retiring.resize(kept);
  const Vmm& v = vmm();
  for (Retiring& t : ready) {
    cudaEventDestroy(t.done);
    if (t.granules.empty()) continue;  // all taken back, or the range freed
    Range& r = g_ranges.at(t.range);
    for (size_t g : t.granules) {
      const CUmemGenericAllocationHandle h = r.mapped[g];
      r.mapped[g] = 0;
      r.retiring[g] = 0;
      check_cu(v.unmap(r.base + g * r.granule, r.granule), "cuMemUnmap");
      check_cu(v.release(h), "cuMemRelease");
    }
  }
  TITAN_CUDA_CHECK(bad);
}

// What an allocation that found no memory tries first (g_mu held): waits for the stream, unmaps
// every retiring granule, and hands the stream-ordered pool's free blocks (the ops' Temp
// buffers, kept by the pool until a synchronization) back to the device.
void reclaim_locked() {
  TITAN_CUDA_CHECK(cudaStreamSynchronize(stream()));  // every retiring group's event passes
  reap();
  int dev = 0;
  cudaMemPool_t pool = nullptr;
  TITAN_CUDA_CHECK(cudaGetDevice(&dev));
  TITAN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  TITAN_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
}

// Maps fresh memory behind granule g of r (out of memory: false).
bool map_granule(Range& r, size_t g) {
  const Vmm& v = vmm();
  const CUdeviceptr at = r.base + g * r.granule;
  CUmemGenericAllocationHandle h = 0;
  const CUresult made = v.create(&h, r.granule, &r.prop, 0);
  if (made == CUDA_ERROR_OUT_OF_MEMORY) return false;
  check_cu(made, "cuMemCreate");
  if (const CUresult m = v.map(at, r.granule, 0, h, 0); m != CUDA_SUCCESS) {
    v.release(h);
    check_cu(m, "cuMemMap");
  }
  CUmemAccessDesc access{};
  access.location = r.prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult a = v.set_access(at, r.granule, &access, 1); a != CUDA_SUCCESS) {
    v.unmap(at, r.granule);
    v.release(h);
    check_cu(a, "cuMemSetAccess");
  }
  r.mapped[g] = h;
  return true;
}

}  // namespace

void reclaim() {
  std::lock_guard<std::mutex> lock(g_mu);
  reclaim_locked();
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {  // first the granules still retiring, then give up
    cudaGetLastError();
    reclaim();
    e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      out_of_memory(bytes);
    }
  }
  TITAN_CUDA_CHECK(e);
  return p;
}

void free(void* p) {
  if (!p) return;
  // From destructors: never throws (a fault shows at the next check).
  std::lock_guard<std::mutex> lock(g_mu);
  const auto it = g_ranges.find(reinterpret_cast<CUdeviceptr>(p));
  if (it == g_ranges.end()) {
    cudaFree(p);
    return;
  }
  Range& r = it->second;
  cudaDeviceSynchronize();  // every stream: a collective may still use it
  const Vmm& v = vmm();
  for (Retiring& t : g_retiring)
    if (t.range == r.base) t.granules.clear();  // unmapped below; the event destroyed when reaped
  for (size_t g = 0; g < r.mapped.size(); ++g)
    if (r.mapped[g]) {
      v.unmap(r.base + g * r.granule, r.granule);
      v.release(r.mapped[g]);
    }
  v.address_free(r.base, r.size);
  g_ranges.erase(it);
}

void* reserve(size_t bytes) {
  if (bytes == 0) return nullptr;
  const Vmm& v = vmm();
  Range r;
  int dev = 0;
  TITAN_CUDA_CHECK(cudaGetDevice(&dev));
  r.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  r.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  r.prop.location.id = dev;
  check_cu(v.granularity(&r.granule, &r.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
           "cuMemGetAllocationGranularity");
  r.size = (bytes + r.granule - 1) / r.granule * r.granule;
  check_cu(v.reserve(&r.base, r.size, r.granule, 0, 0), "cuMemAddressReserve");
  r.mapped.assign(r.size / r.granule, 0);
  r.retiring.assign(r.size / r.granule, 0);
  std::lock_guard<std::mutex> lock(g_mu);
  const CUdeviceptr base = r.base;
  g_ranges.emplace(base, std::move(r));
  return reinterpret_cast<void*>(base);
}

void commit(void* p, size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  reap();
  Range& r = range_of(p, bytes);
  const size_t lo = reinterpret_cast<CUdeviceptr>(p) - r.base;
  for (size_t g = lo / r.granule; g <= (lo + bytes - 1) / r.granule; ++g) {
    if (r.mapped[g] && !r.retiring[g]) continue;
    if (r.retiring[g]) {  // taken back before it was unmapped: zeroed after its last use
      r.retiring[g] = 0;
      for (Retiring& t : g_retiring)
        if (t.range == r.base)
          t.granules.erase(std::remove(t.granules.begin(), t.granules.end(), g), t.granules.end());
    } else if (!map_granule(r, g)) {
      reclaim_locked();  // out of memory: first what is retiring and the pool's free blocks
      if (!map_granule(r, g)) out_of_memory(bytes);
    }
    TITAN_CUDA_CHECK(
        cudaMemsetAsync(reinterpret_cast<void*>(r.base + g * r.granule), 0, r.granule, stream()));
  }
}

void decommit(void* p, size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  Range& r = range_of(p, bytes);
  const size_t lo = reinterpret_cast<CUdeviceptr>(p) - r.base, hi = lo + bytes, G = r.granule;
  // Zero what stays mapped: the parts of the first and last granules the range covers only in
  // part (or the whole range inside one granule).
  const size_t a = (lo + G - 1) / G * G, z = hi / G * G;
  auto zero = [&](size_t from, size_t to) {
    if (from < to && r.mapped[from / G] && !r.retiring[from / G])
      TITAN_CUDA_CHECK(
          cudaMemsetAsync(reinterpret_cast<void*>(r.base + from), 0, to - from, stream()));
  };
  if (a >= z) {
    zero(lo, std::min(hi, a));
    if (a < hi) zero(a, hi);
    return;
  }
  zero(lo, a);
  zero(z, hi);
  // The whole granules retire: unmapped once the kernels queued so far (which may still use
  // them) have run, without waiting for them here.
  Retiring t;
  t.range = r.base;
  for (size_t g = a / G; g < z / G; ++g)
    if (r.mapped[g] && !r.retiring[g]) t.granules.push_back(g);
  if (t.granules.empty()) return;
  TITAN_CUDA_CHECK(cudaEventCreateWithFlags(&t.done, cudaEventDisableTiming));
  if (const cudaError_t e = cudaEventRecord(t.done, stream()); e != cudaSuccess) {
    cudaEventDestroy(t.done);
    TITAN_CUDA_CHECK(e);
  }
  for (size_t g : t.granules) r.retiring[g] = 1;
  g_retiring.push_back(std::move(t));
  reap();
}

void memory_info(int64_t* total, int64_t* used) {
  size_t free_b = 0, total_b = 0;
  TITAN_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  *total = static_cast<int64_t>(total_b);
  *used = static_cast<int64_t>(total_b - free_b);
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes) TITAN_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void memset(void* dst, int value, size_t bytes) {
  if (bytes) TITAN_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream()));
}

void synchronize() { TITAN_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace titan::ops::cuda
