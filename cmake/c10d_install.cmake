# `cmake --install`: headers, the static libraries, a CMake package (find_package(c10d) gives
# c10d::<component> and c10d::c10d, everything built) and a pkg-config file (c10d.pc).
include(CMakePackageConfigHelpers)

get_property(c10d_libraries GLOBAL PROPERTY C10D_LIBRARIES)
add_library(c10d INTERFACE)
add_library(c10d::c10d ALIAS c10d)
target_link_libraries(c10d INTERFACE ${c10d_libraries})

set(c10d_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/c10d)
install(TARGETS ${c10d_libraries} c10d EXPORT c10dTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/c10d DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h"
        PATTERN "python" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/include/c10d/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/c10d)
install(EXPORT c10dTargets NAMESPACE c10d:: DESTINATION ${c10d_cmake_dir})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/c10dConfig.cmake.in
  ${PROJECT_BINARY_DIR}/c10dConfig.cmake INSTALL_DESTINATION ${c10d_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/c10dConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/c10dConfig.cmake ${PROJECT_BINARY_DIR}/c10dConfigVersion.cmake
        DESTINATION ${c10d_cmake_dir})

# pkg-config: the libraries in link order (dependents first), then what they need.
set(c10d_pc_libs "")
foreach(lib IN ITEMS backends_hier backends_gloo net_ring backends_shm backends_mpi ddp control pg store net core)
  if(TARGET c10d_${lib})
    string(APPEND c10d_pc_libs " -lc10d_${lib}")
  endif()
endforeach()
set(c10d_pc_requires "libuv cpp-httplib")
set(c10d_pc_private "")
if(C10D_WITH_GLOO)
  string(APPEND c10d_pc_private " -lgloo")
endif()
if(C10D_WITH_MPI)
  string(APPEND c10d_pc_requires " ompi-c")
endif()
# From <libdir>/pkgconfig back to the prefix, whatever the prefix given at install time.
file(RELATIVE_PATH c10d_pc_up /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/c10d.pc.in ${PROJECT_BINARY_DIR}/c10d.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/c10d.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
