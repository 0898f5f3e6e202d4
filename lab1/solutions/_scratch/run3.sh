mkdir -p /tmp/so
nvcc -O3 -lineinfo -std=c++17 -Xcompiler -fPIC -shared -gencode arch=compute_90,code=sm_90 -I grader/include lab1/solutions/_scratch/06_max_pool_v2.cu -o /tmp/so/v2.so
python3 - <<'PY'
import ctypes as C, torch, torch.nn.functional as F
a = C.CDLL('/tmp/so/06_max_pool.so').max_pool_4x4; b = C.CDLL('/tmp/so/v2.so').max_pool_4x4_v2
def ref(x): return F.max_pool2d(F.pad(x[None,None], (0,3,0,3), value=float('-inf')), 4, stride=1)[0,0]
for H, W in [(1,1),(17,19),(100,37),(4096,4096),(8192,8192)]:
    x = torch.randn(H, W, device='cuda'); o = torch.empty_like(x)
    for name, f in [('v1', a), ('v2', b)]:
        f(C.c_void_p(x.data_ptr()), C.c_void_p(o.data_ptr()), H, W); torch.cuda.synchronize()
        assert torch.equal(o, ref(x))
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(20): f(C.c_void_p(x.data_ptr()), C.c_void_p(o.data_ptr()), H, W)
        e.record(); torch.cuda.synchronize(); t = s.elapsed_time(e) / 20 * 1e3
        print(H, W, name, f'{t:.1f} us', f'{8*H*W/t/1e3:.0f} GB/s')
xp = F.pad(x[None,None], (0,3,0,3), value=float('-inf'))
s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
for _ in range(20): F.max_pool2d(xp, 4, stride=1)
e.record(); torch.cuda.synchronize(); print('torch max_pool2d 8192^2', s.elapsed_time(e)/20*1e3, 'us')
PY
