# Which source the build was made from (docs/design.md, "The GPU wheel and the one-call run"):
# build_source.json in the package, {"commit": <git HEAD or "unknown">, "dirty": true|false|null}.
# A GPU run installs a wheel built on another machine beforehand (scripts/gpu_wheel.sh); its
# results name the commit the wheel was built from, read from here, so they still say what they
# tested. "dirty": tracked or untracked (not ignored) files differed from that commit. Without git
# (an sdist) both are unknown. Runs at every configure, which scikit-build-core does per build.
set(_gpuext_commit "unknown")
set(_gpuext_dirty "null")
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse HEAD WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}"
                  OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0 AND _out MATCHES "^[0-9a-f]+$")
    set(_gpuext_commit "${_out}")
    execute_process(COMMAND "${GIT_EXECUTABLE}" status --porcelain WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}"
                    OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0)
      if(_out STREQUAL "")
        set(_gpuext_dirty "false")
      else()
        set(_gpuext_dirty "true")
      endif()
    endif()
  endif()
endif()
message(STATUS "jax-gpuext: source commit ${_gpuext_commit} (dirty: ${_gpuext_dirty})")
file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/build_source.json"
     "{\"commit\": \"${_gpuext_commit}\", \"dirty\": ${_gpuext_dirty}}\n")
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/build_source.json" DESTINATION jax_gpuext)
