# commgrid_speed_up_build(): run once at the end of the top-level CMakeLists, after every
# target exists. It changes how targets compile, never what they do:
# Test programs (every executable linking GoogleTest) compile with -Og -g1 under
# RelWithDebInfo: their own code is assertions and set-up, which -O2 and full debug
# information make twice as slow to compile for nothing. The code under test (the
# libraries, the commgrid command, the examples) keeps -O2 -g.
# (The commgrid command is a unity build in every preset: tools/CMakeLists.txt,
# COMMGRID_UNITY_TOOLS. Test programs are not: each test file keeps its own helpers.)

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
    if(is_test)
      target_compile_options(${t} PRIVATE $<$<CONFIG:RelWithDebInfo>:-Og -g1>)
    endif()
  endforeach()
endfunction()
