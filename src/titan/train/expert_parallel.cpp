// Expert parallelism's dispatch and combine around a grouped-experts op (expert_parallel.h
// states the maths and the order of the rows).
#include "titan/train/expert_parallel.h"

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/buffer.h"
#include "titan/core/error.h"

namespace titan::train {
namespace {

// Grows b to at least n elements (contents dropped when it grows).
template <typename T>
T* at_least(Buffer<T>& b, int64_t n) {
  if (b.size() < n) b.resize(n);
  return b.data();
}

// What one layer keeps from its forward to its backward.
struct LayerState {
  std::vector<int64_t> send, recv;  // rows to / from each rank
  std::vector<int64_t> slot;        // slot[t·K + j]: the row of (t, j) in the send order
  Buffer<float> x_in;               // [R, D] the rows received (the local op's input)
  Buffer<int32_t> idx_in;           // [R] their local expert
  Buffer<float> w_in;               // [R] their routing weight
  Buffer<float> saved;              // the local op's saved state
  int64_t R = 0;
};

}  // namespace

// Per call: rows in the send order, rows as received, the local op's outputs and its buffers.
struct DispatchBuffers {
  Buffer<float> rows, got, out, dx, dw_in, scratch;
  DispatchSeconds seconds;
};

std::shared_ptr<DispatchBuffers> dispatch_buffers() { return std::make_shared<DispatchBuffers>(); }
DispatchSeconds dispatch_seconds(const DispatchBuffers& b) { return b.seconds; }

namespace {

struct Shared {
  ops::GroupedExpertsOp local;
  dist::Communicator* group = nullptr;
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

// The local op's arguments: this rank's experts and the rows it received.
ops::ExpertsArgs local_args(const ops::ExpertsArgs& ea, LayerState& st, Shared& sh) {
  const ops::ExpertsShape& s = ea.s;
  const int64_t El = s.E / sh.group->size();
  ops::ExpertsArgs la = ea;  // the weights: this rank's experts (the model's slice)
  la.s = {st.R, s.D, s.F, El, 1};
  la.x = st.x_in.data();
  la.idx = st.idx_in.data();
  la.w = st.w_in.data();
  la.saved = at_least(st.saved, sh.local.saved_floats(la.s));
  la.scratch = at_least(sh.buf->scratch, sh.local.scratch_floats(la.s));
  return la;
}

void forward(Shared& sh, const ops::ExpertsArgs& ea, float* y) {
  const ops::ExpertsShape& s = ea.s;
  dist::Communicator& g = *sh.group;
  const int P = g.size();
  check_split(s, P);
  const int64_t El = s.E / P, D = s.D, N = s.T * s.K, W = D + 1;
  LayerState& st = sh.layers[ea.saved];

  // 1. Rows [x[t] | w[t,j]] sorted by (expert, t, j): rank-major, a rank's experts being
  //    consecutive.
  std::vector<int64_t> per_expert(static_cast<size_t>(s.E), 0);
  for (int64_t a = 0; a < N; ++a) {
    const int32_t e = ea.idx[a];
    check(e >= 0 && e < s.E, "expert parallelism: expert index " + std::to_string(e) +
                                 " outside [0, " + std::to_string(s.E) + ")");
    ++per_expert[static_cast<size_t>(e)];
  }
  std::vector<int64_t> start(static_cast<size_t>(s.E), 0);
  for (int64_t e = 1; e < s.E; ++e)
    start[static_cast<size_t>(e)] = start[size_t(e - 1)] + per_expert[size_t(e - 1)];
  st.slot.resize(static_cast<size_t>(N));
  float* rows = at_least(sh.buf->rows, N * W);
  for (int64_t a = 0; a < N; ++a) {
    const int64_t at = start[static_cast<size_t>(ea.idx[a])]++;
    st.slot[static_cast<size_t>(a)] = at;
    std::memcpy(rows + at * W, ea.x + a / s.K * D, sizeof(float) * static_cast<size_t>(D));
    rows[at * W + D] = ea.w[a];
  }
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
  float* in = at_least(sh.buf->got, R * W);
  timed(sh.buf->seconds.exchange,
        [&] { g.all_to_all(rows, times(st.send, W), in, times(st.recv, W)); });
  // Received from rank q: its rows for local expert 0, then 1, ...
  float* x_in = at_least(st.x_in, R * D);
  int32_t* idx_in = at_least(st.idx_in, R);
  float* w_in = at_least(st.w_in, R);
  int64_t k = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t e = 0; e < El; ++e)
      for (int64_t i = 0; i < got[static_cast<size_t>(q * El + e)]; ++i, ++k) {
        std::memcpy(x_in + k * D, in + k * W, sizeof(float) * static_cast<size_t>(D));
        w_in[k] = in[k * W + D];
        idx_in[k] = static_cast<int32_t>(e);
      }

