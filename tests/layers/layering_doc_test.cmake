# docs/architecture.md's picture of the layer graph (the mermaid block after the line
# "<!-- layers: generated from cmake/layers.txt -->") is what cmake/check_layering.cmake draws from
# cmake/layers.txt. To redraw it: cmake -DROOT=. -DMERMAID=/dev/stdout -P cmake/check_layering.cmake
#   cmake -DROOT=<source tree> -DWORK=<scratch dir> -P layering_doc_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${ROOT} -DMERMAID=${WORK}/graph.mmd
                        -P ${ROOT}/cmake/check_layering.cmake
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "drawing the graph failed:\n${out}${err}")
endif()
file(READ "${WORK}/graph.mmd" want)
file(READ "${ROOT}/docs/architecture.md" doc)
set(marker "<!-- layers: generated from cmake/layers.txt -->\n```mermaid\n")
string(FIND "${doc}" "${marker}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "docs/architecture.md has no block after '<!-- layers: generated from cmake/layers.txt -->'")
endif()
string(LENGTH "${marker}" ml)
math(EXPR from "${at} + ${ml}")
string(SUBSTRING "${doc}" ${from} -1 rest)
string(FIND "${rest}" "```" end)
string(SUBSTRING "${rest}" 0 ${end} have)
if(NOT have STREQUAL want)
  message(FATAL_ERROR "docs/architecture.md's layer graph is out of date. It should be:\n${want}\n"
                      "It is:\n${have}")
endif()
file(REMOVE_RECURSE "${WORK}")
message("layering_doc_test: ok")
