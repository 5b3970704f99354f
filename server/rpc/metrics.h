// Prometheus metrics of the server, exposed on their own port (prometheus-cpp
// pull exposer): requests by RPC and status code, latency histograms (total,
// queue and device time apart), in-flight requests, experts held per device,
// device memory in use, build info, and the standard process_* families. Names follow Prometheus
// conventions (base units, _total for counters). The same port answers /healthz (200 while the
// process serves) and /readyz (200 when the readiness health service is SERVING, 503 otherwise) for
// probes that speak only HTTP.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/rpc/process_metrics.h"

namespace kplan::rpc {

// Labels of kplan_build_info.
struct BuildLabels {
  std::string version, git_revision, cuda_version, nccl_version;
};

class Metrics {
 public:
  // The hops of a request (kplan_hop_seconds{method, hop}).
  enum class Hop { kDecode, kRoute, kQueue, kDevice, kAnswerWait, kEncode, kSerialize };
  static constexpr int kNumHops = static_cast<int>(Hop::kSerialize) + 1;

  explicit Metrics(const BuildLabels& build);
  ~Metrics();

  // Serves /metrics on `address` ("0.0.0.0:9464"; port 0 picks one).
  absl::Status Serve(const std::string& address);
  // The bound port, 0 when not serving.
  int port() const;

  void RequestStarted();
  // One finished call: counts it under its gRPC code name and observes its latency.
  void RequestFinished(const std::string& method, const std::string& code, absl::Duration total);
  void ObserveQueue(const std::string& method, absl::Duration d);
  void ObserveDevice(const std::string& method, absl::Duration d);
  // One hop of a request (kplan_hop_seconds{method, hop}).
  void ObserveHop(const std::string& method, Hop hop, absl::Duration d);
  // Experts held on `device` ("cpu", "cuda:0"): count and bytes.
  void SetExperts(const std::string& device, double count, double bytes);
  void SetDeviceMemoryUsed(const std::string& device, double bytes);
  // The resident sets, id -> bytes: one kplan_expert_set_bytes{experts_id}
  // series each (bounded by what the store holds); an id no longer listed
  // loses its series.
  void SetExpertSets(const std::map<std::string, double>& bytes_by_id);
  // A RunMoE launch through the coalescer (--coalesce_window_us) with its
  // members (1: it ran alone).
  void ObserveMoeLaunch(int members);

  // What /readyz answers (false until the server says otherwise).
  void SetReady(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }

  // The text exposition of every metric, as a scrape would return it.
  std::string Render() const;

 private:
  // One method's histograms, each made on its first observation (so a
  // series appears once observed, as with Family::Add). Found by SeriesFor
  // with one map lookup, without building a label set: a RunMoE call's
  // eight observations cost about 3 us through Family::Add each, on the
  // call's path (session 33).
  struct Series {
    std::atomic<prometheus::Histogram*> latency{nullptr}, queue{nullptr}, device{nullptr};
    std::array<std::atomic<prometheus::Histogram*>, kNumHops> hops{};
  };
  Series& SeriesFor(const std::string& method);
  // *slot, made by `make` on its first use.
  static prometheus::Histogram& Made(std::atomic<prometheus::Histogram*>& slot,
                                     absl::FunctionRef<prometheus::Histogram&()> make);
  void ObserveLatency(prometheus::Family<prometheus::Histogram>& family,
                      std::atomic<prometheus::Histogram*> Series::*slot, const std::string& method,
                      absl::Duration d);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessCollector> process_;  // process_* families, read at each scrape
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& queue_;
  prometheus::Family<prometheus::Histogram>& device_;
  prometheus::Family<prometheus::Histogram>& hops_;
  prometheus::Gauge& inflight_;
  prometheus::Family<prometheus::Gauge>& experts_;
  prometheus::Family<prometheus::Gauge>& expert_bytes_;
  prometheus::Family<prometheus::Gauge>& device_memory_;
  prometheus::Family<prometheus::Gauge>& expert_set_bytes_;
  prometheus::Counter& coalesced_launches_;
  prometheus::Histogram& requests_per_launch_;
  std::mutex sets_mu_;
  std::map<std::string, prometheus::Gauge*> set_gauges_;  // guarded by sets_mu_
  absl::Mutex series_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Series>> series_ ABSL_GUARDED_BY(series_mu_);
  std::atomic<bool> ready_{false};
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace kplan::rpc
