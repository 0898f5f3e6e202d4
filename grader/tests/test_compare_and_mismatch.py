import torch

from grader.child.buffers import PREFILL, bits, guarded
from grader.child.compare import bad_mask, judge
from grader.child.mismatch import pattern


def test_tolerance_is_atol_plus_rtol_times_ref():
    ref = torch.tensor([1.0, 100.0])
    assert not bad_mask(ref + torch.tensor([1.9e-5, 1e-3]), ref, 1e-5, 1e-5).any()
    assert bad_mask(ref + torch.tensor([2.1e-5, 0.0]), ref, 1e-5, 1e-5).tolist() == [True, False]


def test_nan_and_inf_only_where_the_reference_has_them():
    ref = torch.tensor([float("nan"), float("inf"), 1.0])
    got = torch.tensor([float("nan"), float("inf"), float("nan")])
    assert bad_mask(got, ref, 1e-5, 1e-5).tolist() == [False, False, True]
    assert bad_mask(torch.tensor([float("inf")]), torch.tensor([1e30]), 1e-5, 1e-5).all()


def test_never_written_output_is_named():
    g = guarded((10,), "f32", "cpu")
    report = judge("c", g.data, torch.ones(10), 1e-5, 1e-5, g.never_written())
    assert report and "never written" in report


def test_prefill_and_canaries_for_every_dtype():
    for dtype in ("f32", "i32", "u32", "u8", "f16", "i64"):
        g = guarded((3, 4), dtype, "cpu")
        assert bool((bits(g.data, dtype) == PREFILL[dtype]).all())
        assert g.fence_report() is None
        g.full[-1] = 0
        assert "past the end" in g.fence_report()


def test_write_before_the_start_is_caught():
    g = guarded((8,), "f32", "cpu")
    g.full[4095] = 1.0
    assert "before the start" in g.fence_report()


def test_tail_pattern_names_the_last_partial_block():
    bad = torch.zeros(1000, dtype=torch.bool)
    bad[768:] = True
    assert "last partial block" in pattern(bad)


def test_strided_pattern():
    bad = torch.zeros(1024, dtype=torch.bool)
    bad[5::32] = True
    assert "every 32nd element (indices ≡ 5 mod 32)" in pattern(bad)


def test_rows_and_columns_patterns():
    bad = torch.zeros(40, 50, dtype=torch.bool)
    bad[32:, :] = True
    assert "rows ≥ 32" in pattern(bad)
    bad = torch.zeros(40, 50, dtype=torch.bool)
    bad[:, 48:] = True
    assert "columns ≥ 48" in pattern(bad)


def test_report_lists_indices_and_errors():
    ref = torch.zeros(100)
    got = ref.clone()
    got[7] = 3.0
    report = judge("out", got, ref, 1e-5, 1e-5, None)
    assert "1 of 100" in report and "[7]" in report and "got 3" in report and "max abs error 3" in report


def test_border_and_tile_edge_patterns():
    bad = torch.zeros(40, 50, dtype=torch.bool)
    bad[38, 5] = bad[10, 48] = bad[39, 49] = True
    assert "bottom/right border" in pattern(bad)
    bad = torch.zeros(40, 50, dtype=torch.bool)
    bad[3, 14] = bad[20, 29] = bad[13, 2] = True
    assert "edge of each 16×16 tile" in pattern(bad)


def test_the_tf32_bound_admits_tf32_and_rejects_what_is_wrong():
    """past_tf32_bound: a product of TF32-rounded inputs passes; a missing bias, a NaN and zeros do not."""
    import torch

    from grader.child.compare import past_tf32_bound

    g = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(8, 300, generator=g),
        torch.randn(40, 300, generator=g) / 300**0.5,
        torch.randn(40, generator=g),
    )
    ref = x.double() @ w.double().T + b.double()

    def tf32(t: torch.Tensor) -> torch.Tensor:  # round to 10 mantissa bits, to nearest
        bits = t.view(torch.int32)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)

    y = (tf32(x) @ tf32(w).T + b).float()
    assert past_tf32_bound(y, ref, x, w, ref, b) is None
    assert "past the TF32 bound" in (past_tf32_bound((x @ w.T).float(), ref, x, w, ref, b) or "")
    y_nan = y.clone()
    y_nan[3, 7] = float("nan")
    assert "y[3][7]" in (past_tf32_bound(y_nan, ref, x, w, ref, b) or "")
    assert past_tf32_bound(torch.zeros_like(y), ref, x, w, ref, b) is not None
