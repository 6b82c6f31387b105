// The single-process communicator, the MPI one (OpenMPI), and the world group.
#include "titan/dist/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/cpu.h"
#include "titan/core/error.h"
#include "titan/core/log.h"

namespace titan::dist {
namespace {

struct Done final : Request {
  void wait() override {}
};

class Single final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  void all_reduce(int64_t*, int64_t, ReduceOp) override {}
  std::unique_ptr<Request> all_reduce_async(float*, int64_t) override {
    return std::make_unique<Done>();
  }
  void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts) override {
    if (in != out && counts.at(0) > 0)
      std::memmove(out, in, static_cast<size_t>(counts[0]) * sizeof(float));
  }
  void all_gather(float*, const std::vector<int64_t>&) override {}
  std::unique_ptr<Request> reduce_scatter_async(const float* in, float* out,
                                                const std::vector<int64_t>& counts) override {
    reduce_scatter(in, out, counts);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Request> all_gather_async(float*, const std::vector<int64_t>&) override {
    return std::make_unique<Done>();
  }
  std::unique_ptr<Request> all_gather_async(uint16_t*, const std::vector<int64_t>&) override {
    return std::make_unique<Done>();
  }
  void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                  const std::vector<int64_t>& recv) override {
    check(send.size() == 1 && recv.size() == 1 && send[0] == recv[0],
          "all_to_all: one rank sends " + std::to_string(send.at(0)) + " values to itself but " +
              "receives " + std::to_string(recv.at(0)));
    if (in != out && send[0] > 0) std::memmove(out, in, static_cast<size_t>(send[0]) * 4);
  }
  std::unique_ptr<Request> all_to_all_async(const float* in, const std::vector<int64_t>& send,
                                            float* out, const std::vector<int64_t>& recv) override {
    all_to_all(in, send, out, recv);
    return std::make_unique<Done>();
  }
  void all_to_all(const int64_t* in, int64_t* out, int64_t n) override {
    if (in != out && n > 0) std::memmove(out, in, static_cast<size_t>(n) * 8);
  }
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

// Whether MPI granted MPI_THREAD_MULTIPLE (a lane's thread calls MPI beside the caller's).
bool g_thread_multiple = false;

// The completion of one non-blocking collective, shared by its Request and the lane.
struct OpState {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  double seconds = 0;
};

class LaneRequest final : public Request {
 public:
  explicit LaneRequest(std::shared_ptr<OpState> s) : s_(std::move(s)) {}
  void wait() override {
    std::unique_lock<std::mutex> l(s_->m);
    s_->cv.wait(l, [&] { return s_->done; });
    if (!s_->error.empty()) throw Error(s_->error);
  }
  double seconds() const override { return s_->seconds; }

