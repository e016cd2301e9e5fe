# What `cmake --install` puts where (GNU directories): the server and the example agents, and
# the SDK a handler project outside this tree finds with find_package(Caracal): the public
# headers, the libraries behind them, imported targets named as in the tree (caracal::agent,
# caracal::accel, ...), and caracal_add_handler().
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CARACAL_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Caracal)

# caracal_install_module(TARGET [EXPORT SET]): the module's library into the export set
# (CaracalTargets by default) and its public headers (include/caracal/<module>/) under the
# install's include directory, where the installed target points.
function(caracal_install_module target)
  cmake_parse_arguments(ARG "" "EXPORT" "" ${ARGN})
  if(NOT ARG_EXPORT)
    set(ARG_EXPORT CaracalTargets)
  endif()
  # Installed as caracal::<module>, the name of its alias in the tree.
  string(REGEX REPLACE "^caracal_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  target_include_directories(${target} INTERFACE
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  install(TARGETS ${target} EXPORT ${ARG_EXPORT} COMPONENT dev
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
  endif()
endfunction()

# Called once every module is defined (top-level CMakeLists.txt).
function(caracal_install_package)
  # caracal::options carries the CARACAL_HAVE_* definitions and the CUDA flags.
  set_target_properties(caracal_options PROPERTIES EXPORT_NAME options)
  install(TARGETS caracal_options EXPORT CaracalTargets COMPONENT dev)
  install(EXPORT CaracalTargets NAMESPACE caracal:: DESTINATION ${CARACAL_CMAKE_INSTALL_DIR}
          FILE CaracalTargets.cmake COMPONENT dev)
  if(TARGET caracal_accel_gpu)
    install(EXPORT CaracalGpuTargets NAMESPACE caracal:: DESTINATION ${CARACAL_CMAKE_INSTALL_DIR}
            FILE CaracalGpuTargets.cmake COMPONENT dev)
  endif()
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/CaracalConfig.cmake.in
    ${PROJECT_BINARY_DIR}/CaracalConfig.cmake INSTALL_DESTINATION ${CARACAL_CMAKE_INSTALL_DIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/CaracalConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/CaracalConfig.cmake
                ${PROJECT_BINARY_DIR}/CaracalConfigVersion.cmake
                ${PROJECT_SOURCE_DIR}/cmake/CaracalHandler.cmake
          DESTINATION ${CARACAL_CMAKE_INSTALL_DIR} COMPONENT dev)
endfunction()
