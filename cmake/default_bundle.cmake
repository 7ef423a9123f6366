# cmake/default_bundle.cmake: the default AOT bundle the wheel ships (luminamoon/bundle/)
#
# LUMINAMOON_DEFAULT_BUNDLE chooses it:
#   auto (default)  every default kernel variant for the archs of python/luminamoon/aot/default.py
#                   (ARCHS), compiled by `python -m luminamoon.aot build` with the build's Python
#                   and its Triton, once: the result is kept in LUMINAMOON_BUNDLE_CACHE under a key
#                   of the kernel sources' SHA-256, the archs and the Triton version, so later
#                   builds of the same sources copy it (a full build takes about 10 minutes on two
#                   cores). A build Python without Triton or torch (pip's isolated build
#                   environment) takes a cached bundle of the same sources and archs built by any
#                   Triton, and where there is none builds the wheel without a bundle (one line
#                   says how to get one: `luminamoon aot build`, or a build with Triton).
#   OFF             no bundle: backend="aot" then needs aot_bundle=DIR
#   <folder>        that bundle, as it is
#
# LUMINAMOON_BUNDLE_CACHE: the cache folder (default: $LUMINAMOON_BUNDLE_CACHE, else
#   build/bundle-cache in the source tree). LUMINAMOON_BUNDLE_JOBS: compile processes (default:
#   $CMAKE_BUILD_PARALLEL_LEVEL, else the number of cores).
set(LUMINAMOON_DEFAULT_BUNDLE "auto" CACHE STRING
  "The wheel's default AOT bundle: auto (built and cached), OFF, or a bundle folder")
if(DEFINED ENV{LUMINAMOON_BUNDLE_CACHE})
  set(_luminamoon_cache_default "$ENV{LUMINAMOON_BUNDLE_CACHE}")
else()
  get_filename_component(_luminamoon_cache_default "${LUMINAV_REPO_DIR}/build/bundle-cache" ABSOLUTE)
endif()
set(LUMINAMOON_BUNDLE_CACHE "${_luminamoon_cache_default}" CACHE PATH "Where built default bundles are kept")
if(NOT "$ENV{CMAKE_BUILD_PARALLEL_LEVEL}" STREQUAL "")
  set(_luminamoon_jobs_default "$ENV{CMAKE_BUILD_PARALLEL_LEVEL}")
else()
  cmake_host_system_information(RESULT _luminamoon_jobs_default QUERY NUMBER_OF_LOGICAL_CORES)
endif()
set(LUMINAMOON_BUNDLE_JOBS "${_luminamoon_jobs_default}" CACHE STRING "Compile processes for the default bundle")

