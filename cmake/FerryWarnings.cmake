# Warnings every ferry target builds with: -Wall -Wextra (and -Werror unless FERRY_WERROR=OFF).
# clang also checks the lock contracts of ferry/detail/thread_annotations.hpp (-Wthread-safety).
function(ferry_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  if(FERRY_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
