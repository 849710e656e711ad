// Sparse MLA kernel for the bf16 cache (one format per file keeps builds parallel).
#include "cuda/sparse_mla/sparse_mla_kernel.cuh"

namespace dsmla::cuda::sparse_mla_detail {
template void run_sparse_mla_kernel<CacheFormat::bf16>(const KernelArgs&, cudaStream_t);
}  // namespace dsmla::cuda::sparse_mla_detail
