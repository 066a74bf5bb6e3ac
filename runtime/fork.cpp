// The fork generation (fork.h): one atomic counter bumped by a pthread_atfork child handler.
#include "runtime/fork.h"

#include <pthread.h>

#include <atomic>

namespace kc {
namespace {

std::atomic<uint64_t> g_generation{0};

void in_child() { g_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered when the library loads, so that no fork can happen before it.
[[maybe_unused]] const bool kRegistered = [] { return pthread_atfork(nullptr, nullptr, in_child) == 0; }();

}  // namespace

uint64_t fork_generation() { return g_generation.load(std::memory_order_relaxed); }

}  // namespace kc
