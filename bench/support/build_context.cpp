// Adds ferry's own build type to the context every benchmark run prints first. Debian's
// libbenchmark is built without NDEBUG, so Google Benchmark also prints "Library was
// built as DEBUG. Timings may be affected." (and "library_build_type": "debug" in JSON):
// that line is about the benchmark library, which only starts and stops the clock, not
// about ferry, whose build this context line states.
#include <benchmark/benchmark.h>

#include <string>

namespace {

[[maybe_unused]] const bool registered = [] {
  benchmark::AddCustomContext("ferry_build",
                              std::string(FERRY_BENCH_BUILD_TYPE) + " (" + FERRY_BENCH_CXX_FLAGS +
                                  "); a \"Library was built as DEBUG\" warning below is about Google Benchmark's "
                                  "library (Debian's libbenchmark), not ferry");
  return true;
}();

}  // namespace
