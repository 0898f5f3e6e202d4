# CUDA course: `make help` lists the targets. Everything runs in .venv, made by ./setup.sh on first use.

PY      := .venv/bin/python
STAMP   := .venv/.setup-stamp
PYTEST  := $(PY) -m pytest
LABS    := lab1 lab2 lab3 lab4 lab5 lab6 lab7
TASK    ?=
ARGS    ?=
OUT     ?= grade-results
DEST    ?=
SOLUTIONS ?=
SUB     ?=
SUBS    ?=
PROMPT      ?= Once upon a time
MODEL       ?=
TEMPERATURE ?= 0
TOP_P       ?= 1
SEED        ?= 0
STEPS       ?= 128
GPUS        ?=

# third-party pytest plugins a shared Python may carry cost startup time and add nothing here
export PYTEST_DISABLE_PLUGIN_AUTOLOAD := 1

# pytest options shared by the grading targets: short output, our own table at the end
GRADE_OPTS := -q --no-header -p no:cacheprovider -rfEs $(if $(TASK),--task=$(TASK)) $(if $(SOLUTIONS),--solutions) $(ARGS)

.DEFAULT_GOAL := help
.PHONY: help setup doctor train-lab3 generate bench-lab4 bench-lab5 bench-lab6 bench-lab7 check verify grade grade-submission gradebook grade-class bench-grader skeletons release lint clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_%-]+:.*## / {name = $$1; sub(/%/, "N", name); printf "  %-16s %s\n", name, $$2}' $(MAKEFILE_LIST)
	@echo "  labs: N is 1 to 7 (make test-lab1, make bench-lab2, ...)"
	@echo "  variables: TASK=NN or labN/NN (one task), SOLUTIONS=1 (grade the reference solutions), ARGS='...' (extra options), LABS='lab2 lab3' (make verify), JOBS=1 (make check in one process), OUT=dir, DEST=dir"

# .venv/bin/python is a link to an old interpreter binary, so the set-up leaves a fresh stamp instead
$(STAMP): setup.sh requirements.txt
	./setup.sh --quiet

setup: ## (re)create .venv and print the environment check
	./setup.sh

# the lab a pattern target names (test-lab3 -> lab3); a lab without task files yet says so, and
# one that does not exist is an error that names the labs there are
define grade_lab
	@if ls $(1)/tests/test_[0-9][0-9]_*.py >/dev/null 2>&1; then \
		$(PYTEST) $(1)/tests $(GRADE_OPTS) $(2); \
	elif [ -d $(1) ]; then echo "$(1) is coming next: see $(1)/README.md"; \
	else echo "there is no $(1): the labs are $$(ls -d lab[0-9]* | tr '\n' ' ')"; exit 2; fi
endef

# the head start builds, in the background, what the lab's last run built (pytest takes half a
# second to start; the grader then waits for that build instead of starting its own)
test-lab%: $(STAMP) ## grade one lab: make test-lab1 (one task: TASK=03)
	@$(PY) -m grader.build.head_start lab$* $(if $(TASK),--task $(TASK)) $(if $(SOLUTIONS),--solutions) >/dev/null 2>&1 &
	$(call grade_lab,lab$*)

sanitize-lab%: $(STAMP) ## run a lab under compute-sanitizer memcheck and racecheck (small sizes)
	$(call grade_lab,lab$*,--sanitize)

# labs 4 and 5 time their kernels, then what they build from them (explicit rules beat bench-lab%)
bench-lab4: $(STAMP) ## lab 4 (GPU): the kernels' timings, then one CUDA graph per run against launches (chapter 7's table)
	$(PY) -m grader bench lab4 $(if $(TASK),--task $(TASK)) $(if $(SOLUTIONS),--solutions)
	$(PY) lab4/bench_graph.py $(if $(SOLUTIONS),--solutions --write-readme) $(ARGS)
bench-lab5: $(STAMP) ## lab 5 (GPU): the kernels' timings, then decode against the memory roofline and transformers
	$(PY) -m grader bench lab5 $(if $(TASK),--task $(TASK)) $(if $(SOLUTIONS),--solutions)
	$(PY) lab5/bench_llama.py $(if $(SOLUTIONS),--solutions --write-readme) $(ARGS)

# lab 6: task 01's timings, then decode of the 7B shape on 1, 2 and 4 GPUs (those this machine shows)
bench-lab6: $(STAMP) ## lab 6 (GPUs): task 01's timings, then 7B decode on 1, 2 and 4 GPUs (NCCL, then tasks 02+03), compute and communication apart, then tasks 02 and 03 against NCCL, then every GPU pair's bandwidth and latency
	$(PY) -m grader bench lab6 $(if $(TASK),--task $(TASK)) $(if $(SOLUTIONS),--solutions)
	$(PY) lab6/bench_tp.py --own-all-reduce $(if $(SOLUTIONS),--solutions --write-readme) $(ARGS)
	$(PY) lab6/bench_allreduce.py $(if $(SOLUTIONS),--solutions --write-readme)
	$(PY) lab6/bench_peer.py $(if $(SOLUTIONS),--write-readme)

# lab 7: the kernels' timings and ladders, then task 07: a GPT-2 124M step against PyTorch eager and torch.compile
bench-lab7: $(STAMP) ## lab 7 (GPU): the kernels' timings, task 06's loss curve against PyTorch's, then a GPT-2 small step against eager and torch.compile
	$(PY) -m grader bench lab7 $(if $(TASK),--task $(TASK)) $(if $(SOLUTIONS),--solutions)
	$(PY) lab7/curve.py $(if $(SOLUTIONS),--solutions --write-readme)
	$(PY) lab7/bench_gpt.py $(if $(SOLUTIONS),--solutions --write-readme) $(ARGS)

