// bitpush-pslite-driver: a dense fp32 push/pull benchmark written for dmlc/ps-lite, the peer that
// `bitpush-bench pushpull --peer pslite` runs beside bitpush (bench/peers/README.md). Not part of
// bitpush's CMake build: bench/peers/build-pslite-driver.sh compiles it against a ps-lite
// checkout outside this repository.
//
// One program for the three ps-lite roles; ps-lite reads the role and the cluster shape from the
// environment (DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER;
// DMLC_NODE_HOST and PORT pin a node's own address). The launcher (pslite_peer.cc) sets them.
//
// It drives ps-lite the way its users do (BytePS's server and core loops): every partition is in
// flight at once, a key's pull follows its own push rather than every push, the server answers a
// push on arrival and a pull with a zero-copy view of its store, and nothing is copied that the
// API lets us share.
//
// The tensor: --mb MiB of fp32 per worker, cut into partitions of --partition-kb x 1024 bytes,
// one ps-lite key per partition, the partitions dealt round-robin over the servers (partition p
// goes to server p mod S: its key is the first key of that server's range + p).
//
// Server: per key a store per round; each worker's push of a round is acknowledged on arrival and
// added into it, and a pull of that round is answered only when every worker's push of the round
// is in (pulls that come early wait in a queue). The store of a round is the first push's own
// received buffer (--first-push keep: ps-lite hands it over as an SArray that owns zeromq's
// message, so nothing is copied) or a copy of it in a buffer the server owns (--first-push copy,
// BytePS's COPY_FIRST). Two stores per key alternate between even and odd rounds: a worker can
// only push round r + 2 after every worker has pulled round r (its own round-r + 1 pull needed
// everyone's round-r + 1 push, sent after their round-r pull), so a store is never overwritten
// while a reply from it may still be on its way. Replies point into the store (no copy on the
// server), as ps-lite's zero-copy API allows.
//
// Worker: per iteration every partition's ZPush and ZPull, in the order --issue says (together:
// ZPush then ZPull of each key in turn, the default; chained: a key's ZPull issued by its ZPush's
// callback, as BytePS's push loop hands a partition to its pull loop; pushes-first: every ZPush,
// then every ZPull). ZPull fills a slice of one output buffer that lives for the whole run.
// --warmup iterations, a barrier of the workers, then --iters timed iterations; then it checks the
// pulled sum (every worker pushes the same pattern plus its rank, so the sum is exact in fp32) and
// writes --results: a flat JSON object with loop_seconds (the timed loop's wall time),
// best_iter_seconds, tensor_bytes and goodput_gbps = tensor bytes x iters / loop_seconds / 1e9
// (per direction: the same bytes go up and come back).
//
// Threading: ps-lite calls the server's handle from one thread (its customer thread), so the
// server's state needs no lock; the worker's ZPush/ZPull callbacks run on its customer thread and
// its main thread waits on ps-lite's futures (or, chained, on a counter under a mutex).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

using Clock = std::chrono::steady_clock;

enum class Issue { kTogether, kChained, kPushesFirst };

struct Flags {
  double mb = 100;
  long long partition_kb = 4000;
  int iters = 10;
  int warmup = 2;
  std::string results;
  Issue issue = Issue::kTogether;
  bool keep_first_push = true;  // --first-push keep (true) or copy
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "bitpush-pslite-driver: %s\n"
               "usage: DMLC_ROLE=... bitpush-pslite-driver [--mb 100] [--partition-kb 4000]\n"
               "         [--iters 10] [--warmup 2] [--results FILE]  (FILE: workers only)\n"
               "         [--issue together|chained|pushes-first] [--first-push keep|copy]\n",
               why);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    const std::string value = v;
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
    } else if (a == "--issue") {
      if (value == "together") {
        f.issue = Issue::kTogether;
      } else if (value == "chained") {
        f.issue = Issue::kChained;
      } else if (value == "pushes-first") {
        f.issue = Issue::kPushesFirst;
      } else {
        Usage("bad --issue (together, chained or pushes-first)");
      }
    } else if (a == "--first-push") {
      if (value != "keep" && value != "copy") Usage("bad --first-push (keep or copy)");
      f.keep_first_push = value == "keep";
    } else {
      Usage(("unknown option " + a).c_str());
    }
  }
  return f;
}

// ---- server ---------------------------------------------------------------------------------

class SumServer {
 public:
  SumServer(int workers, bool keep_first_push)
      : workers_(workers), keep_first_push_(keep_first_push), server_(0) {
    server_.set_request_handle([this](const ps::KVMeta& meta, const ps::KVPairs<float>& data,
                                      ps::KVServer<float>* s) { Handle(meta, data, s); });
  }

