#!/usr/bin/env bash
# The CPU-scale study (README, "A CPU-scale study"; configs/study/micro.yaml): AdamW against MARS-AdamW, each
# searched over wide ranges (16 scrambled-Sobol trials per arm, more where its best sits at a bound), each
# arm's best rerun with seeds 1-3, the paired verdict. One command, scripts/study.py study=micro; this script
# only names the study dir and the model. Rerunning it continues an interrupted study.
#   bash scripts/micro_study.sh [STUDY_DIR]                       # default studies/micro; JOBS=2, PYTHON=python
#   MODEL=llama_tiny bash scripts/micro_study.sh studies/micro_llama   # the same study on LLaMA
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-studies/micro${MODEL:+_$MODEL}}
args=(study=micro "study.dir=$out" "study.launcher.n_jobs=${JOBS:-2}")
if [[ -n "${MODEL:-}" ]]; then args+=("model=$MODEL"); fi
"${PYTHON:-python}" scripts/study.py "${args[@]}"
