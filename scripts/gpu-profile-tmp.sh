set -uo pipefail
out=${OUT:-out}; mkdir -p $out
cc="nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Iinclude -Isrc -isystem .deps/cutlass/include bench/sparse_mla_kernel_bench.cu src/cuda/sparse_mla/*.cu src/format/*.cpp"
$cc -o /tmp/b0
timeout 300 ncu --clock-control none -k regex:head_rows --launch-skip 2 --launch-count 1 --section WarpStateStats --section SourceCounters --page source --print-source sass --csv /tmp/b0 --quick > $out/src.csv 2>/dev/null
head -3 $out/src.csv | cut -c1-600
python3 - "$out/src.csv" <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=None
for i,r in enumerate(rows):
    if any('Source' == c or 'Address' in c for c in r): hdr=i; break
h=rows[hdr]; data=rows[hdr+1:]
print(h)
def col(name):
    for j,c in enumerate(h):
        if name in c: return j
    return None
js=col('Warp Stall Sampling (All'); jsrc=col('Source'); jn=col('Warp Stall Sampling (Not')
tot=sum(float(r[js] or 0) for r in data if len(r)>js)
top=sorted(data,key=lambda r: -float(r[js] or 0) if len(r)>js else 0)[:45]
for r in top: print(f"{float(r[js])/tot*100:5.1f}%", r[0], r[jsrc][:110])
PY
