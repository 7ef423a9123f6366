# cmake/install.cmake: the C/C++ package that `cmake --install` writes under the prefix
#
#   include/luminav/          the public headers of both components (nothing under src/: no
#                             installed header includes one)
#   lib/libluminav.so.X.Y.Z   (or libluminav.a with LUMINAV_BUILD_SHARED=OFF)
#   bin/luminav               the command line (inspect, verify, selftest, bench, version)
#   lib/cmake/luminav/        luminavConfig.cmake, luminavConfigVersion.cmake (SameMajorVersion),
#                             luminavTargets.cmake: find_package(luminav CONFIG) gives
#                             luminav::luminav (the library) and luminav::cli (the command)
#   lib/pkgconfig/luminav.pc  pkg-config --cflags --libs luminav
include(CMakePackageConfigHelpers)

set(LUMINAV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/luminav)

install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/luminav-triton-aot/include/luminav
                  ${CMAKE_CURRENT_SOURCE_DIR}/luminav/include/luminav
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

set_target_properties(luminav_cli PROPERTIES EXPORT_NAME cli)
install(TARGETS luminav luminav_cli EXPORT luminavTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT luminavTargets NAMESPACE luminav:: DESTINATION ${LUMINAV_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/luminavConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/luminavConfig.cmake
  INSTALL_DESTINATION ${LUMINAV_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/luminavConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/luminavConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/luminavConfigVersion.cmake
        DESTINATION ${LUMINAV_CMAKE_DIR})

# luminav.pc finds its prefix from where it lies (${pcfiledir}), so a moved prefix still works.
# A static archive needs its own dependencies on the consumer's link line, and the C++ runtime
# for a C program.
set(LUMINAV_PC_LIBDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(LUMINAV_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  # the way up from the .pc file's folder to the prefix, e.g. "../.." for lib/pkgconfig
  file(RELATIVE_PATH LUMINAV_PC_UP /prefix/${LUMINAV_PC_LIBDIR} /prefix)
  string(REGEX REPLACE "/$" "" LUMINAV_PC_UP "${LUMINAV_PC_UP}")
  set(LUMINAV_PC_PREFIX "\${pcfiledir}/${LUMINAV_PC_UP}")
endif()
if(CMAKE_DL_LIBS)
  set(LUMINAV_PC_DEPS "-lcrypto -lpthread -l${CMAKE_DL_LIBS}")
else()
  set(LUMINAV_PC_DEPS "-lcrypto -lpthread")
endif()
if(LUMINAV_BUILD_SHARED)
  set(LUMINAV_PC_LIBS "-L\${libdir} -lluminav")
  set(LUMINAV_PC_LIBS_PRIVATE "${LUMINAV_PC_DEPS}")
else()
  set(LUMINAV_PC_LIBS "-L\${libdir} -lluminav ${LUMINAV_PC_DEPS} -lstdc++ -lm")
  set(LUMINAV_PC_LIBS_PRIVATE "")
endif()
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/luminav.pc.in ${CMAKE_CURRENT_BINARY_DIR}/luminav.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/luminav.pc DESTINATION ${LUMINAV_PC_LIBDIR})
