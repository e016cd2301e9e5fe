# caracal_add_handler(NAME SOURCES src... [LIBS lib...] [CPU_ONLY])
#
# Builds a host agent from one handler source: the source defines the handler type and a
# main() that calls caracal::agent::agent_main<Handler>(argc, argv) (see
# host_init/include/caracal/agent/agent.hpp). The result is an executable NAME that takes
# `--config FILE`, registers with a Caracal server and serves the handler on the configured
# accelerator. LIBS are linked too (what the handler itself uses).
#
# With the CUDA backend built (CARACAL_WITH_CUDA), the sources are compiled by nvcc, so the
# same handler also runs as a persistent kernel (`accelerator: gpu:N`, or `auto` on a host with
# a GPU); its call operator must then be CARACAL_HOST_DEVICE. CPU_ONLY keeps a host-only
# handler on the host compiler.
function(caracal_add_handler name)
  cmake_parse_arguments(ARG "CPU_ONLY" "" "SOURCES;LIBS" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "caracal_add_handler(${name}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "caracal_add_handler(${name}): SOURCES names no handler source")
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE caracal::agent ${ARG_LIBS})
  if(CARACAL_WITH_CUDA AND NOT ARG_CPU_ONLY)
    set_source_files_properties(${ARG_SOURCES} TARGET_DIRECTORY ${name} PROPERTIES LANGUAGE CUDA)
    target_link_libraries(${name} PRIVATE caracal::accel_gpu)
  endif()
endfunction()
