include_guard(GLOBAL)
# Command-line flags of the examples and the benchmarks: CLI11 (header-only; Debian's
# libcli11-dev installs a CMake config in share/cmake/CLI11). Not a dependency of the library.
# Where no config file is found (another packaging), the header alone, searched on
# CMAKE_PREFIX_PATH (scripts/gpu_run.sh passes .deps/root/usr there) and CLI11_ROOT.
find_package(CLI11 CONFIG QUIET)
if(CLI11_FOUND)
  message(STATUS "torchpilot examples: CLI11 ${CLI11_VERSION} (${CLI11_DIR})")
else()
  find_path(TORCHPILOT_CLI11_INCLUDE_DIR CLI/CLI.hpp HINTS ENV CLI11_ROOT PATH_SUFFIXES include)
  if(NOT TORCHPILOT_CLI11_INCLUDE_DIR)
    message(FATAL_ERROR "CLI11 not found (the examples' and benchmarks' flags): install "
                        "libcli11-dev, or set CMAKE_PREFIX_PATH to a prefix with include/CLI/CLI.hpp")
  endif()
  message(STATUS "torchpilot examples: CLI11 header in ${TORCHPILOT_CLI11_INCLUDE_DIR}")
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TORCHPILOT_CLI11_INCLUDE_DIR}")
endif()
