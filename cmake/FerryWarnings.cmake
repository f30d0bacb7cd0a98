# Warnings every ferry target builds with: -Wall -Wextra (and -Werror unless FERRY_WERROR=OFF).
function(ferry_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
  if(FERRY_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
