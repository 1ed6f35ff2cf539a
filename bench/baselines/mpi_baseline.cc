#include "baselines/mpi_baseline.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "env.h"
#include "free_port.h"
#include "gradcomm/errors.h"

namespace gradcomm::bench {

namespace {

// Store keys of the singleton join; the store is fresh per job, so they never go stale.
constexpr const char* kServerUriKey = "bench/mpi/server_uri";
constexpr const char* kPortKey = "bench/mpi/port";
std::string turn_key(int rank) { return fmt::format("bench/mpi/turn/{}", rank); }

void store_set(detail::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::span(reinterpret_cast<const uint8_t*>(value.data()), value.size()));
}

std::string store_get(detail::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  auto bytes = store.get(key, timeout);
  return std::string(bytes.begin(), bytes.end());
}

// MPI_ERRORS_RETURN is set on every communicator we use, so failures come back as codes.
void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw TransportError(fmt::format("{} failed: {}", what, std::string(text, len)));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    default:
      throw Unsupported(fmt::format("--baseline mpi: MPI has no {} type to sum; use --dtype float32 or --baseline none",
                                    dtype_name(dtype)));
  }
}

// True when an MPI launcher (mpirun, or srun with PMIx) started this process, so
// MPI_COMM_WORLD already holds the job.
bool launched_by_mpi() {
  return detail::env_string("OMPI_COMM_WORLD_SIZE").has_value() || detail::env_string("PMIX_RANK").has_value();
}

void init_mpi(bool& initialized) {
  int already = 0;
  MPI_Initialized(&already);
  if (already) return;
  // Open MPI aborts the process itself when MPI_Init fails; nothing to check here.
  MPI_Init(nullptr, nullptr);
  initialized = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string v(text, len);
  if (auto comma = v.find(','); comma != std::string::npos) v.resize(comma);  // "Open MPI v4.1.4, package: ..."
  return v;
}

}  // namespace

