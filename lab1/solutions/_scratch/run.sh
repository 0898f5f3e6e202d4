mkdir -p /tmp/so
for f in lab1/solutions/*.cu; do nvcc -O3 -lineinfo -std=c++17 -Xcompiler -fPIC -shared -gencode arch=compute_90,code=sm_90 -I grader/include $f -o /tmp/so/$(basename $f .cu).so & done; wait
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 lab1/solutions/_scratch/t.py /tmp/so 2>&1
for tool in memcheck racecheck synccheck initcheck; do echo "== $tool"; SMALL=1 timeout 200 compute-sanitizer --tool $tool --print-limit 5 python3 lab1/solutions/_scratch/t.py /tmp/so 2>&1 | grep -v "^b'NVIDIA\|CUDA error\|silu huge\|silu extremes\|^va 1025" | tail -8; done
