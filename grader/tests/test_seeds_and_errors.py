from grader.child.cudalib import _is_cuda_error
from grader.tasks.seeds import seed_for
from grader.tasks.spec import CudaTask


def task():
    return CudaTask(
        lab="lab1", number="09", title="t", sources=["09_t.cu"], entries=[], cases=[], make_inputs=lambda p, r: {}
    )


def test_secret_seed_moves_every_input(monkeypatch):
    monkeypatch.delenv("GRADER_SEED", raising=False)
    plain = seed_for(task(), "n=33")
    assert plain == seed_for(task(), "n=33") and plain != seed_for(task(), "n=33", draw=1)
    monkeypatch.setenv("GRADER_SEED", "s3cret")
    assert seed_for(task(), "n=33") != plain


def test_only_cuda_errors_count_as_the_students_crash():
    assert _is_cuda_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not _is_cuda_error(RuntimeError("Expected all tensors to be on the same device, cuda:0 and cpu!"))
