// Placeholder: replaced by the fp8 tensor-core logits kernel.
#include <string>

#include "cuda/indexer/indexer_kernels.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda::indexer {

void launch_logits_wgmma(const IndexerTopkParams&, int, int, int, std::uint32_t*, cudaStream_t) {
  throw Error("launch_indexer_topk: the wgmma logits kernel is not built");
}

}  // namespace dsmla::cuda::indexer
