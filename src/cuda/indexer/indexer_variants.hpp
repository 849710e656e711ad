// The indexer's logits kernels side by side, for the GPU tests and the kernel
// harness (NOTES.md): launch_indexer_topk (indexer.hpp) runs the default one,
// which is `wgmma_ws` unless the environment variable DSMLA_INDEXER_LOGITS names
// another (`cuda_core`, `wgmma`; read once per process). Host code may include it.
#pragma once
#include <cuda_runtime.h>

#include "cuda/indexer/indexer.hpp"

namespace dsmla::cuda {

enum class IndexerLogitsKernel {
  cuda_core,  // fp32 FMAs on dequantised codes: the simple reference kernel
  wgmma,      // fp8 tensor cores (wgmma m64n64k32 e4m3 x e4m3 -> fp32)
  wgmma_ws,   // fp8 tensor cores, warp-specialised: producer warp + consumer warpgroup, 4 rows per CTA (NOTES.md v2)
};

const char* to_string(IndexerLogitsKernel kernel);

// The kernel launch_indexer_topk(p, stream) uses.
IndexerLogitsKernel default_indexer_logits_kernel();

// launch_indexer_topk with an explicit logits kernel (same contract), and for
// the tests an explicit number of top-k CTAs per row (1, 2, 4 or 8; 0:
// indexer_topk_ctas_per_row's choice, as launch_indexer_topk makes it).
void launch_indexer_topk(const IndexerTopkParams& p, IndexerLogitsKernel kernel, cudaStream_t stream,
                         int topk_ctas_per_row = 0);

// For the kernel harness: only the logits launches of launch_indexer_topk (every
// chunk into the same workspace, no top-k; topk_out is not written).
void launch_indexer_logits_only(const IndexerTopkParams& p, IndexerLogitsKernel kernel, cudaStream_t stream);

// For the kernel harness: the top-k CTAs per row launch_indexer_topk(p, ...)
// uses for its first chunk of rows on the current device (1 when p has no rows).
int default_topk_ctas_per_row(const IndexerTopkParams& p);

}  // namespace dsmla::cuda
