// Sparse MLA kernel for the fp8_ds_mla cache (one format per file keeps builds parallel).
#include "cuda/sparse_mla/sparse_mla_kernel.cuh"

namespace dsmla::cuda::sparse_mla_detail {
template void run_sparse_mla_kernel<CacheFormat::fp8_ds_mla>(const KernelArgs&, cudaStream_t);
}  // namespace dsmla::cuda::sparse_mla_detail
