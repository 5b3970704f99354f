#include "server/rpc/metrics.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <prometheus/text_serializer.h>

#include <cstring>
#include <iterator>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace kplan::rpc {
namespace {

// Seconds, from 50 µs (a plan resolution) to 30 s (a large expert load).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
      50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0,  30.0};
  return *b;
}

// The exposer's HTTP callbacks carry no pointer of ours: the Metrics of each
// listening port, for /healthz and /readyz.
std::mutex& ProbeMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<int, const Metrics*>& ProbePorts() {
  static auto* ports = new std::map<int, const Metrics*>;
  return *ports;
}

void Reply(mg_connection* conn, int code, const char* reason, const char* body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n%s",
            code, reason, std::strlen(body), body);
}

// civetweb's begin_request: 1 when answered here, 0 to let the exposer serve.
int ProbeRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const bool health = std::strcmp(info->local_uri, "/healthz") == 0;
  const bool ready = std::strcmp(info->local_uri, "/readyz") == 0;
  if (!health && !ready) return 0;
  bool known = false, is_ready = false;
  {
    // Only the state under the lock: a slow client must not hold up the
    // other probes or ~Metrics while the reply goes out.
    std::lock_guard<std::mutex> lock(ProbeMutex());
    auto it = ProbePorts().find(info->server_port);
    known = it != ProbePorts().end();
    is_ready = known && it->second->ready();
  }
  if (!known) {
    Reply(conn, 503, "Service Unavailable", "stopping\n");
  } else if (health || is_ready) {
    Reply(conn, 200, "OK", "ok\n");
  } else {
    Reply(conn, 503, "Service Unavailable", "not ready\n");
  }
  return 1;
}

const CivetCallbacks* ProbeCallbacks() {
  static const CivetCallbacks* callbacks = [] {
    auto* c = new CivetCallbacks();  // every other callback null
    c->begin_request = ProbeRequest;
    return c;
  }();
  return callbacks;
}

// Seconds, from 1 µs to 1 s: the hops of one request.
const prometheus::Histogram::BucketBoundaries& HopBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      1e-6,   2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6,  100e-6,
      250e-6, 500e-6, 1e-3, 5e-3,  25e-3, 100e-3, 1.0};
  return *b;
}

}  // namespace

Metrics::~Metrics() {
  const int listening = port();
  std::lock_guard<std::mutex> lock(ProbeMutex());
  if (listening != 0) ProbePorts().erase(listening);
}

Metrics::Metrics(const BuildLabels& build)
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessCollector>()),
      requests_(prometheus::BuildCounter()
                    .Name("kplan_requests_total")
                    .Help("Finished RPCs by method and gRPC status code")
                    .Register(*registry_)),
      latency_(prometheus::BuildHistogram()
                   .Name("kplan_request_duration_seconds")
                   .Help("RPC latency from arrival to response, by method")
                   .Register(*registry_)),
      queue_(prometheus::BuildHistogram()
                 .Name("kplan_request_queue_seconds")
                 .Help("Time a request waited for its device worker, by method")
                 .Register(*registry_)),
      device_(prometheus::BuildHistogram()
                  .Name("kplan_request_device_seconds")
                  .Help("Device (or CPU reference) compute time of a request, by method")
                  .Register(*registry_)),
      hops_(prometheus::BuildHistogram()
                .Name("kplan_hop_seconds")
                .Help("Time of each hop of a request, by method and hop: decode (arrival to "
                      "converted), route (to queued), queue, device, answer_wait (output on "
                      "the host to an answering thread), encode (to response filled), "
                      "serialize (response to gRPC's bytes)")
                .Register(*registry_)),
      inflight_(prometheus::BuildGauge()
                    .Name("kplan_inflight_requests")
                    .Help("RPCs being served now")
                    .Register(*registry_)
                    .Add({})),
      experts_(prometheus::BuildGauge()
                   .Name("kplan_experts_loaded")
                   .Help("Expert sets resident, by device")
                   .Register(*registry_)),
      expert_bytes_(prometheus::BuildGauge()
                        .Name("kplan_experts_bytes")
                        .Help("Bytes of expert weights resident, by device")
                        .Register(*registry_)),
      device_memory_(prometheus::BuildGauge()
                         .Name("kplan_device_memory_used_bytes")
                         .Help("Device memory in use, by device")
                         .Register(*registry_)),
      expert_set_bytes_(prometheus::BuildGauge()
                            .Name("kplan_expert_set_bytes")
                            .Help("Bytes of each resident expert set, by experts_id")
                            .Register(*registry_)),
      coalesced_launches_(prometheus::BuildCounter()
                              .Name("kplan_moe_coalesced_launches_total")
                              .Help("RunMoE launches that ran two or more coalesced calls")
                              .Register(*registry_)
                              .Add({})),
      requests_per_launch_(
          prometheus::BuildHistogram()
              .Name("kplan_moe_coalesce_requests_per_launch")
              .Help("RunMoE calls per launch through the coalescer (1: alone)")
              .Register(*registry_)
              .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})) {
  prometheus::BuildGauge()
      .Name("kplan_build_info")
      .Help("Build facts of this server; the value is always 1")
      .Register(*registry_)
      .Add({{"version", build.version},
            {"git_revision", build.git_revision},
            {"cuda_version", build.cuda_version.empty() ? "none" : build.cuda_version},
            {"nccl_version", build.nccl_version.empty() ? "none" : build.nccl_version}})
      .Set(1);
}

