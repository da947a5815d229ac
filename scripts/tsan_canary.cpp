// A deliberate data race (two threads increment one int without synchronization).
// scripts/sanitize.sh tsan loads it into Python with the same preloaded runtime and
// options as the tests, and refuses to go on unless ThreadSanitizer reports it: a clean
// run then means no race was seen, not that the setup could not see one.
#include <thread>

static int counter = 0;

extern "C" int colibri_tsan_canary() {
  std::thread a([] { for (int i = 0; i < 100000; ++i) ++counter; });
  std::thread b([] { for (int i = 0; i < 100000; ++i) ++counter; });
  a.join();
  b.join();
  return counter;
}
