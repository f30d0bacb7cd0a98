# CUDA support. FERRY_WITH_CUDA is AUTO (the default: build the CUDA parts when the CUDA
# toolkit is found), ON (the toolkit is required) or OFF. The outcome is FERRY_HAS_CUDA,
# which is also a compile definition of the ferry target (1 or 0) for code that uses it.
#
# The library's CUDA code is host C++ that calls the CUDA runtime API (no nvcc); nvcc only
# compiles the test kernels (tests/support/cuda_kernels.cu).
set(FERRY_WITH_CUDA AUTO CACHE STRING "Build the CUDA parts: AUTO (when the toolkit is found), ON (required) or OFF")
set_property(CACHE FERRY_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)

set(FERRY_HAS_CUDA OFF)
string(TOUPPER "${FERRY_WITH_CUDA}" _ferry_cuda_mode)
if(_ferry_cuda_mode STREQUAL "AUTO")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(FERRY_HAS_CUDA ON)
  else()
    message(STATUS "ferry: building WITHOUT CUDA (no CUDA toolkit found; set CUDAToolkit_ROOT to use one)")
  endif()
elseif(FERRY_WITH_CUDA)
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "ferry: FERRY_WITH_CUDA=${FERRY_WITH_CUDA} but no CUDA toolkit was found; "
                        "install one or point CUDAToolkit_ROOT at it (or configure with -DFERRY_WITH_CUDA=OFF)")
  endif()
  set(FERRY_HAS_CUDA ON)
else()
  message(STATUS "ferry: building WITHOUT CUDA (FERRY_WITH_CUDA=${FERRY_WITH_CUDA})")
endif()
if(FERRY_HAS_CUDA)
  message(STATUS "ferry: building WITH CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_LIBRARY_DIR})")
endif()

# Adds the runtime layer's CUDA parts to `target` (sources relative to runtime/): the
# host-only pieces (release boards, the block pool) always, the code that calls CUDA only with CUDA, and
# stubs that report "built without CUDA" otherwise.
function(ferry_add_cuda_sources target)
  target_sources(${target} PRIVATE
    src/cuda/release_board.cpp
    src/cuda/block_pool.cpp)
  if(FERRY_HAS_CUDA)
    target_sources(${target} PRIVATE
      src/cuda/runtime.cpp
      src/cuda/device_memory.cpp
      src/cuda/ipc_memory.cpp
      src/cuda/ipc_signals.cpp
      src/cuda/fence_watch.cpp
      src/cuda/copy.cpp)
    target_link_libraries(${target} PUBLIC CUDA::cudart)
    target_compile_definitions(${target} PUBLIC FERRY_HAS_CUDA=1)
  else()
    target_sources(${target} PRIVATE src/cuda/disabled.cpp)
    target_compile_definitions(${target} PUBLIC FERRY_HAS_CUDA=0)
  endif()
endfunction()
