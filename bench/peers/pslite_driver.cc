// bitpush-pslite-driver: a dense fp32 push/pull benchmark written for dmlc/ps-lite, the peer that
// `bitpush-bench pushpull --peer pslite` runs beside bitpush (bench/peers/README.md). Not part of
// bitpush's CMake build: bench/peers/build-pslite-driver.sh compiles it against a ps-lite
// checkout outside this repository.
//
// One program for the three ps-lite roles; ps-lite reads the role and the cluster shape from the
// environment (DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER;
// DMLC_NODE_HOST and PORT pin a node's own address). The launcher (pslite_peer.cc) sets them.
//
// The tensor: --mb MiB of fp32 per worker, cut into partitions of --partition-kb x 1024 bytes,
// one ps-lite key per partition, the partitions dealt round-robin over the servers (partition p
// goes to server p mod S: its key is the first key of that server's range + p).
//
// Server: per key a store; each worker's push of a round adds into it (the first push of a round
// copies), and a pull of that round is answered only when every worker's push of the round is in
// (pulls that come early wait in a queue). Two stores per key alternate between even and odd
// rounds: a worker can only push round r + 2 after every worker has pulled round r (its own
// round-r + 1 pull needed everyone's round-r + 1 push, sent after their round-r pull), so a store
// is never overwritten while a reply from it may still be on its way. Replies point into the
// store (no copy on the server), as ps-lite's zero-copy API allows.
//
// Worker: per iteration ZPush of every key, then ZPull of every key (all partitions in flight at
// once), then Wait on all of them. --warmup iterations, a barrier of the workers, then --iters
// timed iterations; then it checks the pulled sum (every worker pushes the same pattern plus its
// rank, so the sum is exact in fp32) and writes --results: a flat JSON object with loop_seconds
// (the timed loop's wall time), best_iter_seconds, tensor_bytes and goodput_gbps = tensor bytes
// x iters / loop_seconds / 1e9 (per direction: the same bytes go up and come back).
//
// Threading: ps-lite calls the server's handle from one thread (its customer thread), so the
// server's state needs no lock; the worker's main thread only waits on ps-lite's futures.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  double mb = 100;
  long long partition_kb = 4000;
  int iters = 10;
  int warmup = 2;
  std::string results;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "bitpush-pslite-driver: %s\n"
               "usage: DMLC_ROLE=... bitpush-pslite-driver [--mb 100] [--partition-kb 4000]\n"
               "         [--iters 10] [--warmup 2] [--results FILE]  (FILE: workers only)\n",
               why);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    if (a == "--mb") {
      f.mb = std::strtod(v, &end);
      if (*end != '\0' || !(f.mb > 0)) Usage("bad --mb");
    } else if (a == "--partition-kb") {
      f.partition_kb = std::strtoll(v, &end, 10);
      if (*end != '\0' || f.partition_kb < 1) Usage("bad --partition-kb");
    } else if (a == "--iters") {
      f.iters = static_cast<int>(std::strtol(v, &end, 10));
      if (*end != '\0' || f.iters < 1) Usage("bad --iters");
    } else if (a == "--warmup") {
      f.warmup = static_cast<int>(std::strtol(v, &end, 10));
      if (*end != '\0' || f.warmup < 0) Usage("bad --warmup");
    } else if (a == "--results") {
      f.results = v;
    } else {
      Usage(("unknown option " + a).c_str());
    }
  }
  return f;
}

// ---- server ---------------------------------------------------------------------------------

class SumServer {
 public:
  explicit SumServer(int workers) : workers_(workers), server_(0) {
    server_.set_request_handle([this](const ps::KVMeta& meta, const ps::KVPairs<float>& data,
                                      ps::KVServer<float>* s) { Handle(meta, data, s); });
  }

 private:
  struct PendingPull {
    ps::KVMeta meta;
    long long round;
  };
  struct KeyState {
    std::vector<float> store[2];  // even and odd rounds
    long long store_round[2] = {-1, -1};
    int arrived[2] = {0, 0};
    std::unordered_map<int, long long> pushes, pulls;  // per sender: requests seen so far
    std::deque<PendingPull> waiting;
  };