 private:
  std::shared_ptr<OpState> s_;
};

// A group's non-blocking collectives: started in submission order on a duplicate of the group's
// communicator (never interleaved with the caller's blocking calls on the group itself) by a
// thread that then polls them (MPI_Test, sleeping ~20 us between polls that find nothing done:
// the core stays the compute's).
class Lane {
 public:
  using Start = std::function<int(MPI_Comm, MPI_Request*)>;
  explicit Lane(MPI_Comm parent) {
    mpi_check(MPI_Comm_dup(parent, &c_), "Comm_dup");
    MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
    thread_ = std::thread([this] { run(); });
  }
  ~Lane() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && clean_) MPI_Comm_free(&c_);
  }
  std::unique_ptr<Request> submit(Start start, const char* what) {
    auto s = std::make_shared<OpState>();
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.push_back({std::move(start), what, s, 0, MPI_REQUEST_NULL});
    }
    cv_.notify_all();
    return std::make_unique<LaneRequest>(std::move(s));
  }

 private:
  struct Op {
    Start start;
    const char* what;
    std::shared_ptr<OpState> state;
    double t0;
    MPI_Request r;
  };
  static void finish(Op& op, std::string error) {
    std::lock_guard<std::mutex> l(op.state->m);
    op.state->seconds = cpu::now_seconds() - op.t0;
    op.state->error = std::move(error);
    op.state->done = true;
    op.state->cv.notify_all();
  }
  static std::string message(int rc, const char* what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return std::string("MPI ") + what + " failed: " + std::string(msg, static_cast<size_t>(len));
  }
  void run() {
    std::vector<Op> active;
    for (;;) {
      std::deque<Op> fresh;
      {
        std::unique_lock<std::mutex> l(m_);
        if (active.empty()) cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        // Stopping with collectives in flight (an error unwinding): leave them, and the
        // duplicate communicator, to MPI_Abort.
        if (stop_) {
          clean_ = active.empty() && queue_.empty();
          return;
        }
        fresh.swap(queue_);
      }
      for (Op& op : fresh) {
        op.t0 = cpu::now_seconds();
        const int rc = op.start(c_, &op.r);
        if (rc == MPI_SUCCESS)
          active.push_back(std::move(op));
        else
          finish(op, message(rc, op.what));
      }
      bool progressed = false;
      for (size_t i = 0; i < active.size();) {
        int flag = 0;
        const int rc = MPI_Test(&active[i].r, &flag, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !flag) {
          ++i;
          continue;
        }
        finish(active[i], rc == MPI_SUCCESS ? std::string() : message(rc, active[i].what));
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        progressed = true;
      }
      if (!progressed && !active.empty())
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  MPI_Comm c_ = MPI_COMM_NULL;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stop_ = false, clean_ = true;
  std::thread thread_;
};

class Mpi final : public Communicator {
 public:
  explicit Mpi(MPI_Comm c) : c_(c) {
    MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c_, &rank_);
    MPI_Comm_size(c_, &size_);
  }
  ~Mpi() override {
    lane_.reset();
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
    count(ring(2.0, 4.0 * static_cast<double>(n)));
    return lane_submit(
        [=](MPI_Comm c, MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_SUM, c, r);
        },
        "Iallreduce");
  }
  std::unique_ptr<Request> reduce_scatter_async(const float* in, float* out,
                                                const std::vector<int64_t>& counts) override {
    std::vector<int> c, d;
    const int64_t total = int_counts(counts, &c, &d, "reduce_scatter");
    count(ring(1.0, 4.0 * static_cast<double>(total)));
    return lane_submit(
        [=, c = std::move(c)](MPI_Comm comm, MPI_Request* r) {
          return MPI_Ireduce_scatter(in, out, c.data(), MPI_FLOAT, MPI_SUM, comm, r);
        },
        "Ireduce_scatter");
  }
  std::unique_ptr<Request> all_gather_async(float* x, const std::vector<int64_t>& counts) override {
    return gather_async(x, counts, MPI_FLOAT, 4);
  }
  std::unique_ptr<Request> all_gather_async(uint16_t* x,
                                            const std::vector<int64_t>& counts) override {
    return gather_async(x, counts, MPI_UINT16_T, 2);
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
  void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                  const std::vector<int64_t>& recv) override {
    all_to_all_async(in, send, out, recv)->wait();
  }
  std::unique_ptr<Request> all_to_all_async(const float* in, const std::vector<int64_t>& send,
                                            float* out, const std::vector<int64_t>& recv) override {
    std::vector<int> sc, sd, rc, rd;
    int_counts(send, &sc, &sd, "all_to_all (send)");
    int_counts(recv, &rc, &rd, "all_to_all (receive)");
    count(4.0 * static_cast<double>([&] {
            int64_t b = 0;
            for (int q = 0; q < size_; ++q) b += q == rank_ ? 0 : send[static_cast<size_t>(q)];
            return b;
          }()));
    return lane_submit(
        [=, sc = std::move(sc), sd = std::move(sd), rc = std::move(rc), rd = std::move(rd)](
            MPI_Comm comm, MPI_Request* r) {
          return MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_FLOAT, out, rc.data(), rd.data(),
                                MPI_FLOAT, comm, r);
        },
        "Ialltoallv");
  }
  void all_to_all(const int64_t* in, int64_t* out, int64_t n) override {
    check(n * size_ < (int64_t{1} << 31),
          "all_to_all: " + std::to_string(n) + " values per rank too many");
    count(8.0 * static_cast<double>(n) * (size_ - 1));
    mpi_check(MPI_Alltoall(in, static_cast<int>(n), MPI_INT64_T, out, static_cast<int>(n),
                           MPI_INT64_T, c_),
              "Alltoall");
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
  std::unique_ptr<Request> gather_async(void* x, const std::vector<int64_t>& counts, MPI_Datatype t,
                                        int elem) {
    std::vector<int> c, d;
    const int64_t total = int_counts(counts, &c, &d, "all_gather");
    count(ring(1.0, elem * static_cast<double>(total)));
    return lane_submit(
        [=, c = std::move(c), d = std::move(d)](MPI_Comm comm, MPI_Request* r) {
          return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, c.data(), d.data(), t, comm,
                                 r);
        },
        "Iallgatherv");
  }
  // A non-blocking collective on this group's lane (made at the first one: MPI_Comm_dup is
  // collective, and every rank reaches its first in the same place). Without
  // MPI_THREAD_MULTIPLE it runs to completion here, blocking.
  std::unique_ptr<Request> lane_submit(Lane::Start start, const char* what) {
    if (!g_thread_multiple) {
      const double t0 = cpu::now_seconds();
      MPI_Request r = MPI_REQUEST_NULL;
      mpi_check(start(c_, &r), what);
      mpi_check(MPI_Wait(&r, MPI_STATUS_IGNORE), what);
      struct Blocked final : Request {
        double s = 0;
        void wait() override {}
        double seconds() const override { return s; }
      };
      auto req = std::make_unique<Blocked>();
      req->s = cpu::now_seconds() - t0;
      return req;
    }
    if (!lane_) lane_ = std::make_unique<Lane>(c_);
    return lane_->submit(std::move(start), what);
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
  std::unique_ptr<Lane> lane_;  // declared last: stopped before the communicator is freed
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
    // MULTIPLE: a group's lane thread runs the non-blocking collectives beside the driving
    // thread's blocking ones (OpenMP threads never call MPI).
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "Init_thread");
    std::atexit(finalize_mpi);
    g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    if (!g_thread_multiple)
      log::warn(
          "this MPI library does not grant MPI_THREAD_MULTIPLE: non-blocking collectives (FSDP's "
          "prefetch) run blocking, not overlapped with compute");
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
