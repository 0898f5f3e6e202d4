# CUDA course: `make help` lists the targets. Everything runs in .venv, made by ./setup.sh on first use.

PY      := .venv/bin/python
STAMP   := .venv/.setup-stamp
PYTEST  := $(PY) -m pytest
LABS    := lab1 lab2 lab3 lab4 lab5
TASK    ?=
ARGS    ?=
OUT     ?= grade-results
DEST    ?=
SOLUTIONS ?=

# third-party pytest plugins a shared Python may carry cost startup time and add nothing here
export PYTEST_DISABLE_PLUGIN_AUTOLOAD := 1

# pytest options shared by the grading targets: short output, our own table at the end
GRADE_OPTS := -q --no-header -p no:cacheprovider -rfEs $(if $(TASK),--task=$(TASK)) $(if $(SOLUTIONS),--solutions) $(ARGS)

.DEFAULT_GOAL := help
.PHONY: help setup $(addprefix test-,$(LABS)) check verify grade bench-lab1 bench-grader sanitize-lab1 skeletons release lint clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_%-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: TASK=NN (one task), SOLUTIONS=1 (grade the reference solutions), ARGS='...' (extra pytest options), OUT=dir, DEST=dir"

# .venv/bin/python is a link to an old interpreter binary, so the set-up leaves a fresh stamp instead
$(STAMP): setup.sh requirements.txt
	./setup.sh --quiet

setup: ## (re)create .venv and print the environment check
	./setup.sh

# grades one lab: its task files if it has any yet, else a pointer to its README
define grade_lab
	@if ls $(1)/tests/test_[0-9][0-9]_*.py >/dev/null 2>&1; then \
		$(PYTEST) $(1)/tests $(GRADE_OPTS); \
	else echo "$(1) is coming next: see $(1)/README.md"; fi
endef

test-lab1: $(STAMP) ## grade lab 1 (CUDA basics); one task: make test-lab1 TASK=03
	$(call grade_lab,lab1)
test-lab2: $(STAMP) ## grade lab 2 (GPU performance)
	$(call grade_lab,lab2)
test-lab3: $(STAMP) ## grade lab 3 (CUDA libraries)
	$(call grade_lab,lab3)
test-lab4: $(STAMP) ## grade lab 4 (inference compiler, part 1)
	$(call grade_lab,lab4)
test-lab5: $(STAMP) ## grade lab 5 (inference compiler, part 2: LLaMA)
	$(call grade_lab,lab5)

check: $(STAMP) ## the course's own tests: pass on any machine, CPU-only included
	$(PYTEST) grader/tests tests -q -p no:cacheprovider $(ARGS)

verify: $(STAMP) ## instructors: every skeleton fails and every reference solution passes
	$(PY) -m grader verify

grade: $(STAMP) ## grade every lab (benchmark timing + sanitizer) into OUT=dir: results.json, junit.xml, summary.md
	@mkdir -p $(OUT)
	$(PYTEST) $(wildcard lab*/tests) $(GRADE_OPTS) --timing=bench --sanitize --grade-dir=$(OUT) --junitxml=$(OUT)/junit.xml -o junit_family=xunit1

bench-lab1: $(STAMP) ## time lab 1 carefully (longer runs, benchmark targets)
	$(PYTEST) lab1/tests $(GRADE_OPTS) --timing=bench

bench-grader: $(STAMP) ## time the edit-and-retest loop against torch's load_inline (GPU, instructors)
	@test -f benchmarks/edit_loop.py || { echo "bench-grader is an instructor tool: not part of a student release"; exit 2; }
	$(PY) benchmarks/edit_loop.py

sanitize-lab1: $(STAMP) ## run lab 1 under compute-sanitizer memcheck and racecheck (small sizes)
	$(PYTEST) lab1/tests $(GRADE_OPTS) --sanitize

skeletons: $(STAMP) ## regenerate the student files from labN/solutions/*.cu
	$(PY) -m grader skeletons

release: $(STAMP) ## export a student tree without solutions: make release DEST=../student-release
	@test -n "$(DEST)" || { echo "usage: make release DEST=../student-release"; exit 2; }
	$(PY) -m grader release $(DEST)

lint: $(STAMP) ## ruff over the Python code
	$(PY) -m ruff check grader tests benchmarks $(LABS)

clean: ## remove build outputs and caches (keeps .venv)
	rm -rf .build grade-results .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
