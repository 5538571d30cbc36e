// Metrics: what one process exposes to Prometheus (docs/metrics.md).
//
// A MetricSet is one scrape's worth of samples — counters, gauges and summaries (count and sum,
// no quantiles), each a named family with a help line and labelled samples — and renders
// itself as the Prometheus text exposition format 0.0.4 (HELP and TYPE once per family,
// families in the order they were first added). A Registry holds the process's collectors:
// callbacks that read the counters each component already keeps (ServerStats, ClientStats,
// EndpointStats, ...) and add them to the MetricSet of a scrape. Values are gathered at scrape
// time, so no hot path takes a lock or touches an atomic for the sake of metrics.
//
// Names follow Prometheus: `bitpush_<component>_<what>[_<unit>][_total]`, units in base units
// (seconds, bytes). A name or label name that is not valid Prometheus, or a family added twice
// with a different type or help, is a programming error (BP_CHECK).
//
// Ownership: a Registry belongs to whoever owns the process's components (a daemon's main, an
// embedded worker Client); it must outlive every Registration it handed out and the exporter
// that renders it (common/metrics/exporter.h).
// Thread-safety: a MetricSet is a plain value (one thread at a time). Registry::Add, the
// Registration's destruction and Render may be called from any thread; Render runs the
// collectors one at a time under the registry's mutex, so once a Registration is destroyed its
// collector never runs again. A collector must not call back into its Registry.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bitpush::metrics {

enum class MetricType { kCounter, kGauge, kSummary };

// Label pairs of one sample, in the order they are rendered: {{"direction", "sent"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

class MetricSet {
 public:
  // A monotonically increasing count (the name should end in `_total`).
  void Counter(std::string_view name, std::string_view help, uint64_t value,
               const Labels& labels = {});
  void Counter(std::string_view name, std::string_view help, double value,
               const Labels& labels = {});
  // A value that goes up and down.
  void Gauge(std::string_view name, std::string_view help, uint64_t value,
             const Labels& labels = {});
  void Gauge(std::string_view name, std::string_view help, double value, const Labels& labels = {});
  // A summary without quantiles: `name_count` observations that add up to `name_sum`.
  void Summary(std::string_view name, std::string_view help, uint64_t count, double sum,
               const Labels& labels = {});

  // The text exposition format 0.0.4, ending in a newline ("" when empty).
  std::string Render() const;

  bool empty() const { return families_.empty(); }

 private:
  struct Family {
    std::string name;
    std::string help;
    MetricType type;
    std::vector<std::string> lines;  // rendered samples
  };
  Family& FamilyFor(std::string_view name, std::string_view help, MetricType type);
  void AddSample(std::string_view name, std::string_view help, MetricType type,
                 std::string_view suffix, const Labels& labels, const std::string& value);

  std::vector<Family> families_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> families_ index
};

// The text of a sample value: integers exactly, other numbers in their shortest round-trip
// form, NaN, +Inf, -Inf.
std::string FormatValue(uint64_t value);
std::string FormatValue(double value);
// Whether `name` is a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) / label name
// ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__").
bool ValidMetricName(std::string_view name);
bool ValidLabelName(std::string_view name);

class Registry {
 public:
  using Collector = std::function<void(MetricSet&)>;

  // Removes its collector when destroyed (waits for a Render in progress). Move-only.
  class Registration {
   public:
    Registration() = default;
    ~Registration() { Reset(); }
    Registration(Registration&& o) noexcept
        : registry_(std::exchange(o.registry_, nullptr)), id_(o.id_) {}
    Registration& operator=(Registration&& o) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    // Removes the collector now (idempotent).
    void Reset();

   private:
    friend class Registry;
    Registration(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
    Registry* registry_ = nullptr;
    uint64_t id_ = 0;
  };

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds a collector, run at every Render after those added before it.
  [[nodiscard]] Registration Add(Collector collector);

  // Runs every collector into one MetricSet and renders it.
  std::string Render() const;

 private:
  void Remove(uint64_t id);

  mutable std::mutex mu_;
  std::map<uint64_t, Collector> collectors_;  // guarded by mu_, by id = addition order
  uint64_t next_id_ = 1;                      // guarded by mu_
};

}  // namespace bitpush::metrics
