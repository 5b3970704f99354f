// The experts this server holds, by experts_id, under one byte budget
// (--max_expert_bytes). A run keeps its set alive (shared_ptr) even if it is
// unloaded meanwhile. A load reserves its bytes and its id when its header
// arrives (Reserve), before any chunk is buffered: concurrent loads together
// can never hold more than the budget, and two loads of one id cannot both
// proceed. The reservation is released when the load fails or is cancelled
// and becomes the resident set on Commit. Loads under way are listed too
// (Loads: their spec and LoadProgress), and ids of a --preload can be held
// before the server listens (HoldForPreload), so that no client load takes
// them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "server/moe/expert_loader.h"
#include "server/moe/expert_set.h"

namespace kplan {

class ExpertStore {
 public:
  // Budget and id held for one load under way. Move-only; its destructor
  // releases what it still holds. The store must outlive it.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Release(); }

    // Gives the bytes and the id back (idempotent).
    void Release();
    bool held() const { return store_ != nullptr; }
    const std::string& id() const { return id_; }
    int64_t bytes() const { return bytes_; }
    // What the load has done, for the loader to add to (null once released).
    const std::shared_ptr<LoadProgress>& progress() const { return progress_; }

   private:
    friend class ExpertStore;
    ExpertStore* store_ = nullptr;
    std::string id_;
    int64_t bytes_ = 0;
    std::shared_ptr<LoadProgress> progress_;
  };

  // A load under way (or a preloaded set waiting for its turn), as
  // ListExperts shows it.
  struct Loading {
    ExpertsSpec spec;
    int64_t bytes = 0;                             // reserved
    std::shared_ptr<const LoadProgress> progress;  // null: a preload not started yet
    bool preload = false;
  };

  explicit ExpertStore(int64_t max_bytes) : max_bytes_(max_bytes) {}

  int64_t max_bytes() const { return max_bytes_; }

  // Holds `bytes` of the budget and the id of `spec`: ALREADY_EXISTS naming
  // experts_id when the id is loaded, being loaded or held for the preload
  // (unless `preload`: the preload's own load of a held id takes the hold
  // over), RESOURCE_EXHAUSTED when the bytes do not fit next to what is
  // held and reserved.
  absl::StatusOr<Reservation> Reserve(const ExpertsSpec& spec, int64_t bytes, bool preload = false);
  // Holds the id and bytes of a set the preload will load (before the server
  // listens); the preload's Reserve of the id takes the hold over as its
  // reservation (committed, or released when that load fails). Errors as
  // Reserve's.
  absl::Status HoldForPreload(const ExpertsSpec& spec, int64_t bytes);
  // Loads under way and held preloads, by id.
  std::vector<Loading> Loads() const;
  // Turns `reservation` (for set's id) into the resident set; the set's
  // bytes may differ from the reservation's (checked against the budget
  // again). The reservation is consumed on success and kept on error.
  absl::Status Commit(Reservation& reservation, std::shared_ptr<const ExpertSet> set);
  absl::StatusOr<std::shared_ptr<const ExpertSet>> Get(const std::string& id) const;
  // The bytes freed; NOT_FOUND for an unknown id.
  absl::StatusOr<int64_t> Remove(const std::string& id);
  std::vector<std::shared_ptr<const ExpertSet>> List() const;
  // Sets and bytes held per device ("cpu", "cuda:0").
  std::map<std::string, std::pair<int, int64_t>> UsageByDevice() const;
  // Resident plus reserved bytes.
  int64_t bytes_in_use() const;

 private:
  absl::Status CheckIdLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckBytesLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseReservation(const std::string& id, int64_t bytes);

  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const ExpertSet>> sets_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Loading> loading_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // resident sets
  // Unloaded sets that runs still hold (a run keeps its set alive): their
  // memory is not free until the last holder lets go.
  mutable std::vector<std::pair<std::weak_ptr<const ExpertSet>, int64_t>> draining_
      ABSL_GUARDED_BY(mu_);
  // Bytes of draining_ sets still alive (expired ones dropped first).
  int64_t DrainingBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // loads under way
};

}  // namespace kplan
