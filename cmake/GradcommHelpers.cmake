# gradcomm_add_gtest(NAME SOURCES src... [LIBS lib...] [LABELS label...] [TIMEOUT s])
# One GoogleTest executable, its tests registered with ctest one by one.
function(gradcomm_add_gtest name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE gradcomm_obj GTest::gtest GTest::gtest_main ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  if(TARGET gradcomm_gtest_pch)  # tests/CMakeLists.txt: the common headers, precompiled once
    target_precompile_headers(${name} REUSE_FROM gradcomm_gtest_pch)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
endfunction()
