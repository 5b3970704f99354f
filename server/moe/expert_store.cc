#include "server/moe/expert_store.h"

#include "absl/strings/str_cat.h"
#include "server/base/client_text.h"
#include "server/base/status.h"

namespace kplan {

absl::Status ExpertStore::CheckLocked(const std::string& id, int64_t bytes) const {
  if (sets_.count(id)) {
    return WithField(absl::AlreadyExistsError(absl::StrCat("experts '", id,
                                                           "' are already loaded; unload them first")),
                     "experts_id");
  }
  if (bytes_ + bytes > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("loading ", bytes, " bytes of experts would exceed the server's budget (",
                     bytes_, " of ", max_bytes_, " bytes in use)"));
  }
  return absl::OkStatus();
}

absl::Status ExpertStore::CheckCanAdd(const std::string& id, int64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckLocked(id, bytes);
}

absl::Status ExpertStore::Add(std::shared_ptr<const ExpertSet> set) {
  std::lock_guard<std::mutex> lock(mu_);
  KPLAN_RETURN_IF_ERROR(CheckLocked(set->spec().experts_id, set->bytes()));
  bytes_ += set->bytes();
  sets_[set->spec().experts_id] = std::move(set);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ExpertSet>> ExpertStore::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return WithField(absl::NotFoundError(absl::StrCat("no experts loaded as '", ClientText(id), "'")),
                     "experts_id");
  }
  return it->second;
}

absl::StatusOr<int64_t> ExpertStore::Remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return WithField(absl::NotFoundError(absl::StrCat("no experts loaded as '", ClientText(id), "'")),
                     "experts_id");
  }
  const int64_t freed = it->second->bytes();
  bytes_ -= freed;
  sets_.erase(it);
  return freed;
}

std::vector<std::shared_ptr<const ExpertSet>> ExpertStore::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const ExpertSet>> out;
  for (const auto& [id, set] : sets_) out.push_back(set);
  return out;
}

std::map<std::string, std::pair<int, int64_t>> ExpertStore::UsageByDevice() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::pair<int, int64_t>> out;
  for (const auto& [id, set] : sets_) {
    for (const ExpertsPlacement& p : set->placement()) {
      out[p.device].first += 1;
      out[p.device].second += p.bytes;
    }
  }
  return out;
}

}  // namespace kplan
