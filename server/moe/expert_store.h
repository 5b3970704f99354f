// The experts this server holds, by experts_id. A run keeps its set alive
// (shared_ptr) even if it is unloaded meanwhile; the byte budget is checked
// when a load starts and again when it is committed.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/moe/expert_set.h"

namespace kplan {

class ExpertStore {
 public:
  explicit ExpertStore(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Whether a set of `bytes` could be added as `id` now: ALREADY_EXISTS or
  // RESOURCE_EXHAUSTED otherwise (checked again by Add).
  absl::Status CheckCanAdd(const std::string& id, int64_t bytes) const;
  absl::Status Add(std::shared_ptr<const ExpertSet> set);
  absl::StatusOr<std::shared_ptr<const ExpertSet>> Get(const std::string& id) const;
  // The bytes freed; NOT_FOUND for an unknown id.
  absl::StatusOr<int64_t> Remove(const std::string& id);
  std::vector<std::shared_ptr<const ExpertSet>> List() const;
  // Sets and bytes held per device ("cpu", "cuda:0").
  std::map<std::string, std::pair<int, int64_t>> UsageByDevice() const;

 private:
  absl::Status CheckLocked(const std::string& id, int64_t bytes) const;
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const ExpertSet>> sets_;
  int64_t bytes_ = 0;
};

}  // namespace kplan