  // 2. The local experts on the rows received, weighted: out = w·expert(x).
  float* out = at_least(sh.buf->out, R * D);
  if (R > 0) timed(sh.buf->seconds.experts, [&] { sh.local.forward(local_args(ea, st, sh), out); });

  // 3. Back to the rows' ranks; y[t] = Σ_j in slot order.
  float* back = at_least(sh.buf->rows, N * D);
  timed(sh.buf->seconds.exchange,
        [&] { g.all_to_all(out, times(st.recv, D), back, times(st.send, D)); });
  std::memset(y, 0, sizeof(float) * static_cast<size_t>(s.T * D));
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t j = 0; j < s.K; ++j) {
      const float* row = back + st.slot[static_cast<size_t>(t * s.K + j)] * D;
      float* yt = y + t * D;
      for (int64_t d = 0; d < D; ++d) yt[d] += row[d];
    }
}

void backward(Shared& sh, const ops::ExpertsArgs& ea, const ops::ExpertsGrads& eg) {
  const ops::ExpertsShape& s = ea.s;
  dist::Communicator& g = *sh.group;
  const int P = g.size();
  check_split(s, P);
  const int64_t D = s.D, N = s.T * s.K, W = D + 1;
  auto it = sh.layers.find(ea.saved);
  check(it != sh.layers.end() && static_cast<int64_t>(it->second.slot.size()) == N,
        "expert parallelism: backward without the forward of the same layer and tokens");
  LayerState& st = it->second;
  const int64_t R = st.R;

  // The rows dy[t] to the experts' ranks.
  float* rows = at_least(sh.buf->rows, N * W);
  for (int64_t a = 0; a < N; ++a)
    std::memcpy(rows + st.slot[static_cast<size_t>(a)] * D, eg.dy + a / s.K * D,
                sizeof(float) * static_cast<size_t>(D));
  float* dy_in = at_least(sh.buf->got, R * W);
  timed(sh.buf->seconds.exchange,
        [&] { g.all_to_all(rows, times(st.send, D), dy_in, times(st.recv, D)); });

  // The local experts' backward: the rows' input and routing-weight gradients, the experts'
  // weight gradients; packed [dx | dw] for the way back.
  float* dx_in = at_least(sh.buf->out, R * W);
  if (R > 0) {
    const ops::ExpertsArgs la = local_args(ea, st, sh);
    float* dx = at_least(sh.buf->dx, R * D);
    ops::ExpertsGrads lg = eg;  // the weight gradients: this rank's experts'
    lg.dy = dy_in;
    lg.dx = dx;
    lg.dw = at_least(sh.buf->dw_in, R);
    timed(sh.buf->seconds.experts, [&] { sh.local.backward(la, lg); });
    for (int64_t k = 0; k < R; ++k) {
      std::memcpy(dx_in + k * W, dx + k * D, sizeof(float) * static_cast<size_t>(D));
      dx_in[k * W + D] = lg.dw[k];
    }
  }

  // Back to the rows' ranks: dx[t] = Σ_j dx'[t,j] (j in order), dw[t,j] = dw'[t,j].
  timed(sh.buf->seconds.exchange,
        [&] { g.all_to_all(dx_in, times(st.recv, W), rows, times(st.send, W)); });
  std::memset(eg.dx, 0, sizeof(float) * static_cast<size_t>(s.T * D));
  for (int64_t a = 0; a < N; ++a) {
    const float* row = rows + st.slot[static_cast<size_t>(a)] * W;
    float* dxt = eg.dx + a / s.K * D;
    for (int64_t d = 0; d < D; ++d) dxt[d] += row[d];
    eg.dw[a] = row[D];
  }
}

}  // namespace

ops::GroupedExpertsOp expert_parallel(ops::GroupedExpertsOp local, dist::Communicator& group,
                                      std::shared_ptr<DispatchBuffers> buffers) {
  auto sh = std::make_shared<Shared>();
  sh->local = std::move(local);
  sh->group = &group;
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

}  // namespace titan::train
