set -uo pipefail
out=${OUT:-out}; mkdir -p $out
cc="nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Iinclude -Isrc -isystem .deps/cutlass/include bench/sparse_mla_kernel_bench.cu src/cuda/sparse_mla/*.cu src/format/*.cpp"
$cc -o /tmp/b0 & $cc -DDSMLA_EXPERIMENT_NO_GATHER -o /tmp/b1 & wait
echo "== no gather"; timeout 100 /tmp/b1 --quick 2>&1 | grep -E "^\| prefill"
echo "== normal"; timeout 100 /tmp/b0 --quick 2>&1 | grep -E "^\| prefill"
timeout 300 ncu --clock-control none -k regex:head_rows --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis_Chart --section ComputeWorkloadAnalysis --section SchedulerStats /tmp/b0 --quick > $out/ncu.txt 2>&1
grep -vE "^==PROF==|^  *$" $out/ncu.txt | grep -E "Throughput|Pipe|Stall|Warp Cycles|Issued|Eligible|Active|L2|L1|Shared|DRAM|Busy|Duration|Elapsed|SM Freq" | head -60
