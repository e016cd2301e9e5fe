# Cross-building for aarch64 (BlueField's Arm cores) on a Debian amd64 host, with Debian's cross
# compiler and arm64 libraries installed multiarch (scripts/cross-arm64.sh sets them up). Two -dev
# packages cannot be co-installed with their amd64 twins (libyaml-cpp-dev is not multiarch;
# libdpdk-dev:arm64 would pull rdma-core:arm64 over the amd64 one): the script unpacks them into
# CARACAL_ARM64_SYSROOT, which this file adds to the search path.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

if(NOT CARACAL_ARM64_SYSROOT)
  set(CARACAL_ARM64_SYSROOT "$ENV{CARACAL_ARM64_SYSROOT}")
endif()
if(NOT CARACAL_ARM64_SYSROOT)
  message(FATAL_ERROR "CARACAL_ARM64_SYSROOT is not set: run scripts/cross-arm64.sh, which sets it up")
endif()
set(CARACAL_ARM64_SYSROOT "${CARACAL_ARM64_SYSROOT}" CACHE PATH "unpacked arm64 -dev packages")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES CARACAL_ARM64_SYSROOT)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu ${CARACAL_ARM64_SYSROOT} /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# The cross pkg-config sees arm64 .pc files only: the native one would find the amd64
# libdpdk.pc and turn DPDK on with x86 include paths.
set(PKG_CONFIG_EXECUTABLE /usr/bin/aarch64-linux-gnu-pkg-config CACHE FILEPATH "")
set(ENV{PKG_CONFIG_PATH} ${CARACAL_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig)
# No RUNPATH into the sysroot: dpkg-shlibdeps refuses binaries that carry one.
set(CMAKE_SKIP_BUILD_RPATH ON)
# ctest (and gtest's test discovery) run the arm64 programs under qemu-user.
set(CMAKE_CROSSCOMPILING_EMULATOR /usr/bin/qemu-aarch64-static)
