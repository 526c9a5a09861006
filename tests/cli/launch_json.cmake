# Runs a program under `commgrid launch --output rank0` and checks that stdout is exactly
# one JSON document (what a pipe into a parser needs) with the given member:
#   cmake -DCMD=commgrid;launch;...;--;prog;... -DMEMBER=steps -P launch_json.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "exit code ${rc}, expected 0")
endif()
string(JSON _type ERROR_VARIABLE _error TYPE "${out}" ${MEMBER})
if(_error)
  message(FATAL_ERROR "stdout is not one JSON document with \"${MEMBER}\": ${_error}")
endif()
message(STATUS "stdout parses as JSON; ${MEMBER} is an ${_type}")
