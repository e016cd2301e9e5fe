# caracal_add_vm_test(NAME name COMMAND "shell command" [LABEL label] [FILES file ...]
#                     [DIRS dir ...] [TARGETS target ...] [ENV NAME=VALUE ...] [TIMEOUT seconds])
#
# A CTest test that boots the Soft-RoCE VM of tests/vm/rxe-vm.sh (a stock kernel with rdma_rxe
# under QEMU) and runs COMMAND inside it, in /opt/test, where FILES and DIRS are copied (with
# the shared libraries of every executable among them, so programs built here run there).
# FILES may be generator expressions such as $<TARGET_FILE:prog>; TARGETS are built by the
# label's target caracal_tests_<label> (scripts/test.sh -L builds it).
#
# The VM is emulated (TCG) and uses both cores of this machine: the tests hold RESOURCE_LOCK
# rxe_vm (one VM at a time) and ask CTest for 2 processors, so a parallel ctest runs nothing
# beside them. Where QEMU, rdma-core's tools or the kernel package cannot be had, the harness
# exits 77 and the test is reported skipped. Default LABEL rdma, TIMEOUT 600.
set(CARACAL_RXE_VM "${CMAKE_CURRENT_LIST_DIR}/../tests/vm/rxe-vm.sh")
cmake_path(NORMAL_PATH CARACAL_RXE_VM)

function(caracal_add_vm_test)
  cmake_parse_arguments(ARG "" "NAME;COMMAND;LABEL;TIMEOUT" "FILES;DIRS;TARGETS;ENV" ${ARGN})
  if(NOT ARG_NAME OR NOT ARG_COMMAND)
    message(FATAL_ERROR "caracal_add_vm_test needs NAME and COMMAND")
  endif()
  if(NOT ARG_LABEL)
    set(ARG_LABEL rdma)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  # The VM's own limit ends it a little before CTest's, so its console tail is reported.
  math(EXPR vm_limit "${ARG_TIMEOUT} - 20")
  set(args -t ${vm_limit})
  foreach(f IN LISTS ARG_FILES)
    list(APPEND args -f "${f}")
  endforeach()
  foreach(d IN LISTS ARG_DIRS)
    list(APPEND args -d "${d}")
  endforeach()
  foreach(e IN LISTS ARG_ENV)
    list(APPEND args -e "${e}")
  endforeach()
  add_test(NAME ${ARG_NAME} COMMAND "${CARACAL_RXE_VM}" ${args} -- "${ARG_COMMAND}")
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS ${ARG_LABEL}
    RESOURCE_LOCK rxe_vm
    PROCESSORS 2
    SKIP_RETURN_CODE 77
    TIMEOUT ${ARG_TIMEOUT})
  if(NOT TARGET caracal_tests_${ARG_LABEL})
    add_custom_target(caracal_tests_${ARG_LABEL})
  endif()
  if(ARG_TARGETS)
    add_dependencies(caracal_tests_${ARG_LABEL} ${ARG_TARGETS})
  endif()
endfunction()
