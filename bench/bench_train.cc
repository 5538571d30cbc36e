// `bitpush-bench train`: training steps of a model layout (bench/layouts/) on loopback,
// bitpush against PyTorch DDP in one invocation. The benchmark itself is Python
// (bench/train_bench.py, which runs bench/train_driver.py's rank processes under Debian's
// torch); this command replaces itself with it, so its options, output and exit status are the
// script's (`bitpush-bench train --help`).
//
// The script gets the interpreter of --python (default /usr/bin/python3), and, unless the
// environment already sets them, PYTHONPATH = this build's Python package and
// BITPUSH_BIN_DIR = the directory of this executable (where bitpush-scheduler and
// bitpush-server are), so the bitpush ranks' local cluster runs this build's binaries.
//
// Thread-safety: runs before any thread starts; the process image is replaced.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// bench/ in the source tree and the build's Python package (bench/CMakeLists.txt).
#ifndef BITPUSH_BENCH_DIR
#define BITPUSH_BENCH_DIR "bench"
#endif
#ifndef BITPUSH_PYTHON_DIR
#define BITPUSH_PYTHON_DIR "python"
#endif

namespace bitpush::bench {
namespace {

constexpr char kDefaultPython[] = "/usr/bin/python3";

// The directory holding this executable, or "" when /proc/self/exe cannot be read.
std::string ExecutableDir() {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  const ssize_t n = readlink("/proc/self/exe", buf.data(), PATH_MAX);
  if (n <= 0) return "";
  std::string path(buf.data(), static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

int RunTrainBench(int argc, char** argv) {
  std::string python = kDefaultPython;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--python") == 0 && i + 1 < argc) python = argv[i + 1];
    if (std::strncmp(argv[i], "--python=", 9) == 0) python = argv[i] + 9;
  }
  const std::string script = std::string(BITPUSH_BENCH_DIR) + "/train_bench.py";
  if (access(script.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "bitpush-bench train: cannot read %s (%s); the benchmark is that script\n",
                 script.c_str(), std::strerror(errno));
    return 2;
  }
  if (access(python.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "bitpush-bench train: no Python at %s (--python)\n", python.c_str());
    return 2;
  }
  if (std::getenv("PYTHONPATH") == nullptr) setenv("PYTHONPATH", BITPUSH_PYTHON_DIR, 1);
  const std::string bin_dir = ExecutableDir();
  if (std::getenv("BITPUSH_BIN_DIR") == nullptr && !bin_dir.empty()) {
    setenv("BITPUSH_BIN_DIR", bin_dir.c_str(), 1);
  }
  std::vector<char*> args;
  args.push_back(const_cast<char*>(python.c_str()));
  args.push_back(const_cast<char*>(script.c_str()));
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(python.c_str(), args.data());
  std::fprintf(stderr, "bitpush-bench train: cannot run %s (%s)\n", python.c_str(),
               std::strerror(errno));
  return 2;
}

}  // namespace bitpush::bench