# The SHA-256 of everything that decides the compiled kernels: the kernel sources and the
# builder (file names and contents).
function(_luminamoon_kernel_source_hash out)
  set(py ${LUMINAV_REPO_DIR}/python/luminamoon)
  file(GLOB files ${py}/kernels/*.py)
  list(APPEND files ${py}/aot/builder.py ${py}/aot/compat.py ${py}/aot/manifest.py
       ${py}/aot/cubin.py ${py}/aot/_worker.py)
  list(SORT files)
  set(text "")
  foreach(f ${files})
    file(SHA256 ${f} h)
    file(RELATIVE_PATH rel ${py} ${f})
    string(APPEND text "${rel} ${h}\n")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${f})
  endforeach()
  string(SHA256 all "${text}")
  string(SUBSTRING "${all}" 0 16 short)
  set(${out} ${short} PARENT_SCOPE)
endfunction()

function(luminamoon_default_bundle result)
  set(${result} "" PARENT_SCOPE)
  set(choice "${LUMINAMOON_DEFAULT_BUNDLE}")
  if(NOT choice OR choice STREQUAL "OFF")
    message(STATUS "Default AOT bundle: none (LUMINAMOON_DEFAULT_BUNDLE=${choice})")
    return()
  endif()
  if(NOT choice STREQUAL "auto")
    if(NOT EXISTS "${choice}/manifest.json")
      message(FATAL_ERROR "LUMINAMOON_DEFAULT_BUNDLE=${choice} is neither auto, OFF nor a bundle "
        "folder (it has no manifest.json); give a folder written by `luminamoon aot build`")
    endif()
    message(STATUS "Default AOT bundle: ${choice}")
    set(${result} "${choice}" PARENT_SCOPE)
    return()
  endif()

  # The archs: the one list in python/luminamoon/aot/default.py ("ARCHS = (80, 90, ...)").
  set(default_py ${LUMINAV_REPO_DIR}/python/luminamoon/aot/default.py)
  file(STRINGS ${default_py} archs_line REGEX "^ARCHS = \\(")
  string(REGEX MATCH "\\(([0-9, ]+)\\)" _ "${archs_line}")
  string(REPLACE " " "" archs "${CMAKE_MATCH_1}")
  if(NOT archs MATCHES "^[0-9]+(,[0-9]+)*$")
    message(FATAL_ERROR "${default_py}: no line \"ARCHS = (80, 90, ...)\" (found \"${archs_line}\")")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${default_py})
  string(REPLACE "," "_" archs_word "${archs}")
  _luminamoon_kernel_source_hash(source_hash)
  set(stem "${LUMINAMOON_BUNDLE_CACHE}/${source_hash}-sm${archs_word}-triton")

  # The build Python's Triton and torch (their metadata: importing Triton would take seconds).
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.metadata as m, importlib.util as u; print(m.version('triton') if u.find_spec('triton') and u.find_spec('torch') else '')"
    OUTPUT_VARIABLE triton_version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    set(triton_version "")
  endif()

  if(triton_version)
    set(bundle "${stem}${triton_version}")
    if(EXISTS "${bundle}/manifest.json")
      message(STATUS "Default AOT bundle: cached ${bundle}")
    else()
      set(partial "${bundle}.partial")
      file(REMOVE_RECURSE "${partial}")
      message(STATUS "Default AOT bundle: compiling every default variant for sm ${archs} with "
        "Triton ${triton_version} (${LUMINAMOON_BUNDLE_JOBS} processes; minutes, once) into ${bundle}")
      string(TIMESTAMP t0 "%s")
      execute_process(
        COMMAND ${CMAKE_COMMAND} -E env --unset=TRITON_INTERPRET
                "PYTHONPATH=${LUMINAV_REPO_DIR}/python"
                "${Python_EXECUTABLE}" -m luminamoon.aot build --arch ${archs} --out "${partial}"
                --jobs ${LUMINAMOON_BUNDLE_JOBS} --quiet
        RESULT_VARIABLE rc OUTPUT_VARIABLE build_out ERROR_VARIABLE build_err)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "building the default AOT bundle failed (exit ${rc}):\n${build_out}\n${build_err}\n"
          "Fix the build, or build the wheel without a bundle: -DLUMINAMOON_DEFAULT_BUNDLE=OFF "
          "(pip: --config-settings=cmake.define.LUMINAMOON_DEFAULT_BUNDLE=OFF)")
      endif()
      file(RENAME "${partial}" "${bundle}")
      string(TIMESTAMP t1 "%s")
      math(EXPR seconds "${t1} - ${t0}")
      message(STATUS "Default AOT bundle: built in ${seconds} s")
    endif()
  else()
    # No Triton here: a bundle of these sources from an earlier build, whichever Triton built it.
    file(GLOB candidates LIST_DIRECTORIES true "${stem}*")
    set(bundle "")
    list(SORT candidates)
    foreach(c ${candidates})
      if(EXISTS "${c}/manifest.json" AND NOT c MATCHES "\\.partial$")
        set(bundle "${c}")
      endif()
    endforeach()
    if(NOT bundle)
      # pip's isolated build environment (pip install ., pip install git+...) has no Triton: the
      # wheel builds without a bundle, and says in one line how to get one.
      message(STATUS "Default AOT bundle: none (no Triton in the build's Python); for backend=\"aot\" "
        "run `luminamoon aot build --arch 80,90 --out DIR`, or build with Triton: "
        "pip install triton && pip install --no-build-isolation . (cmake/default_bundle.cmake)")
      return()
    endif()
    message(STATUS "Default AOT bundle: cached ${bundle} (the build's Python has no Triton)")
  endif()
  set(${result} "${bundle}" PARENT_SCOPE)
endfunction()
