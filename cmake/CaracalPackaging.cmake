# Debian packages from this build (CPack DEB, one package per install component):
#   caracal-server  snic_server, /etc/caracal/server.yaml (a conffile), its systemd unit;
#   caracal-agent   the example agents, /etc/caracal/agents/echo.yaml, caracal-agent@.service;
#   caracal-dev     the SDK: headers, libraries, find_package(Caracal).
# `cpack --config build/CPackConfig.cmake -B build/packages` (scripts/package.sh) makes them.
# The version is the project's (CMakeLists.txt), which --version prints too.
set(CARACAL_PACKAGE_CONTACT "Caracal maintainers <maintainers@caracal.example>"
    CACHE STRING "The packages' Maintainer field")

# Where units go: systemd's own answer (/lib/systemd/system on Debian 12, /usr/lib/... on
# Ubuntu 24.04), else the prefix's lib/systemd/system.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_get_variable(CARACAL_UNIT_DIR systemd systemdsystemunitdir)
endif()
if(NOT CARACAL_UNIT_DIR)
  set(CARACAL_UNIT_DIR lib/systemd/system)
endif()

# /etc when the prefix is /usr (the packages); PREFIX/etc otherwise.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/etc/server.yaml
        DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/caracal COMPONENT server)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/caracal-server.service
        DESTINATION ${CARACAL_UNIT_DIR} COMPONENT server)
install(FILES ${PROJECT_SOURCE_DIR}/snic_server/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/../caracal-server COMPONENT server)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/etc/agents/echo.yaml
        DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/caracal/agents COMPONENT agent)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/caracal-agent@.service
        DESTINATION ${CARACAL_UNIT_DIR} COMPONENT agent)
install(FILES ${PROJECT_SOURCE_DIR}/host_init/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/../caracal-agent COMPONENT agent)
# Debian's changelog, compressed as policy asks (gzip -9n: no name, no time stamp).
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/debian)
execute_process(COMMAND gzip -9n -c ${PROJECT_SOURCE_DIR}/deploy/debian/changelog
                OUTPUT_FILE ${PROJECT_BINARY_DIR}/debian/changelog.gz)
foreach(component server agent dev)
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright
                ${PROJECT_BINARY_DIR}/debian/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DOCDIR}/../caracal-${component} COMPONENT ${component})
endforeach()

# Manual pages, made by help2man from each program's --help and --version and a page of
# sections of its own (deploy/man/*.h2m: signals, files, environment). A cross-build runs the
# program under its emulator (CMAKE_CROSSCOMPILING_EMULATOR) through a wrapper of the program's
# name. Without help2man (or, cross-building, without an emulator) the packages have none.
# Target caracal_man_pages builds them all (part of ALL; scripts/cross-arm64.sh names it).
find_program(CARACAL_HELP2MAN help2man)
add_custom_target(caracal_man_pages ALL)
set(_man_ok FALSE)
if(CARACAL_HELP2MAN AND (NOT CMAKE_CROSSCOMPILING OR CMAKE_CROSSCOMPILING_EMULATOR))
  set(_man_ok TRUE)
endif()
function(_caracal_man_page target component include name)
  if(NOT _man_ok OR NOT TARGET ${target})
    return()
  endif()
  # help2man writes into a folder that must exist: Ninja makes an output's folder, Unix Makefiles
  # do not.
  set(dir ${PROJECT_BINARY_DIR}/man)
  file(MAKE_DIRECTORY ${dir})
  set(page ${dir}/${target}.1)
  set(run $<TARGET_FILE:${target}>)
  if(CMAKE_CROSSCOMPILING)
    set(run ${dir}/run/${target})
    file(MAKE_DIRECTORY ${dir}/run)
    file(GENERATE OUTPUT ${run}
         CONTENT "#!/bin/sh\nexec ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:${target}> \"$@\"\n"
         FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                          WORLD_READ WORLD_EXECUTE)
  endif()
  add_custom_command(
    OUTPUT ${page}.gz
    COMMAND ${CARACAL_HELP2MAN} --no-info --no-discard-stderr --section 1
            --name ${name} --source "Caracal ${PROJECT_VERSION}" --manual "Caracal"
            --include ${include} --output ${page} ${run}
    COMMAND gzip -9n -f ${page}
    DEPENDS ${target} ${include}
    COMMENT "Manual page of ${target}"
    VERBATIM)
  add_custom_target(${target}_man DEPENDS ${page}.gz)
  add_dependencies(caracal_man_pages ${target}_man)
  install(FILES ${page}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT ${component})
