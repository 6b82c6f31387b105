// Expert parallelism's dispatch and combine around a grouped-experts op (expert_parallel.h
// states the maths and the order of the rows).
#include "titan/parallel/expert_parallel.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/error.h"
#include "titan/ops/backend.h"

namespace titan::parallel {
namespace {

// Grows b to at least n elements in mem's memory (contents dropped when it grows).
template <typename T>
T* at_least(Buffer<T>& b, int64_t n, const DeviceMemory& mem) {
  if (b.size() < n) b.resize(n, mem);
  return b.data();
}

// An index array computed on the host; `at` is where the kernels read it (place()): host itself on
// the CPU, else its copy in dev.
struct Index {
  std::vector<int32_t> host;
  Buffer<int32_t> dev;
  const int32_t* at = nullptr;
};

// What one layer keeps from its forward to its backward.
struct LayerState {
  std::vector<int64_t> send, recv;  // rows to / from each rank
  Index slot;                       // slot[t·K + j]: the row of (t, j) in the send order
  Index tok;                        // tok[t·K + j] = t
  Index idx_in;                     // [R] the local expert of each row received
  Buffer<float> x_in;               // [R, D] the rows received (the local op's input)
  Buffer<float> w_in;               // [R] their routing weight
  Buffer<float> saved;              // the local op's saved state
  int64_t R = 0;
};

}  // namespace

// Per call: rows in the send order, rows as received, the local op's outputs and its buffers.
struct DispatchBuffers {
  Buffer<float> rows, got, out, dx, dw_in, scratch;
  std::vector<int32_t> idx;  // the routing read back from a device
  DispatchSeconds seconds;
};

std::shared_ptr<DispatchBuffers> dispatch_buffers() { return std::make_shared<DispatchBuffers>(); }
DispatchSeconds dispatch_seconds(const DispatchBuffers& b) { return b.seconds; }

namespace {

struct Shared {
  ops::GroupedExpertsOp local;
  dist::Communicator* group = nullptr;  // the counts (host memory)
  dist::Communicator* rows = nullptr;   // the rows (the local op's memory)
  const ops::Backend* be = nullptr;     // the local op's device: row moves, memory
  DeviceMemory mem;
  std::map<const float*, LayerState> layers;
  std::shared_ptr<DispatchBuffers> buf;
};

// Runs f, adding its wall time to acc.
template <typename F>
void timed(double& acc, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::vector<int64_t> times(const std::vector<int64_t>& v, int64_t k) {
  std::vector<int64_t> out(v);
  for (int64_t& x : out) x *= k;
  return out;
}

void check_split(const ops::ExpertsShape& s, int P) {
  check(s.E % P == 0, "expert parallelism: num_experts (" + std::to_string(s.E) +
                          ") must be divisible by ep (" + std::to_string(P) + ")");
}

// Sets i.at: i.host on the CPU, else i.host copied into i.dev.
const int32_t* place(const Shared& sh, Index& i) {
  i.at = i.host.data();
  if (sh.mem.host()) return i.at;
  at_least(i.dev, static_cast<int64_t>(i.host.size()), sh.mem);
  if (!i.host.empty()) sh.be->copy(i.dev.data(), i.at, sizeof(int32_t) * i.host.size());
  return i.at = i.dev.data();
}

// The local op's arguments: this rank's experts and the rows it received.
ops::ExpertsArgs local_args(const ops::ExpertsArgs& ea, LayerState& st, Shared& sh) {
  const ops::ExpertsShape& s = ea.s;
  const int64_t El = s.E / sh.group->size();
  ops::ExpertsArgs la = ea;  // the weights: this rank's experts (the model's slice)
  la.s = {st.R, s.D, s.F, El, 1};
  la.x = st.x_in.data();
  la.idx = st.idx_in.at;
  la.w = st.w_in.data();
  la.saved = at_least(st.saved, sh.local.saved_floats(la.s), sh.mem);
  la.scratch = at_least(sh.buf->scratch, sh.local.scratch_floats(la.s), sh.mem);
  return la;
}

void forward(Shared& sh, const ops::ExpertsArgs& ea, float* y) {
  const ops::ExpertsShape& s = ea.s;
  dist::Communicator& g = *sh.group;
  const ops::Backend& be = *sh.be;
  const int P = g.size();
  check_split(s, P);
  const int64_t El = s.E / P, D = s.D, N = s.T * s.K, W = D + 1;
  LayerState& st = sh.layers[ea.saved];

  // 1. Rows [x[t] | w[t,j]] sorted by (expert, t, j): rank-major, a rank's experts being
  //    consecutive. The order is computed on the host (from the routing read back off the CPU).
  const int32_t* idx = ea.idx;
  if (!sh.mem.host()) {
    sh.buf->idx.resize(static_cast<size_t>(N));
    be.copy(sh.buf->idx.data(), ea.idx, sizeof(int32_t) * static_cast<size_t>(N));
    idx = sh.buf->idx.data();
  }
  std::vector<int64_t> per_expert(static_cast<size_t>(s.E), 0);
  for (int64_t a = 0; a < N; ++a) {
    const int32_t e = idx[a];
    check(e >= 0 && e < s.E, "expert parallelism: expert index " + std::to_string(e) +
                                 " outside [0, " + std::to_string(s.E) + ")");
    ++per_expert[static_cast<size_t>(e)];
  }
  std::vector<int64_t> start(static_cast<size_t>(s.E), 0);
  for (int64_t e = 1; e < s.E; ++e)
    start[static_cast<size_t>(e)] = start[size_t(e - 1)] + per_expert[size_t(e - 1)];
  st.slot.host.resize(static_cast<size_t>(N));
  st.tok.host.resize(static_cast<size_t>(N));
  for (int64_t a = 0; a < N; ++a) {
    st.slot.host[static_cast<size_t>(a)] =
        static_cast<int32_t>(start[static_cast<size_t>(idx[a])]++);
    st.tok.host[static_cast<size_t>(a)] = static_cast<int32_t>(a / s.K);
  }
  const int32_t* slot = place(sh, st.slot);
  const int32_t* tok = place(sh, st.tok);
  float* rows = at_least(sh.buf->rows, N * W, sh.mem);
  be.copy_rows(ea.x, D, tok, rows, W, slot, N, D);
  be.copy_rows(ea.w, 1, nullptr, rows + D, W, slot, N, 1);
  // The counts per (destination, local expert), then the rows.
  std::vector<int64_t> got(static_cast<size_t>(s.E));
  timed(sh.buf->seconds.exchange, [&] { g.all_to_all(per_expert.data(), got.data(), El); });
  st.send.assign(static_cast<size_t>(P), 0);
  st.recv.assign(static_cast<size_t>(P), 0);
  for (int64_t e = 0; e < s.E; ++e) {
    st.send[static_cast<size_t>(e / El)] += per_expert[static_cast<size_t>(e)];
    st.recv[static_cast<size_t>(e / El)] += got[static_cast<size_t>(e)];
  }
  const int64_t R = sum(st.recv);
  st.R = R;
  float* in = at_least(sh.buf->got, R * W, sh.mem);
  timed(sh.buf->seconds.exchange,
        [&] { sh.rows->all_to_all(rows, times(st.send, W), in, times(st.recv, W)); });
  // Received from rank q: its rows for local expert 0, then 1, ...
  float* x_in = at_least(st.x_in, R * D, sh.mem);
  float* w_in = at_least(st.w_in, R, sh.mem);
  be.copy_rows(in, W, nullptr, x_in, D, nullptr, R, D);
  be.copy_rows(in + D, W, nullptr, w_in, 1, nullptr, R, 1);
  st.idx_in.host.resize(static_cast<size_t>(R));
  int64_t k = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t e = 0; e < El; ++e)
      for (int64_t i = 0; i < got[static_cast<size_t>(q * El + e)]; ++i, ++k)
        st.idx_in.host[static_cast<size_t>(k)] = static_cast<int32_t>(e);
  place(sh, st.idx_in);

  // 2. The local experts on the rows received, weighted: out = w·expert(x).
  float* out = at_least(sh.buf->out, R * D, sh.mem);
  if (R > 0) timed(sh.buf->seconds.experts, [&] { sh.local.forward(local_args(ea, st, sh), out); });

  // 3. Back to the rows' ranks; y[t] = Σ_j in slot order.
  float* back = at_least(sh.buf->rows, N * D, sh.mem);
  timed(sh.buf->seconds.exchange,
        [&] { sh.rows->all_to_all(out, times(st.recv, D), back, times(st.send, D)); });
  be.sum_rows(back, D, slot, s.K, y, s.T, D);
}

void backward(Shared& sh, const ops::ExpertsArgs& ea, const ops::ExpertsGrads& eg) {
  const ops::ExpertsShape& s = ea.s;
  const ops::Backend& be = *sh.be;
  const int P = sh.group->size();
  check_split(s, P);
  const int64_t D = s.D, N = s.T * s.K, W = D + 1;
  auto it = sh.layers.find(ea.saved);
  check(it != sh.layers.end() && static_cast<int64_t>(it->second.slot.host.size()) == N,
        "expert parallelism: backward without the forward of the same layer and tokens");
  LayerState& st = it->second;
  const int64_t R = st.R;
  const int32_t *slot = st.slot.at, *tok = st.tok.at;

  // The rows dy[t] to the experts' ranks.
  float* rows = at_least(sh.buf->rows, N * W, sh.mem);
  be.copy_rows(eg.dy, D, tok, rows, D, slot, N, D);
  float* dy_in = at_least(sh.buf->got, R * W, sh.mem);
  timed(sh.buf->seconds.exchange,
        [&] { sh.rows->all_to_all(rows, times(st.send, D), dy_in, times(st.recv, D)); });

  // The local experts' backward: the rows' input and routing-weight gradients, the experts'
  // weight gradients; packed [dx | dw] for the way back.
  float* dx_in = at_least(sh.buf->out, R * W, sh.mem);
  if (R > 0) {
    const ops::ExpertsArgs la = local_args(ea, st, sh);
    float* dx = at_least(sh.buf->dx, R * D, sh.mem);
    ops::ExpertsGrads lg = eg;  // the weight gradients: this rank's experts'
    lg.dy = dy_in;
    lg.dx = dx;
    lg.dw = at_least(sh.buf->dw_in, R, sh.mem);
    timed(sh.buf->seconds.experts, [&] { sh.local.backward(la, lg); });
    be.copy_rows(dx, D, nullptr, dx_in, W, nullptr, R, D);
    be.copy_rows(lg.dw, 1, nullptr, dx_in + D, W, nullptr, R, 1);
  }

  // Back to the rows' ranks: dx[t] = Σ_j dx'[t,j] (j in order), dw[t,j] = dw'[t,j].
  timed(sh.buf->seconds.exchange,
        [&] { sh.rows->all_to_all(dx_in, times(st.recv, W), rows, times(st.send, W)); });
  be.sum_rows(rows, W, slot, s.K, eg.dx, s.T, D);
  be.copy_rows(rows + D, W, slot, eg.dw, 1, nullptr, N, 1);
}

}  // namespace

ops::GroupedExpertsOp expert_parallel(ops::GroupedExpertsOp local, dist::Communicator& group,
                                      std::shared_ptr<DispatchBuffers> buffers,
                                      dist::Communicator* rows_group) {
  auto sh = std::make_shared<Shared>();
  sh->local = std::move(local);
  sh->group = &group;
  sh->rows = rows_group ? rows_group : &group;
  sh->be = &ops::backend(sh->local.device, "float32");
  sh->mem = sh->be->memory();
  sh->buf = buffers ? std::move(buffers) : dispatch_buffers();
  const int P = group.size();
  ops::GroupedExpertsOp op;
  op.name = sh->local.name + "+ep" + std::to_string(P);
  op.device = sh->local.device;
  op.dtype = sh->local.dtype;
  op.saved_floats = [](const ops::ExpertsShape&) -> int64_t { return 16; };  // the layer's key
  op.scratch_floats = [](const ops::ExpertsShape&) -> int64_t { return 0; };
  op.forward = [sh](const ops::ExpertsArgs& ea, float* y) { forward(*sh, ea, y); };
  op.backward = [sh](const ops::ExpertsArgs& ea, const ops::ExpertsGrads& eg) {
    backward(*sh, ea, eg);
  };
  op.check = [sh, P](const ops::ExpertsShape& s) {
    check_split(s, P);
    // The most rows this rank can receive: every routed row of every rank.
    if (sh->local.check) sh->local.check({s.T * s.K * P, s.D, s.F, s.E / P, 1});
  };
  return op;
}

}  // namespace titan::parallel
