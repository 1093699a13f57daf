# Builds and runs one consumer project (see CMakeLists.txt beside this file). Any failing step
# fails the test with the step's output.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${KIND}: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

# pkg_config: no CMake on the consumer's side; the installed decentrain.pc gives the flags, for
# the umbrella header and for the installed single header <decentrain.hpp>.
if(KIND STREQUAL "pkg_config")
  run_step("install" ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${WORK_DIR}/prefix/${LIBDIR}/pkgconfig
                          pkg-config --cflags --libs decentrain
                  RESULT_VARIABLE rc OUTPUT_VARIABLE flags ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer pkg_config: pkg-config failed (${rc}): ${err}")
  endif()
  message(STATUS "pkg-config --cflags --libs decentrain: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run_step("compile" ${CXX} -Wall -Wextra -Wshadow -Wpedantic -Werror
           ${SOURCE_DIR}/tests/consumers/consumer.cpp -o ${WORK_DIR}/consumer ${flags})
  run_step("run" ${WORK_DIR}/consumer)
  # The installed single header: the same flags find it (preprocessed through them), and it is
  # single_include's (which single_header_program compiles with g++ and consumer_single_header
  # with clang++).
  run_step("preprocess (single header)" ${CXX} -DDECENTRAIN_CONSUMER_SINGLE_HEADER -E
           ${SOURCE_DIR}/tests/consumers/consumer.cpp ${flags} -o ${WORK_DIR}/consumer_single_header.ii)
  file(STRINGS ${WORK_DIR}/consumer_single_header.ii from_prefix LIMIT_COUNT 1 REGEX "^# 1 \"${WORK_DIR}/prefix/")
  if(NOT from_prefix)
    message(FATAL_ERROR "consumer pkg_config: <decentrain.hpp> was not taken from ${WORK_DIR}/prefix")
  endif()
  run_step("compare (single header)" ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/prefix/include/decentrain.hpp
           ${SOURCE_DIR}/single_include/decentrain/decentrain.hpp)
  return()
endif()

# This build's type, so that a program compiled here and the decentrain::compiled it links (built
# with this build's flags) are compiled alike (NDEBUG the same in both).
set(args -S ${SOURCE_DIR}/tests/consumers/${KIND} -B ${WORK_DIR}/build -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX}
         -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
# OPTIMIZE (CMakeLists.txt beside this file says when): the optimisation level of everything built
# here, the decentrain::compiled that add_subdirectory builds included.
if(OPTIMIZE AND BUILD_TYPE)
  string(TOUPPER "${BUILD_TYPE}" type)
  list(APPEND args "-DCMAKE_CXX_FLAGS_${type}=${OPTIMIZE} -DNDEBUG")
elseif(OPTIMIZE)
  list(APPEND args -DCMAKE_CXX_FLAGS=${OPTIMIZE})
endif()
if(KIND STREQUAL "find_package")
  run_step("install" ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DDECENTRAIN_SOURCE_DIR=${SOURCE_DIR})
elseif(KIND STREQUAL "add_subdirectory")
  list(APPEND args -DDECENTRAIN_SOURCE_DIR=${SOURCE_DIR})
elseif(KIND STREQUAL "single_header")
  list(APPEND args -DDECENTRAIN_SINGLE_INCLUDE=${SOURCE_DIR}/single_include)
endif()
run_step("configure" ${CMAKE_COMMAND} ${args})
run_step("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
if(NOT KIND STREQUAL "find_package")
  run_step("run" ${WORK_DIR}/build/consumer)
endif()

# find_package: the trainer against the installed decentrain::compiled runs, and built
# header-only the same program prints the same losses to the last digit.
if(KIND STREQUAL "find_package")
  set(programs trainer_compiled trainer)
  foreach(program IN LISTS programs)
    execute_process(COMMAND ${WORK_DIR}/build/${program} RESULT_VARIABLE rc OUTPUT_VARIABLE out_${program} ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "consumer ${KIND}: ${program} failed (${rc}):\n${out_${program}}\n${err}")
    endif()
    message(STATUS "${program}: ${out_${program}}")
  endforeach()
  if(KIND STREQUAL "find_package" AND NOT out_trainer STREQUAL out_trainer_compiled)
    message(FATAL_ERROR "consumer ${KIND}: the program against decentrain::compiled printed\n${out_trainer_compiled}"
                        "where the header-only build printed\n${out_trainer}")
  endif()
endif()