absl::Status Metrics::Serve(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, 2, ProbeCallbacks());
  } catch (const std::exception& e) {
    return WithField(
        absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what())),
        "metrics_listen");
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(process_);
  std::lock_guard<std::mutex> lock(ProbeMutex());
  ProbePorts()[port()] = this;
  return absl::OkStatus();
}

int Metrics::port() const {
  if (!exposer_) return 0;
  std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

Metrics::Series& Metrics::SeriesFor(const std::string& method) {
  {
    absl::ReaderMutexLock lock(&series_mu_);
    if (auto it = series_.find(method); it != series_.end()) return *it->second;
  }
  absl::MutexLock lock(&series_mu_);
  std::unique_ptr<Series>& s = series_[method];
  if (s == nullptr) s = std::make_unique<Series>();
  return *s;  // never erased: the methods are the server's, a handful
}

prometheus::Histogram& Metrics::Made(std::atomic<prometheus::Histogram*>& slot,
                                     absl::FunctionRef<prometheus::Histogram&()> make) {
  prometheus::Histogram* h = slot.load(std::memory_order_acquire);
  if (h == nullptr) {
    h = &make();  // Family::Add: the same object for racing callers
    slot.store(h, std::memory_order_release);
  }
  return *h;
}

void Metrics::ObserveLatency(prometheus::Family<prometheus::Histogram>& family,
                             std::atomic<prometheus::Histogram*> Series::*slot,
                             const std::string& method, absl::Duration d) {
  Made(SeriesFor(method).*slot, [&]() -> prometheus::Histogram& {
    return family.Add({{"method", method}}, LatencyBuckets());
  }).Observe(absl::ToDoubleSeconds(d));
}

void Metrics::RequestStarted() { inflight_.Increment(); }

void Metrics::RequestFinished(const std::string& method, const std::string& code,
                              absl::Duration total) {
  inflight_.Decrement();
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  ObserveLatency(latency_, &Series::latency, method, total);
}

void Metrics::ObserveQueue(const std::string& method, absl::Duration d) {
  ObserveLatency(queue_, &Series::queue, method, d);
}

void Metrics::ObserveDevice(const std::string& method, absl::Duration d) {
  ObserveLatency(device_, &Series::device, method, d);
}

void Metrics::ObserveHop(const std::string& method, Hop hop, absl::Duration d) {
  static constexpr const char* kNames[] = {"decode",      "route",  "queue",    "device",
                                           "answer_wait", "encode", "serialize"};
  static_assert(std::size(kNames) == kNumHops, "a name for every Metrics::Hop");
  const int i = static_cast<int>(hop);
  Made(SeriesFor(method).hops[i], [&]() -> prometheus::Histogram& {
    return hops_.Add({{"method", method}, {"hop", kNames[i]}}, HopBuckets());
  }).Observe(absl::ToDoubleSeconds(d));
}

void Metrics::SetExperts(const std::string& device, double count, double bytes) {
  experts_.Add({{"device", device}}).Set(count);
  expert_bytes_.Add({{"device", device}}).Set(bytes);
}

void Metrics::SetDeviceMemoryUsed(const std::string& device, double bytes) {
  device_memory_.Add({{"device", device}}).Set(bytes);
}

void Metrics::SetExpertSets(const std::map<std::string, double>& bytes_by_id) {
  std::lock_guard<std::mutex> lock(sets_mu_);
  for (auto it = set_gauges_.begin(); it != set_gauges_.end();) {
    if (bytes_by_id.count(it->first) == 0) {
      expert_set_bytes_.Remove(it->second);
      it = set_gauges_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, bytes] : bytes_by_id) {
    prometheus::Gauge*& gauge = set_gauges_[id];
    if (gauge == nullptr) gauge = &expert_set_bytes_.Add({{"experts_id", id}});
    gauge->Set(bytes);
  }
}

void Metrics::ObserveMoeLaunch(int members) {
  if (members > 1) coalesced_launches_.Increment();
  requests_per_launch_.Observe(members);
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : process_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace kplan::rpc
