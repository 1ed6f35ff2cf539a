# GRADCOMM_SANITIZE: builds every C/C++ target (library, tools, trainer, tests, test
# workers) with GCC's sanitizers, so a multi-process test's ranks are checked too.
#   -DGRADCOMM_SANITIZE=address,undefined   ASan (+ LeakSanitizer) and UBSan
#   -DGRADCOMM_SANITIZE=thread              TSan (cannot share a process with ASan)
# scripts/test-sanitizers.sh configures both and runs the tests with the runtime
# options and the third-party suppressions in tests/sanitizers/.
#
# Included before the CUDA and Python sections: a sanitizer build turns both off,
# because nvcc's host objects and the static CUDA runtime are not instrumented (and
# cudart reserves address ranges that ASan's shadow wants), and an instrumented Python
# module only loads into an interpreter started with the runtime preloaded.
if(NOT GRADCOMM_SANITIZE)
  return()
endif()

# Accept a comma- or semicolon-separated list of the sanitizers we support.
string(REPLACE "," ";" _gradcomm_sanitizers "${GRADCOMM_SANITIZE}")
set(_gradcomm_known address undefined leak thread)
foreach(_s IN LISTS _gradcomm_sanitizers)
  if(NOT _s IN_LIST _gradcomm_known)
    message(FATAL_ERROR "GRADCOMM_SANITIZE=${GRADCOMM_SANITIZE}: unknown sanitizer '${_s}' "
                        "(expected a comma-separated subset of: address, undefined, leak, thread)")
  endif()
endforeach()
if("thread" IN_LIST _gradcomm_sanitizers AND ("address" IN_LIST _gradcomm_sanitizers OR
                                              "leak" IN_LIST _gradcomm_sanitizers))
  message(FATAL_ERROR "GRADCOMM_SANITIZE=${GRADCOMM_SANITIZE}: thread cannot be combined with address or "
                      "leak (one runtime owns the shadow memory); configure a separate build for each")
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  message(FATAL_ERROR "GRADCOMM_SANITIZE needs GCC or Clang (found ${CMAKE_CXX_COMPILER_ID})")
endif()

if(GRADCOMM_CUDA STREQUAL "ON")
  message(FATAL_ERROR "GRADCOMM_SANITIZE=${GRADCOMM_SANITIZE} with GRADCOMM_CUDA=ON: the CUDA code is not "
                      "sanitized; configure with -DGRADCOMM_CUDA=OFF (or AUTO, which a sanitizer build turns off)")
endif()
# Normal variables shadow the cache entries for the rest of this configure.
set(GRADCOMM_CUDA OFF)
if(GRADCOMM_PYTHON STREQUAL "ON")
  message(FATAL_ERROR "GRADCOMM_SANITIZE=${GRADCOMM_SANITIZE} with GRADCOMM_PYTHON=ON: the bindings are not "
                      "built in a sanitizer build; configure with -DGRADCOMM_PYTHON=OFF or AUTO")
endif()
set(GRADCOMM_PYTHON OFF)

string(REPLACE ";" "," _gradcomm_sanitize_flag "${_gradcomm_sanitizers}")
if("undefined" IN_LIST _gradcomm_sanitizers)
  # GCC leaves this UB out of "undefined": a float converted to an integer type that
  # cannot hold it (NaN, inf, out of range), as quantizers and index maths might.
  string(APPEND _gradcomm_sanitize_flag ",float-cast-overflow")
endif()
set(_gradcomm_flags -fsanitize=${_gradcomm_sanitize_flag} -fno-omit-frame-pointer)
if("undefined" IN_LIST _gradcomm_sanitizers)
  # A UB report is a test failure, not a line in a log nobody reads.
  list(APPEND _gradcomm_flags -fno-sanitize-recover=undefined,float-cast-overflow)
endif()
if("thread" IN_LIST _gradcomm_sanitizers)
  # GCC warns that TSan does not understand std::atomic_thread_fence; we use none.
  list(APPEND _gradcomm_flags -Wno-tsan)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_gradcomm_flags}>")
add_link_options(-fsanitize=${_gradcomm_sanitize_flag})
message(STATUS "gradcomm: sanitizers ${_gradcomm_sanitize_flag} (CUDA and Python bindings off)")
