# `cmake --install` puts the library, its headers and a CMake package in the prefix, so that
# another project can use `find_package(ferry)` and link `ferry::ferry`.
include(CMakePackageConfigHelpers)

# ferry::ucx (ucx:// endpoints) when it was built: a consumer links it only where it uses
# ucx:// (ferryConfig.cmake then finds UCX and libsodium through pkg-config).
set(_ferry_installed_targets ferry ferry_runtime ferry_serialization ferry_channels)
if(FERRY_UCX_ENABLED)
  list(APPEND _ferry_installed_targets ferry_ucx)
endif()
install(TARGETS ${_ferry_installed_targets} EXPORT ferryTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Each layer's public headers and its ferry/detail/ headers (which the public templates
# include); the headers in <layer>/internal/ and <layer>/src/ stay behind (tests/consumer/
# check_installed_headers.sh checks that every installed header is reachable from a public
# one). ferry/dlpack.hpp only in a build with DLPack (it includes <dlpack/dlpack.h>).
set(_ferry_header_exclusions)
if(NOT FERRY_HAS_DLPACK)
  set(_ferry_header_exclusions PATTERN dlpack.hpp EXCLUDE)
endif()
foreach(layer runtime serialization channels)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          ${_ferry_header_exclusions})
endforeach()
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ferryConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ferryConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ferryConfig.cmake ${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
