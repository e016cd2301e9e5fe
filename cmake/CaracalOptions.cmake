# Optional parts and build modes. Each optional dependency is AUTO by default: on when it is
# found at this configure, so a build folder first configured before a dependency was installed
# picks it up at the next configure. ON requires it, OFF leaves it out. Each part that is on adds
# a CARACAL_HAVE_* definition through the caracal_options interface target.

include(CheckLanguage)

# caracal_optional_part(VAR FOUND DOC): VAR is a cache string, AUTO, ON or OFF. Sets the normal
# variable VAR (which every directory below sees) to ON or OFF: AUTO follows FOUND; ON with
# FOUND false stops the configure.
function(caracal_optional_part var found doc)
  set(${var} AUTO CACHE STRING "${doc}: AUTO (on when found), ON or OFF")
  set_property(CACHE ${var} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "$CACHE{${var}}" choice)
  # (A variable named `on` would not do: if(on) reads the constant ON.)
  if(choice STREQUAL "AUTO")
    set(enabled ${found})
  elseif(choice MATCHES "^(ON|YES|TRUE|1)$")
    set(enabled TRUE)
  elseif(choice MATCHES "^(OFF|NO|FALSE|0)$")
    set(enabled FALSE)
  else()
    message(FATAL_ERROR "${var} must be AUTO, ON or OFF, not '$CACHE{${var}}'")
  endif()
  if(enabled AND NOT found)
    message(FATAL_ERROR "${var}=ON but ${doc} was not found")
  endif()
  if(enabled)
    set(${var} ON PARENT_SCOPE)
  else()
    set(${var} OFF PARENT_SCOPE)
  endif()
endfunction()

add_library(caracal_options INTERFACE)
add_library(caracal::options ALIAS caracal_options)
# The public headers are C++20 (concepts): a project that builds against the installed SDK gets
# the standard from the targets, not from this project's CMAKE_CXX_STANDARD.
target_compile_features(caracal_options INTERFACE cxx_std_20)

# --- CUDA -----------------------------------------------------------------------------------
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_caracal_cuda_found TRUE)
else()
  set(_caracal_cuda_found FALSE)
endif()
caracal_optional_part(CARACAL_WITH_CUDA ${_caracal_cuda_found}
                      "the CUDA accelerator (a CUDA compiler; set CUDACXX)")
if(CARACAL_WITH_CUDA)
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
set(_caracal_dpdk_found FALSE)
if(PkgConfig_FOUND)
  pkg_check_modules(DPDK QUIET IMPORTED_TARGET libdpdk)
  if(DPDK_FOUND)
    set(_caracal_dpdk_found TRUE)
  endif()
endif()
caracal_optional_part(CARACAL_WITH_DPDK ${_caracal_dpdk_found}
                      "the DPDK UDP port (pkg-config's libdpdk)")
if(CARACAL_WITH_DPDK)
  target_compile_definitions(caracal_options INTERFACE CARACAL_HAVE_DPDK=1)
endif()

# --- rdma-core ------------------------------------------------------------------------------
find_library(CARACAL_IBVERBS_LIB ibverbs)
find_library(CARACAL_RDMACM_LIB rdmacm)
find_path(CARACAL_RDMA_INCLUDE rdma/rdma_cma.h)
if(CARACAL_IBVERBS_LIB AND CARACAL_RDMACM_LIB AND CARACAL_RDMA_INCLUDE)
  set(_caracal_rdma_found TRUE)
else()
  set(_caracal_rdma_found FALSE)
endif()
caracal_optional_part(CARACAL_WITH_RDMA ${_caracal_rdma_found}
                      "the rdma transport (rdma-core: libibverbs, librdmacm and their headers)")
if(CARACAL_WITH_RDMA)
  target_compile_definitions(caracal_options INTERFACE CARACAL_HAVE_RDMA=1)
endif()

# --- systemd --------------------------------------------------------------------------------
# sd_notify, so that the units can be Type=notify (ready once the server serves, the agent is
# registered). Without it the programs run the same, and say nothing to a service manager.
set(_caracal_systemd_found FALSE)
if(PkgConfig_FOUND)
  pkg_check_modules(SYSTEMD QUIET IMPORTED_TARGET libsystemd)
  if(SYSTEMD_FOUND)
    set(_caracal_systemd_found TRUE)
  endif()
endif()
caracal_optional_part(CARACAL_WITH_SYSTEMD ${_caracal_systemd_found}
                      "readiness notification to systemd (pkg-config's libsystemd)")

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

# --- Fuzzers --------------------------------------------------------------------------------
# libFuzzer targets (tests/fuzz): clang only. Every library is compiled with the fuzzer's
# coverage instrumentation and ASan+UBSan, so a target sees the code it drives and a bad access
# stops it; the targets themselves link libFuzzer's main (scripts/fuzz.sh builds and runs them).
option(CARACAL_BUILD_FUZZERS "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)
if(CARACAL_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "CARACAL_BUILD_FUZZERS needs clang for libFuzzer, not "
                        "${CMAKE_CXX_COMPILER_ID}: configure a build folder of its own with "
                        "-DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does)")
  endif()
  if(NOT CARACAL_SANITIZE STREQUAL "")
    message(FATAL_ERROR "CARACAL_BUILD_FUZZERS brings its own ASan+UBSan; leave "
                        "CARACAL_SANITIZE empty (it is '${CARACAL_SANITIZE}')")
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=fuzzer)
  check_cxx_source_compiles([[
    #include <cstddef>
    #include <cstdint>
    extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }]]
    CARACAL_LIBFUZZER_LINKS)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(NOT CARACAL_LIBFUZZER_LINKS)
    message(FATAL_ERROR "clang cannot link -fsanitize=fuzzer here: libFuzzer comes with "
                        "Debian's libclang-rt-dev (scripts/deps.sh test installs it)")
  endif()
  set(_caracal_fuzz_san -fsanitize=fuzzer-no-link,address,undefined
                        -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_caracal_fuzz_san}>")
  add_link_options(-fsanitize=address,undefined)
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
_caracal_onoff(CARACAL_WITH_SYSTEMD _y)
if(CARACAL_BUILD_FUZZERS)
  set(_s "address (libFuzzer targets)")
elseif(CARACAL_SANITIZE STREQUAL "")
  set(_s "none")
else()
  set(_s "${CARACAL_SANITIZE}")
endif()
message(STATUS "Caracal: CUDA ${_c}, DPDK ${_d}, RDMA ${_r}, systemd ${_y}, sanitizer ${_s}, build ${CMAKE_BUILD_TYPE}")
