# Runs a command and checks its exit code and output:
#   cmake -DEXPECT_RC=2 -DEXPECT_REGEX=... -DCMD=a;b;c -P expect_run.cmake
# ctest alone can check either the exit code or the output, not both.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 170)
message("${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}")
endif()
if(DEFINED EXPECT_REGEX AND NOT "${out}${err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match: ${EXPECT_REGEX}")
endif()
