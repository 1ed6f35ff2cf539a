// A program with one deliberate bug per mode, run by the sanitizer builds' ctest
// (tests/sanitizers/CMakeLists.txt) to show that the sanitizers are armed: compiled
// in, their report produced, and the process stopped with a failure status, so a
// real bug of this kind in gradcomm fails its test instead of scrolling past.
//   sanitizer_canary heap-overflow | use-after-free | leak | signed-overflow |
//                    float-cast-overflow | data-race
// Prints "canary: survived <mode>" only when nothing stopped it.
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>

namespace {

// The index is volatile and every value read is printed: the compiler can neither
// prove the bad access away nor drop it as unused.
volatile int g_index = 0;
[[gnu::noinline]] int read_at(const int* p, int i) { return p[i]; }

int heap_overflow() {
  int* p = new int[8]();
  g_index = 8;
  int v = read_at(p, g_index);  // one past the end
  delete[] p;
  std::printf("canary: read %d\n", v);
  return 0;
}

#pragma GCC diagnostic ignored "-Wuse-after-free"  // the bug is the point
int use_after_free() {
  int* p = new int[8]();
  delete[] p;
  std::printf("canary: read %d\n", read_at(p, g_index));
  return 0;
}

int* volatile g_leaked = nullptr;
int leak() {
  g_leaked = new int[64]();
  g_leaked = nullptr;  // the only pointer to it is gone: reported at exit
  return 0;
}

int signed_overflow() {
  volatile int big = std::numeric_limits<int>::max();
  int v = big + 1;  // UB; -fno-sanitize-recover makes it fatal
  std::printf("canary: computed %d\n", v);
  return 0;
}

int float_cast_overflow() {
  volatile float huge = 1e20f;
  int v = static_cast<int>(huge);  // UB: out of int's range (GCC needs float-cast-overflow)
  std::printf("canary: computed %d\n", v);
  return 0;
}

int data_race() {
  static int shared = 0;  // written by two threads without synchronisation
  std::thread t([] { for (int i = 0; i < 1000; ++i) shared = shared + 1; });
  for (int i = 0; i < 1000; ++i) shared = shared + 1;
  t.join();
  std::printf("canary: counted %d\n", shared);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s heap-overflow|use-after-free|leak|signed-overflow|float-cast-overflow|data-race\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  int rc = 0;
  if (mode == "heap-overflow") {
    rc = heap_overflow();
  } else if (mode == "use-after-free") {
    rc = use_after_free();
  } else if (mode == "leak") {
    rc = leak();
  } else if (mode == "signed-overflow") {
    rc = signed_overflow();
  } else if (mode == "float-cast-overflow") {
    rc = float_cast_overflow();
  } else if (mode == "data-race") {
    rc = data_race();
  } else {
    std::fprintf(stderr, "sanitizer_canary: unknown mode '%s'\n", mode.c_str());
    return 2;
  }
  std::printf("canary: survived %s\n", mode.c_str());
  return rc;  // 0: a failure status can only come from a sanitizer
}
