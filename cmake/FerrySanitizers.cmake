# FERRY_SANITIZE=address builds everything with AddressSanitizer + UBSan,
# FERRY_SANITIZE=thread with ThreadSanitizer. Applied globally so that tests,
# benchmarks and samples are instrumented like the library. C++ only: nvcc (the CUDA test
# kernels) does not take these flags.
if(FERRY_SANITIZE STREQUAL "address")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>")
  add_link_options(-fsanitize=address,undefined)
elseif(FERRY_SANITIZE STREQUAL "thread")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(NOT FERRY_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FERRY_SANITIZE must be '', 'address' or 'thread', not '${FERRY_SANITIZE}'")
endif()
