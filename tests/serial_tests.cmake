# Read by CTest after the discovered test cases (tests/CMakeLists.txt): the cases that measure
# their own compute against the time their exchanges take on a lane beside it (each peer a thread,
# four of them on two cores), run alone: beside another test program they measured its load, not
# what they check, and failed one run in a few (CI runs `ctest -j2`).
foreach(serial IN ITEMS
        "test_comm:streaming_diloco tune: exchanges in the background hide behind the overlap picked, on simulated links and measured compute"
        "test_comm:streaming_diloco tune: the start's probe runs beside the first steps, and every peer picks after the same one"
        "test_comm:streaming_diloco sized_to_speed: timed, nobody waits for the first speeds' agreement, and the fast peer fills its first round")
  set_tests_properties("${serial}" PROPERTIES RUN_SERIAL TRUE)
endforeach()
