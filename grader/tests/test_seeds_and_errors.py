from grader.child import _is_cuda_error
from grader.context import seed_for
from grader.spec import Task


def task():
    return Task("lab1", "09", "t", "09_t.cu", [], [], lambda p, r: {}, lambda v: {})


def test_secret_seed_moves_every_input(monkeypatch):
    monkeypatch.delenv("GRADER_SEED", raising=False)
    plain = seed_for(task(), "n=33")
    assert plain == seed_for(task(), "n=33") and plain != seed_for(task(), "n=33", draw=1)
    monkeypatch.setenv("GRADER_SEED", "s3cret")
    assert seed_for(task(), "n=33") != plain


def test_only_cuda_errors_count_as_the_students_crash():
    assert _is_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not _is_cuda_error(RuntimeError("Expected all tensors to be on the same device, cuda:0 and cpu!"))
