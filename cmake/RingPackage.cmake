# The Debian package: `cpack -G DEB` in the build tree writes ringmaster_<version>_<arch>.deb
# (binaries, transport and SPANK plugins, man pages, completion, examples, docs) and, when the
# CUDA backend is built, ringmaster-cuda_<version>_<arch>.deb (libring_kernels_cuda.so and the
# NCCL plugin). tests/install/package_test.sh builds, checks, unpacks and runs it.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ringmaster)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "ringmaster developers")
set(CPACK_PACKAGE_CONTACT "ringmaster developers <ringmaster@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "long-context transformer training on Slurm clusters")
# Debian wants extended description lines under 80 columns; CPack puts the summary first.
set(CPACK_PACKAGE_DESCRIPTION
    "ringmaster trains transformers on long contexts: one YAML spec describes the
model, the data, the ring of workers that shares one sequence (ring
attention), the optimizer with its CPU offload, checkpoints and the Slurm
resources. ringctl checks, plans and runs the job on one machine (ringctl
run) or submits it to Slurm; ring-coord keeps job state, ringd supervises
the workers of a node and ring-worker trains one rank.
.
This package holds the programs, the UCX transport, the Slurm SPANK plugin,
man pages, bash completion and the example specs
(/usr/share/ringmaster/examples).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_SOURCE_IGNORE_FILES "/build.*/;/\\\\.git/")

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime)
if(RING_CUDA_ENABLED)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # <name>_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE "")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.org/ringmaster")

# ringmaster: Depends computed by dpkg-shlibdeps from the ELF files (libc, libstdc++, yaml-cpp,
# zeromq, sqlite, sodium, openblas, ucx, ...).
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ringmaster)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "${CPACK_PACKAGE_DESCRIPTION}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "slurm-client, ringmaster-cuda")

# ringmaster-cuda: the CUDA runtime, cuBLAS and NCCL come from NVIDIA's installation, which is not
# a Debian package dpkg-shlibdeps could name (it fails on them); the package says so and depends
# on ringmaster and the C/C++ runtime only.
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME ringmaster-cuda)
set(CPACK_DEBIAN_CUDA_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS
    "ringmaster (= ${PROJECT_VERSION}), libc6 (>= 2.34), libstdc++6 (>= 12), libgcc-s1 (>= 3.0)")
set(CPACK_DEBIAN_CUDA_DESCRIPTION
    "The CUDA backend of ringmaster (libring_kernels_cuda.so, loaded on demand
by ring-worker) and the NCCL transport plugin. They need the CUDA runtime,
cuBLAS and NCCL of an NVIDIA CUDA installation on the dynamic linker's path,
and a GPU at run time.")

# Debian policy files: copyright (machine-readable, Apache-2.0 by reference to
# /usr/share/common-licenses as policy asks; the LICENSE file is the same text) and changelog.gz
# (the name for a native package: the version has no Debian revision).
set(ring_pkg_dir ${CMAKE_BINARY_DIR}/packaging)
configure_file(${PROJECT_SOURCE_DIR}/packaging/copyright.in ${ring_pkg_dir}/copyright @ONLY)
string(TIMESTAMP ring_pkg_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(${PROJECT_SOURCE_DIR}/packaging/changelog.in ${ring_pkg_dir}/changelog.Debian @ONLY)
add_custom_command(
  OUTPUT ${ring_pkg_dir}/changelog.gz
  COMMAND gzip -n -9 -c ${ring_pkg_dir}/changelog.Debian > ${ring_pkg_dir}/changelog.gz
  DEPENDS ${ring_pkg_dir}/changelog.Debian
  VERBATIM)
add_custom_target(ring_package_files ALL DEPENDS ${ring_pkg_dir}/changelog.gz)
foreach(component runtime cuda)
  set(doc ${CMAKE_INSTALL_DATADIR}/doc/ringmaster)
  if(component STREQUAL "cuda")
    set(doc ${CMAKE_INSTALL_DATADIR}/doc/ringmaster-cuda)
    if(NOT RING_CUDA_ENABLED)
      continue()
    endif()
  endif()
  install(FILES ${ring_pkg_dir}/copyright ${ring_pkg_dir}/changelog.gz DESTINATION ${doc}
          COMPONENT ${component})
endforeach()

include(CPack)
