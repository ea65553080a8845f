#!/usr/bin/env bash
# One device call (run 35): the prefill breakdown of this revision and of .base/, the benches against .base/ on the
# same routings (seed 43), then the GPU tests of the W4A16 kernels, then EXP2 (an experiment script, its own
# EXP_* settings) if given; every output tarred into $OUT/call.tgz.
R=$(pwd); O=/tmp/o; mkdir -p $O
OUT=$O STEPS=exp,bench,base EXP=bench/exp/prefill_breakdown.py BENCH_SEED=43 BENCH_ARGS="--batch 1,2,16,256,2048,4096,8192 --skew 0" BASE_ARGS="--batch 1,2,16,256,2048,4096,8192" BENCH_M=64 timeout 420 bash bench/device_run.sh > $O/device_run.log 2>&1
mkdir -p $O/base_bd; (cd /tmp && SGLANG_GLM5_CACHE_DIR=/tmp/cache_base PYTHONPATH=/tmp/pkg_base timeout 100 python3 -P $R/bench/exp/prefill_breakdown.py $O/base_bd > $O/base_bd/exp.log 2>&1)
(cd /tmp/pkg && SGLANG_GLM5_TEST_DEVICE=cuda PYTHONPATH=/tmp/pkg:/tmp/site timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_moe.py tests/test_gluon.py tests/test_split_k.py tests/test_weight_layout.py > $O/pytest_cuda.log 2>&1)
if [ -n "${EXP2:-}" ]; then mkdir -p $O/exp2; (cd /tmp/pkg && PYTHONPATH=/tmp/pkg timeout ${EXP2_TIMEOUT:-240} python3 $R/$EXP2 $O/exp2 > $O/exp2/exp.log 2>&1); fi
tar czf $OUT/call.tgz -C $O .
grep -h "B=" $O/exp.log $O/base_bd/exp.log; tail -3 $O/pytest_cuda.log; [ -n "${EXP2:-}" ] && grep -v "^\s*$" $O/exp2/exp.log | tail -40
