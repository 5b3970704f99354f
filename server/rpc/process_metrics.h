// The process_* metrics Prometheus' client libraries export (CPU seconds,
// resident and virtual memory, open and maximum file descriptors, threads,
// start time), read from /proc/self on every scrape. Linux only; on a system
// without /proc the families are simply absent.
#pragma once

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace kplan::rpc {

class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace kplan::rpc
