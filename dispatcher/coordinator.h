// Job-wide coordination of evolution in a distributed job (docs/DESIGN.md "Distributed jobs").
// Through the job's own c10d store (job_store.h) each missed key is searched once for the whole
// job, by the node that claimed it, and its record reaches the local cache of every node of the
// same target. All store I/O runs on one thread of this process; the caller only queues.
//
// Store keys, under kJobStorePrefix (the "owner" is "<host>/<pid>/rank<RANK>"):
//   claim/<fnv1a64(key)>  JSON {"key", "owner", "beat", "state": "search" | "ended", "record"}:
//                         taken with compareSet (absent -> ours); the owner bumps "beat" every
//                         lease/4 while its local job is pending and sets "ended" when it is not.
//                         A claim whose value stays the same for job_lease_s, timed on the
//                         watcher's own clock (clocks of nodes need not agree), is taken over
//                         with compareSet(that value -> ours) and searched again there.
//   records               counter (add): how many records were published
//   record/<i>            CBOR {"owner", "key", "bundle"}: the i-th published record as a
//                         one-record bundle (kernel_cache/bundle.h: source, launch spec, evidence
//                         and the binary's BLAKE2b hash, not the binary)
// A receiving node imports records whose key's target is one of the targets it has missed keys
// for: import rebuilds the binary here and stores it only if the hash matches; the "verified"
// claim is kept as the peer's (meta.provenance.verified_here = false), so the live check runs on
// the kernel's first calls here. A record refused here (its hash differs) is searched here.
#pragma once
#include <functional>

#include <nlohmann/json.hpp>

#include "runtime/worker_client.h"

namespace kc::dispatch {

// Hands `job`, a first miss of this process, to the job-wide coordination. False: there is none
// here (a single process, job_store off, a fork()ed child, or the store failed earlier), and the
// caller submits the job locally as always. True: the coordinator's thread decides: it claims the
// key and calls `local` with the job to search it here, or waits for the claimant's record; if
// the store fails or stops answering, every job it still holds goes to `local`. Never blocks on
// the network. `local` must stay callable for the life of the process.
// `job` is moved from only when the answer is true.
bool coordinate(Job&& job, const std::function<void(const Job&)>& local);

// Keys handed over and not resolved yet (neither submitted here nor imported from a peer).
int coordinated_waiting();

// Gives the store up (one log line; held jobs go local) if a store call has been in flight longer
// than job_store_timeout_ms plus a second. For threads other than the coordinator's.
void check_job_store();

// {"state": "none" | "connecting" | "on" | "off", "store", "owner", "error", "claimed",
//  "taken_over", "published", "imported", "refused", "resumed", "waiting", "owned"}
nlohmann::json coordination_status();

// Process exit (the library's atexit hook): the coordinator's thread starts no further round and
// leaves the one in flight at its next store or cache call; waits at most `wait_s` for that, so
// that no thread of ours is inside RocksDB while its statics are destroyed (a renewal opening
// the cache at exit crashed a process with SIGSEGV).
void stop_coordination(double wait_s);

}  // namespace kc::dispatch
