# commgrid_speed_up_build(): run once at the end of the top-level CMakeLists, after every
# target exists. It changes how targets compile, never what they do:
# Test programs (every executable linking GoogleTest) compile with -Og -g1 under
# RelWithDebInfo: their own code is assertions and set-up, which -O2 and full debug
# information make twice as slow to compile for nothing. The code under test (the
# libraries, the commgrid command, the examples) keeps -O2 -g.
# Test programs are unity builds (COMMGRID_UNITY_TESTS, ON by default): their files compile
# in batches of up to eight, one translation unit each, so GoogleTest's and commgrid's headers
# are parsed once a batch rather than once a file (about half the compile time of a test
# program). Two files whose namespace-scope helpers share a name never share a batch: the
# table below names them. A file that adds such a helper and breaks the unity build goes
# into the table (or gets a name of its own).
# (The commgrid command is a unity build in every preset too: tools/CMakeLists.txt,
# COMMGRID_UNITY_TOOLS.)
option(COMMGRID_UNITY_TESTS "Compile each test program's files in batches (unity build)" ON)
# The libraries under src/ and tools/ compile one file a unit unless COMMGRID_UNITY_LIBS is on (off by
# default: an edit recompiles one file). scripts/tidy's tree turns it on, so that clang-tidy
# parses the headers once a batch rather than once a file.
option(COMMGRID_UNITY_LIBS "Compile each library's files under src/ and tools/ in batches (unity build)" OFF)

# FILE:NAME,...: the names FILE defines at namespace scope that another file of its program
# defines too (an anonymous namespace does not keep them apart in one unit).
set(_commgrid_unity_apart
  test_config.cpp:cfg,expect_error test_validation_order.cpp:cfg
  test_head_config.cpp:expect_error
  test_deadlines.cpp:Clock,Outcome test_faults.cpp:Clock test_world_size.cpp:Clock
  test_gate.cpp:Outcome test_job_secret.cpp:Outcome
  test_tcp_store.cpp:bytes test_tcp_store_limits.cpp:bytes,has test_job_claims.cpp:has
  test_store_red_team.cpp:has
  test_etcd_store.cpp:text,bytes,job,fresh test_etcd_lost_reply.cpp:text,bytes,job,fresh
  test_plan_cli.cpp:plan test_plan_job_cli.cpp:plan test_plan_scale_cli.cpp:plan
  test_mpi_communicator.cpp:make_world test_mpi_process_groups.cpp:make_world
  test_layouts.cpp:kSteps,kRelTolerance test_moe.cpp:kSteps,kRelTolerance
  test_nccl_host.cpp:FakeComm test_nccl_recovery.cpp:FakeComm
  recovery.cpp:text,join resilience_keys.cpp:text,join config.cpp:str rank_map.cpp:str)

# _commgrid_unity_batches(TARGET): UNITY_GROUP on each of TARGET's .cpp files, in source
# order, each into the first batch that has fewer than eight files and none that shares a
# name with it.
function(_commgrid_unity_batches t)
  get_target_property(sources ${t} SOURCES)
  get_target_property(dir ${t} SOURCE_DIR)
  set(batches 0)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.cpp$")
      continue()
    endif()
    get_filename_component(file "${src}" NAME)
    set(own "")
    foreach(entry IN LISTS _commgrid_unity_apart)
      if(entry MATCHES "^([^:]+):(.*)$" AND CMAKE_MATCH_1 STREQUAL file)
        string(REPLACE "," ";" own "${CMAKE_MATCH_2}")
      endif()
    endforeach()
    set(batch ${batches})  # a new one unless one below fits
    foreach(b RANGE ${batches})
      if(b EQUAL batches OR NOT batch EQUAL batches)
        break()
      endif()
      set(fits TRUE)
      if(count_${b} EQUAL 8)
        set(fits FALSE)
      endif()
      foreach(n IN LISTS own)
        if(n IN_LIST names_${b})
          set(fits FALSE)
        endif()
      endforeach()
      if(fits)
        set(batch ${b})
      endif()
    endforeach()
    if(batch EQUAL batches)
      math(EXPR batches "${batches} + 1")
      set(count_${batch} 0)
      set(names_${batch} "")
    endif()
    math(EXPR count_${batch} "${count_${batch}} + 1")
    list(APPEND names_${batch} ${own})
    if(NOT IS_ABSOLUTE "${src}")
      set(src "${dir}/${src}")
    endif()
    set_source_files_properties("${src}" TARGET_DIRECTORY ${t} PROPERTIES UNITY_GROUP "batch${batch}")
  endforeach()
  set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
endfunction()

function(_commgrid_targets_below dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _commgrid_targets_below("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(commgrid_speed_up_build)
  _commgrid_targets_below("${PROJECT_SOURCE_DIR}" targets)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "EXECUTABLE" AND NOT type STREQUAL "STATIC_LIBRARY")
      continue()
    endif()
    get_target_property(imported ${t} IMPORTED)
    if(imported)
      continue()
    endif()
    get_target_property(libs ${t} LINK_LIBRARIES)
    set(is_test FALSE)
    foreach(l IN LISTS libs)
      if(l MATCHES "^GTest::")
        set(is_test TRUE)
      endif()
    endforeach()
    get_target_property(dir ${t} SOURCE_DIR)
    if(is_test)
      target_compile_options(${t} PRIVATE $<$<CONFIG:RelWithDebInfo>:-Og -g1>)
      if(COMMGRID_UNITY_TESTS AND type STREQUAL "EXECUTABLE")
        _commgrid_unity_batches(${t})
      endif()
    elseif(COMMGRID_UNITY_LIBS AND type STREQUAL "STATIC_LIBRARY")
      file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${dir}")
      if(rel MATCHES "^(src|tools)/")
        _commgrid_unity_batches(${t})
      endif()
    endif()
  endforeach()
endfunction()
