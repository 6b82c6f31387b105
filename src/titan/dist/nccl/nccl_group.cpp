// NCCL groups; see nccl_group.h. Every collective runs on the default CUDA stream, in the order
// of titan's kernels there, and is complete (the stream synchronized) when the call returns.
#include "titan/dist/nccl/nccl_group.h"

#include "titan/core/error.h"

#ifdef TITAN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

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

void sync() {
  const cudaError_t e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess) throw Error(std::string("NCCL collective: ") + cudaGetErrorString(e));
}

struct Done final : Request {
  void wait() override {}
};

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

class NcclGroup final : public Communicator {
 public:
  NcclGroup(ncclComm_t comm, Communicator& host, std::unique_ptr<Communicator> owned = nullptr)
      : comm_(comm), host_(host), owned_(std::move(owned)) {}
  ~NcclGroup() override { ncclCommDestroy(comm_); }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string backend() const override { return "nccl"; }

  void all_reduce(float* x, int64_t n, ReduceOp op) override { reduce(x, n, ncclFloat, 4, op); }
  void all_reduce(double* x, int64_t n, ReduceOp op) override { reduce(x, n, ncclDouble, 8, op); }
  void all_reduce(int64_t* x, int64_t n, ReduceOp op) override { reduce(x, n, ncclInt64, 8, op); }
  std::unique_ptr<Request> all_reduce_async(float* x, int64_t n) override {
    all_reduce(x, n, ReduceOp::sum);
    return std::make_unique<Done>();
  }
  void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts) override {
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (equal(counts)) {
      TITAN_NCCL(ncclReduceScatter(in, out, static_cast<size_t>(counts[0]), ncclFloat, ncclSum,
                                   comm_, nullptr));
    } else {  // one reduce to each block's rank
      TITAN_NCCL(ncclGroupStart());
      int64_t at = 0;
      for (int r = 0; r < size(); ++r) {
        TITAN_NCCL(ncclReduce(in + at, out, static_cast<size_t>(counts[static_cast<size_t>(r)]),
                              ncclFloat, ncclSum, r, comm_, nullptr));
        at += counts[static_cast<size_t>(r)];
      }
      TITAN_NCCL(ncclGroupEnd());
    }
    sync();
    count(4.0 * static_cast<double>(total) * (size() - 1) / size());
  }
  void all_gather(float* x, const std::vector<int64_t>& counts) override {
    gather(x, counts, ncclFloat, 4);
  }
  std::unique_ptr<Request> reduce_scatter_async(const float* in, float* out,
                                                const std::vector<int64_t>& counts) override {
    reduce_scatter(in, out, counts);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Request> all_gather_async(float* x, const std::vector<int64_t>& counts) override {
    gather(x, counts, ncclFloat, 4);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Request> all_gather_async(uint16_t* x,
                                            const std::vector<int64_t>& counts) override {
    gather(x, counts, ncclHalf, 2);  // bf16 bits moved, never combined (any 2-byte type)
    return std::make_unique<Done>();
  }
  void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                  const std::vector<int64_t>& recv) override {
    exchange(in, send, out, recv, ncclFloat, 4);
  }
  std::unique_ptr<Request> all_to_all_async(const float* in, const std::vector<int64_t>& send,
                                            float* out, const std::vector<int64_t>& recv) override {
    exchange(in, send, out, recv, ncclFloat, 4);
    return std::make_unique<Done>();
  }
  void all_to_all(const int64_t* in, int64_t* out, int64_t n) override {
    const std::vector<int64_t> blocks(static_cast<size_t>(size()), n);
    exchange(in, blocks, out, blocks, ncclInt64, 8);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    TITAN_NCCL(
        ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclChar, root, comm_, nullptr));
    sync();
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
    if (n <= 0) return;
    TITAN_NCCL(ncclAllReduce(x, x, static_cast<size_t>(n), type, nccl_op(op), comm_, nullptr));
    sync();
    count(2.0 * bytes * static_cast<double>(n) * (size() - 1) / size());
  }
  // In place: block r of x (counts[r] values) from rank r to every rank.
  void gather(void* x, const std::vector<int64_t>& counts, ncclDataType_t type, int bytes) {
    auto* base = static_cast<char*>(x);
    std::vector<int64_t> at(counts.size() + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), at.begin() + 1);
    if (equal(counts)) {
      TITAN_NCCL(ncclAllGather(base + at[static_cast<size_t>(rank())] * bytes, base,
                               static_cast<size_t>(counts[0]), type, comm_, nullptr));
    } else {
      TITAN_NCCL(ncclGroupStart());
      for (int r = 0; r < size(); ++r)
        TITAN_NCCL(ncclBroadcast(
            base + at[static_cast<size_t>(r)] * bytes, base + at[static_cast<size_t>(r)] * bytes,
            static_cast<size_t>(counts[static_cast<size_t>(r)]), type, r, comm_, nullptr));
      TITAN_NCCL(ncclGroupEnd());
    }
    sync();
    count(static_cast<double>(bytes) * static_cast<double>(at.back()) * (size() - 1) / size());
  }
  void exchange(const void* in, const std::vector<int64_t>& send, void* out,
                const std::vector<int64_t>& recv, ncclDataType_t type, int bytes) {
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    double sent = 0;
    TITAN_NCCL(ncclGroupStart());
    int64_t s_at = 0, r_at = 0;
    for (int r = 0; r < size(); ++r) {
      const auto i = static_cast<size_t>(r);
      if (send[i] > 0)
        TITAN_NCCL(
            ncclSend(src + s_at * bytes, static_cast<size_t>(send[i]), type, r, comm_, nullptr));
      if (recv[i] > 0)
        TITAN_NCCL(
            ncclRecv(dst + r_at * bytes, static_cast<size_t>(recv[i]), type, r, comm_, nullptr));
      if (r != rank()) sent += static_cast<double>(send[i]) * bytes;
      s_at += send[i];
      r_at += recv[i];
    }
    TITAN_NCCL(ncclGroupEnd());
    sync();
    count(sent);
  }

  ncclComm_t comm_;
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
