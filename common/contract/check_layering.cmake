# The include layering of the source tree, checked on every build (target check_layering) and by
# ctest (tests/contract): what the lower layers may not include.
#
#   daemon/  never includes worker/  (what ringd shares with the workers is common/contract/)
#   worker/  never includes daemon/  (the checkpoint format both use is common/checkpoint/)
#   sim/     never includes worker/ or daemon/  (what it models alike, e.g. the context-parallel
#            cut and the ring's message sizes, is in common/cp/)
#   common/  never includes worker/ or daemon/  (common/ is below both)
#
# Usage: cmake -DROOT=<source tree> -P check_layering.cmake
# Prints every offending include as file:line, the include and the rule, then fails.
cmake_minimum_required(VERSION 3.20)
if(NOT DEFINED ROOT)
  message(FATAL_ERROR "check_layering.cmake: pass -DROOT=<source tree>")
endif()

# Each rule: the folder it applies to, the include prefixes it forbids, and why.
set(rule_dirs daemon worker sim common)
set(forbidden_daemon worker)
set(why_daemon "daemon/ must not include worker/: move what ringd and the workers share to common/contract/")
set(forbidden_worker daemon)
set(why_worker "worker/ must not include daemon/: move what the workers and ringd share to common/")
set(forbidden_sim worker daemon)
set(why_sim "sim/ must not include worker/ or daemon/: move what the simulator models alike to common/ (e.g. common/cp/)")
set(forbidden_common worker daemon)
set(why_common "common/ must not include worker/ or daemon/: common/ is below both")

set(violations 0)
foreach(dir IN LISTS rule_dirs)
  if(NOT IS_DIRECTORY "${ROOT}/${dir}")
    continue()
  endif()
  list(JOIN forbidden_${dir} "|" alternatives)
  set(pattern "^[ \t]*#[ \t]*include[ \t]*[\"<](${alternatives})/")
  file(GLOB_RECURSE sources RELATIVE "${ROOT}"
       "${ROOT}/${dir}/*.h" "${ROOT}/${dir}/*.hpp" "${ROOT}/${dir}/*.c" "${ROOT}/${dir}/*.cc"
       "${ROOT}/${dir}/*.cpp" "${ROOT}/${dir}/*.cu" "${ROOT}/${dir}/*.cuh" "${ROOT}/${dir}/*.inc")
  list(SORT sources)
  foreach(rel IN LISTS sources)
    file(STRINGS "${ROOT}/${rel}" hits REGEX "${pattern}")
    if(NOT hits)
      continue()
    endif()
    # Line numbers: count the newlines before each hit, searching on after the previous one.
    file(READ "${ROOT}/${rel}" rest)
    set(line 1)
    foreach(hit IN LISTS hits)
      string(FIND "${rest}" "${hit}" pos)
      string(SUBSTRING "${rest}" 0 ${pos} before)
      string(REGEX MATCHALL "\n" newlines "${before}")
      list(LENGTH newlines n)
      math(EXPR line "${line} + ${n}")
      string(STRIP "${hit}" shown)
      message("${rel}:${line}: ${shown}: ${why_${dir}}")
      math(EXPR violations "${violations} + 1")
      string(LENGTH "${hit}" len)
      math(EXPR next "${pos} + ${len}")
      string(SUBSTRING "${rest}" ${next} -1 rest)
    endforeach()
  endforeach()
endforeach()

if(violations GREATER 0)
  message(FATAL_ERROR "check_layering: ${violations} include(s) break the layering (above)")
endif()
