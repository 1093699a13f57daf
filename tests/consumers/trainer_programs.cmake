# Included by the find_package and add_subdirectory consumers: a DiLoCo program with the CPU
# instantiations taken from decentrain::compiled, and (find_package: against the installed
# library) the same program header-only, whose losses run_consumer.cmake compares with the first's.
set(_trainer ${DECENTRAIN_SOURCE_DIR}/bench/compile_time/diloco_program.cpp)
set(_programs trainer_compiled)
if(DECENTRAIN_COMPARE_HEADER_ONLY)
  list(APPEND _programs trainer)
endif()
foreach(_program IN LISTS _programs)
  add_executable(${_program} ${_trainer})
  target_compile_definitions(${_program} PRIVATE DECENTRAIN_LIGHT)
endforeach()
target_link_libraries(trainer_compiled PRIVATE decentrain::compiled)
if(DECENTRAIN_COMPARE_HEADER_ONLY)
  target_link_libraries(trainer PRIVATE decentrain::decentrain)
endif()
