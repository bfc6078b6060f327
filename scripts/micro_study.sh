#!/usr/bin/env bash
# The CPU-scale study (README, "A CPU-scale study"): lr sweeps for AdamW and MARS-AdamW and a gamma
# sweep for MARS-AdamW, 3 seeds each (27 runs of experiment=micro/*, JOBS at a time through
# hydra/launcher=parallel), then the report against the best AdamW lr. About 45 minutes on 2 CPU cores.
#   bash scripts/micro_study.sh [OUT_DIR]          # default multirun/micro; JOBS=2, PYTHON=python
#   MODEL=llama_tiny bash scripts/micro_study.sh multirun/micro_llama   # the same study on LLaMA
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-multirun/micro}
py=${PYTHON:-python}
sweep=(hydra/launcher=parallel "hydra.launcher.n_jobs=${JOBS:-2}" train.seed=1,2,3)
if [[ -n "${MODEL:-}" ]]; then sweep+=("model=$MODEL"); fi
"$py" train.py -m experiment=micro/adamw optimizer.lr=2e-3,4e-3,8e-3 "${sweep[@]}" "hydra.sweep.dir=$out/adamw_lr"
"$py" train.py -m experiment=micro/mars_adamw optimizer.lr=3e-3,6e-3,1.2e-2 "${sweep[@]}" "hydra.sweep.dir=$out/mars_lr"
"$py" train.py -m experiment=micro/mars_adamw optimizer.gamma=0,0.0125,0.05 "${sweep[@]}" "hydra.sweep.dir=$out/mars_gamma"
"$py" scripts/report.py "$out/adamw_lr" "$out/mars_lr" "$out/mars_gamma" \
    --baseline optimizer.name=adamw --best --out "$out/report"
