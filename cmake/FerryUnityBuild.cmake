# Unity builds: a target's sources compiled `batch` at a time, each batch as one compiler run
# that parses the shared headers and instantiates the shared templates once. GCC's
# -Wsubobject-linkage takes a source file included by the batch for a header, and so reports
# every class of it with a member whose type is in the file's anonymous namespace; a batch is
# one translation unit, where that cannot break the one-definition rule, so it is left out.
function(ferry_unity_build target batch)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
endfunction()
