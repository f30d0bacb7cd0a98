# FERRY_BUILD_FUZZERS=ON builds the libFuzzer targets of tests/fuzz. libFuzzer comes with
# clang only. Every target of the build gets coverage instrumentation
# (-fsanitize=fuzzer-no-link), so that the fuzzer sees the library's branches; the fuzz
# executables link the libFuzzer driver (-fsanitize=fuzzer). Combine with
# FERRY_SANITIZE=address (the 'asan' preset does: CI's one clang build serves
# the sanitized test suite and the fuzzers) to catch memory errors, not just crashes.
if(FERRY_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FERRY_BUILD_FUZZERS needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with -DCMAKE_CXX_COMPILER=clang++-14, or use the 'asan' preset")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