bench-lab%: $(STAMP) ## time a lab carefully; write its ladder tables and plots into its chapter (labN/*.md)
	$(PY) -m grader bench lab$* $(if $(TASK),--task $(TASK)) $(if $(SOLUTIONS),--solutions)

profile-lab%: $(STAMP) ## Nsight Compute summary of one task: make profile-lab1 TASK=03
	@test -n "$(TASK)" || { echo "usage: make profile-lab$* TASK=NN"; exit 2; }
	$(PY) -m grader profile lab$*/$(TASK) $(if $(SOLUTIONS),--solutions)

# GPUS=N: lab 6's tensor-parallel model over N GPUs (kiln_tp.generate), the same options otherwise
ifeq ($(strip $(GPUS)),)
generate: $(STAMP) ## lab 5: continue PROMPT with kiln's LLaMA (MODEL=dir or .bin, else the tiny model; TEMPERATURE, TOP_P, SEED, STEPS; GPUS=N: lab 6, over N GPUs)
	PYTHONPATH=lab5 $(PY) -m llama.generate --prompt "$(PROMPT)" $(if $(MODEL),--model "$(MODEL)") --temperature $(TEMPERATURE) --top-p $(TOP_P) --seed $(SEED) --max-new-tokens $(STEPS) $(if $(SOLUTIONS),--solutions) $(ARGS)
else
generate: $(STAMP)
	PYTHONPATH=lab6 $(PY) -m kiln_tp.generate --world $(GPUS) --prompt "$(PROMPT)" $(if $(MODEL),--model "$(MODEL)") --temperature $(TEMPERATURE) --top-p $(TOP_P) --seed $(SEED) --max-new-tokens $(STEPS) $(if $(SOLUTIONS),--solutions) $(ARGS)
endif

doctor: $(STAMP) ## what this machine has for the course: toolkit, GPU, packages, profilers, models
	$(PY) -m grader doctor

train-lab3: $(STAMP) ## train lab 3's MLP and CNN into lab3/models/ (MNIST when online, else scikit-learn's digits)
	$(PY) -m lab3.train $(ARGS)

# make check on every core (JOBS=1: one process, pytest's own per-file lines): pytest-xdist hands
# out tests and groups of tests that share a build or a fixture (tests/conftest.py), and prints one
# line per test file as it finishes
JOBS ?= auto
check: $(STAMP) ## the course's own tests: pass on any machine, CPU-only included (JOBS=1: in one process)
	$(PYTEST) grader/tests tests -p no:cacheprovider $(if $(filter 1,$(JOBS)),,-p xdist.plugin -n $(JOBS) --maxprocesses=8 --dist loadgroup --no-loadscope-reorder) -rs --durations=25 $(ARGS)

verify: $(STAMP) ## instructors: every skeleton fails, every reference solution passes, every broken variant is caught (LABS='lab2 lab3')
	$(PY) -m grader verify $(LABS) $(ARGS)

grade: $(STAMP) ## grade every lab (benchmark timing, sanitizer, cases past 2^31 elements) into OUT=dir
	@mkdir -p $(OUT)
	$(PYTEST) $(wildcard lab*/tests) $(GRADE_OPTS) --timing=bench --sanitize --huge --grade-dir=$(OUT) --junitxml=$(OUT)/junit.xml -o junit_family=xunit1

bench-grader: $(STAMP) ## time the edit-and-retest loop against torch's load_inline (GPU, instructors)
	@test -f benchmarks/edit_loop.py || { echo "bench-grader is an instructor tool: not part of a student release"; exit 2; }
	$(PY) benchmarks/edit_loop.py $(ARGS)

skeletons: $(STAMP) ## regenerate the student files (.cu, .py, .ipynb) from labN/solutions/
	$(PY) -m grader skeletons

grade-submission: $(STAMP) ## instructors: grade one student's work: make grade-submission SUB=path-or-git-url [OUT=dir]
	@test -n "$(SUB)" || { echo "usage: make grade-submission SUB=path-or-git-url [OUT=dir]"; exit 2; }
	$(PY) -m grader submission $(SUB) --out $(OUT)

gradebook: $(STAMP) ## instructors: grade a folder of submissions into OUT/gradebook.csv: make gradebook SUBS=dir
	@test -n "$(SUBS)" || { echo "usage: make gradebook SUBS=dir-of-submissions [OUT=dir] [ARGS='--only NAME | --gpus 0,1 | --shard I/N | --slurm N | --collect']"; exit 2; }
	$(PY) -m grader gradebook $(SUBS) --out $(OUT) $(ARGS)

grade-class: $(STAMP) ## instructors (GPU): 21 lab 1 submissions, hostile ones included, graded by the gradebook and checked
	@test -f benchmarks/grade_class.py || { echo "grade-class is an instructor tool: not part of a student release"; exit 2; }
	$(PY) benchmarks/grade_class.py --out .build/class $(ARGS)

release: $(STAMP) ## export a student tree without solutions: make release DEST=../student-release [GRADER_REPO=owner/name]
	@test -n "$(DEST)" || { echo "usage: make release DEST=../student-release [GRADER_REPO=owner/name]"; exit 2; }
	$(PY) -m grader release $(DEST) $(if $(GRADER_REPO),--grader-repo $(GRADER_REPO))

lint: $(STAMP) ## ruff over the Python code
	$(PY) -m ruff check grader tests benchmarks $(LABS)

clean: ## remove build outputs and caches (keeps .venv)
	rm -rf .build grade-results .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
