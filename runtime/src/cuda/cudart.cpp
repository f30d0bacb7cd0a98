#include "cuda/cudart.hpp"

#include <dlfcn.h>

#include <string>

#include "ferry/cuda.hpp"

#ifndef FERRY_CUDART_SONAME
#error "FERRY_CUDART_SONAME (the CUDA runtime's soname, e.g. libcudart.so.13) is set by cmake/FerryCuda.cmake"
#endif
#ifndef FERRY_CUDART_PATH
#error "FERRY_CUDART_PATH (the CUDA runtime in the toolkit ferry was built with) is set by cmake/FerryCuda.cmake"
#endif

namespace ferry::cuda {
namespace {

#define FERRY_CUDART_NAME(name) FERRY_CUDART_NAME_OF(name)  // expands a name that the headers #define
#define FERRY_CUDART_NAME_OF(name) #name

struct Loaded {
  Cudart functions;
  std::string error;  // why the runtime is not usable; empty when it is
};

Loaded load() {
  Loaded loaded;
  // Never closed: CUDA objects and the runtime's own threads live until the process exits.
  void* library = ::dlopen(FERRY_CUDART_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const std::string first = ::dlerror();
    library = ::dlopen(FERRY_CUDART_PATH, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      loaded.error = "the CUDA runtime " FERRY_CUDART_SONAME " that this ferry was built for cannot be loaded (" +
                     first + "; " + ::dlerror() +
                     "): install the CUDA runtime of that major version, or add its folder to LD_LIBRARY_PATH";
      return loaded;
    }
  }
#define FERRY_CUDART_LOAD(name)                                                                           \
  loaded.functions.name = reinterpret_cast<decltype(&::name)>(::dlsym(library, FERRY_CUDART_NAME(name))); \
  if (loaded.functions.name == nullptr && loaded.error.empty()) {                                         \
    loaded.error = "the CUDA runtime " FERRY_CUDART_SONAME " has no " FERRY_CUDART_NAME(                  \
        name) ": it is older than the one this ferry was built with; install a newer CUDA runtime";       \
  }
  FERRY_CUDART_FUNCTIONS(FERRY_CUDART_LOAD)
#undef FERRY_CUDART_LOAD
  return loaded;
}

}  // namespace

const Cudart& cudart() {
  static const Loaded loaded = load();
  if (!loaded.error.empty()) throw CudaError(loaded.error, static_cast<int>(cudaErrorInsufficientDriver));
  return loaded.functions;
}

}  // namespace ferry::cuda
