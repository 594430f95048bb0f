#!/bin/bash
# Device side of run 4 (docs/measured-h100.md: prepared 2026-11-25, run 2026-11-26): 4.x names
# and the nvlink family on a real GPU, in one call of the device tool. Stage first, in an ignored
# folder .gpu/ of the checkout the tool sends: .gpu/wheels (py3.12 wheels, gpufed from
# `pip wheel --no-deps`), .gpu/src (a copy of this tree), then run `bash .gpu/src/scripts/gpu_run4.sh`
# with carry [".gpu"]; results: $OUT/run4.tgz.
G=$PWD/.gpu; R=/tmp/r; mkdir -p $R
trap 'tar czf $OUT/run4.tgz -C $R . ; cp $R/summary.txt $OUT/ 2>/dev/null' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $G/wheels/*.whl || exit 1
export PYTHONPATH=$G/src:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
cd $G/src
# Every step is bounded, and once the whole run is past ${GPU_RUN_BUDGET_S:-420} s the rest is
# skipped, so the EXIT trap packs the results before the device tool's own limit cuts the call.
DEADLINE=$((SECONDS + ${GPU_RUN_BUDGET_S:-420}))
T() { local s=$1; shift; if (( SECONDS + 5 > DEADLINE )); then echo "step skipped (run budget spent): $*" >> $R/summary.txt; return; fi
  (( SECONDS + s > DEADLINE )) && s=$((DEADLINE - SECONDS))
  local t0=$EPOCHREALTIME; timeout $s "$@"; local rc=$?; echo "step rc=$rc $(awk "BEGIN{print $EPOCHREALTIME - $t0}")s: $*" >> $R/summary.txt; }
# prometheus_client has no __version__ (run of 2026-11-26): ask the installed distributions instead.
python3 -c "import sys,pynvml;from importlib.metadata import version as v;print(sys.version, pynvml.__file__, *(f'{d}={v(d)}' for d in ('nvidia-ml-py','prometheus-client','pydantic','gpufed')))" > $R/versions.txt 2>&1
nvidia-smi > $R/nvidia-smi.txt 2>&1
nvidia-smi -q > $R/nvidia-smi-q.txt 2>&1
{ echo "## nvlink -s"; nvidia-smi nvlink -s; echo "## nvlink --status"; nvidia-smi nvlink --status; echo "## nvlink -c"; nvidia-smi nvlink -c; echo "## nvlink -e"; nvidia-smi nvlink -e; echo "## topo -m"; nvidia-smi topo -m; } > $R/nvidia-smi-nvlink.txt 2>&1
T 120 python3 scripts/gpu_probe.py --repeat 100 > $R/probe.json 2> $R/probe.err
FAM=pcie,gpm,process,nvlink
for N in 3 4 both; do
  T 60 python3 scripts/gpu_measure.py --out $R/m-nvml-$N --idle 5 --scrapes 500 -- gpufed-exporter --backend nvml --collect-interval 1 --families $FAM --dcgm-names $N > $R/measure-nvml-$N.json
  T 60 python3 scripts/gpu_measure.py --out $R/m-sim-$N --idle 2 --scrapes 200 -- gpufed-exporter --backend simulated --gpus 1 --collect-interval 1 --families $FAM --dcgm-names $N > $R/measure-sim-$N.json
  T 60 python3 scripts/gpu_measure.py --out $R/d-nvml-$N --idle 3 --scrapes 300 -- gpufed-exporter --backend nvml --dcgm-names $N > $R/measure-default-nvml-$N.json
done
T 150 python3 scripts/gpu_measure.py --out $R/load-nvml-4 --idle 2 --scrapes 500 --load "python3 scripts/gpu_load.py 40" --load-settle 15 -- gpufed-exporter --backend nvml --collect-interval 1 --families $FAM --dcgm-names 4 > $R/measure-load-nvml-4.json
for pass in 1 2; do
  for N in 3 4 both; do
    T 60 gpufed-exporter bench --backend nvml --dcgm-names $N --fleet-nodes 0 --scrapes 2000 --collect-rounds 50 --json > $R/bench-nvml-default-$N-p$pass.json
  done
  T 60 gpufed-exporter bench --backend nvml --families nvlink --fleet-nodes 0 --scrapes 2000 --collect-rounds 50 --json > $R/bench-nvml-nvlink-p$pass.json
  T 60 gpufed-exporter bench --backend nvml --families nvlink --dcgm-names both --fleet-nodes 0 --scrapes 2000 --collect-rounds 50 --json > $R/bench-nvml-nvlink-both-p$pass.json
  T 60 gpufed-exporter bench --backend simulated --gpus 1 --dcgm-names 3 --fleet-nodes 0 --scrapes 2000 --collect-rounds 50 --json > $R/bench-sim-default-3-p$pass.json
  T 60 gpufed-exporter bench --backend simulated --gpus 1 --dcgm-names 4 --fleet-nodes 0 --scrapes 2000 --collect-rounds 50 --json > $R/bench-sim-default-4-p$pass.json
done
T 60 python3 scripts/gpu_measure.py --out $R/xid --idle 2 --scrapes 50 --xid "python3 scripts/gpu_xid.py" -- gpufed-exporter --backend nvml --collect-interval 1 --dcgm-names both > $R/measure-xid.json
# The device's pytest does not know pytest-asyncio's ini option; under filterwarnings=error that
# warning ended the 2026-11-26 run's step with rc 3 before any test ran.
T 240 python3 -m pytest tests/exporter -q -p no:cacheprovider -o filterwarnings= -W ignore::pytest.PytestConfigWarning -m "not e2e" -k "not promtool" > $R/pytest.txt 2>&1
dmesg 2>/dev/null | grep -iE "xid|nvrm|nvlink" | tail -40 > $R/dmesg.txt
cat $R/summary.txt
