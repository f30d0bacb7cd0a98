# One static library per layer (runtime, serialization, channels): a layer's sources see its
# own public headers (<layer>/include), its private headers (<layer>/src), the internal
# headers (<layer>/internal: ferry::detail, shared with the layers above, never installed) of
# its own and the layers below, and what the layers below it export, nothing above it. A call from a lower layer into a higher one fails to
# link, so "dependencies point one way" is checked by every build.
#
# ferry_add_layer(<layer> DEPENDS <lower layer targets...> SOURCES <files...>) creates
# ferry_<layer>, exported as ferry::<layer>.
function(ferry_add_layer layer)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "DEPENDS;SOURCES")
  set(target ferry_${layer})
  add_library(${target} STATIC ${arg_SOURCES})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${layer})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/internal)
    set_property(GLOBAL APPEND PROPERTY FERRY_INTERNAL_INCLUDE_DIRS ${CMAKE_CURRENT_SOURCE_DIR}/internal)
  endif()
  get_property(internal_dirs GLOBAL PROPERTY FERRY_INTERNAL_INCLUDE_DIRS)
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src ${internal_dirs})
  target_link_libraries(${target} PUBLIC ${arg_DEPENDS})
  ferry_set_warnings(${target})
  ferry_use_tls_descriptors(${target})
  if(FERRY_UNITY_BUILD)
    ferry_unity_build(${target} 8)
  endif()
  # Tests and benchmarks also reach the layers' private and internal headers (ferry_internals).
  target_include_directories(ferry_internals INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/src ${internal_dirs})
endfunction()

# The internal headers of every layer (<layer>/internal), for the targets beside the layers
# that use them: the ucx:// library and the Python module.
function(ferry_use_internal_headers target)
  get_property(internal_dirs GLOBAL PROPERTY FERRY_INTERNAL_INCLUDE_DIRS)
  target_include_directories(${target} PRIVATE ${internal_dirs})
endfunction()
