// `ferry show PID`: everything one process reports, for a person. Contract: render_show()
// returns sections in the order of the schema (process, ends, listeners, shared memory,
// CUDA, workers, fan-outs), each with aligned columns; an empty section says "none".
// (`--json` prints Snapshot::raw instead, as received.)
#pragma once

#include <string>

#include "snapshot.hpp"

namespace ferry::cli {

std::string render_show(const Snapshot& snapshot);

/// A number as an integer when it is one ("12"), otherwise with up to 6 significant digits.
std::string plain_number(double value);

}  // namespace ferry::cli
