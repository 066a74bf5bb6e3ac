// fork() without exec (PyTorch DataLoader workers, multiprocessing's default on Linux) copies this
// library's state but none of its threads: a store thread or submitter that "is running" in the
// parent does not exist in the child. Components compare the generation they started under with
// the current one and start over when it changed.
#pragma once
#include <cstdint>

namespace kc {

// Starts at 0; +1 in the child of every fork() (a pthread_atfork handler registered at load).
uint64_t fork_generation();

}  // namespace kc
