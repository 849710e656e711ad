// A minimal fork-join loop for the CPU backend: std::thread only, no pool.
// Work items of the backend are coarse (a token x a group of heads, a
// request's rows), so spawning threads per loop costs nothing measurable.
#pragma once
#include <cstdint>
#include <functional>

namespace dsmla::cpu {

// Number of worker threads for a requested count: `requested` when > 0, else
// std::thread::hardware_concurrency() (at least 1).
int resolve_thread_count(int requested);

// Calls body(i) for every i in [0, n) on at most `threads` threads (the caller
// is one of them). Items are handed out one at a time from a shared counter,
// so uneven items (causal rows, sparse rows of different lengths) balance.
// The first exception thrown by any body is rethrown after all threads joined;
// remaining items are skipped once one failed.
void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& body);

}  // namespace dsmla::cpu
