// fork() without exec (PyTorch DataLoader workers, multiprocessing's default on Linux) copies this
// library's state but none of its threads: a store thread or submitter that "is running" in the
// parent does not exist in the child, and the parent's mutexes and condition variables may record
// those threads (a mutex held by one stays locked forever; glibc's pthread_cond_signal on a
// condition variable they waited on blocks for a wake-up confirmation that never comes). So a
// child never touches the parent's synchronisation objects: state that holds any lives in a
// PerFork<T>, and the child's first use builds a fresh T.
#pragma once
#include <atomic>
#include <cstdint>

namespace kc {

// Starts at 0; +1 in the child of every fork() (a pthread_atfork handler registered at load).
uint64_t fork_generation();

// One T per process. The first get() in a fork()ed child builds a fresh T and abandons the
// parent's: it is leaked on purpose, since destroying it would touch its mutexes, and threads of
// the parent's that still use it (none exist here) would not be told. A published T is never
// destroyed, so a reference from get() stays valid. Cost on the hot path: two relaxed loads.
template <class T>
class PerFork {
 public:
  constexpr PerFork() = default;   // constant-initialised: no static-init guard to take
  PerFork(const PerFork&) = delete;
  PerFork& operator=(const PerFork&) = delete;

  T& get() {
    const uint64_t gen = fork_generation();
    Slot* s = cur_.load(std::memory_order_acquire);
    while (!s || s->gen != gen) {
      Slot* fresh = new Slot{gen};
      if (cur_.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return fresh->value;
      delete fresh;   // another thread of this process published first; `s` now holds its slot
    }
    return s->value;
  }

 private:
  struct Slot {
    uint64_t gen;
    T value{};
  };
  std::atomic<Slot*> cur_{nullptr};
};

}  // namespace kc