 private:
  struct PendingPull {
    ps::KVMeta meta;
    long long round;
  };
  // The sum of one round (of one parity) of one key.
  struct Store {
    long long round = -1;
    int arrived = 0;
    ps::SArray<float> sum;     // the first push's buffer (keep) or a view of `owned` (copy)
    std::vector<float> owned;  // --first-push copy only
  };
  struct KeyState {
    Store store[2];                                    // even and odd rounds
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
      // Acknowledged on arrival, as BytePS's server does: `data` stays alive in the store.
      s->Response(meta);
      const long long round = k.pushes[meta.sender]++;
      Store& store = k.store[round & 1];
      if (store.round != round) {
        store.round = round;
        store.arrived = 0;
        if (keep_first_push_) {
          store.sum = data.vals;  // shares zeromq's received message: no copy
        } else {
          store.owned.resize(data.vals.size());
          std::memcpy(store.owned.data(), data.vals.data(), data.vals.size() * sizeof(float));
          store.sum = ps::SArray<float>(store.owned.data(), store.owned.size(),
                                        /*deletable=*/false);
        }
      } else {
        const float* in = data.vals.data();
        float* out = store.sum.data();
        const size_t n = std::min(store.sum.size(), data.vals.size());
        for (size_t i = 0; i < n; ++i) out[i] += in[i];
      }
      if (++store.arrived == workers_) {
        for (auto it = k.waiting.begin(); it != k.waiting.end();) {
          if (it->round == round) {
            Reply(key, store, it->meta, s);
            it = k.waiting.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    if (meta.pull) {
      const long long round = k.pulls[meta.sender]++;
      Store& store = k.store[round & 1];
      if (store.round == round && store.arrived == workers_) {
        Reply(key, store, meta, s);
      } else {
        k.waiting.push_back({meta, round});
      }
    }
  }

  static void Reply(ps::Key key, const Store& store, const ps::KVMeta& meta,
                    ps::KVServer<float>* s) {
    ps::KVPairs<float> res;
    res.keys = ps::SArray<ps::Key>(1, key);
    res.vals = store.sum;  // zero-copy: the reply holds a reference until zeromq has sent it
    s->Response(meta, res);
  }

  const int workers_;
  const bool keep_first_push_;
  std::unordered_map<ps::Key, KeyState> keys_;
  ps::KVServer<float> server_;  // last: destroyed first, before the state its handle uses
};

// ---- worker ---------------------------------------------------------------------------------

float Pattern(size_t i, int rank) {
  return static_cast<float>(i % 1024) * 0.25f + rank;
}

// Counts finished partitions of an iteration when ZPulls are issued from callbacks (--issue
// chained), where there is no timestamp to Wait on.
class Countdown {
 public:
  void Reset(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    left_ = n;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--left_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t left_ = 0;
};

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
  Countdown chained_left;
  auto iteration = [&] {
    pending.clear();
    switch (f.issue) {
      case Issue::kTogether:
        for (size_t p = 0; p < parts; ++p) {
          pending.push_back(kv.ZPush(keys[p], push_vals[p]));
          pending.push_back(kv.ZPull(keys[p], &pull_vals[p]));
        }
        break;
      case Issue::kChained:
        chained_left.Reset(parts);
        for (size_t p = 0; p < parts; ++p) {
          kv.ZPush(keys[p], push_vals[p], {}, 0, [&kv, &keys, &pull_vals, &chained_left, p] {
            kv.ZPull(keys[p], &pull_vals[p], nullptr, 0, [&chained_left] { chained_left.Done(); });
          });
        }
        chained_left.Wait();
        break;
      case Issue::kPushesFirst:
        for (size_t p = 0; p < parts; ++p) pending.push_back(kv.ZPush(keys[p], push_vals[p]));
        for (size_t p = 0; p < parts; ++p) pending.push_back(kv.ZPull(keys[p], &pull_vals[p]));
        break;
    }
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
  const char* issue = f.issue == Issue::kTogether  ? "together"
                      : f.issue == Issue::kChained ? "chained"
                                                   : "pushes-first";
  const double bytes = static_cast<double>(elements) * 4;
  char json[1024];
  std::snprintf(json, sizeof(json),
                "{\"status\": \"%s\", \"rank\": %d, \"workers\": %d, \"servers\": %d, "
                "\"tensor_bytes\": %.17g, \"partitions\": %zu, \"iters\": %d, \"warmup\": %d, "
                "\"loop_seconds\": %.9g, \"best_iter_seconds\": %.9g, \"goodput_gbps\": %.6g, "
                "\"wrong_elements\": %zu, \"issue\": \"%s\", \"first_push\": \"%s\"}\n",
                wrong == 0 ? "OK" : "WRONG_SUM", rank, workers, servers, bytes, parts, f.iters,
                f.warmup, loop, best, bytes * f.iters / loop / 1e9, wrong, issue,
                f.keep_first_push ? "keep" : "copy");
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
    SumServer server(ps::NumWorkers(), flags.keep_first_push);
    ps::Postoffice::Get()->Barrier(0, ps::kServerGroup + ps::kWorkerGroup);
    ps::Finalize(0, true);  // returns when every node finalized: the workers are done
    return 0;
  }
  ps::Finalize(0, true);  // the scheduler
  return 0;
}
