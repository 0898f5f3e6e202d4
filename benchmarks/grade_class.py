"""A class of 21 lab 1 submissions, graded by the batch command, checked against what each
should get: the acceptance test of grading students' submissions (instructors only; needs a GPU).

    python benchmarks/grade_class.py --out /tmp/class [--gpus 0,1] [--timing off]

The class: the reference solutions; the untouched skeletons; one submission per deliberately
broken variant of lab1/solutions/broken.py (the ones a plain `gradebook` run catches: not those
that need the huge cases, compute-sanitizer or the timed calls); and hostile submissions whose
saxpy library runs code of its own when it is loaded (a constructor): it hunts for the secret
seed, writes into the grader's files, leaves a daemon behind, forges the report, floods its
output, opens a network connection, or keeps a kernel spinning after the entry point returns.

It runs `python -m grader gradebook` with a secret GRADER_SEED in its environment, then checks
every student's verdict per task, that the secret appears nowhere in what the batch wrote, that
the grader's checkout is unchanged, that no process the submissions started is alive, and that
nobody connected to a listener on this machine. Exit 0 when all of that holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader.tasks import catalogue  # noqa: E402
from grader.tests.variants import processes_with  # noqa: E402
from lab1.solutions.broken import HUGE, SANITIZED, TIMED, VARIANTS  # noqa: E402

SAXPY = "03_saxpy.cu"
TOP = '#include "course.h"\n'
BODY = "    if (i < n) out[i] = alpha * x[i] + y[i];"
HEADERS = "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <dirent.h>\n#include <unistd.h>\n"


def constructor(body: str) -> str:
    return HEADERS + "__attribute__((constructor)) static void hostile_on_load() {\n" + body + "\n}\n"


def hostile_cases(tag: str, port: int) -> dict[str, tuple[str, set[str], list[tuple[str, str]]]]:
    """name -> (code added at the top of saxpy, the verdicts saxpy may get, other edits)."""
    hunt = r"""
    const char* e = getenv("GRADER_SEED");
    fprintf(stderr, "HOSTILE env=%s\n", e ? e : "(none)");
    int pids = 0;
    DIR* d = opendir("/proc");
    for (struct dirent* de; d && (de = readdir(d));) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        pids++;
        char p[300], buf[65536];
        snprintf(p, sizeof p, "/proc/%s/environ", de->d_name);
        FILE* f = fopen(p, "rb");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        for (size_t i = 0; i + 7 <= n; i++)
            if (!memcmp(buf + i, "sekrit-", 7)) fprintf(stderr, "HOSTILE found in %s: %.40s\n", p, buf + i);
    }
    fprintf(stderr, "HOSTILE pids=%d\n", pids);
    fflush(stderr);
    abort();"""
    write = f"""
    const char* targets[] = {{"{ROOT}/grader/__init__.py", "{ROOT}/lab1/tests/PWNED-{tag}", "/tmp/PWNED-{tag}"}};
    for (const char* t : targets) {{
        FILE* f = fopen(t, "a");
        if (f) {{ fputs("// pwned\\n", f); fclose(f); }}
    }}"""
    daemon = f"""
    if (fork() == 0) {{
        setsid();
        if (fork() == 0) execl("/bin/sh", "sh", "-c", "sleep 600; : {tag}", (char*)nullptr);
        _exit(0);
    }}"""
    forge = r"""
    const char* fake = "{\"verdict\": \"pass\", \"phase\": \"done\", \"message\": \"\"}";
    printf("RESULT %s\nPASSED 100/100\n", fake);
    fflush(stdout);
    for (int fd = 3; fd < 64; fd++) {
        char line[256];
        int n = snprintf(line, sizeof line, "%064d %s\n", 0, fake);
        (void)!write(fd, line, n);
    }"""
    flood = r"""
    static char chunk[1 << 16];
    memset(chunk, 'x', sizeof chunk);
    for (long total = 0; total < (2L << 30); total += sizeof chunk)
        if (fwrite(chunk, 1, sizeof chunk, stdout) != sizeof chunk) break;"""
    net = f"""
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {{}};
    a.sin_family = AF_INET;
    a.sin_port = htons({port});
    a.sin_addr.s_addr = htonl(0x7f000001);
    int rc = connect(s, (struct sockaddr*)&a, sizeof a);
    fprintf(stderr, "HOSTILE connect rc=%d\\n", rc);
    close(s);"""
    spin = [
        (
            "COURSE_API cudaError_t saxpy(",
            "__global__ void spin_forever(volatile int* never) { while (*never == 0) {} }\n\n"
            "COURSE_API cudaError_t saxpy(",
        ),
        (
            "    return cudaGetLastError();",
            "    static cudaStream_t side;\n    static int* flag;\n    if (!side) {\n"
            "        cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);\n"
            "        cudaMalloc(&flag, sizeof(int));\n        cudaMemset(flag, 0, sizeof(int));\n    }\n"
            "    spin_forever<<<1, 1, 0, side>>>(flag);  // still running when saxpy returns\n"
            "    return cudaGetLastError();",
        ),
    ]
    net_headers = "#include <arpa/inet.h>\n#include <netinet/in.h>\n#include <sys/socket.h>\n"
    return {
        "hostile-seed": (constructor(hunt), {"crash"}, []),
        "hostile-write": (constructor(write), {"pass"}, []),
        "hostile-daemon": (constructor(daemon), {"pass"}, []),
        "hostile-forge": (constructor(forge), {"wrong"}, [(BODY, "    if (i < n) out[i] = 0.0f;")]),
        "hostile-flood": (constructor(flood), {"pass"}, []),
        "hostile-net": (net_headers + constructor(net), {"pass"}, []),
        "hostile-spin": ("", {"timeout", "crash"}, spin),
    }


def make_class(subs: Path, tag: str, port: int) -> dict[str, dict[str, set[str]]]:
    """Writes the submissions; returns, per student, the verdicts each task may get."""
    tasks = catalogue.all_tasks(["lab1"])
    solution = {t.task_id: ROOT / "lab1" / "solutions" / t.source for t in tasks}
    expected: dict[str, dict[str, set[str]]] = {}

    def student(name: str, files: dict[str, str], verdicts: dict[str, set[str]]) -> None:
        for t in tasks:
            dest = subs / name / "lab1" / t.source
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(files.get(t.source) or solution[t.task_id].read_text())
        expected[name] = {t.task_id: verdicts.get(t.task_id, {"pass"}) for t in tasks}

    student("reference", {}, {})
    skeleton = {t.source: (ROOT / "lab1" / t.source).read_text() for t in tasks}
    student("skeleton", skeleton, {t.task_id: {"not started"} for t in tasks})
    skipped = set(HUGE) | set(SANITIZED) | set(TIMED)
    for name, v in VARIANTS.items():
        if name in skipped:
            continue
        text = (ROOT / "lab1" / "solutions" / v.solution).read_text()
        for old, new in v.edits:
            assert old in text, f"{name}: edit no longer applies"
            text = text.replace(old, new)
        task_id = next(t.task_id for t in tasks if t.source == v.solution)
        student(f"broken-{name.replace('.', '-')}", {v.solution: text}, {task_id: set(v.verdicts)})
    saxpy_id = next(t.task_id for t in tasks if t.source == SAXPY)
    for name, (code, verdicts, edits) in hostile_cases(tag, port).items():
        text = (ROOT / "lab1" / "solutions" / SAXPY).read_text().replace(TOP, TOP + code)
        for old, new in edits:
            assert old in text, f"{name}: edit no longer applies"
            text = text.replace(old, new)
        student(name, {SAXPY: text}, {saxpy_id: verdicts})
    return expected


def checkout_state() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True, text=True
    ).stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the submissions go to OUT/subs, the gradebook to OUT/book")
    p.add_argument("--gpus", default="all")
    p.add_argument("--timing", default="off", choices=["off", "quick", "bench"])
    a = p.parse_args()
    tag = uuid.uuid4().hex[:12]
    secret = f"sekrit-{uuid.uuid4().hex}"
    shutil.rmtree(a.out, ignore_errors=True)
    subs, book = a.out / "subs", a.out / "book"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    expected = make_class(subs, tag, listener.getsockname()[1])
    before = checkout_state()
    env = {**os.environ, "GRADER_SEED": secret, "GRADER_TIMEOUT": os.environ.get("GRADER_TIMEOUT", "20")}
    cmd = [sys.executable, "-m", "grader", "gradebook", str(subs), "--out", str(book), "--timing", a.timing]
    start = time.perf_counter()
    rc = subprocess.run([*cmd, "--gpus", a.gpus], cwd=ROOT, env=env).returncode
    seconds = time.perf_counter() - start
    problems = [] if rc == 0 else [f"gradebook exited {rc}"]
    rows = []
    for name, want in sorted(expected.items()):
        results = book / name / "results.json"
        got = {r["task"]: r for r in json.loads(results.read_text())["tasks"]} if results.exists() else {}
        for task_id, verdicts in want.items():
            r = got.get(task_id)
            verdict = r["verdict"] if r else "(none)"
            ok = verdict in verdicts
            rows.append((name, task_id, verdict, ok))
            if not ok:
                problems.append(f"{name} {task_id}: {verdict}, expected {' or '.join(sorted(verdicts))}")
        if name == "hostile-seed" and "HOSTILE pids=" not in json.dumps(got):
            problems.append("hostile-seed: its report did not come through (the check proves nothing)")
        if name == "hostile-forge" and not any("did not carry" in n for r in got.values() for n in r["notes"]):
            problems.append("hostile-forge: the forged lines were not noticed")
    leaked = [str(f) for f in a.out.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    problems += [f"the secret seed is in {f}" for f in leaked]
    if checkout_state() != before:
        problems.append("the grader's checkout changed during the batch")
    if Path(f"/tmp/PWNED-{tag}").exists():
        problems.append(f"/tmp/PWNED-{tag} was written")
    deadline = time.time() + 10
    while processes_with(tag) and time.time() < deadline:
        time.sleep(0.5)
    for pid in processes_with(tag):
        problems.append(f"process {pid} left by hostile-daemon is alive")
        os.kill(pid, 9)
    try:
        listener.accept()
        problems.append("a submission connected to a listener on this machine")
    except BlockingIOError:
        pass
    per = {}
    for name, _task, verdict, ok in rows:
        per.setdefault(name, []).append("" if ok else f"{_task}={verdict}")
    for name in sorted(per):
        bad = [x for x in per[name] if x]
        print(f"{'✓' if not bad else '✗'} {name:40s} {' '.join(bad)}")
    throughput = book / "throughput.json"
    if throughput.exists():
        print("throughput:", throughput.read_text().strip())
    print(f"{len(expected)} submissions graded in {seconds:.1f} s (gpus={a.gpus}); {len(problems)} problem(s)")
    for line in problems:
        print("  ✗", line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
