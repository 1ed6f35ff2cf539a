// Compiles the tests' precompiled header (tests/CMakeLists.txt, gradcomm_gtest_pch) and nothing else.
