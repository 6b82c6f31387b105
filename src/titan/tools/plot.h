// titan plot: a picture of a run from its metrics.jsonl — training loss against step (and the
// validation loss where the run validated) on the left axis, the learning rate on a right axis —
// as an SVG file, readable at a glance in a browser or a README.
//
// Written by a small SVG writer here: the plotting library Debian offers for C/C++ (PLplot)
// pulls Qt, wxWidgets and Fortran into the build for one line chart.
#pragma once
#include <string>

namespace titan::tools {

// Reads `metrics_jsonl` (training records: step, loss, lr; validation records: step,
// validation_loss) and writes the SVG to `svg_out` (temporary name, then rename). Throws
// titan::Error naming the file for a missing or unreadable file or one without loss records.
void plot_metrics(const std::string& metrics_jsonl, const std::string& svg_out,
                  const std::string& title);

}  // namespace titan::tools
