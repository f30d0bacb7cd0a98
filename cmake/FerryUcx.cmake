# FERRY_WITH_UCX: finds UCX (ucp) and libsodium through pkg-config and sets FERRY_UCX_ENABLED.
# ON fails the configure when either is missing; AUTO builds without them; OFF never looks.
# Sanitizer builds leave UCX out: its memory hooks crash under TSan, and ASan reports its
# own allocations at exit.
#
# FERRY_UCX_WIRE_ENABLED: libsodium found (also in sanitizer builds): the ucx:// wire formats
# (handshake, active-message headers) build as ferry_ucx_wire, without UCX, for their unit
# tests and fuzz targets.
set(FERRY_UCX_ENABLED OFF)
set(FERRY_UCX_WIRE_ENABLED OFF)
if(NOT FERRY_WITH_UCX STREQUAL "OFF")
  find_package(PkgConfig)
  if(PkgConfig_FOUND)
    pkg_check_modules(FERRY_SODIUM IMPORTED_TARGET libsodium)
  endif()
  if(FERRY_SODIUM_FOUND)
    set(FERRY_UCX_WIRE_ENABLED ON)
  endif()
  if(FERRY_SANITIZE AND NOT FERRY_WITH_UCX STREQUAL "ON")
    message(STATUS "ferry: ucx:// endpoints left out of the ${FERRY_SANITIZE} sanitizer build")
  else()
    find_package(PkgConfig)
    if(PkgConfig_FOUND)
      pkg_check_modules(FERRY_UCX IMPORTED_TARGET ucx)
    endif()
    if(FERRY_UCX_FOUND AND FERRY_SODIUM_FOUND)
      set(FERRY_UCX_ENABLED ON)
      message(STATUS "ferry: ucx:// endpoints on UCX ${FERRY_UCX_VERSION} (ferry_ucx)")
    elseif(FERRY_WITH_UCX STREQUAL "ON")
      message(FATAL_ERROR "FERRY_WITH_UCX=ON needs UCX and libsodium: run scripts/install-deps "
                          "(apt-get install libucx-dev libsodium-dev), or configure with -DFERRY_WITH_UCX=OFF")
    else()
      message(STATUS "ferry: ucx:// endpoints not built (libucx-dev or libsodium-dev missing: scripts/install-deps)")
    endif()
  endif()
endif()
