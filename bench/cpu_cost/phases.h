// The measured phases of gradcomm-cpu-cost (bench/cpu_cost/README.md): one Phase is
// one call (or the smallest public group of calls) the collectives make on the host,
// with the bytes it must move. phases.cc builds them; cpu_cost.cc times them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gradcomm::bench {

// The read-only inputs of one size: two independent N(0, 1) vectors of n floats.
struct Inputs {
  const float* grad;   // this rank's gradient (seed 1)
  const float* other;  // seed 2: the starting residual, and a second rank's gradient
  int64_t n;
};

struct Phase {
  std::string compressor;  // row label, a spec string ("quant:bits=4,round=stochastic")
  std::string name;        // "encode", "select_acc", ...
  std::string traffic;     // the memory-traffic formula, in n, k and P (payload bytes)
  double bytes = 0;        // that formula at this n: the bytes the phase must read + write
  std::string note;        // what is called when it is not the collective's own function;
                           // allocations the library makes per call
  std::function<void()> reset;  // untimed, before every execution (may be empty)
  std::function<void()> run;    // exactly one execution of the phase
};

// A compressor's phases at one size. Its buffers live in the phases' closures, so
// they are freed when the returned vector is: one group's memory at a time.
struct Group {
  std::string label;
  std::function<std::vector<Phase>(const Inputs&)> build;
};

std::vector<Group> all_groups();

// Steps a collective takes on the host that this bench cannot call, and why.
std::vector<std::string> not_measured();

}  // namespace gradcomm::bench
