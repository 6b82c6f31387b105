// The collectives of data parallelism over a group of ranks (torchtitan's process groups; MPI
// communicators here, NCCL ones later on GPUs). A Communicator is one group: the world, or a
// sub-group made by split() for one mesh axis (dist/parallel_dims.h). Model code never sees one:
// the trainer reduces what the model produced.
//
// Every call is collective: all ranks of the group call it in the same order with the same sizes.
// Buffers are host memory. Blocking calls return when this rank's part is complete. The
// non-blocking ones (…_async) return a Request whose wait() completes them; their buffers must
// not be touched before. Under MPI they run on the group's communication lane: a duplicate of
// its communicator, driven by a thread of its own that starts them in call order (so every rank
// matches them) and polls them to completion, so they move while the caller computes (OpenMPI
// has no progress thread of its own). Errors (a failed collective) throw titan::Error, from
// wait() for the non-blocking ones.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan::dist {

enum class ReduceOp { sum, max };

class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  // Seconds from the collective's start to its completion (after wait()): what it took in the
  // background, hidden behind compute or not.
  virtual double seconds() const { return 0; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single" or "mpi"

  // x[0:n] ← op over ranks of x[0:n], in place. Sums of floats are reduced in a fixed order for
  // a fixed group size (MPI's reduction trees are deterministic for a given layout).
  virtual void all_reduce(float* x, int64_t n, ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_reduce(double* x, int64_t n, ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_reduce(int64_t* x, int64_t n, ReduceOp op = ReduceOp::sum) = 0;
  virtual std::unique_ptr<Request> all_reduce_async(float* x, int64_t n) = 0;  // sum
  // Blocks of a buffer split by counts (counts[r] values for rank r, consecutive; the sum is the
  // buffer's length; each count and the sum must fit MPI's int):
  // out[0:counts[rank]] = Σ over ranks of in's block `rank`.
  virtual void reduce_scatter(const float* in, float* out, const std::vector<int64_t>& counts) = 0;
  // In place: every rank's block of x (its own values) ends up in every rank's x.
  virtual void all_gather(float* x, const std::vector<int64_t>& counts) = 0;
  virtual std::unique_ptr<Request> reduce_scatter_async(const float* in, float* out,
                                                        const std::vector<int64_t>& counts) = 0;
  virtual std::unique_ptr<Request> all_gather_async(float* x,
                                                    const std::vector<int64_t>& counts) = 0;
  // The same of 16-bit values (bf16 bits: FSDP's gathers under bf16 mixed precision).
  virtual std::unique_ptr<Request> all_gather_async(uint16_t* x,
                                                    const std::vector<int64_t>& counts) = 0;
  // All-to-all(v) (expert parallelism's token dispatch and combine): rank p sends its block q of
  // `in` (send[q] values; blocks consecutive in rank order) to rank q, and receives rank q's
  // block for it into block q of `out` (recv[q] values, consecutive). send[q] on rank p must
  // equal recv[p] on rank q: exchange the sizes first (the fixed-size overload below).
  virtual void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                          const std::vector<int64_t>& recv) = 0;
  virtual std::unique_ptr<Request> all_to_all_async(const float* in,
                                                    const std::vector<int64_t>& send, float* out,
                                                    const std::vector<int64_t>& recv) = 0;
  // Fixed size: `n` values to every rank (in: size()·n, out: size()·n), e.g. split sizes.
  virtual void all_to_all(const int64_t* in, int64_t* out, int64_t n) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // The group of the ranks that pass the same color, ranked by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Bytes this rank has sent into collectives so far, counted as the ring algorithms move them
  // (all-reduce 2·(p−1)/p·bytes, reduce-scatter and all-gather (p−1)/p·bytes of the full
  // buffer; all-to-all: the blocks for the other ranks): what the communication-volume checks
  // compare with the theory.
  int64_t bytes_sent() const { return bytes_sent_; }

 protected:
  void count(double bytes) { bytes_sent_ += static_cast<int64_t>(bytes); }

 private:
  int64_t bytes_sent_ = 0;
};

// A group of one: every collective is a copy or a no-op.
std::unique_ptr<Communicator> single_process();

// Whether this process was started by an MPI launcher (mpirun/mpiexec set OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK). Only then is MPI initialized: a plain `titan` runs without MPI.
bool launched_by_mpi();

// The world group: MPI_COMM_WORLD when launched_by_mpi() (MPI initialized on first use, finalized
// at exit), else a single process. Throws titan::Error when MPI cannot start.
Communicator& world();

// Ends every rank of the job with `code` (MPI_Abort under MPI, else std::exit): the error path of
// a multi-rank run, so that one rank's failure never leaves the others waiting in a collective.
[[noreturn]] void abort_job(int code);

}  // namespace titan::dist
