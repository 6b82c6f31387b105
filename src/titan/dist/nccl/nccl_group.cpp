// NCCL groups; see nccl_group.h. Every collective runs on the group's own CUDA stream (non-
// blocking, so the kernels on titan's stream run beside it), after everything queued on titan's
// stream before the call (an event it waits for): the inputs are ready, and a buffer an earlier
// kernel still reads is not yet overwritten. A blocking call returns once the collective is
// complete; an …_async one returns at once and its wait() blocks until it is, so the kernels
// queued meanwhile (the next unit's compute) overlap it on the GPU. Nothing is given back or
// read before wait() (the callers' rule), so no buffer is in use by two streams at once.
#include "titan/dist/nccl/nccl_group.h"

#include "titan/core/error.h"

#ifdef TITAN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace titan::dist {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw Error(std::string("NCCL: ") + what + " failed: " + ncclGetErrorString(r));
}
#define TITAN_NCCL(call) check_nccl((call), #call)

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("NCCL collective: ") + what + ": " + cudaGetErrorString(e));
}

// One collective in flight on a group's stream: queued after an event on titan's stream (the
// legacy default stream), timed from when the group's stream reaches it (after titan's stream
// caught up and the group's earlier collectives finished) to its end.
class InFlight final : public Request {
 public:
  explicit InFlight(cudaStream_t s) : stream_(s) {
    try {
      check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
      check_cuda(cudaEventCreate(&begin_), "cudaEventCreate");
      check_cuda(cudaEventCreate(&done_), "cudaEventCreate");
      check_cuda(cudaEventRecord(ready_, cudaStreamLegacy), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
      check_cuda(cudaEventRecord(begin_, stream_), "cudaEventRecord");
    } catch (...) {
      destroy_events();  // no destructor runs for a constructor that throws
      throw;
    }
  }
  ~InFlight() override {
    // Not waited for (an error unwinding): what titan's stream runs next waits for it, so that
    // its buffers are not reused under it.
    if (!waited_ && queued_) cudaStreamWaitEvent(cudaStreamLegacy, done_, 0);
    destroy_events();
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  // After the NCCL calls were queued.
  void queued() {
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
    queued_ = true;
  }
  void wait() override {
    if (waited_) return;
    check_cuda(cudaEventSynchronize(done_), "the collective");
    float ms = 0;
    if (cudaEventElapsedTime(&ms, begin_, done_) == cudaSuccess) seconds_ = 1e-3 * ms;
    waited_ = true;
  }
  double seconds() const override { return seconds_; }

 private:
  void destroy_events() {
    for (cudaEvent_t e : {ready_, begin_, done_})
      if (e) cudaEventDestroy(e);
  }
  cudaStream_t stream_;
  cudaEvent_t ready_ = nullptr, begin_ = nullptr, done_ = nullptr;
  bool queued_ = false, waited_ = false;
  double seconds_ = 0;
};

// ncclGroupStart() … ncclGroupEnd(), the end also when a call in between throws.
class NcclBatch {
 public:
  NcclBatch() { TITAN_NCCL(ncclGroupStart()); }
  ~NcclBatch() {
    if (open_) ncclGroupEnd();
  }
  NcclBatch(const NcclBatch&) = delete;
  NcclBatch& operator=(const NcclBatch&) = delete;
  void end() {
    open_ = false;
    TITAN_NCCL(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

class NcclGroup final : public Communicator {
 public:
  NcclGroup(ncclComm_t comm, Communicator& host, std::unique_ptr<Communicator> owned = nullptr)
      : comm_(comm), host_(host), owned_(std::move(owned)) {
    if (const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
        e != cudaSuccess) {
      ncclCommDestroy(comm_);  // ours from here on, and no destructor runs
      check_cuda(e, "cudaStreamCreate");
    }
  }
  ~NcclGroup() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string backend() const override { return "nccl"; }

  void all_reduce(float* x, int64_t n, ReduceOp op) override { reduce(x, n, ncclFloat, 4, op); }
  void all_reduce(double* x, int64_t n, ReduceOp op) override { reduce(x, n, ncclDouble, 8, op); }
  void all_reduce(int64_t* x, int64_t n, ReduceOp op) override { reduce(x, n, ncclInt64, 8, op); }
  std::unique_ptr<Request> all_reduce_async(float* x, int64_t n) override {
    return reduce_async(x, n, ncclFloat, 4, ReduceOp::sum);
  }
  void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts) override {
    reduce_scatter_async(in, out, counts)->wait();
  }
  void all_gather(float* x, const std::vector<int64_t>& counts) override {
    gather(x, counts, ncclFloat, 4)->wait();
  }
  std::unique_ptr<Request> reduce_scatter_async(const float* in, float* out,
                                                const std::vector<int64_t>& counts) override {
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    auto r = std::make_unique<InFlight>(stream_);
    if (equal(counts)) {
      TITAN_NCCL(ncclReduceScatter(in, out, static_cast<size_t>(counts[0]), ncclFloat, ncclSum,
                                   comm_, stream_));
    } else {  // one reduce to each block's rank
      NcclBatch batch;
      int64_t at = 0;
      for (int q = 0; q < size(); ++q) {
        TITAN_NCCL(ncclReduce(in + at, out, static_cast<size_t>(counts[static_cast<size_t>(q)]),
                              ncclFloat, ncclSum, q, comm_, stream_));
        at += counts[static_cast<size_t>(q)];
      }
      batch.end();
    }
    r->queued();
    count(4.0 * static_cast<double>(total) * (size() - 1) / size());
    return r;
  }
  std::unique_ptr<Request> all_gather_async(float* x, const std::vector<int64_t>& counts) override {
    return gather(x, counts, ncclFloat, 4);
  }
  std::unique_ptr<Request> all_gather_async(uint16_t* x,
                                            const std::vector<int64_t>& counts) override {
    return gather(x, counts, ncclHalf, 2);  // bf16 bits moved, never combined (any 2-byte type)
  }
  void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                  const std::vector<int64_t>& recv) override {
    exchange(in, send, out, recv, ncclFloat, 4)->wait();
  }
  std::unique_ptr<Request> all_to_all_async(const float* in, const std::vector<int64_t>& send,
                                            float* out, const std::vector<int64_t>& recv) override {
    return exchange(in, send, out, recv, ncclFloat, 4);
  }
  void all_to_all(const int64_t* in, int64_t* out, int64_t n) override {
    const std::vector<int64_t> blocks(static_cast<size_t>(size()), n);
    exchange(in, blocks, out, blocks, ncclInt64, 8)->wait();
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    auto r = std::make_unique<InFlight>(stream_);
    TITAN_NCCL(
        ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclChar, root, comm_, stream_));
    r->queued();
    r->wait();
    count(static_cast<double>(bytes) * (size() - 1) / size());
  }
  void barrier() override { host_.barrier(); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> host = host_.split(color, key);
    ncclComm_t c = nullptr;
    TITAN_NCCL(ncclCommSplit(comm_, color, key, &c, nullptr));
    Communicator& h = *host;
    return std::make_unique<NcclGroup>(c, h, std::move(host));
  }

 private:
  static bool equal(const std::vector<int64_t>& counts) {
    for (int64_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }
  void reduce(void* x, int64_t n, ncclDataType_t type, int bytes, ReduceOp op) {
    reduce_async(x, n, type, bytes, op)->wait();
  }
  std::unique_ptr<InFlight> reduce_async(void* x, int64_t n, ncclDataType_t type, int bytes,
                                         ReduceOp op) {
    auto r = std::make_unique<InFlight>(stream_);
    if (n > 0)
      TITAN_NCCL(ncclAllReduce(x, x, static_cast<size_t>(n), type, nccl_op(op), comm_, stream_));
    r->queued();
    count(2.0 * bytes * static_cast<double>(std::max<int64_t>(n, 0)) * (size() - 1) / size());
    return r;
  }
  // In place: block r of x (counts[r] values) from rank r to every rank.
  std::unique_ptr<InFlight> gather(void* x, const std::vector<int64_t>& counts, ncclDataType_t type,
                                   int bytes) {
    auto r = std::make_unique<InFlight>(stream_);
    auto* base = static_cast<char*>(x);
    std::vector<int64_t> at(counts.size() + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), at.begin() + 1);
    if (equal(counts)) {
      TITAN_NCCL(ncclAllGather(base + at[static_cast<size_t>(rank())] * bytes, base,
                               static_cast<size_t>(counts[0]), type, comm_, stream_));
    } else {
      NcclBatch batch;
      for (int q = 0; q < size(); ++q)
        TITAN_NCCL(ncclBroadcast(
            base + at[static_cast<size_t>(q)] * bytes, base + at[static_cast<size_t>(q)] * bytes,
            static_cast<size_t>(counts[static_cast<size_t>(q)]), type, q, comm_, stream_));
      batch.end();
    }
    r->queued();
    count(static_cast<double>(bytes) * static_cast<double>(at.back()) * (size() - 1) / size());
    return r;
  }
  std::unique_ptr<InFlight> exchange(const void* in, const std::vector<int64_t>& send, void* out,
                                     const std::vector<int64_t>& recv, ncclDataType_t type,
                                     int bytes) {
    auto req = std::make_unique<InFlight>(stream_);
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    double sent = 0;
    NcclBatch batch;
    int64_t s_at = 0, r_at = 0;
    for (int r = 0; r < size(); ++r) {
      const auto i = static_cast<size_t>(r);
      if (send[i] > 0)
        TITAN_NCCL(
            ncclSend(src + s_at * bytes, static_cast<size_t>(send[i]), type, r, comm_, stream_));
      if (recv[i] > 0)
        TITAN_NCCL(
            ncclRecv(dst + r_at * bytes, static_cast<size_t>(recv[i]), type, r, comm_, stream_));
      if (r != rank()) sent += static_cast<double>(send[i]) * bytes;
      s_at += send[i];
      r_at += recv[i];
    }
    batch.end();
    req->queued();
    count(sent);
    return req;
  }

  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;  // the collectives' stream
  Communicator& host_;
  std::unique_ptr<Communicator> owned_;  // the host group of a split
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> nccl_group(Communicator& host) {
  ncclUniqueId id{};
  if (host.rank() == 0) TITAN_NCCL(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  TITAN_NCCL(ncclCommInitRank(&comm, host.size(), id, host.rank()));
  return std::make_unique<NcclGroup>(comm, host);
}

}  // namespace titan::dist

#else  // built without NCCL

namespace titan::dist {

bool nccl_built() { return false; }

std::unique_ptr<Communicator> nccl_group(Communicator&) {
  throw Error(
      "this titan was built without NCCL (CMake found no nccl.h and libnccl beside the CUDA "
      "toolkit); install NCCL and rebuild to train on several GPUs");
}

}  // namespace titan::dist

#endif
