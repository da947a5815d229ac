#include "model/expert_cache.hpp"

#include <algorithm>

#include "common/errors.hpp"

namespace colibri {

ExpertCache::ExpertCache(int32_t n_slots, int64_t n_keys, CachePolicy policy)
    : policy_(policy),
      slot_of_(static_cast<std::size_t>(n_keys), -1),
      slot_key_(static_cast<std::size_t>(n_slots), -1),
      busy_(static_cast<std::size_t>(n_slots), 0),
      pinned_(static_cast<std::size_t>(n_slots), 0),
      want_pin_(static_cast<std::size_t>(n_keys), 0),
      freq_(static_cast<std::size_t>(n_keys), 0),
      prev_(static_cast<std::size_t>(n_slots), -1),
      next_(static_cast<std::size_t>(n_slots), -1) {
  if (n_slots < 0 || n_keys < 0) fail(ErrorKind::InvalidArgument, "expert cache: negative size");
  free_.reserve(static_cast<std::size_t>(n_slots));
  for (int32_t s = n_slots - 1; s >= 0; --s) free_.push_back(s);  // slot 0 handed out first
}

void ExpertCache::link_front(int32_t s) {
  prev_[static_cast<std::size_t>(s)] = -1;
  next_[static_cast<std::size_t>(s)] = head_;
  if (head_ >= 0) prev_[static_cast<std::size_t>(head_)] = s;
  head_ = s;
  if (tail_ < 0) tail_ = s;
}

void ExpertCache::link_back(int32_t s) {
  next_[static_cast<std::size_t>(s)] = -1;
  prev_[static_cast<std::size_t>(s)] = tail_;
  if (tail_ >= 0) next_[static_cast<std::size_t>(tail_)] = s;
  tail_ = s;
  if (head_ < 0) head_ = s;
}

void ExpertCache::unlink(int32_t s) {
  const int32_t p = prev_[static_cast<std::size_t>(s)], n = next_[static_cast<std::size_t>(s)];
  (p >= 0 ? next_[static_cast<std::size_t>(p)] : head_) = n;
  (n >= 0 ? prev_[static_cast<std::size_t>(n)] : tail_) = p;
  prev_[static_cast<std::size_t>(s)] = next_[static_cast<std::size_t>(s)] = -1;
}

void ExpertCache::count(int64_t key) {
  if (policy_ != CachePolicy::Lfru) return;
  ++freq_[static_cast<std::size_t>(key)];
  // Decay: halve every count once per (keys) uses, so the frequencies describe the recent
  // past (amortized O(1) per use).
  if (++uses_ >= freq_.size() * 4) {
    uses_ = 0;
    for (auto& f : freq_) f >>= 1;
  }
}

void ExpertCache::touch(int64_t key) {
  const int32_t s = find(key);
  if (s < 0 || pinned_[static_cast<std::size_t>(s)]) return;
  unlink(s);
  link_front(s);
}

int32_t ExpertCache::insert(int64_t key, int64_t* evicted, bool speculative) {
  *evicted = -1;
  int32_t s = -1;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    // Walk from the least recent end, skipping busy slots.
    int32_t best = -1;
    int seen = 0;
    for (int32_t c = tail_; c >= 0; c = prev_[static_cast<std::size_t>(c)]) {
      if (!evictable(c)) continue;
      if (policy_ != CachePolicy::Lfru) {
        best = c;
        break;
      }
      const auto fc = freq_[static_cast<std::size_t>(slot_key_[static_cast<std::size_t>(c)])];
      if (best < 0 || fc < freq_[static_cast<std::size_t>(slot_key_[static_cast<std::size_t>(best)])]) best = c;
      if (++seen == kLfruWindow) break;
    }
    if (best < 0) return -1;
    s = best;
    *evicted = slot_key_[static_cast<std::size_t>(s)];
    slot_of_[static_cast<std::size_t>(*evicted)] = -1;
    unlink(s);
    --n_cached_;
  }
  slot_key_[static_cast<std::size_t>(s)] = key;
  slot_of_[static_cast<std::size_t>(key)] = s;
  ++n_cached_;
  if (policy_ == CachePolicy::Pinned && want_pin_[static_cast<std::size_t>(key)] && n_pinned_ < max_pinned_) {
    pinned_[static_cast<std::size_t>(s)] = 1;
    ++n_pinned_;
  } else if (speculative) {
    link_back(s);
  } else {
    link_front(s);
  }
  return s;
}

void ExpertCache::remove(int32_t s) {
  const int64_t key = slot_key_[static_cast<std::size_t>(s)];
  if (key < 0) return;
  if (pinned_[static_cast<std::size_t>(s)]) {
    pinned_[static_cast<std::size_t>(s)] = 0;
    --n_pinned_;
  } else {
    unlink(s);
  }
  slot_of_[static_cast<std::size_t>(key)] = -1;
  slot_key_[static_cast<std::size_t>(s)] = -1;
  busy_[static_cast<std::size_t>(s)] = 0;
  --n_cached_;
  free_.push_back(s);
}

void ExpertCache::set_pins(const std::vector<int64_t>& keys, int32_t max_pinned) {
  // Unpin everything, then pin listed keys that are already cached (in list order).
  for (int32_t s = 0; s < slots(); ++s) {
    if (pinned_[static_cast<std::size_t>(s)]) {
      pinned_[static_cast<std::size_t>(s)] = 0;
      link_front(s);
    }
  }
  n_pinned_ = 0;
  max_pinned_ = max_pinned < 0 ? 0 : max_pinned;
  std::fill(want_pin_.begin(), want_pin_.end(), 0);
  for (int64_t k : keys)
    if (k < 0 || k >= static_cast<int64_t>(want_pin_.size()))
      fail(ErrorKind::InvalidArgument, "pinned expert key " + std::to_string(k) + " is out of range");
  // Only the first max_pinned keys (the hottest, in the caller's order) may be pinned: the
  // pins go to the history's ranking, not to whichever listed experts load first.
  const std::size_t n_want = std::min(keys.size(), static_cast<std::size_t>(max_pinned_));
  for (std::size_t i = 0; i < n_want; ++i) want_pin_[static_cast<std::size_t>(keys[i])] = 1;
  if (policy_ != CachePolicy::Pinned) return;
  for (std::size_t i = 0; i < n_want; ++i) {
    const int32_t s = find(keys[i]);
    if (s < 0 || pinned_[static_cast<std::size_t>(s)]) continue;
    unlink(s);
    pinned_[static_cast<std::size_t>(s)] = 1;
    ++n_pinned_;
  }
}

}  // namespace colibri
