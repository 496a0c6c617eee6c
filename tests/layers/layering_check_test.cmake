# cmake/check_layering.cmake over a made-up tree and graph: passes on declared includes, fails on
# each planted bad one and names it as file:line with the rule; a malformed graph is refused.
#   cmake -DSCRIPT=<check_layering.cmake> -DWORK=<scratch dir> -P layering_check_test.cmake
file(REMOVE_RECURSE "${WORK}")

function(check expect_ok)
  execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK} -DLAYERS=${WORK}/layers.txt -P ${SCRIPT}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc ${rc} PARENT_SCOPE)
  set(log "${out}${err}" PARENT_SCOPE)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "check_layering failed on an allowed tree:\n${out}${err}")
  endif()
  if(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "check_layering passed a tree with bad includes:\n${out}${err}")
  endif()
endfunction()

function(expect_in_log)
  foreach(expected IN LISTS ARGN)
    string(FIND "${log}" "${expected}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "check_layering did not report\n  ${expected}\nIt printed:\n${log}")
    endif()
  endforeach()
endfunction()

# The graph: common below all; worker uses common and one header of plugins; daemon uses common
# and kernels; sim only common.
file(WRITE "${WORK}/layers.txt" "# a comment\ncommon:\nkernels: common\nplugins: common\nworker: common plugins/transport/loader.h\ndaemon: common kernels\nsim: common\n")

# Allowed: declared parts and the one declared header; commented-out includes and strings that
# mention another part are not includes.
file(WRITE "${WORK}/daemon/ringd/ok.cc"
     "#include \"common/contract/layout.h\"\n#include <vector>\n#include \"kernels/backend.h\"\n// #include \"worker/model/model.h\"\nconst char* p = \"#include \\\"worker/x.h\\\"\";\n")
file(WRITE "${WORK}/common/spec/ok.h" "#pragma once\n#include \"common/spec/spec.h\"\n")
file(WRITE "${WORK}/worker/model/ok.cc" "#include \"common/checkpoint/checkpoint.h\"\n#include \"worker/model/model.h\"\n#include \"plugins/transport/loader.h\"\n")
check(TRUE)

# Planted: daemon/ includes worker/ (twice the same line, to check both line numbers), worker/
# includes daemon/ and a plugins/ header it did not declare, sim/ includes worker/, common/
# includes daemon/ and, with spaces and angle brackets, worker/.
file(WRITE "${WORK}/daemon/ringd/bad.cc"
     "// a daemon file\n#include \"common/spec/spec.h\"\n#include \"worker/model/layout.h\"\n\n#include \"worker/model/layout.h\"\n")
file(WRITE "${WORK}/worker/train/bad.cc" "#include \"daemon/checkpoint/checkpoint.h\"\n#include \"plugins/transport/ucx.h\"\n")
file(WRITE "${WORK}/sim/bad.cc" "#include \"common/cp/split.h\"\n#include \"worker/ring/ring_messages.h\"\n")
file(WRITE "${WORK}/common/contract/bad.h"
     "#pragma once\n#include \"daemon/optim/node_optimizer.h\"\n  #  include <worker/offload/shm.h>\n")
check(FALSE)
expect_in_log(
    "daemon/ringd/bad.cc:3: #include \"worker/model/layout.h\": daemon/ may include its own files and common, kernels (cmake/layers.txt)"
    "daemon/ringd/bad.cc:5: #include \"worker/model/layout.h\": daemon/ may include"
    "common/contract/bad.h:2: #include \"daemon/optim/node_optimizer.h\": common/ may include only its own files"
    "common/contract/bad.h:3: #  include <worker/offload/shm.h>: common/ may include only its own files"
    "worker/train/bad.cc:1: #include \"daemon/checkpoint/checkpoint.h\": worker/ may include its own files and common, plugins/transport/loader.h"
    "worker/train/bad.cc:2: #include \"plugins/transport/ucx.h\": worker/ may include"
    "sim/bad.cc:2: #include \"worker/ring/ring_messages.h\": sim/ may include its own files and common"
    "7 include(s) break the declared layering")
foreach(unexpected "ok.cc" "ok.h" "sim/bad.cc:1")
  string(FIND "${log}" "${unexpected}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "check_layering reported the allowed ${unexpected}:\n${log}")
  endif()
endforeach()

# A malformed graph is refused naming the line: an edge to no declared part, a part twice, a line
# without a colon.
file(REMOVE_RECURSE "${WORK}/daemon" "${WORK}/worker" "${WORK}/sim" "${WORK}/common")
file(WRITE "${WORK}/layers.txt" "common:\nworker: common gpu\n")
check(FALSE)
expect_in_log("layers.txt:2: worker may include 'gpu', which is in no declared part")
file(WRITE "${WORK}/layers.txt" "common:\ncommon: worker\n")
check(FALSE)
expect_in_log("layers.txt:2: part 'common' is declared twice")
file(WRITE "${WORK}/layers.txt" "common\n")
check(FALSE)
expect_in_log("layers.txt:1: expected 'part: other parts or headers', got 'common'")
file(REMOVE_RECURSE "${WORK}")
message("layering_check_test: ok")
