# Fresh machine: `make demo` runs the main job end to end, `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
QKM := $(VENV)/bin/qkm
SAMPLE := qkm/datasets/fashion_mnist_2000.npz
OUT := demo_out

.PHONY: demo models test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,distributed]'
	touch $@

demo: $(VENV)/.installed
	mkdir -p $(OUT)
	$(QKM) train $(SAMPLE) -k 10 --seed 0 --algorithm elkan -o $(OUT)/model.qkm --labels $(OUT)/train_labels.txt
	$(QKM) predict $(OUT)/model.qkm $(SAMPLE) -o $(OUT)/predicted.npy
	$(QKM) score $(SAMPLE) --model $(OUT)/model.qkm
	$(QKM) train $(SAMPLE) -k 10 --seed 0 --algorithm qkmeans --sparsity-level 3 --with-index --with-features \
		-o $(OUT)/qkmeans.qkm
	$(QKM) score $(SAMPLE) --model $(OUT)/qkmeans.qkm
	$(QKM) export $(OUT)/qkmeans.qkm --format onnx -o $(OUT)/qkmeans.onnx
	@# serve it on a free loopback port (/assign through onnxruntime), query it, stop it even if a query fails
	@port=$$($(PY) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	echo "$(QKM) serve $(OUT)/qkmeans.qkm --backend onnx --port $$port   (log: $(OUT)/serve.log)"; \
	$(QKM) serve $(OUT)/qkmeans.qkm --backend onnx --port $$port > $(OUT)/serve.log 2>&1 & server=$$!; \
	trap 'kill $$server 2>/dev/null; wait $$server; echo "server stopped (exit status $$?)"' EXIT; \
	$(PY) examples/serve_client.py http://127.0.0.1:$$port --wait 120 || { tail -n 20 $(OUT)/serve.log; exit 1; }

# the demo model that `qkm serve` serves without a model argument (see models/README.md)
models: $(VENV)/.installed
	$(PY) models/build_demo_model.py

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
	$(PY) benchmarks/onnx_export.py --out benchmarks/results/onnx_export
	$(PY) benchmarks/paper_table4.py --out benchmarks/results/paper_table4
	$(PY) benchmarks/serve_load.py --out benchmarks/results/serve_load
	$(PY) benchmarks/ann.py --out benchmarks/results/ann

clean:
	rm -rf $(OUT) .pytest_cache
