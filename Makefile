# Two entry points for a fresh machine: `make demo` and `make test` (each sets itself up).
VENV ?= .venv
PY := $(VENV)/bin/python
# Debian packages: the fonts the synthetic generators draw with (Bengali graphemes; historical
# writers). The tests also render eval/report.html in a headless browser (TEST_PACKAGES).
DEBIAN_PACKAGES := \
  fonts-beng fonts-beng-extra fonts-lohit-beng-bengali fonts-noto-core fonts-freefont-ttf \
  fonts-dkg-handwriting fonts-breip fonts-sjfonts fonts-rufscript fonts-kristi fonts-dancingscript \
  fonts-kaushanscript fonts-ecolier-court fonts-tlwg-purisa-ttf fonts-comic-neue fonts-joscelyn \
  fonts-isabella fonts-blankenburg fonts-gotico-antiqua fonts-junicode fonts-elstob fonts-cardo \
  fonts-klaudia-berenika
TEST_PACKAGES := chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO_DATA := data/bengali-synth
DEMO_WORKDIR := workdirs/grapheme-demo
FRAG_DATA := data/fragments-synth
FRAG_WORKDIR := workdirs/fragments-demo

.PHONY: setup setup-test fonts system-packages test-packages demo demo-fragments demo-saghog test \
  wheelhouse serve-demo workbench-viewer
# What the demos need; setup-test adds the tests' extras (README: Two commands; their sizes:
# docs/benchmarks.md#what-the-setup-installs).
setup: $(VENV)/.installed fonts workbench-viewer
setup-test: setup $(VENV)/.installed-test test-packages

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

# bench/requirements-bench.txt: requirements-torch.txt, the PyTorch references the backbone
# tests and a benchmark compare against (a CUDA build of torch; requirements-torch.txt says
# why), and Albumentations for the third grapheme family. Neither demo imports them.
$(VENV)/.installed-test: $(VENV)/.installed requirements-torch.txt bench/requirements-bench.txt
	$(PY) -m pip install -q -r bench/requirements-bench.txt
	touch $@

system-packages:
	@dpkg -s $(DEBIAN_PACKAGES) >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
	  $(SUDO) apt-get install -y -q --no-install-recommends $(DEBIAN_PACKAGES) fontconfig; }

# The fonts the generators draw with: the Debian packages, and Google Fonts' Bengali families
# from the npm registry at the versions fonts/package-lock.json pins (16 MB).
fonts: system-packages fonts/node_modules/.installed

fonts/node_modules/.installed: fonts/package.json fonts/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update -q && \
	  $(SUDO) apt-get install -y -q --no-install-recommends npm; }
	npm ci --prefix fonts --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

# The workbench's joining table: OpenSeadragon from the npm registry, at the version
# retrieval/collections/workbench/static/package-lock.json pins (6 MB).
WORKBENCH_STATIC := retrieval/collections/workbench/static
workbench-viewer: $(WORKBENCH_STATIC)/node_modules/.installed

$(WORKBENCH_STATIC)/node_modules/.installed: $(WORKBENCH_STATIC)/package.json $(WORKBENCH_STATIC)/package-lock.json
	@command -v npm >/dev/null || { $(SUDO) apt-get update -q && \
	  $(SUDO) apt-get install -y -q --no-install-recommends npm; }
	npm ci --prefix $(WORKBENCH_STATIC) --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

test-packages:
	@dpkg -s $(TEST_PACKAGES) >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
	  $(SUDO) apt-get install -y -q --no-install-recommends $(TEST_PACKAGES); }

$(DEMO_DATA)/train.csv: | setup
	$(PY) -m bengrapheme.grapheme.synth --out $(DEMO_DATA) --train 16000 --test 2000 --seed 0

demo: setup $(DEMO_DATA)/train.csv
	$(PY) -m launch.train --config configs/grapheme.py:demo --data $(DEMO_DATA) --workdir $(DEMO_WORKDIR)
	$(PY) -m launch.evaluate --config configs/grapheme.py:demo --data $(DEMO_DATA) --workdir $(DEMO_WORKDIR)
	$(PY) -m launch.predict --config configs/grapheme.py:demo --data $(DEMO_DATA) --workdir $(DEMO_WORKDIR)

$(FRAG_DATA)/test: | setup
	$(PY) -m retrieval.synthetic.synth --out $(FRAG_DATA) --writers-train 60 --writers-test 30 \
	  --pages-per-writer 4 --seed 0 --workers 2

# The fragment validation family (chooses) and the third draw (reports): retrieval/synthetic/synth_val.py.
data/fragments-valfam/test: | setup
	$(PY) -m retrieval.synthetic.synth_val --out data/fragments-valfam --writers 40 --seed 0 --workers 2

data/fragments-third/test: | setup
	$(PY) -m retrieval.synthetic.synth_val --out data/fragments-third --writers 32 --seed 1 --draw third \
	  --workers 2

# Train the recipe the validation family chose (configs/fragments.py:demo), evaluate it on its
# own val and test, then on the three sets (experiments/fragment_family.py: the family chooses the
# post-processing, test and the third draw report).
demo-fragments: setup $(FRAG_DATA)/test data/fragments-valfam/test data/fragments-third/test
	$(PY) -m launch.train --config configs/fragments.py:demo --data $(FRAG_DATA) --workdir $(FRAG_WORKDIR)
	$(PY) -m launch.evaluate --config configs/fragments.py:demo --data $(FRAG_DATA) --workdir $(FRAG_WORKDIR)
	$(PY) -m experiments.fragment_family --notrain --config configs/fragments.py:demo --workdir $(FRAG_WORKDIR)

# The scholars' workbench over the fragments demo: trains it first if its workdir has no
# evaluated checkpoint, indexes the test writers' folder, serves http://127.0.0.1:8765/.
serve-demo: setup $(FRAG_DATA)/test
	[ -f $(FRAG_WORKDIR)/eval/metrics.json ] || $(MAKE) demo-fragments
	$(PY) -m launch.index --config configs/fragments.py:demo --workdir $(FRAG_WORKDIR) --collection $(FRAG_DATA)/test
	$(PY) -m launch.serve --workdir $(FRAG_WORKDIR)

# SAGHOG at CPU size: MaskFeat pre-training of a ViT, then the fragment fine-tune from it
# (configs/fragments.py:recipe=saghog reads workdirs/maskfeat-demo; docs/fragments.md).
demo-saghog: setup $(FRAG_DATA)/test
	$(PY) -m launch.train --config configs/maskfeat.py:demo --data $(FRAG_DATA) --workdir workdirs/maskfeat-demo
	$(PY) -m launch.evaluate --config configs/maskfeat.py:demo --data $(FRAG_DATA) --workdir workdirs/maskfeat-demo
	$(PY) -m launch.train --config configs/fragments.py:recipe=saghog --data $(FRAG_DATA) --workdir workdirs/saghog-demo
	$(PY) -m launch.evaluate --config configs/fragments.py:recipe=saghog --data $(FRAG_DATA) --workdir workdirs/saghog-demo

test: setup-test
	$(PY) -m pytest -q -m "slow or not slow" --durations=15 -rs

# The project and its runtime dependencies as wheels, for an offline install (a Kaggle
# notebook; docs/kaggle-notebook.md). For another Python / platform than this one's, e.g. Kaggle's:
#   make wheelhouse WHEELHOUSE_ARGS='--python-version 3.11 --platform manylinux_2_35_x86_64'
WHEELHOUSE_ARGS ?=
wheelhouse: $(VENV)/.installed
	$(PY) -m launch.wheelhouse --out dist/wheelhouse $(WHEELHOUSE_ARGS)
