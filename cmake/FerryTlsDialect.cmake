# Thread-local variables reached through TLS descriptors (-mtls-dialect=gnu2, GCC on x86-64).
# The layers are compiled as position-independent code and linked into the Python module, a
# shared object that Python dlopen()s: there the default dialect calls __tls_get_addr on every
# access to a thread_local (the object pool's caches, the open release batch, ...), a few
# dozen calls per received message. With descriptors, glibc resolves each access when it
# loads the module: from the static TLS block when it has room (a load and an add), else
# from dynamically allocated TLS as before, so a dlopen()ed module never fails for lack of
# static TLS (as -ftls-model=initial-exec can). Executables relax either dialect to direct
# accesses at link time. Sanitizer builds keep the default dialect.
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-mtls-dialect=gnu2 FERRY_HAS_TLS_DESCRIPTORS)

function(ferry_use_tls_descriptors target)
  if(FERRY_HAS_TLS_DESCRIPTORS AND FERRY_SANITIZE STREQUAL "")
    target_compile_options(${target} PRIVATE -mtls-dialect=gnu2)
  endif()
endfunction()
