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
