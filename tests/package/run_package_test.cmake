# ctest driver: install the build tree into a fresh prefix, then configure, build and run
# the consumer project against it with find_package(commgrid): layout-only (which must look
# for no backend), with each component this build has (every backend, resilience, world), and
# asking for a component it lacks (which must fail, naming it).
# Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, BACKENDS (comma-separated), CXX_FLAGS,
# LINKER_FLAGS.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
if(EXISTS ${BUILD_DIR}/examples/train_gpt/commgrid-train-gpt AND
   NOT EXISTS ${WORK_DIR}/prefix/bin/commgrid-train-gpt)
  message(FATAL_ERROR "cmake --install did not install commgrid-train-gpt")
endif()
string(REPLACE "," ";" BACKENDS "${BACKENDS}")
foreach(_component "" ${BACKENDS})
  set(_build ${WORK_DIR}/build${_component})
  step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${_build}
       -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCOMPONENT=${_component}
       -DCMAKE_CXX_FLAGS=${CXX_FLAGS} -DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS})
  step(${CMAKE_COMMAND} --build ${_build})
  step(${_build}/consumer)
  # The backend program runs where it can here: Gloo's rank-threads need nothing else.
  if(_component STREQUAL "gloo")
    step(${_build}/consumer_gloo)
  endif()
  if(_component STREQUAL "resilience")
    step(${_build}/consumer_resilience)
  endif()
  if(_component STREQUAL "world")
    step(${_build}/consumer_world)
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer
                -B ${WORK_DIR}/build-missing -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
                -DCOMPONENT=nosuch RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "built without the component \"nosuch\"")
  message(FATAL_ERROR "asking for a missing component: exit ${rc}\n${out}\n${err}")
endif()
message(STATUS "package test: ok (layout-only and components: ${BACKENDS})")
