# What `cmake --install` installs beyond what a target's own CMakeLists.txt installs (ringctl and
# ring-coord to bin/, the plugins and the CUDA backend to lib/ringmaster/): ringd and ring-worker,
# man pages generated from --help with help2man, bash completion for ringctl, the example specs
# and the documentation.

# ringd finds ring-worker next to itself; ringctl finds ringd and ring-coord next to itself.
install(TARGETS ringd ring-worker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# ---- man pages: help2man runs each program's --help at build time ---------------------------
set(RING_MAN_ENABLED OFF)
if(NOT RING_MAN_PAGES STREQUAL "OFF")
  find_program(RING_HELP2MAN help2man)
  if(RING_HELP2MAN)
    set(RING_MAN_ENABLED ON)
  elseif(RING_MAN_PAGES STREQUAL "ON")
    message(FATAL_ERROR "RING_MAN_PAGES=ON but help2man was not found (scripts/install-deps.sh)")
  else()
    message(STATUS "man pages: not generated (help2man not found)")
  endif()
endif()

if(RING_MAN_ENABLED)
  set(ring_man_pages
      "ringctl|check, plan, run and follow ringmaster training jobs"
      "ring-coord|the ringmaster coordinator (job state and control plane)"
      "ringd|the ringmaster node daemon (workers, offloaded optimizer, checkpoints)"
      "ring-worker|a ringmaster training worker (one rank of the ring)")
  set(ring_man_files)
  foreach(entry IN LISTS ring_man_pages)
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 prog)
    list(GET parts 1 what)
    set(page ${CMAKE_BINARY_DIR}/man/${prog}.1)
    set(out ${page}.gz)
    # --version-string: the project's version whatever --version prints (or whether a program
    # has it); --no-discard-stderr: a program that prints its help on stderr still gets a page.
    # Compressed without a timestamp (gzip -n), as Debian policy wants.
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${RING_HELP2MAN} --no-info --no-discard-stderr --section=1
              --source=ringmaster --manual=ringmaster
              --version-string=${PROJECT_VERSION} --name=${what} --output=${page}
              $<TARGET_FILE:${prog}>
      COMMAND gzip -n -9 -f ${page}
      DEPENDS ${prog}
      COMMENT "help2man ${prog}"
      VERBATIM)
    list(APPEND ring_man_files ${out})
  endforeach()
  add_custom_target(ring_man_pages ALL DEPENDS ${ring_man_files})
  install(FILES ${ring_man_files} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()

# ---- bash completion ------------------------------------------------------------------------
install(FILES ${PROJECT_SOURCE_DIR}/completion/ringctl.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME ringctl)

# ---- example specs and documentation -------------------------------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/examples/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ringmaster/examples FILES_MATCHING PATTERN "*.yaml")
# As in the source tree, so that the links between them work: README.md at the top, docs/ with
# its images, daemon/INTERFACE.md (the operator guide links it).
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        FILES_MATCHING PATTERN "*.md" PATTERN "*.png" PATTERN "*.svg")
install(FILES ${PROJECT_SOURCE_DIR}/daemon/INTERFACE.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/daemon)
# LICENSE is not installed: the package's copyright file names Apache-2.0 from
# /usr/share/common-licenses, as Debian policy asks.
foreach(f CHANGELOG.md CONTRIBUTING.md)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${f})
    install(FILES ${PROJECT_SOURCE_DIR}/${f} DESTINATION ${CMAKE_INSTALL_DOCDIR})
  endif()
endforeach()