endfunction()
_caracal_man_page(snic_server server ${PROJECT_SOURCE_DIR}/deploy/man/snic_server.h2m
                  "Caracal's network server: serves TCP and UDP clients with handlers on accelerators")
_caracal_man_page(caracal_echo_agent agent ${PROJECT_SOURCE_DIR}/deploy/man/caracal_agent.h2m
                  "Caracal agent serving the echo handler")
_caracal_man_page(caracal_kv_agent agent ${PROJECT_SOURCE_DIR}/deploy/man/caracal_agent.h2m
                  "Caracal agent serving key lookups in memcached")
_caracal_man_page(caracal_matvec_agent agent ${PROJECT_SOURCE_DIR}/deploy/man/caracal_agent.h2m
                  "Caracal agent serving a matrix-vector product")
_caracal_man_page(caracal_face_agent agent ${PROJECT_SOURCE_DIR}/deploy/man/caracal_agent.h2m
                  "Caracal agent serving face verification with references in memcached")
_caracal_man_page(caracal_face_loader agent ${PROJECT_SOURCE_DIR}/deploy/man/caracal_face_tools.h2m
                  "enrolls the face verification example's references in memcached")
_caracal_man_page(caracal_face_client agent ${PROJECT_SOURCE_DIR}/deploy/man/caracal_face_tools.h2m
                  "sends one face verification request and prints its reply")

# The maintainer scripts: one text for both packages that run as the caracal user, with what
# differs (the units they manage) filled in.
function(_caracal_deb_scripts component other postinst_unit prerm_unit postrm_unit)
  set(dir ${PROJECT_BINARY_DIR}/debian/${component})
  set(CARACAL_DEB_PACKAGE caracal-${component})
  set(CARACAL_DEB_OTHER_PACKAGE caracal-${other})
  set(CARACAL_DEB_POSTINST_UNIT "${postinst_unit}")
  set(CARACAL_DEB_PRERM_UNIT "${prerm_unit}")
  set(CARACAL_DEB_POSTRM_UNIT "${postrm_unit}")
  foreach(script postinst prerm postrm)
    configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/${script}.in ${dir}/${script} @ONLY
                   FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                   GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  endforeach()
  # Every file the package puts under /etc is a conffile: an upgrade keeps local changes.
  set(conffiles "")
  foreach(f ${ARGN})
    string(APPEND conffiles "${CMAKE_INSTALL_FULL_SYSCONFDIR}/${f}\n")
  endforeach()
  file(WRITE ${dir}/conffiles "${conffiles}")
  set(${component}_scripts ${dir}/postinst ${dir}/prerm ${dir}/postrm ${dir}/conffiles
      PARENT_SCOPE)
endfunction()
_caracal_deb_scripts(server agent
  "# As debhelper's snippet: enabled at the first install (was-enabled is true then), and
  # never again once the operator disabled it.
  deb-systemd-helper unmask caracal-server.service >/dev/null || true
  if deb-systemd-helper --quiet was-enabled caracal-server.service; then
    deb-systemd-helper enable caracal-server.service >/dev/null || true
  else
    deb-systemd-helper update-state caracal-server.service >/dev/null || true
  fi
  if [ -d /run/systemd/system ]; then
    deb-systemd-invoke restart caracal-server.service >/dev/null || true
  fi"
  "deb-systemd-invoke stop caracal-server.service >/dev/null || true"
  "deb-systemd-helper purge caracal-server.service >/dev/null || true"
  caracal/server.yaml)
