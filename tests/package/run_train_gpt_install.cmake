# ctest driver: examples/train_gpt built as a user's program is, against `cmake --install`'s
# prefix alone (find_package(commgrid), no build or source tree of commgrid on any path),
# then run under the installed `commgrid launch -n 4`; its losses must equal those of the
# build tree's program on 4 rank-threads (--local 4).
# Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, CXX_FLAGS, LINKER_FLAGS, LAUNCHER
# (the compiler launcher, e.g. ccache; may be empty), TRAIN_GPT (the build tree's program),
# BUILD_TYPE and TYPE_FLAGS (the build tree's build type and its flags).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(_prefix ${WORK_DIR}/prefix)
set(_build ${WORK_DIR}/build)
string(TOUPPER "${BUILD_TYPE}" _type)
# Every step is bounded: a hung step fails the test with its output.
function(step timeout)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT ${timeout})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(step_out "${out}" PARENT_SCOPE)
endfunction()

step(300 ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${_prefix})
foreach(_file bin/commgrid include/commgrid/world.hpp include/commgrid/cli/world_runner.hpp)
  if(NOT EXISTS ${_prefix}/${_file})
    message(FATAL_ERROR "cmake --install did not install ${_file}")
  endif()
endforeach()

# Only the prefix: no package registry, no system-wide commgrid.
step(300 ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/train_gpt -B ${_build} -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${_prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
     -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
     -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER} -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
     -DCMAKE_CXX_FLAGS=${CXX_FLAGS} -DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}
     "-DCMAKE_CXX_FLAGS_${_type}=${TYPE_FLAGS}")
file(STRINGS ${_build}/CMakeCache.txt _dir REGEX "^commgrid_DIR:")
if(NOT _dir MATCHES "=${_prefix}/")
  message(FATAL_ERROR "find_package(commgrid) did not find the install in ${_prefix}: ${_dir}")
endif()
# No compile or link command reaches into commgrid's source or build tree (tools/ included).
file(READ ${_build}/compile_commands.json _commands)
if(EXISTS ${_build}/build.ninja)
  file(READ ${_build}/build.ninja _ninja)
  string(APPEND _commands "${_ninja}")
endif()
foreach(_tree tools include src)
  foreach(_root ${SOURCE_DIR} ${BUILD_DIR})
    string(FIND "${_commands}" "${_root}/${_tree}" _at)
    if(NOT _at EQUAL -1)
      message(FATAL_ERROR "train_gpt's build uses ${_root}/${_tree}; it must use the install alone")
    endif()
  endforeach()
endforeach()
step(900 ${CMAKE_COMMAND} --build ${_build} --target train_gpt -j 2)

# The losses under the installed launcher equal the build tree's on rank-threads.
set(_args --tp 2 --pp 2 --steps 3)
step(300 ${_prefix}/bin/commgrid launch -n 4 --output rank0 --timeout 120 --
     ${_build}/commgrid-train-gpt ${_args})
set(_launched "${step_out}")
step(300 ${TRAIN_GPT} --local 4 ${_args})
set(_local "${step_out}")
message(STATUS "under the installed commgrid launch -n 4:\n${_launched}")
if(NOT _launched MATCHES "step +loss +grad_norm\n +1 +[0-9.]+ +[0-9.]+\n +2 +[0-9.]+ +[0-9.]+\n +3 +[0-9.]+")
  message(FATAL_ERROR "no loss lines for steps 1-3 in the output above")
endif()
if(NOT _launched STREQUAL _local)
  message(FATAL_ERROR "the installed program's output differs from the build tree's "
                      "(--local 4):\n${_local}")
endif()
message(STATUS "train_gpt against the install: built and trained under commgrid launch -n 4")
