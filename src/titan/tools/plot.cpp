#include "titan/tools/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "nlohmann/json.hpp"
#include "titan/core/error.h"
#include "titan/core/file_io.h"

namespace titan::tools {
namespace {

struct Series {
  std::vector<double> x, y;
};

// Tick positions: about n "nice" values (1, 2 or 5 × 10^k apart) covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int n) {
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}

}  // namespace

void plot_metrics(const std::string& path, const std::string& out, const std::string& title) {
  io::check_input_file(path, "metrics file");
  io::check_not_input(out, "--output", path, "the metrics file");
  std::ifstream f(path);
  check(f.good(),
        path + " cannot be read; pass the dump_folder of a run with metrics.enable_jsonl");
  Series loss, val, lr;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    check(!j.is_discarded() && j.is_object(),
          path + ":" + std::to_string(n) + ": not a JSON record");
    if (!j.contains("step") || !j["step"].is_number()) continue;
    const double s = j["step"].get<double>();
    auto take = [&](const char* k, Series& to) {
      if (j.contains(k) && j[k].is_number() && std::isfinite(j[k].get<double>())) {
        to.x.push_back(s);
        to.y.push_back(j[k].get<double>());
      }
    };
    take("loss", loss);
    take("validation_loss", val);
    take("lr", lr);
  }
  check(!loss.x.empty(), path + " holds no training loss records");

  const double W = 800, H = 450, L = 70, R = 70, T = 50, B = 55, pw = W - L - R, ph = H - T - B;
  double x0 = loss.x.front(), x1 = loss.x.back();
  double y0 = *std::min_element(loss.y.begin(), loss.y.end());
  double y1 = *std::max_element(loss.y.begin(), loss.y.end());
  for (double v : val.y) y0 = std::min(y0, v), y1 = std::max(y1, v);
  for (double v : val.x) x1 = std::max(x1, v);
  if (x1 <= x0) x1 = x0 + 1;
  const double pad = (y1 - y0) * 0.05 + 1e-9;
  y0 -= pad, y1 += pad;
  double l1 = 0;
  for (double v : lr.y) l1 = std::max(l1, v);
  if (l1 <= 0) l1 = 1;
  l1 *= 1.05;
  auto X = [&](double v) { return L + (v - x0) / (x1 - x0) * pw; };
  auto Y = [&](double v) { return T + (1 - (v - y0) / (y1 - y0)) * ph; };
  auto YL = [&](double v) { return T + (1 - v / l1) * ph; };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << esc(title)
    << "</text>\n";
  for (double t : ticks(y0, y1, 6))  // grid and left axis
    s << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << Y(t) << "\" y2=\"" << Y(t)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << L - 6 << "\" y=\"" << Y(t) + 4
      << "\" text-anchor=\"end\">" << num(t) << "</text>\n";
  for (double t : ticks(x0, x1, 8))
    s << "<line x1=\"" << X(t) << "\" x2=\"" << X(t) << "\" y1=\"" << T + ph << "\" y2=\""
      << T + ph + 5 << "\" stroke=\"black\"/><text x=\"" << X(t) << "\" y=\"" << T + ph + 18
      << "\" text-anchor=\"middle\">" << num(t) << "</text>\n";
  if (!lr.x.empty())
    for (double t : ticks(0, l1, 5))
      s << "<text x=\"" << L + pw + 6 << "\" y=\"" << YL(t) + 4 << "\" fill=\"#888\">" << num(t)
        << "</text>\n";
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 12
    << "\" text-anchor=\"middle\">step</text>\n"
    << "<text transform=\"translate(18 " << T + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">loss</text>\n";
  if (!lr.x.empty())
    s << "<text transform=\"translate(" << W - 14 << " " << T + ph / 2
      << ") rotate(90)\" text-anchor=\"middle\" fill=\"#888\">learning rate</text>\n";
  auto poly = [&](const Series& d, auto&& y, const char* style) {
    s << "<polyline fill=\"none\" " << style << " points=\"";
    for (size_t i = 0; i < d.x.size(); ++i) s << X(d.x[i]) << "," << y(d.y[i]) << " ";
    s << "\"/>\n";
  };
  if (!lr.x.empty()) poly(lr, YL, "stroke=\"#999\" stroke-dasharray=\"5 4\" stroke-width=\"1.5\"");
  poly(loss, Y, "stroke=\"#1f77b4\" stroke-width=\"2\"");
  if (!val.x.empty()) {
    poly(val, Y, "stroke=\"#ff7f0e\" stroke-width=\"2\"");
    for (size_t i = 0; i < val.x.size(); ++i)
      s << "<circle cx=\"" << X(val.x[i]) << "\" cy=\"" << Y(val.y[i])
        << "\" r=\"3.5\" fill=\"#ff7f0e\"/>\n";
  }
  // Legend, top right inside the plot.
  double ly = T + 18;
  auto key = [&](const char* name, const char* style) {
    s << "<line x1=\"" << L + pw - 170 << "\" x2=\"" << L + pw - 140 << "\" y1=\"" << ly - 4
      << "\" y2=\"" << ly - 4 << "\" " << style << "/><text x=\"" << L + pw - 132 << "\" y=\"" << ly
      << "\">" << name << "</text>\n";
    ly += 18;
  };
  key("training loss", "stroke=\"#1f77b4\" stroke-width=\"2\"");
  if (!val.x.empty()) key("validation loss", "stroke=\"#ff7f0e\" stroke-width=\"2\"");
  if (!lr.x.empty()) key("learning rate", "stroke=\"#999\" stroke-dasharray=\"5 4\"");
  s << "</svg>\n";
  io::write_file_atomic(out, s.str());
}

}  // namespace titan::tools
