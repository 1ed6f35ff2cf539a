// gradcomm-run's command line, parsed by hand: CLI11 would want to parse PROGRAM's
// flags too, and the rule here is simple (launcher flags, then PROGRAM and its args).
#include <charconv>  // from_chars
#include <cmath>     // isfinite
#include <cstdlib>   // strtod

#include "launcher.h"

namespace gradcomm::launcher {

namespace {
constexpr int kMaxRanks = 4096;      // each costs two fds in the launcher; more is surely a typo
constexpr double kMaxSeconds = 1e8;  // keeps deadlines far from overflow
}  // namespace

const char kUsage[] =
    "usage: gradcomm-run -n N [--timeout S] [--grace S] [--] PROGRAM [ARGS...]\n"
    "       gradcomm-run --help | --version\n"
    "\n"
    "Starts N local ranks of PROGRAM (searched in PATH) with RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GRADCOMM_STORE and GRADCOMM_JOB_TOKEN set,\n"
    "prefixes every output line with \"[rank] \" (a rank turns that off for one stream by\n"
    "printing the line in $GRADCOMM_RUN_UNPREFIXED; gradcomm-bench does, for rank 0's table),\n"
    "and stops the job when a rank fails.\n"
    "\n"
    "  -n, -np, --nproc N\n"
    "                  number of ranks (>= 1; -np as mpirun spells it)\n"
    "  --timeout S     wall-clock limit for the whole job, in seconds; exit 124 on expiry\n"
    "  --grace S       after a rank fails, how long the others may run before SIGTERM\n"
    "                  (default 10)\n"
    "  -h, --help      show this help\n"
    "  --version       show gradcomm's version\n"
    "\n"
    "Everything from PROGRAM on is passed to it untouched. Exit status: the first failing\n"
    "rank's (128+signal if killed), 124 on timeout, 127 if PROGRAM is not found, 2 on\n"
    "bad usage, 0 when every rank exits 0.\n";

namespace {

int parse_nprocs(const std::string& text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 || value > kMaxRanks) {
    throw UsageError{"-n needs an integer from 1 to " + std::to_string(kMaxRanks) + ", got '" + text + "'"};
  }
  return value;
}

double parse_seconds(const std::string& flag, const std::string& text, bool allow_zero) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  bool ok = !text.empty() && *end == '\0' && std::isfinite(value) && value <= kMaxSeconds &&
            (allow_zero ? value >= 0 : value > 0);
  if (!ok) {
    throw UsageError{flag + " needs " + (allow_zero ? "a number of seconds >= 0" : "a number of seconds > 0") +
                     ", got '" + text + "'"};
  }
  return value;
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options opts;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    if (arg == "-h" || arg == "--help" || arg == "--version") {
      opts.action = arg == "--version" ? Options::Action::kVersion : Options::Action::kHelp;
      return opts;
    }
    // Accept "--flag value", "--flag=value", mpirun's "-np N" and, for the short
    // flag, "-nVALUE".
    std::string_view name = arg;
    std::optional<std::string> inline_value;
    if (arg == "-np") {
      name = "-n";
    } else if (arg.starts_with("--")) {
      if (auto eq = arg.find('='); eq != std::string_view::npos) {
        name = arg.substr(0, eq);
        inline_value = std::string(arg.substr(eq + 1));
      }
    } else if (arg.size() > 2) {
      name = arg.substr(0, 2);
      inline_value = std::string(arg.substr(2));
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError{std::string(name) + " needs a value"};
      return argv[++i];
    };
    if (name == "-n" || name == "--nproc") {
      opts.nprocs = parse_nprocs(value());
    } else if (name == "--timeout") {
      opts.timeout_s = parse_seconds("--timeout", value(), /*allow_zero=*/false);
    } else if (name == "--grace") {
      opts.grace_s = parse_seconds("--grace", value(), /*allow_zero=*/true);
    } else {
      throw UsageError{"unknown option '" + std::string(arg) + "'"};
    }
  }
  if (opts.nprocs == 0) throw UsageError{"-n N is required"};
  if (i >= argc) throw UsageError{"no PROGRAM given"};
  opts.command.assign(argv + i, argv + argc);
  return opts;
}

}  // namespace gradcomm::launcher
