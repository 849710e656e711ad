// The lightning indexer on the CPU (DESIGN §6): index-cache write and top-k
// selection, templated on the precision like the rest of the CPU backend
// (float: float32 accumulation, threaded; double: the reference).
#pragma once
#include <cstdint>

#include "dsmla/attention.hpp"

namespace dsmla::cpu {

// Stores the key of every new token with a slot (slot_mapping != -1) into the
// index cache, in token order.
void write_index_cache(const Plan& plan, const ForwardInputs& in);

// Fills topk [T, topk] with the request-local indices each token uses: for an
// indexer row, the positions of the topk largest logits (ties: lower position
// first) in ascending order; for a full-set token (position < topk), 0..pos;
// then -1. Dense and padding rows are all -1. Reads the index cache after
// write_index_cache, so the new tokens are candidates too.
template <class Real>
void select_topk(const Plan& plan, const ForwardInputs& in, int threads, std::int32_t* topk);

}  // namespace dsmla::cpu
