# Runs an example and checks both its exit code (0) and its stdout (EXPECT_REGEX), which
# ctest alone cannot do together:  cmake -DEXPECT_REGEX=... -DCMD=a;b;c -P run_example.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "exit code ${rc}, expected 0")
endif()
if(NOT out MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "stdout does not match: ${EXPECT_REGEX}")
endif()
