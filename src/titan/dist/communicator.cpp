// The single-process communicator, the MPI one (OpenMPI), and the world group.
#include "titan/dist/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "titan/core/error.h"

namespace titan::dist {
namespace {

class Single final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  void all_reduce(int64_t*, int64_t, ReduceOp) override {}
  std::unique_ptr<Request> all_reduce_async(float*, int64_t) override {
    struct Done final : Request {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts) override {
    if (in != out && counts.at(0) > 0)
      std::memmove(out, in, static_cast<size_t>(counts[0]) * sizeof(float));
  }
  void all_gather(float*, const std::vector<int64_t>&) override {}
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<Single>(); }
};

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("MPI ") + what +
              " failed: " + std::string(msg, static_cast<size_t>(len)));
}

// MPI counts are int: long buffers go in chunks of at most 2^30 elements.
constexpr int64_t kChunk = int64_t{1} << 30;

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

class Mpi final : public Communicator {
 public:
  explicit Mpi(MPI_Comm c) : c_(c) {
    MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c_, &rank_);
    MPI_Comm_size(c_, &size_);
  }
  ~Mpi() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && c_ != MPI_COMM_WORLD) MPI_Comm_free(&c_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(float* x, int64_t n, ReduceOp op) override { reduce(x, n, MPI_FLOAT, 4, op); }
  void all_reduce(double* x, int64_t n, ReduceOp op) override { reduce(x, n, MPI_DOUBLE, 8, op); }
  void all_reduce(int64_t* x, int64_t n, ReduceOp op) override { reduce(x, n, MPI_INT64_T, 8, op); }
  std::unique_ptr<Request> all_reduce_async(float* x, int64_t n) override {
    check(n < kChunk, "all_reduce_async: buffer of " + std::to_string(n) + " values too long");
    struct Req final : Request {
      MPI_Request r = MPI_REQUEST_NULL;
      void wait() override { mpi_check(MPI_Wait(&r, MPI_STATUS_IGNORE), "Wait"); }
    };
    auto req = std::make_unique<Req>();
    count(ring(2.0, 4.0 * static_cast<double>(n)));
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_SUM, c_, &req->r),
              "Iallreduce");
    return req;
  }
  void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts) override {
    std::vector<int> c, d;
    const int64_t total = int_counts(counts, &c, &d, "reduce_scatter");
    count(ring(1.0, 4.0 * static_cast<double>(total)));
    mpi_check(MPI_Reduce_scatter(in, out, c.data(), MPI_FLOAT, MPI_SUM, c_), "Reduce_scatter");
  }
  void all_gather(float* x, const std::vector<int64_t>& counts) override {
    std::vector<int> c, d;
    const int64_t total = int_counts(counts, &c, &d, "all_gather");
    count(ring(1.0, 4.0 * static_cast<double>(total)));
    mpi_check(
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, c.data(), d.data(), MPI_FLOAT, c_),
        "Allgatherv");
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (int64_t o = 0; o < bytes; o += kChunk)
      mpi_check(MPI_Bcast(p + o, static_cast<int>(std::min(kChunk, bytes - o)), MPI_BYTE, root, c_),
                "Bcast");
  }
  void barrier() override { mpi_check(MPI_Barrier(c_), "Barrier"); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    mpi_check(MPI_Comm_split(c_, color, key, &sub), "Comm_split");
    return std::make_unique<Mpi>(sub);
  }

 private:
  // counts as MPI ints (and displacements); throws when a count or the total does not fit.
  int64_t int_counts(const std::vector<int64_t>& counts, std::vector<int>* c, std::vector<int>* d,
                     const char* what) const {
    check(static_cast<int>(counts.size()) == size_,
          std::string(what) + ": " + std::to_string(counts.size()) + " counts for " +
              std::to_string(size_) + " ranks");
    int64_t total = 0;
    for (int64_t n : counts) {
      d->push_back(static_cast<int>(total));
      c->push_back(static_cast<int>(n));
      total += n;
    }
    check(total < (int64_t{1} << 31),
          std::string(what) + ": " + std::to_string(total) +
              " values exceed MPI's int count (2^31); more ranks or a smaller model");
    return total;
  }
  // Bytes a ring algorithm sends from this rank: factor·(p−1)/p·bytes.
  double ring(double factor, double bytes) const {
    return size_ > 1 ? factor * (size_ - 1) / size_ * bytes : 0.0;
  }
  void reduce(void* x, int64_t n, MPI_Datatype t, int elem, ReduceOp op) {
    count(ring(2.0, static_cast<double>(elem) * static_cast<double>(n)));
    auto* p = static_cast<char*>(x);
    for (int64_t o = 0; o < n; o += kChunk)
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, p + o * elem, static_cast<int>(std::min(kChunk, n - o)),
                              t, mpi_op(op), c_),
                "Allreduce");
  }
  MPI_Comm c_;
  int rank_ = 0, size_ = 1;
};

void finalize_mpi() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

}  // namespace

std::unique_ptr<Communicator> single_process() { return std::make_unique<Single>(); }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

Communicator& world() {
  static std::unique_ptr<Communicator> w = []() -> std::unique_ptr<Communicator> {
    if (!launched_by_mpi()) return single_process();
    int provided = 0;
    // FUNNELED: only the driving thread calls MPI; OpenMP threads compute.
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "Init_thread");
    std::atexit(finalize_mpi);
    return std::make_unique<Mpi>(MPI_COMM_WORLD);
  }();
  return *w;
}

void abort_job(int code) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::exit(code);
}

}  // namespace titan::dist
