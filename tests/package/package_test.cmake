# ctest `package`: installs the build into a fresh prefix, then configures,
# builds and runs tests/package/consumer against the installed tree only.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... [-DEXTRA_ARGS=a|b] -P package_test.cmake
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "package_test.cmake: ${v} not set")
  endif()
endforeach()

string(REPLACE "|" ";" EXTRA_ARGS "${EXTRA_ARGS}")
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer-build")

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/dsmla/attention.hpp include/dsmla/dsmla.h include/dsmla/version.h)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
# The testing library and private headers stay out of the package.
file(GLOB_RECURSE leaked "${prefix}/include/dsmla/testing/*" "${prefix}/include/cuda/*")
if(leaked)
  message(FATAL_ERROR "installed headers that are not public: ${leaked}")
endif()

run("configure consumer" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/package/consumer" -B "${consumer_build}"
    -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" ${EXTRA_ARGS})
run("build consumer" ${CMAKE_COMMAND} --build "${consumer_build}")
run("run consumer_cpp" "${consumer_build}/consumer_cpp")
message(STATUS "${last_output}")
run("run consumer_c" "${consumer_build}/consumer_c")
message(STATUS "${last_output}")
file(REMOVE_RECURSE "${WORK_DIR}")
