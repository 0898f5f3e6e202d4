import os, ctypes as C, sys, time, torch, torch.nn.functional as F
D = sys.argv[1]; dev = 'cuda'
P = lambda t, off=0: C.c_void_p(t.data_ptr() + off)
def lib(name):
    l = C.CDLL(f'{D}/{name}.so')
    return l
def sync(): torch.cuda.synchronize()
ok = True
BIG = not os.environ.get('SMALL')
S = lambda l: [v for v in l if BIG or (v if isinstance(v, int) else v[0]*v[1]) <= (1 << 21)]
def check(cond, msg):
    global ok
    if not cond: ok = False; print('FAIL', msg)
def bench(fn, iters=20):
    if not BIG: return float('nan')
    fn(); sync()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters): fn()
    e.record(); sync(); return s.elapsed_time(e) / iters * 1e3  # us
# 00
class DI(C.Structure):
    _fields_ = [('name', C.c_char*256)] + [(f, C.c_int) for f in 'major minor sm_count warp_size max_threads_per_block max_threads_per_sm l2_cache_bytes'.split()] + [('total_global_mem', C.c_ulonglong), ('shared_mem_per_block', C.c_ulonglong)]
assert C.sizeof(DI) == 304
l = lib('00_device_query'); di = DI()
check(l.query_device(0, C.byref(di)) == 0, 'query'); p = torch.cuda.get_device_properties(0)
print(di.name, di.major, di.minor, di.sm_count, di.warp_size, di.max_threads_per_block, di.max_threads_per_sm, di.l2_cache_bytes, di.total_global_mem, di.shared_mem_per_block)
check(di.sm_count == p.multi_processor_count and di.name.decode() == p.name and di.total_global_mem == p.total_memory, 'props')
check(l.query_device(99, C.byref(di)) == 101, 'bad device')
bi = torch.full((3*100,), -1, dtype=torch.int32, device=dev); ti = bi.clone()
check(l.whoami(P(bi), P(ti), 3, 100) == 0, 'whoami rc'); sync()
g = torch.arange(300, device=dev)
check(torch.equal(bi, (g // 100).int()) and torch.equal(ti, (g % 100).int()), 'whoami')
# 01
l = lib('01_vector_add')
for n in [1, 7, 32, 1000, 1024]:
    a, b = torch.randn(n, device=dev), torch.randn(n, device=dev); c = torch.full_like(a, float('nan'))
    check(l.vector_add(P(a), P(b), P(c), n) == 0, 'va rc'); sync(); check(torch.equal(c, a + b), f'va {n}')
rc = l.vector_add(P(a), P(b), P(c), 1025); print('va 1025 rc', rc); check(rc in (1, 9), 'va 1025')
# 02
l = lib('02_matrix_add')
for r, c_ in S([(1, 1), (17, 33), (1000, 1), (1, 1000), (513, 1025), (4096, 4096)]):
    A, B = torch.randn(r, c_, device=dev), torch.randn(r, c_, device=dev); Cm = torch.full_like(A, float('nan'))
    check(l.matrix_add(P(A), P(B), P(Cm), r, c_) == 0, 'ma rc'); sync(); check(torch.equal(Cm, A + B), f'ma {r}x{c_}')
print('matrix_add 4096^2 us', bench(lambda: l.matrix_add(P(A), P(B), P(Cm), 4096, 4096)))
# 03
l = lib('03_saxpy'); l.saxpy.argtypes = [C.c_int, C.c_float, C.c_void_p, C.c_void_p, C.c_void_p]
for n in S([1, 255, 256, 257, 1000003, 1 << 27]):
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev); o = torch.full_like(x, float('nan'))
    check(l.saxpy(n, 1.5, x.data_ptr(), y.data_ptr(), o.data_ptr()) == 0, 'saxpy rc'); sync()
    check(torch.allclose(o, 1.5 * x + y, atol=1e-5, rtol=1e-5), f'saxpy {n}')
t = bench(lambda: l.saxpy(n, 1.5, x.data_ptr(), y.data_ptr(), o.data_ptr())); print('saxpy 2^27 us', t, 'GB/s', 12 * n / t / 1e3)
# 04
l = lib('04_swap_pairs')
for n in S([1, 2, 3, 255, 256, 257, 511, 1000001, 1 << 24]):
    x = torch.randn(n, device=dev); o = torch.full_like(x, float('nan'))
    check(l.swap_pairs(P(x), P(o), n) == 0, 'swap rc'); sync()
    ref = x.clone(); m = n // 2 * 2; ref[:m] = x[:m].view(-1, 2).flip(1).reshape(-1)
    check(torch.equal(o, ref), f'swap {n}')
t = bench(lambda: l.swap_pairs(P(x), P(o), n)); print('swap 2^24 us', t, 'GB/s', 8 * n / t / 1e3)
# 05
l = lib('05_silu'); l.silu.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t]
for n in S([0, 1, 1000, 10**7 + 3]):
    x = torch.randn(n) * 10; y = torch.full_like(x, float('nan'))
    check(l.silu(x.data_ptr(), y.data_ptr(), n) == 0, 'silu rc')
    check(torch.allclose(y, F.silu(x.double()).float(), atol=1e-6, rtol=1e-5), f'silu {n}')
xe = torch.tensor([-200., -88., 0., 88., 200.]); ye = torch.empty_like(xe); l.silu(xe.data_ptr(), ye.data_ptr(), 5); print('silu extremes', ye.tolist())
torch.cuda.empty_cache(); f0 = torch.cuda.mem_get_info()[0]
small = torch.zeros(4); so = torch.zeros(4)
for n in [1 << 45, (1 << 62) + 1, 2**64 - 1]:
    rc = l.silu(small.data_ptr(), so.data_ptr(), n); print('silu huge', n, 'rc', rc)
    check(rc == 2, f'silu oom {n}')
x = torch.randn(1000); y = torch.empty_like(x)
check(l.silu(x.data_ptr(), y.data_ptr(), 1000) == 0, 'silu after oom'); check(torch.allclose(y, F.silu(x), atol=1e-6), 'silu after oom val')
check(torch.cuda.mem_get_info()[0] == f0, f'silu leak {f0 - torch.cuda.mem_get_info()[0]}')
# 06
l = lib('06_max_pool')
def ref_pool(x):
    xp = F.pad(x[None, None], (0, 3, 0, 3), value=float('-inf')); return F.max_pool2d(xp, 4, stride=1)[0, 0]
for H, W in S([(1, 1), (3, 5), (4, 4), (16, 16), (17, 19), (100, 37), (1080, 1920), (4096, 4096)]):
    x = torch.randn(H, W, device=dev); o = torch.full_like(x, float('nan'))
    check(l.max_pool_4x4(P(x), P(o), H, W) == 0, 'pool rc'); sync(); check(torch.equal(o, ref_pool(x)), f'pool {H}x{W}')
t = bench(lambda: l.max_pool_4x4(P(x), P(o), H, W)); print('pool 4096^2 us', t, 'GB/s', 8 * H * W / t / 1e3)
# 07
l = lib('07_histogram')
buf = torch.randint(0, 256, (((1 << 28) if BIG else (1 << 21)) + 64,), dtype=torch.uint8, device=dev)
bins = torch.empty(256, dtype=torch.int32, device=dev)
for fn in ['histogram_global', 'histogram_shared']:
    f = getattr(l, fn)
    for n in S([1, 2, 15, 16, 17, 31, 33, 1000, (1 << 20) + 5, 1 << 28]):
        for off in ([0, 1, 3, 8, 15] if n < (1 << 28) else [0, 7]):
            bins.fill_(12345); d = buf[off:off + n]
            check(f(P(buf, off), n, P(bins)) == 0, 'hist rc'); sync()
            check(torch.equal(bins.long(), torch.bincount(d.long(), minlength=256)), f'{fn} n={n} off={off}')
    if not BIG: continue
    n = 1 << 28
    t = bench(lambda: f(P(buf), n, P(bins)), 5); print(fn, 'random 2^28 us', t, 'GB/s', n / t / 1e3)
    z = torch.zeros(n, dtype=torch.uint8, device=dev)
    t = bench(lambda: f(P(z), n, P(bins)), 3); print(fn, 'zeros 2^28 us', t, 'GB/s', n / t / 1e3); sync()
    check(bins[0].item() == n, 'zeros count')
print('ALL OK' if ok else 'SOME FAILED')
