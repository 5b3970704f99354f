#include "server/moe/expert_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/client_text.h"
#include "base/status.h"

namespace kplan {

ExpertStore::Reservation& ExpertStore::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    id_ = std::move(other.id_);
    bytes_ = std::exchange(other.bytes_, 0);
    progress_ = std::move(other.progress_);
  }
  return *this;
}

void ExpertStore::Reservation::Release() {
  if (store_ == nullptr) return;
  std::exchange(store_, nullptr)->ReleaseReservation(id_, bytes_);
  bytes_ = 0;
  progress_.reset();
}

absl::Status ExpertStore::CheckIdLocked(const std::string& id) const {
  if (sets_.count(id)) {
    return WithField(absl::AlreadyExistsError(absl::StrCat(
                         "experts '", ClientText(id), "' are already loaded; unload them first")),
                     "experts_id");
  }
  if (auto it = loading_.find(id); it != loading_.end()) {
    return WithField(
        absl::AlreadyExistsError(absl::StrCat(
            "experts '", ClientText(id), "' are being ",
            it->second.preload ? "preloaded by the server (--preload); they are resident once it "
                                 "is ready"
                               : "loaded by another LoadExperts call")),
        "experts_id");
  }
  return absl::OkStatus();
}

int64_t ExpertStore::DrainingBytesLocked() const {
  int64_t total = 0;
  std::erase_if(draining_, [](const auto& d) { return d.first.expired(); });
  for (const auto& [set, bytes] : draining_) total += bytes;
  return total;
}

absl::Status ExpertStore::CheckBytesLocked(int64_t bytes) const {
  // bytes_ + reserved_ + draining <= max_bytes_ held when each was added (a
  // set leaves bytes_ for draining_ on unload), so this cannot overflow.
  const int64_t draining = DrainingBytesLocked();
  if (bytes < 0 || bytes > max_bytes_ - bytes_ - reserved_ - draining) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "loading ", bytes,
        " bytes of experts would exceed the server's budget (--max_expert_bytes: ", bytes_,
        " bytes held, ", reserved_, " reserved by loads under way and ", draining,
        " of unloaded sets still in use, of ", max_bytes_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExpertStore::Reservation> ExpertStore::Reserve(const ExpertsSpec& spec,
                                                              int64_t bytes, bool preload) {
  const std::string& id = spec.experts_id;
  std::lock_guard<std::mutex> lock(mu_);
  auto held = loading_.find(id);
  if (preload && held != loading_.end() && held->second.preload && !held->second.progress) {
    // The preload's turn: its hold's bytes make room for the reservation.
    reserved_ -= held->second.bytes;
    if (absl::Status fits = CheckBytesLocked(bytes); !fits.ok()) {
      reserved_ += held->second.bytes;
      return fits;
    }
  } else {
    KPLAN_RETURN_IF_ERROR(CheckIdLocked(id));
    KPLAN_RETURN_IF_ERROR(CheckBytesLocked(bytes));
  }
  auto progress = std::make_shared<LoadProgress>(id, ExpectedTensors(spec), spec.num_experts);
  reserved_ += bytes;
  loading_[id] = Loading{spec, bytes, progress, preload};
  Reservation r;
  r.store_ = this;
  r.id_ = id;
  r.bytes_ = bytes;
  r.progress_ = std::move(progress);
  return r;
}

absl::Status ExpertStore::HoldForPreload(const ExpertsSpec& spec, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  KPLAN_RETURN_IF_ERROR(CheckIdLocked(spec.experts_id));
  KPLAN_RETURN_IF_ERROR(CheckBytesLocked(bytes));
  reserved_ += bytes;
  loading_[spec.experts_id] = Loading{spec, bytes, nullptr, /*preload=*/true};
  return absl::OkStatus();
}

std::vector<ExpertStore::Loading> ExpertStore::Loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Loading> out;
  for (const auto& [id, loading] : loading_) out.push_back(loading);
  return out;
}

void ExpertStore::ReleaseReservation(const std::string& id, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= bytes;
  loading_.erase(id);
}

absl::Status ExpertStore::Commit(Reservation& reservation, std::shared_ptr<const ExpertSet> set) {
  const std::string& id = set->spec().experts_id;
  if (reservation.store_ != this || reservation.id_ != id) {
    return absl::InternalError(absl::StrCat("no reservation for experts '", ClientText(id), "'"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // The set replaces its reservation: check it against the budget without it.
  reserved_ -= reservation.bytes_;
  if (absl::Status fits = CheckBytesLocked(set->bytes()); !fits.ok()) {
    reserved_ += reservation.bytes_;
    return fits;
  }
  loading_.erase(id);
  bytes_ += set->bytes();
  sets_[id] = std::move(set);
  reservation.store_ = nullptr;  // consumed
  reservation.bytes_ = 0;
  return absl::OkStatus();
}

int64_t ExpertStore::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_ + reserved_ + DrainingBytesLocked();
}

absl::StatusOr<std::shared_ptr<const ExpertSet>> ExpertStore::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return WithField(
        absl::NotFoundError(absl::StrCat(
            "no experts loaded as '", ClientText(id), "'",
            loading_.count(id) ? " (they are being loaded; ListExperts shows how far)" : "")),
        "experts_id");
  }
  return it->second;
}

absl::StatusOr<int64_t> ExpertStore::Remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return WithField(
        absl::NotFoundError(absl::StrCat("no experts loaded as '", ClientText(id), "'")),
        "experts_id");
  }
  const int64_t freed = it->second->bytes();
  bytes_ -= freed;
  if (it->second.use_count() > 1) draining_.emplace_back(it->second, freed);
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
