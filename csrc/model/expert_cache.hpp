// Which expert lives in which cache slot, and which one to drop when a new expert needs
// room. Pure bookkeeping (no memory, no I/O): the expert store (expert_store.hpp) owns the
// slot memory and the reads.
//
// Keys are layer * n_experts + expert. Lookup is an array index (O(1)); the recency order is
// an intrusive doubly linked list over slots, so touch and evict are O(1) too (LFRU looks at
// a bounded window of the list's tail).
//
// Policies:
// - LRU: drop the least recently used expert.
// - LFRU: frequency-aware LRU. Among the kLfruWindow least recently used experts, drop the
//   one routed to least often (a decayed count per key), ties to the older one. A hot
//   expert that was not needed for a few tokens survives; one-off experts go first.
// - Pinned: keys chosen from the routing history (set_pins) never leave the cache once
//   loaded, up to the pin share of the slots; the other slots are LRU.
//
// A slot can be held (busy > 0: being read or computed with), which makes it ineligible for
// eviction until released.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace colibri {

enum class CachePolicy : int { Lru = 0, Lfru = 1, Pinned = 2 };

class ExpertCache {
 public:
  static constexpr int kLfruWindow = 8;

  ExpertCache() = default;
  ExpertCache(int32_t n_slots, int64_t n_keys, CachePolicy policy);

  int32_t slots() const { return static_cast<int32_t>(slot_key_.size()); }
  CachePolicy policy() const { return policy_; }

  // Slot holding `key`, or -1.
  int32_t find(int64_t key) const { return slot_of_[static_cast<std::size_t>(key)]; }
  int64_t key_of(int32_t slot) const { return slot_key_[static_cast<std::size_t>(slot)]; }

  // Marks `key` as used now (recency and frequency). Call for every routed use.
  void touch(int64_t key);
  // Counts a routing of `key` for LFRU even when it is not cached (yet).
  void count(int64_t key);

  // A slot for `key` (not cached): a free slot, or the policy's victim among slots that
  // are neither busy nor pinned. Returns -1 when every slot is busy or pinned; otherwise
  // *evicted is the key dropped (-1 for a free slot). The key is then cached in the slot.
  // `speculative` (a prefetch): the key enters at the least recent end, so a guess that
  // turns out wrong is the next victim instead of pushing out experts in use; touch()
  // moves it to the front when it is routed to.
  int32_t insert(int64_t key, int64_t* evicted, bool speculative = false);
  // Forgets the key in `slot` (a failed or cancelled read) and any holds; the slot becomes
  // free.
  void remove(int32_t slot);
  // Drops every hold (after an aborted forward nothing computes with a slot).
  void clear_holds() { std::fill(busy_.begin(), busy_.end(), 0); }

  void hold(int32_t slot) { ++busy_[static_cast<std::size_t>(slot)]; }
  void release(int32_t slot) { --busy_[static_cast<std::size_t>(slot)]; }
  bool busy(int32_t slot) const { return busy_[static_cast<std::size_t>(slot)] > 0; }
  int32_t holds(int32_t slot) const { return busy_[static_cast<std::size_t>(slot)]; }

  // Pinned policy: keys that are pinned when they enter the cache (at most max_pinned of
  // them). Replaces the previous set; slots already holding a listed key become pinned.
  void set_pins(const std::vector<int64_t>& keys, int32_t max_pinned);
  bool pinned(int32_t slot) const { return pinned_[static_cast<std::size_t>(slot)] != 0; }
  int32_t pinned_count() const { return n_pinned_; }
  int32_t cached_count() const { return n_cached_; }

 private:
  void link_front(int32_t slot);
  void link_back(int32_t slot);
  void unlink(int32_t slot);
  bool evictable(int32_t slot) const { return busy_[static_cast<std::size_t>(slot)] == 0 && !pinned_[static_cast<std::size_t>(slot)]; }

  CachePolicy policy_ = CachePolicy::Lru;
  std::vector<int32_t> slot_of_;   // per key
  std::vector<int64_t> slot_key_;  // per slot, -1 when free
  std::vector<int32_t> busy_;      // per slot
  std::vector<uint8_t> pinned_;    // per slot
  std::vector<uint8_t> want_pin_;  // per key (Pinned policy)
  std::vector<uint32_t> freq_;     // per key (LFRU), halved every decay period
  uint64_t uses_ = 0;
  std::vector<int32_t> prev_, next_;  // recency list over cached, unpinned slots
  int32_t head_ = -1, tail_ = -1;     // head: most recent
  std::vector<int32_t> free_;         // free slots (a stack)
  int32_t n_pinned_ = 0, n_cached_ = 0, max_pinned_ = 0;
};

}  // namespace colibri
