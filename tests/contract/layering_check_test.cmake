# check_layering.cmake over a made-up tree: passes on allowed includes, fails on each planted bad
# one and names it as file:line with the rule.
#   cmake -DSCRIPT=<check_layering.cmake> -DWORK=<scratch dir> -P layering_check_test.cmake
file(REMOVE_RECURSE "${WORK}")

function(check expect_ok)
  execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK} -P ${SCRIPT}
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

# Allowed: daemon/ and worker/ include common/, worker/ includes worker/, a commented-out include
# and a string mentioning worker/ are not includes.
file(WRITE "${WORK}/daemon/ringd/ok.cc"
     "#include \"common/contract/layout.h\"\n#include <vector>\n// #include \"worker/model/model.h\"\nconst char* p = \"#include \\\"worker/x.h\\\"\";\n")
file(WRITE "${WORK}/common/spec/ok.h" "#pragma once\n#include \"common/spec/spec.h\"\n")
file(WRITE "${WORK}/worker/model/ok.cc" "#include \"common/checkpoint/checkpoint.h\"\n#include \"worker/model/model.h\"\n")
check(TRUE)

# Planted: daemon/ includes worker/ (twice the same line, to check both line numbers), worker/
# includes daemon/, sim/ includes worker/, common/ includes daemon/ and, with spaces and angle
# brackets, worker/.
file(WRITE "${WORK}/daemon/ringd/bad.cc"
     "// a daemon file\n#include \"common/spec/spec.h\"\n#include \"worker/model/layout.h\"\n\n#include \"worker/model/layout.h\"\n")
file(WRITE "${WORK}/worker/train/bad.cc" "#include \"daemon/checkpoint/checkpoint.h\"\n")
file(WRITE "${WORK}/sim/bad.cc" "#include \"common/cp/split.h\"\n#include \"worker/ring/ring_messages.h\"\n")
file(WRITE "${WORK}/common/contract/bad.h"
     "#pragma once\n#include \"daemon/optim/node_optimizer.h\"\n  #  include <worker/offload/shm.h>\n")
check(FALSE)
foreach(expected
    "daemon/ringd/bad.cc:3: #include \"worker/model/layout.h\": daemon/ must not include worker/"
    "daemon/ringd/bad.cc:5: #include \"worker/model/layout.h\": daemon/ must not include worker/"
    "common/contract/bad.h:2: #include \"daemon/optim/node_optimizer.h\": common/ must not include worker/ or daemon/"
    "common/contract/bad.h:3: #  include <worker/offload/shm.h>: common/ must not include worker/ or daemon/"
    "worker/train/bad.cc:1: #include \"daemon/checkpoint/checkpoint.h\": worker/ must not include daemon/"
    "sim/bad.cc:2: #include \"worker/ring/ring_messages.h\": sim/ must not include worker/ or daemon/"
    "6 include(s) break the layering")
  string(FIND "${log}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_layering did not report\n  ${expected}\nIt printed:\n${log}")
  endif()
endforeach()
foreach(unexpected "ok.cc" "ok.h")
  string(FIND "${log}" "${unexpected}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "check_layering reported the allowed file ${unexpected}:\n${log}")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
message("layering_check_test: ok")