std::optional<MpiRendezvous> mpi_rendezvous() {
  if (!launched_by_mpi() || detail::env_string("GRADCOMM_STORE") ||
      (detail::env_string("MASTER_ADDR") && detail::env_string("MASTER_PORT"))) {
    return std::nullopt;
  }
  bool initialized = false;
  init_mpi(initialized);
  if (initialized) {
    // The baseline finalizes MPI only when it initialized it; here the bench did.
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::array<char, 256> message{};  // "URL\nTOKEN", or "!" and the reason rank 0 failed
  if (rank == 0) {
    std::string text;
    const auto local = detail::env_string("OMPI_COMM_WORLD_LOCAL_SIZE");
    const auto world = detail::env_string("OMPI_COMM_WORLD_SIZE");
    if (local && world && *local != *world) {
      // The store serves on one address; which of rank 0's the others reach, only the user knows.
      text = fmt::format("!gradcomm-bench under mpirun across hosts ({} of {} ranks on rank 0's): pass the store, "
                         "e.g. mpirun -x GRADCOMM_STORE=tcp://<rank 0's host>:<free port> ...",
                         *local, *world);
    } else if (const int port = detail::free_loopback_ports(1); port == 0) {
      text = "!gradcomm-bench under mpirun: no free TCP port on 127.0.0.1 for the store";
    } else {
      std::random_device random;
      text = fmt::format("tcp://127.0.0.1:{}\n{:08x}{:08x}{:08x}{:08x}", port, random(), random(), random(),
                         random());
    }
    text.copy(message.data(), message.size() - 1);
  }
  mpi_check(MPI_Bcast(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  const std::string text(message.data());
  if (text.starts_with("!")) throw InvalidArgument(text.substr(1));
  const size_t newline = text.find('\n');
  return MpiRendezvous{text.substr(0, newline), text.substr(newline + 1)};
}

MpiBaseline::MpiBaseline(const BaselineSetup& setup) {
  if (launched_by_mpi()) {
    init_mpi(initialized_);
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    description_ = fmt::format("{}, MPI_COMM_WORLD from the MPI launcher", library_version());
  } else if (setup.world_size == 1) {
    init_mpi(initialized_);
    mpi_check(MPI_Comm_dup(MPI_COMM_SELF, &comm_), "MPI_Comm_dup");
    description_ = fmt::format("{}, one singleton", library_version());
  } else {
    join_singletons(setup);
    description_ = fmt::format("{}, {} singletons joined via ompi-server (MPI_Comm_accept/connect; TCP BTL)",
                               library_version(), setup.world_size);
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  int rank = -1, size = -1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  if (rank != setup.rank || size != setup.world_size) {
    throw MismatchError(fmt::format(
        "--baseline mpi: MPI says rank {} of {}, gradcomm says rank {} of {}; start the ranks with one launcher "
        "(gradcomm-run, or mpirun without RANK/WORLD_SIZE set)",
        rank, size, setup.rank, setup.world_size));
  }
}

void MpiBaseline::join_singletons(const BaselineSetup& setup) {
  detail::Store& store = *setup.store;
  // Every process must know the server before MPI_Init: the singleton's runtime
  // reads OMPI_MCA_pmix_server_uri when it starts.
  std::string uri;
  if (setup.rank == 0) {
    auto user_uri = detail::env_string("OMPI_MCA_pmix_server_uri");
    uri = user_uri ? *user_uri : start_server(setup.timeout);
    store_set(store, kServerUriKey, uri);
  } else {
    uri = store_get(store, kServerUriKey, setup.timeout);
  }
  ::setenv("OMPI_MCA_pmix_server_uri", uri.c_str(), 1);
  // mpirun turns on yield-when-idle when a node is oversubscribed; singletons have to
  // ask. Without it N busy-polling ranks on fewer cores starve each other (measured:
  // a 1 KiB allreduce of 3 ranks on 2 cores took ~30 ms instead of ~50 us).
  if (!detail::env_string("OMPI_MCA_mpi_yield_when_idle") &&
      static_cast<unsigned>(setup.world_size) > std::thread::hardware_concurrency()) {
    ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
  }
  init_mpi(initialized_);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1) {
    throw MismatchError(fmt::format("--baseline mpi: expected an MPI singleton, found MPI_COMM_WORLD of {}", world));
  }

  mpi_check(MPI_Comm_dup(MPI_COMM_SELF, &comm_), "MPI_Comm_dup");
  char port[MPI_MAX_PORT_NAME] = {};
  if (setup.rank == 0) {
    mpi_check(MPI_Open_port(MPI_INFO_NULL, port), "MPI_Open_port");
    port_ = port;
    store_set(store, kPortKey, port_);
    store_set(store, turn_key(1), "go");
  }

  // Rank k > 0 connects when its turn comes; the merge puts it last (high = 1), so
  // the group's ranks stay in gradcomm order.
  int next = 1;
  if (setup.rank > 0) {
    std::string name = store_get(store, kPortKey, setup.timeout);
    store_get(store, turn_key(setup.rank), setup.timeout);
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    mpi_check(MPI_Comm_connect(name.c_str(), MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter), "MPI_Comm_connect");
    mpi_check(MPI_Intercomm_merge(inter, 1, &merged), "MPI_Intercomm_merge");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&comm_);
    comm_ = merged;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    next = setup.rank + 1;
  }
  // Everyone already in the group accepts each later rank (collective over the group, root 0).
  for (int k = next; k < setup.world_size; ++k) {
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    mpi_check(MPI_Comm_accept(port, MPI_INFO_NULL, 0, comm_, &inter), "MPI_Comm_accept");
    mpi_check(MPI_Intercomm_merge(inter, 0, &merged), "MPI_Intercomm_merge");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&comm_);
    comm_ = merged;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    if (setup.rank == 0 && k + 1 < setup.world_size) store_set(store, turn_key(k + 1), "go");
  }
}

std::string MpiBaseline::start_server(std::chrono::milliseconds timeout) {
  // The server reports its URI into a file: on a pipe its stdout is block-buffered
  // and the line would only arrive when it exits.
  std::string dir_template = detail::env_string("TMPDIR").value_or("/tmp") + "/gradcomm-bench-mpi-XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {
    throw TransportError(fmt::format("--baseline mpi: cannot create a directory like {}", dir_template));
  }
  server_dir_ = dir_template;
  const std::string uri_file = server_dir_ + "/uri";
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw TransportError("--baseline mpi: fork() for ompi-server failed");
  if (pid == 0) {
    // Child: dies with the bench's rank 0, so a crashed run leaves no server behind.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);
    ::close_range(3, ~0U, 0);  // the store's and transport's sockets are not the server's to hold
    const char* argv[] = {"ompi-server", "--no-daemonize", "-r", uri_file.c_str(), nullptr};
    ::execvp(argv[0], const_cast<char* const*>(argv));
    ::_exit(127);
  }
  server_pid_ = pid;

  // One line, "<jobid>;tcp://host:port;...\n", once the server listens.
  auto deadline = detail::Deadline::after(std::min(timeout, std::chrono::milliseconds(30'000)));
  std::string line;
  for (;;) {
    std::ifstream in(uri_file);
    line.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!line.empty() && line.back() == '\n') break;
    int status = 0;
    if (::waitpid(server_pid_, &status, WNOHANG) == server_pid_) {
      server_pid_ = -1;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        throw Unsupported(
            "--baseline mpi: `ompi-server` is not on PATH (Debian: openmpi-bin). It is needed to join the MPI "
            "singletons that gradcomm-run starts; or launch with `mpirun -n N gradcomm-bench ...` instead");
      }
      throw TransportError(fmt::format("--baseline mpi: ompi-server exited (status {}) before reporting its URI; "
                                       "or launch with `mpirun -n N gradcomm-bench ...` instead",
                                       status));
    }
    if (deadline.expired()) {
      throw TransportError("--baseline mpi: ompi-server did not report its URI within 30 s; "
                           "or launch with `mpirun -n N gradcomm-bench ...` instead");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  line.pop_back();
  return line;
}

void MpiBaseline::validate(BenchOp, DType dtype) const { mpi_type(dtype); }

void MpiBaseline::prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) {
  if (count > INT_MAX) {
    throw Unsupported(fmt::format("--baseline mpi: {} elements exceed MPI's int count", count));
  }
  op_ = op;
  type_ = mpi_type(dtype);
  in_ = in;
  out_ = out;
  count_ = static_cast<int>(count);
}

void MpiBaseline::run() {
  switch (op_) {
    case BenchOp::kAllreduce:
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, in_, count_, type_, MPI_SUM, comm_), "MPI_Allreduce");
      break;
    case BenchOp::kAllgather:
      mpi_check(MPI_Allgather(in_, count_, type_, out_, count_, type_, comm_), "MPI_Allgather");
      break;
    case BenchOp::kReduceScatter:  // count_: each rank's share
      mpi_check(MPI_Reduce_scatter_block(in_, out_, count_, type_, MPI_SUM, comm_), "MPI_Reduce_scatter_block");
      break;
  }
}

void MpiBaseline::shutdown() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (!port_.empty()) {
    MPI_Close_port(port_.c_str());
    port_.clear();
  }
  // Collective over every connected process, so all ranks must get here.
  if (initialized_) {
    MPI_Finalize();
    initialized_ = false;
  }
}

void MpiBaseline::stop_server() {
  if (server_pid_ > 0) {
    ::kill(server_pid_, SIGTERM);
    ::waitpid(server_pid_, nullptr, 0);
    server_pid_ = -1;
  }
  if (!server_dir_.empty()) {
    std::error_code ignored;  // best effort: a leftover temp dir is harmless
    std::filesystem::remove_all(server_dir_, ignored);
    server_dir_.clear();
  }
}

// Without shutdown() (an error path) MPI is left unfinalized on purpose:
// MPI_Finalize would wait for peers that may be gone. The server still goes.
MpiBaseline::~MpiBaseline() { stop_server(); }

}  // namespace gradcomm::bench