_caracal_deb_scripts(agent server
  ": # agents are instances (caracal-agent@NAME) that the operator enables"
  "systemctl stop 'caracal-agent@*.service' >/dev/null 2>&1 || true"
  ":"
  caracal/agents/echo.yaml)

# Runtime libraries loaded with dlopen, which dpkg-shlibdeps cannot see: EAL's mempool driver
# and the PMDs the server supports (mlx5 for BlueField, af_packet and tap for hosts without a
# DPDK NIC), and libibverbs' providers (mlx5, rxe). Named with the DPDK ABI of this build.
# procps: /bin/kill, which the unit's ExecReload runs (systemd 252 has no Type=notify-reload).
set(_server_depends adduser procps)
if(CARACAL_WITH_DPDK)
  string(REGEX MATCH "^[0-9]+" _dpdk_year "${DPDK_VERSION}")
  # DPDK's ABI is the LTS's year minus one (22.11: 23, 23.11: 24, 24.11: 25).
  math(EXPR _dpdk_abi "${_dpdk_year} + 1")
  list(APPEND _server_depends librte-mempool-ring${_dpdk_abi} librte-net-af-packet${_dpdk_abi}
       librte-net-tap${_dpdk_abi})
  set(_server_recommends "librte-net-mlx5-${_dpdk_abi}")
endif()
if(CARACAL_WITH_RDMA)
  list(APPEND _server_depends ibverbs-providers)
endif()
list(JOIN _server_depends ", " CPACK_DEBIAN_SERVER_PACKAGE_DEPENDS)
if(_server_recommends)
  set(CPACK_DEBIAN_SERVER_PACKAGE_RECOMMENDS "${_server_recommends}")
endif()
set(_agent_depends "adduser")
if(CARACAL_WITH_RDMA)
  list(APPEND _agent_depends ibverbs-providers)
endif()
list(JOIN _agent_depends ", " CPACK_DEBIAN_AGENT_PACKAGE_DEPENDS)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "cmake (>= 3.25), make | ninja-build, g++, libboost-dev, libspdlog-dev, libfmt-dev, libyaml-cpp-dev, libcli11-dev")
if(CARACAL_WITH_SYSTEMD)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libsystemd-dev, pkgconf | pkg-config")
endif()
if(CARACAL_WITH_RDMA)
  string(APPEND CPACK_DEBIAN_DEV_PACKAGE_DEPENDS ", libibverbs-dev, librdmacm-dev")
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_PACKAGE_NAME caracal)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CARACAL_PACKAGE_CONTACT}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "GPU request handlers served from a SmartNIC")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL server agent dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# A cross-build packages for its target (CPack would ask dpkg, which answers for the host).
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR STREQUAL "aarch64")
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
endif()
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://caracal.example")
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME caracal-server)
set(CPACK_DEBIAN_AGENT_PACKAGE_NAME caracal-agent)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME caracal-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_SERVER_DESCRIPTION "Caracal network server (snic_server)
 Serves unmodified TCP and UDP clients with request handlers that run on
 GPUs or CPUs behind it: requests go into message queues in the
 accelerator's memory by shared memory or one-sided RDMA. Runs on a
 BlueField DPU's Arm cores or any Linux host.")
set(CPACK_DEBIAN_AGENT_DESCRIPTION "Caracal host agents
 The agents that serve Caracal handlers on a host's GPUs or CPUs: they
 create the queue regions, register them with the server and run the
 handlers as persistent kernels or threads. Includes the example agents
 and a systemd unit template.")
set(CPACK_DEBIAN_DEV_DESCRIPTION "Caracal handler SDK
 Headers, static libraries and a CMake package (find_package(Caracal),
 caracal_add_handler) for building Caracal agents from handler sources.")
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA ${server_scripts})
set(CPACK_DEBIAN_AGENT_PACKAGE_CONTROL_EXTRA ${agent_scripts})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
