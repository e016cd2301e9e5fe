# caracal_add_handler(NAME SOURCES src... [LIBS lib...])
#
# Builds a host agent from one handler source: the source defines the handler type and a
# main() that calls caracal::host::agent_main<Handler>(argc, argv) (see
# host_init/include/caracal/host_init/agent.hpp). The result is an executable NAME that takes
# `--config FILE`, registers with a Caracal server and serves the handler on the configured
# accelerator. LIBS are linked too (what the handler itself uses).
function(caracal_add_handler name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "caracal_add_handler(${name}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "caracal_add_handler(${name}): SOURCES names no handler source")
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE caracal::host_init ${ARG_LIBS})
endfunction()
