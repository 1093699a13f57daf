# Included by the find_package and add_subdirectory consumers: a DiLoCo program built twice,
# header-only and with the CPU instantiations taken from decentrain::compiled
# (run_consumer.cmake checks that both print the same losses).
set(_trainer ${DECENTRAIN_SOURCE_DIR}/bench/compile_time/diloco_program.cpp)
foreach(_program trainer trainer_compiled)
  add_executable(${_program} ${_trainer})
  target_compile_definitions(${_program} PRIVATE DECENTRAIN_LIGHT)
endforeach()
target_link_libraries(trainer PRIVATE decentrain::decentrain)
target_link_libraries(trainer_compiled PRIVATE decentrain::compiled)
