# Fresh machine: `make demo` runs the main job end to end, `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
QKM := $(VENV)/bin/qkm
SAMPLE := qkm/datasets/fashion_mnist_2000.npz
OUT := demo_out

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	mkdir -p $(OUT)
	$(QKM) train $(SAMPLE) -k 10 --seed 0 --algorithm elkan -o $(OUT)/model.qkm --labels $(OUT)/train_labels.txt
	$(QKM) predict $(OUT)/model.qkm $(SAMPLE) -o $(OUT)/predicted.npy
	$(QKM) score $(SAMPLE) --model $(OUT)/model.qkm
	$(QKM) train $(SAMPLE) -k 10 --seed 0 --algorithm qkmeans --sparsity-level 3 -o $(OUT)/qkmeans.qkm
	$(QKM) score $(SAMPLE) --model $(OUT)/qkmeans.qkm

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m pip install -q -r benchmarks/requirements.txt
	$(PY) benchmarks/train_sparse.py --out benchmarks/results/train_sparse
	$(PY) benchmarks/init_kmeanspp.py --repeat 3 --out benchmarks/results/init_kmeanspp
	$(PY) benchmarks/palm_factorization.py --out benchmarks/results/palm_factorization
	$(PY) benchmarks/operator_speed.py --threads 1 --out benchmarks/results/operator_speed
	$(PY) benchmarks/operator_speed.py --threads 2 --out benchmarks/results/operator_speed_2threads
	$(PY) benchmarks/qkmeans_paper.py --out benchmarks/results/qkmeans_paper

clean:
	rm -rf $(OUT) .pytest_cache
