# commgrid_resolve_backend(NAME VAR): VAR is ON, OFF or AUTO. When the backend's folder
# src/backends/<name>/ exists and its engine is found (or VAR is ON, in which case a
# missing engine is an error), the folder is added; it defines commgrid_<name> and
# appends itself to COMMGRID_EXPORTED_TARGETS and COMMGRID_BACKENDS.
macro(commgrid_resolve_backend NAME VAR)
  string(TOLOWER ${NAME} _cg_lower)
  set(COMMGRID_HAS_${NAME} 0)
  if(NOT "${${VAR}}" STREQUAL "OFF" AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/src/backends/${_cg_lower}/CMakeLists.txt)
    add_subdirectory(src/backends/${_cg_lower})
    if(TARGET commgrid_${_cg_lower})
      set(COMMGRID_HAS_${NAME} 1)
    elseif("${${VAR}}" STREQUAL "ON")
      message(FATAL_ERROR "commgrid: ${VAR}=ON but the ${_cg_lower} engine was not found")
    endif()
  endif()
  message(STATUS "commgrid: ${_cg_lower} backend: ${COMMGRID_HAS_${NAME}}")
endmacro()
