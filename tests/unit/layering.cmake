# One layer's include path, probed with the compiler: the layer's own header must compile
# with it (the control) and a header of a later layer must not be found on it (a wrong-way
# include fails to build).
#   cmake -DCXX=... -DINCLUDES="a|b" -DOWN=commgrid/x.hpp -DLATER=commgrid/y.hpp -DWORK=dir -P layering.cmake
string(REPLACE "|" ";" _dirs "${INCLUDES}")
set(_flags -std=c++20 -fsyntax-only)
foreach(_d IN LISTS _dirs)
  list(APPEND _flags "-I${_d}")
endforeach()
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/own.cpp" "#include <${OWN}>\nint main() { return 0; }\n")
file(WRITE "${WORK}/later.cpp" "#include <${LATER}>\nint main() { return 0; }\n")
execute_process(COMMAND "${CXX}" ${_flags} "${WORK}/own.cpp"
                RESULT_VARIABLE _own_rc ERROR_VARIABLE _own_err)
if(NOT _own_rc EQUAL 0)
  message(FATAL_ERROR "the layer's own header <${OWN}> does not compile on its include path:\n${_own_err}")
endif()
execute_process(COMMAND "${CXX}" ${_flags} "${WORK}/later.cpp"
                RESULT_VARIABLE _later_rc ERROR_VARIABLE _later_err)
if(_later_rc EQUAL 0)
  message(FATAL_ERROR "<${LATER}> (a later layer) compiled on this layer's include path")
endif()
string(FIND "${_later_err}" "${LATER}" _named)
if(_named EQUAL -1)
  message(FATAL_ERROR "<${LATER}> failed for another reason than not being found:\n${_later_err}")
endif()
message(STATUS "<${OWN}> compiles; <${LATER}> is not on the path")
