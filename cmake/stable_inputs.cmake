# Build inputs at paths that do not change between builds (issue 34: a second `pip install` from
# the same checkout recompiled every CUDA part).
#
# pip builds each install in a new temporary environment (/tmp/pip-build-env-XXXX/...), so the
# headers of nanobind, jaxlib and NVIDIA's wheels sit at a new path every time. Every compile
# command names those paths, so the persistent build directory (pyproject.toml `build-dir`) was
# reused but every object was out of date. gpuext_stable_dir() mirrors such a directory into the
# build directory and returns the mirror's path: a file is copied only when its content differs
# (COPY_FILE ONLY_IF_DIFFERENT keeps the old timestamp otherwise), so an unchanged header never
# triggers a recompile, and a changed one (another wheel version) does. Directories outside a
# temporary build environment (a toolkit, a path the user set) are used where they are.

set(GPUEXT_STABLE_ROOT "${CMAKE_BINARY_DIR}/stable-inputs")

# Is PATH inside one of pip's (or build's) temporary build environments?
function(gpuext_is_temporary out path)
  if(path MATCHES "/pip-build-env-[^/]+/" OR path MATCHES "/build-env-[^/]+/")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# gpuext_stable_dir(OUT_VAR SOURCE_DIR NAME): OUT_VAR = SOURCE_DIR, or its mirror under
# ${GPUEXT_STABLE_ROOT}/NAME/<SOURCE_DIR's name> when SOURCE_DIR is in a temporary build environment. Files the source
# no longer has are removed from the mirror.
function(gpuext_stable_dir out src name)
  gpuext_is_temporary(_tmp "${src}/")
  if(NOT _tmp OR NOT IS_DIRECTORY "${src}")
    set(${out} "${src}" PARENT_SCOPE)
    return()
  endif()
  # ...under the source's own folder name: headers that include "../include/x.h" (cudnn-frontend's
  # do) still find their siblings
  get_filename_component(_leaf "${src}" NAME)
  set(_dst "${GPUEXT_STABLE_ROOT}/${name}/${_leaf}")
  file(GLOB_RECURSE _files RELATIVE "${src}" LIST_DIRECTORIES false "${src}/*")
  list(FILTER _files EXCLUDE REGEX "(^|/)__pycache__/")
  foreach(_f IN LISTS _files)
    get_filename_component(_parent "${_dst}/${_f}" DIRECTORY)
    file(MAKE_DIRECTORY "${_parent}")
    file(COPY_FILE "${src}/${_f}" "${_dst}/${_f}" ONLY_IF_DIFFERENT)
  endforeach()
  if(EXISTS "${_dst}")
    file(GLOB_RECURSE _old RELATIVE "${_dst}" LIST_DIRECTORIES false "${_dst}/*")
    foreach(_f IN LISTS _old)
      if(NOT EXISTS "${src}/${_f}")
        file(REMOVE "${_dst}/${_f}")
      endif()
    endforeach()
  endif()
  list(LENGTH _files _n)
  message(STATUS "jax-gpuext: ${name}: ${_n} files from the temporary build environment, mirrored in ${_dst}")
  set(${out} "${_dst}" PARENT_SCOPE)
endfunction()

# gpuext_stable_find_path(VAR NAME HEADER HINTS...): find_path that searches again on every configure
# (a cached path may point into a temporary environment that is gone) and returns a stable path.
function(gpuext_stable_find_path var name header)
  unset(${var} CACHE)
  find_path(${var} ${header} HINTS ${ARGN} NO_DEFAULT_PATH)
  if(${var})
    gpuext_stable_dir(_stable "${${var}}" "${name}")
    set(${var} "${_stable}" CACHE PATH "directory holding ${header} (stable copy where it came from a build environment)" FORCE)
  endif()
endfunction()
