# FERRY_SANITIZE=address builds everything with AddressSanitizer + UBSan,
# FERRY_SANITIZE=thread with ThreadSanitizer. Applied globally so that tests,
# benchmarks and samples are instrumented like the library. C++ only: nvcc (the CUDA test
# kernels) does not take these flags.
#
# UBSan's vptr check is left out: it probes every vtable through a pipe it opens, so in a
# process at its open-file limit (which resource_limit_test creates on purpose, and which
# ferry must handle) every virtual call is reported as a bad vptr.
if(FERRY_SANITIZE STREQUAL "address")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined;-fno-sanitize=vptr;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>")
  add_link_options(-fsanitize=address,undefined -fno-sanitize=vptr)
elseif(FERRY_SANITIZE STREQUAL "thread")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(NOT FERRY_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FERRY_SANITIZE must be '', 'address' or 'thread', not '${FERRY_SANITIZE}'")
endif()