  void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& data, ps::KVServer<float>* s) {
    if (data.keys.size() != 1) {
      std::fprintf(stderr, "bitpush-pslite-driver: server got %zu keys in one request\n",
                   data.keys.size());
      std::abort();
    }
    const ps::Key key = data.keys[0];
    KeyState& k = keys_[key];
    if (meta.push) {
      const long long round = k.pushes[meta.sender]++;
      const int slot = static_cast<int>(round & 1);
      std::vector<float>& store = k.store[slot];
      if (k.store_round[slot] != round) {
        k.store_round[slot] = round;
        k.arrived[slot] = 0;
        store.assign(data.vals.begin(), data.vals.end());
      } else {
        const float* in = data.vals.data();
        float* out = store.data();
        const size_t n = std::min(store.size(), data.vals.size());
        for (size_t i = 0; i < n; ++i) out[i] += in[i];
      }
      s->Response(meta);
      if (++k.arrived[slot] == workers_) {
        for (auto it = k.waiting.begin(); it != k.waiting.end();) {
          if (it->round == round) {
            Reply(key, k, it->meta, round, s);
            it = k.waiting.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    if (meta.pull) {
      const long long round = k.pulls[meta.sender]++;
      const int slot = static_cast<int>(round & 1);
      if (k.store_round[slot] == round && k.arrived[slot] == workers_) {
        Reply(key, k, meta, round, s);
      } else {
        k.waiting.push_back({meta, round});
      }
    }
  }

  static void Reply(ps::Key key, KeyState& k, const ps::KVMeta& meta, long long round,
                    ps::KVServer<float>* s) {
    std::vector<float>& store = k.store[round & 1];
    ps::KVPairs<float> res;
    res.keys = ps::SArray<ps::Key>(1, key);
    res.vals = ps::SArray<float>(store.data(), store.size(), /*deletable=*/false);
    s->Response(meta, res);
  }

  const int workers_;
  std::unordered_map<ps::Key, KeyState> keys_;
  ps::KVServer<float> server_;  // last: destroyed first, before the state its handle uses
};

// ---- worker ---------------------------------------------------------------------------------

float Pattern(size_t i, int rank) {
  return static_cast<float>(i % 1024) * 0.25f + rank;
}

int RunWorker(const Flags& f) {
  const int rank = ps::MyRank();
  const int workers = ps::NumWorkers();
  const int servers = ps::NumServers();
  const size_t elements = static_cast<size_t>(f.mb * 1048576 / 4);
  const size_t part = std::max<size_t>(1, static_cast<size_t>(f.partition_kb) * 1024 / 4);
  const size_t parts = (elements + part - 1) / part;
  std::vector<float> in(elements), out(elements, 0.0f);
  for (size_t i = 0; i < elements; ++i) in[i] = Pattern(i, rank);

  ps::KVWorker<float> kv(0, 0);
  ps::Postoffice::Get()->Barrier(0, ps::kServerGroup + ps::kWorkerGroup);  // every app exists
  const std::vector<ps::Range>& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  std::vector<ps::SArray<ps::Key>> keys(parts);
  std::vector<ps::SArray<float>> push_vals(parts), pull_vals(parts);
  for (size_t p = 0; p < parts; ++p) {
    const size_t begin = p * part;
    const size_t n = std::min(part, elements - begin);
    keys[p] = ps::SArray<ps::Key>(1, ranges[p % servers].begin() + p);
    push_vals[p] = ps::SArray<float>(in.data() + begin, n, /*deletable=*/false);
    pull_vals[p] = ps::SArray<float>(out.data() + begin, n, /*deletable=*/false);
  }
  std::vector<int> pending;
  pending.reserve(2 * parts);
  auto iteration = [&] {
    pending.clear();
    for (size_t p = 0; p < parts; ++p) pending.push_back(kv.ZPush(keys[p], push_vals[p]));
    for (size_t p = 0; p < parts; ++p) pending.push_back(kv.ZPull(keys[p], &pull_vals[p]));
    for (int ts : pending) kv.Wait(ts);
  };
  for (int i = 0; i < f.warmup; ++i) iteration();
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  double best = 1e300;
  const auto t0 = Clock::now();
  for (int i = 0; i < f.iters; ++i) {
    const auto s = Clock::now();
    iteration();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - s).count());
  }
  const double loop = std::chrono::duration<double>(Clock::now() - t0).count();

  // sum over ranks r of (pattern + r) = workers x pattern + workers (workers - 1) / 2: exact.
  size_t wrong = 0;
  for (size_t i = 0; i < elements; ++i) {
    const float want = static_cast<float>(i % 1024) * 0.25f * workers +
                       static_cast<float>(workers * (workers - 1) / 2);
    if (out[i] != want) ++wrong;
  }
  const double bytes = static_cast<double>(elements) * 4;
  char json[1024];
  std::snprintf(json, sizeof(json),
                "{\"status\": \"%s\", \"rank\": %d, \"workers\": %d, \"servers\": %d, "
                "\"tensor_bytes\": %.17g, \"partitions\": %zu, \"iters\": %d, \"warmup\": %d, "
                "\"loop_seconds\": %.9g, \"best_iter_seconds\": %.9g, \"goodput_gbps\": %.6g, "
                "\"wrong_elements\": %zu}\n",
                wrong == 0 ? "OK" : "WRONG_SUM", rank, workers, servers, bytes, parts, f.iters,
                f.warmup, loop, best, bytes * f.iters / loop / 1e9, wrong);
  if (!f.results.empty()) {
    FILE* file = std::fopen(f.results.c_str(), "w");
    if (file == nullptr || std::fputs(json, file) < 0 || std::fclose(file) != 0) {
      std::fprintf(stderr, "bitpush-pslite-driver: cannot write %s\n", f.results.c_str());
      std::exit(1);
    }
  }
  std::fputs(json, stdout);
  ps::Finalize(0, true);  // with the app alive: nothing arrives for a destroyed customer
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  ps::Start(0, argv[0]);
  if (ps::IsWorker()) return RunWorker(flags);
  if (ps::IsServer()) {
    SumServer server(ps::NumWorkers());
    ps::Postoffice::Get()->Barrier(0, ps::kServerGroup + ps::kWorkerGroup);
    ps::Finalize(0, true);  // returns when every node finalized: the workers are done
    return 0;
  }
  ps::Finalize(0, true);  // the scheduler
  return 0;
}
