import pytest

from grader.tasks.regions import RegionError, find_regions, make_skeleton, not_started, untouched_regions

SOLUTION = """\
__global__ void k(float* c) {
    // TODO(lab1/01) begin: write c[0].
    c[0] = 1.0f;
    // TODO(lab1/01) end
}
int f() {
    // TODO(lab1/01) begin: return 42.
    return 42;
    //~ return -1;
    // TODO(lab1/01) end
}
"""


def test_skeleton_empties_regions_and_keeps_stubs():
    skel = make_skeleton(SOLUTION)
    assert "    c[0] = 1.0f;" not in skel and "    return 42;" not in skel
    assert "    return -1;  //~" in skel
    assert skel.count("TODO(lab1/01) begin") == 2


def test_skeleton_is_not_started_and_solution_is():
    assert not_started(make_skeleton(SOLUTION))
    assert not not_started(SOLUTION)


def test_comments_alone_do_not_start_a_task():
    skel = make_skeleton(SOLUTION).replace(
        "// TODO(lab1/01) begin: write c[0].\n", "// TODO(lab1/01) begin: write c[0].\n    // thinking...\n"
    )
    assert not_started(skel)


def test_one_region_done_is_started_and_the_other_is_named():
    skel = make_skeleton(SOLUTION).replace("write c[0].\n", "write c[0].\n    c[0] = 2.0f;\n")
    assert not not_started(skel)
    assert [r.hint for r in untouched_regions(skel)] == ["return 42."]


@pytest.mark.parametrize(
    "bad",
    [
        "// TODO(lab1/01) begin: x\n",
        "// TODO(lab1/01) end\n",
        "// TODO(lab1/01) begin: x\n// TODO(lab1/02) end\n",
    ],
)
def test_unbalanced_markers_are_reported(bad):
    with pytest.raises(RegionError):
        find_regions(bad)


PY_SOLUTION = """\
def f(xs):
    # TODO(lab4/02) begin: the sum.
    return sum(xs)
    #~ raise NotImplementedError
    # TODO(lab4/02) end
"""


def test_python_regions_use_hash_comments_and_a_formatter_stable_stub_mark():
    skel = make_skeleton(PY_SOLUTION, "pkg/mod.py")
    assert "    raise NotImplementedError  # ~\n" in skel and "return sum" not in skel
    assert not_started(skel, "pkg/mod.py") and not not_started(PY_SOLUTION, "pkg/mod.py")
    assert not_started(skel.replace("# ~", "#~"), "pkg/mod.py")  # the unspaced mark reads the same
    assert make_skeleton(PY_SOLUTION, style="#") == skel  # the style given, not the file name
    assert find_regions(PY_SOLUTION) == []  # `//` by default, as for .cu callers


def test_notebook_regions_live_in_code_cells_and_the_skeleton_clears_outputs():
    import json

    cell = {
        "cell_type": "code",
        "execution_count": 3,
        "id": "a",
        "metadata": {},
        "outputs": [{"output_type": "stream"}],
    }
    nb = {"cells": [{**cell, "source": PY_SOLUTION.splitlines(keepends=True)}], "metadata": {}, "nbformat": 4}
    nb["cells"].insert(0, {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "# TODO(lab4/02) begin: x"})
    skel = make_skeleton(json.dumps(nb), "02_t.ipynb")
    (code,) = [c for c in json.loads(skel)["cells"] if c["cell_type"] == "code"]
    assert code["outputs"] == [] and code["execution_count"] is None
    assert "".join(code["source"]) == make_skeleton(PY_SOLUTION, style="#")
    (region,) = find_regions(skel, "02_t.ipynb")  # markdown cells hold no regions
    assert region.cell == 2 and region.at("02_t.ipynb") == "02_t.ipynb, cell 2, line 2"
    assert not_started(skel, "02_t.ipynb") and not not_started(json.dumps(nb), "02_t.ipynb")
    assert find_regions("{not json", "02_t.ipynb") == []  # the task process reports what is wrong
