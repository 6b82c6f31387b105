// Helpers for the kernel tests: random data, comparison of an fp32 kernel result against a
// double-precision reference, and central finite differences of a double reference function.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace titan::kernel_test {

inline std::vector<float> uniform(int64_t n, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(g);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::vector<int64_t> iota_idx(int64_t n) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  return idx;
}

// Checks |got[i] - want[i]| <= rtol·|want[i]| + atol_rel·max_j |want[j]| for i in idx: a relative
// tolerance plus an absolute one scaled to the magnitude of the whole tensor (elements that come
// out near zero by cancellation are judged against the tensor's scale, not their own). Reports
// the first few violations, records the largest error (absolute, and divided by max |want|) as a
// test property, and returns that normalized error.
template <class G>
double expect_close(const std::string& what, const G* got, const double* want,
                    const std::vector<int64_t>& idx, double rtol, double atol_rel) {
  double scale = 0.0;
  for (int64_t i : idx) scale = std::max(scale, std::abs(want[i]));
  const double atol = atol_rel * std::max(scale, 1e-30);
  double max_err = 0.0;
  int reported = 0;
  for (int64_t i : idx) {
    const double g = static_cast<double>(got[i]), w = want[i];
    const double err = std::abs(g - w);
    if (!(err <= atol + rtol * std::abs(w))) {  // also catches NaN
      if (reported++ < 5)
        ADD_FAILURE() << what << ": index " << i << " got " << g << " expected " << w << " (|err| "
                      << err << ", allowed " << atol + rtol * std::abs(w) << ", tensor scale "
                      << scale << ")";
      if (std::isnan(err)) max_err = std::numeric_limits<double>::infinity();
    }
    max_err = std::max(max_err, err);
  }
  if (reported > 5) ADD_FAILURE() << what << ": " << reported << " elements out of tolerance";
  const double norm = max_err / std::max(scale, 1e-30);
  std::ostringstream os;
  os << max_err << " abs, " << norm << " of max|ref| " << scale;
  ::testing::Test::RecordProperty("maxerr " + what, os.str());
  return norm;
}

template <class G>
double expect_close(const std::string& what, const std::vector<G>& got,
                    const std::vector<double>& want, double rtol, double atol_rel) {
  EXPECT_EQ(got.size(), want.size()) << what;
  return expect_close(what, got.data(), want.data(),
                      iota_idx(static_cast<int64_t>(std::min(got.size(), want.size()))), rtol,
                      atol_rel);
}

// Central differences d f / d x[i] for i in idx, of a double function f that reads x.
// eps = 1e-5 on O(1) inputs: truncation error ~eps²·f''' ≈ 1e-10, rounding ~1e-16·|f|/eps.
inline std::vector<double> finite_diff(std::vector<double>& x, const std::vector<int64_t>& idx,
                                       const std::function<double()>& f, double eps = 1e-5) {
  std::vector<double> g;
  g.reserve(idx.size());
  for (int64_t i : idx) {
    const double x0 = x[static_cast<size_t>(i)];
    x[static_cast<size_t>(i)] = x0 + eps;
    const double fp = f();
    x[static_cast<size_t>(i)] = x0 - eps;
    const double fm = f();
    x[static_cast<size_t>(i)] = x0;
    g.push_back((fp - fm) / (2 * eps));
  }
  return g;
}

// Scatters values for indices idx into a dense vector of size n (others 0).
// Formats a double in scientific notation for test properties.
inline std::string sci(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

inline std::vector<double> scatter(int64_t n, const std::vector<int64_t>& idx,
                                   const std::vector<double>& vals) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (size_t k = 0; k < idx.size(); ++k) out[static_cast<size_t>(idx[k])] = vals[k];
  return out;
}

}  // namespace titan::kernel_test
