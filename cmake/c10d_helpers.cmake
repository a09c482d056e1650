# One helper per kind of target, so every component is declared the same way.

# c10d_library(<component> SOURCES ... [DEPS ...])
# Declares the static library c10d_<component> (alias c10d::<component>; for a nested
# component such as backends/gloo: c10d_backends_gloo, alias c10d::backends::gloo). Sources
# live in src/c10d/<component>/ and are included as "c10d/<component>/<file>.h".
function(c10d_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  string(REPLACE "/" "_" target "c10d_${name}")
  string(REPLACE "/" "::" alias "c10d::${name}")
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(${alias} ALIAS ${target})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} Threads::Threads)
  # Installed as c10d::<component> too (cmake/c10d_install.cmake).
  string(REPLACE "/" "::" export_name "${name}")
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  set_property(GLOBAL APPEND PROPERTY C10D_LIBRARIES ${target})
endfunction()

# c10d_test(<name> SOURCES ... [DEPS ...])
# A GoogleTest executable registered with CTest (one CTest entry per test case).
function(c10d_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)
endfunction()

# c10d_require(<found-variable> <what> <Debian packages>)
# Stops the configuration when a library c10d needs was not found, naming it, the Debian
# packages that provide it and scripts/install-deps.sh (which installs them all).
function(c10d_require found what packages)
  if(NOT ${found})
    message(FATAL_ERROR
      "c10d needs ${what}, which CMake did not find. On Debian or Ubuntu, "
      "scripts/install-deps.sh installs everything c10d builds with (for this one: apt install "
      "${packages}); elsewhere, install it and add its prefix to CMAKE_PREFIX_PATH.")
  endif()
endfunction()
