# Optional parts and build modes. Each optional dependency defaults to ON when it is found and
# adds a CARACAL_HAVE_* definition through the caracal_options interface target.

include(CheckLanguage)

add_library(caracal_options INTERFACE)
add_library(caracal::options ALIAS caracal_options)

# --- CUDA -----------------------------------------------------------------------------------
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_caracal_cuda_default ON)
else()
  set(_caracal_cuda_default OFF)
endif()
option(CARACAL_WITH_CUDA "Build the CUDA accelerator" ${_caracal_cuda_default})
if(CARACAL_WITH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "CARACAL_WITH_CUDA=ON but no CUDA compiler was found (set CUDACXX)")
  endif()
  # Named architectures: `native` fails on machines without a GPU. 90 = H100/H200.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake before 3.31 cannot ask nvcc for C++20 through CMAKE_CUDA_STANDARD; pass it directly.
  # Diagnostic 2810: nvcc's front end flags the ignored result of an assignment to a
  # [[nodiscard]] class (Status), which is not a discarded value; g++ rightly does not.
  target_compile_options(caracal_options INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr -diag-suppress=2810>)
  target_compile_definitions(caracal_options INTERFACE CARACAL_HAVE_CUDA=1)
endif()

# --- DPDK -----------------------------------------------------------------------------------
find_package(PkgConfig QUIET)
set(_caracal_dpdk_default OFF)
if(PkgConfig_FOUND)
  pkg_check_modules(DPDK QUIET IMPORTED_TARGET libdpdk)
  if(DPDK_FOUND)
    set(_caracal_dpdk_default ON)
  endif()
endif()
option(CARACAL_WITH_DPDK "Build the DPDK UDP port" ${_caracal_dpdk_default})
if(CARACAL_WITH_DPDK)
  if(NOT DPDK_FOUND)
    message(FATAL_ERROR "CARACAL_WITH_DPDK=ON but pkg-config finds no libdpdk")
  endif()
  target_compile_definitions(caracal_options INTERFACE CARACAL_HAVE_DPDK=1)
endif()

# --- rdma-core ------------------------------------------------------------------------------
find_library(CARACAL_IBVERBS_LIB ibverbs)
find_library(CARACAL_RDMACM_LIB rdmacm)
find_path(CARACAL_RDMA_INCLUDE rdma/rdma_cma.h)
if(CARACAL_IBVERBS_LIB AND CARACAL_RDMACM_LIB AND CARACAL_RDMA_INCLUDE)
  set(_caracal_rdma_default ON)
else()
  set(_caracal_rdma_default OFF)
endif()
option(CARACAL_WITH_RDMA "Build the rdma transport (rdma-core: ibverbs + rdmacm)"
       ${_caracal_rdma_default})
if(CARACAL_WITH_RDMA)
  if(NOT _caracal_rdma_default)
    message(FATAL_ERROR "CARACAL_WITH_RDMA=ON but libibverbs/librdmacm or their headers are missing")
  endif()
  target_compile_definitions(caracal_options INTERFACE CARACAL_HAVE_RDMA=1)
endif()

# --- Sanitizers -----------------------------------------------------------------------------
set(CARACAL_SANITIZE "" CACHE STRING "Sanitizer build: '', 'address' (ASan+UBSan) or 'thread'")
set_property(CACHE CARACAL_SANITIZE PROPERTY STRINGS "" address thread)
if(CARACAL_SANITIZE STREQUAL "address")
  set(_caracal_san -fsanitize=address,undefined -fno-sanitize-recover=undefined
                   -fno-omit-frame-pointer)
elseif(CARACAL_SANITIZE STREQUAL "thread")
  set(_caracal_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT CARACAL_SANITIZE STREQUAL "")
  message(FATAL_ERROR "CARACAL_SANITIZE must be '', 'address' or 'thread', not '${CARACAL_SANITIZE}'")
endif()
if(_caracal_san)
  # Quoted: unquoted, the list would be split inside the generator expression.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_caracal_san}>")
  add_link_options(${_caracal_san})
  target_compile_definitions(caracal_options INTERFACE CARACAL_SANITIZE_${CARACAL_SANITIZE}=1)
endif()

function(_caracal_onoff var out)
  if(${var})
    set(${out} "on" PARENT_SCOPE)
  else()
    set(${out} "off" PARENT_SCOPE)
  endif()
endfunction()
_caracal_onoff(CARACAL_WITH_CUDA _c)
_caracal_onoff(CARACAL_WITH_DPDK _d)
_caracal_onoff(CARACAL_WITH_RDMA _r)
if(CARACAL_SANITIZE STREQUAL "")
  set(_s "none")
else()
  set(_s "${CARACAL_SANITIZE}")
endif()
message(STATUS "Caracal: CUDA ${_c}, DPDK ${_d}, RDMA ${_r}, sanitizer ${_s}, build ${CMAKE_BUILD_TYPE}")
