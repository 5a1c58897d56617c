# Which parts this build has, and why a part is missing (docs/design.md, "Complete builds and the wheel").
#
# Each part reports itself once: gpuext_part_built(<part> <detail> [VERSION <x.y.z>]) or
# gpuext_part_missing(<part> <option value> <why> <fix>...), where <option value> is the part's own
# AUTO|ON|OFF switch ("" when it has none). gpuext_check_parts(), at the end of CMakeLists.txt:
#  - stops the configure, naming every missing part that was required together with its fix: a part
#    whose own option is ON, or every part not switched OFF when JAX_GPUEXT_CUDA=ON (ON means the
#    complete GPU build, so a half build never passes for one);
#  - otherwise emits a CMake WARNING for each part that AUTO left out of a CUDA build (pip shows it
#    with -v: pip hides the output of a build that succeeds);
#  - writes build_parts.json into the package, so `jax-gpuext info` shows what is missing and how to
#    get it long after the build log is gone. VERSION (the NVSHMEM the _nvshmem part was built
#    against) becomes the record's "version": Python checks the host library against it before it
#    imports the module (jax_gpuext/distributed.py).
set_property(GLOBAL PROPERTY GPUEXT_PARTS "")

# ";" would split the record (a CMake list): paths lists in a reason are shown with "," instead.
function(gpuext_part_built part detail)
  cmake_parse_arguments(PARSE_ARGV 2 _arg "" "VERSION" "")
  string(REPLACE ";" ", " detail "${detail}")
  # pip's temporary build environment is gone after the install: keep only the part that informs.
  string(REGEX REPLACE "[^ ]*/site-packages/" "<build env>/" detail "${detail}")
  set_property(GLOBAL APPEND PROPERTY GPUEXT_PARTS "${part}")
  set_property(GLOBAL PROPERTY "GPUEXT_PART_${part}" "built" "" "${detail}" "")
  set_property(GLOBAL PROPERTY "GPUEXT_PART_VERSION_${part}" "${_arg_VERSION}")
endfunction()

# The fix may be given as several strings (joined): keep ";" out of them.
function(gpuext_part_missing part option why)
  string(REPLACE ";" ", " why "${why}")
  string(CONCAT fix ${ARGN})
  set_property(GLOBAL APPEND PROPERTY GPUEXT_PARTS "${part}")
  set_property(GLOBAL PROPERTY "GPUEXT_PART_${part}" "missing" "${option}" "${why}" "${fix}")
endfunction()

function(_gpuext_json_string out value)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  string(REPLACE "\n" " " value "${value}")
  set(${out} "\"${value}\"" PARENT_SCOPE)
endfunction()

function(gpuext_check_parts)
  string(TOUPPER "${JAX_GPUEXT_CUDA}" _want_cuda)
  get_property(_parts GLOBAL PROPERTY GPUEXT_PARTS)
  set(_required "")
  set(_json "{")
  set(_sep "")
  foreach(_part IN LISTS _parts)
    get_property(_rec GLOBAL PROPERTY "GPUEXT_PART_${_part}")
    list(GET _rec 0 _state)
    list(GET _rec 1 _option)
    list(GET _rec 2 _why)
    list(GET _rec 3 _fix)
    string(TOUPPER "${_option}" _option)
    _gpuext_json_string(_jwhy "${_why}")
    _gpuext_json_string(_jfix "${_fix}")
    if(_state STREQUAL "built")
      get_property(_version GLOBAL PROPERTY "GPUEXT_PART_VERSION_${_part}")
      set(_jversion "")
      if(_version)
        _gpuext_json_string(_jversion "${_version}")
        set(_jversion ", \"version\": ${_jversion}")
      endif()
      string(APPEND _json "${_sep}\n  \"${_part}\": {\"built\": true, \"detail\": ${_jwhy}${_jversion}}")
    else()
      string(APPEND _json "${_sep}\n  \"${_part}\": {\"built\": false, \"why\": ${_jwhy}, \"fix\": ${_jfix}}")
      if(_option STREQUAL "ON" OR (_want_cuda STREQUAL "ON" AND NOT _option STREQUAL "OFF"))
        string(APPEND _required "\n  - ${_part}: ${_why}.\n    Fix: ${_fix}.")
      elseif(NOT _option STREQUAL "OFF" AND GPUEXT_BUILD_CUDA)
        message(WARNING "jax-gpuext: building WITHOUT ${_part}: ${_why}.\nFix: ${_fix}.\n"
                        "(JAX_GPUEXT_CUDA=ON turns this into an error; `jax-gpuext info` shows it after install.)")
      endif()
    endif()
    set(_sep ",")
  endforeach()
  string(APPEND _json "\n}\n")
  if(_required)
    message(FATAL_ERROR "jax-gpuext: the complete GPU build was asked for (JAX_GPUEXT_CUDA=ON, or a part's "
                        "own option ON) but these parts cannot be built:${_required}\n"
                        "Switch a part off explicitly (JAX_GPUEXT_CUDNN=OFF, JAX_GPUEXT_NVSHMEM=OFF) to build without it.")
  endif()
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/build_parts.json" "${_json}")
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/build_parts.json" DESTINATION jax_gpuext)
endfunction()
